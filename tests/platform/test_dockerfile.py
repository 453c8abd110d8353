"""platform/Dockerfile: python:3.11-slim, the project's requirements, PyTorch's CPU wheel at the pinned version."""

import re

from .kustomize import PLATFORM

REPO = PLATFORM.parent


def test_it_builds_on_python_3_11_slim_and_installs_the_requirements():
    dockerfile = (PLATFORM / "Dockerfile").read_text()
    assert all(line.split()[1].startswith("python:3.11-slim") for line in re.findall(r"^FROM .*$", dockerfile, re.MULTILINE))
    assert "pip install -r /tmp/requirements.txt" in dockerfile


def test_it_installs_the_torch_version_that_requirements_pin_from_the_cpu_index():
    pinned = re.search(r"^torch==(\S+)$", (REPO / "requirements.txt").read_text(), re.MULTILINE).group(1)
    dockerfile = (PLATFORM / "Dockerfile").read_text()
    assert f"--index-url https://download.pytorch.org/whl/cpu torch=={pinned}" in dockerfile


def test_its_ignore_file_keeps_local_state_out_of_the_image():
    ignored = (PLATFORM / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "var", "tests"} <= set(ignored)
