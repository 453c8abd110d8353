"""A small Kustomize renderer for the tests: resources (files and directories), strategic-merge patches,
``images`` and ``replicas``, enough for platform/kubernetes and no more, so no kubectl is needed.

Strategic merge follows Kubernetes' patch strategy for the lists these manifests patch (containers and env
by ``name``, ...) and Kustomize's order: a merged list holds the patch's items first, then the other items
of the original (no CI machine has kubectl to compare with; ``kubectl kustomize`` is the reference by hand).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

PLATFORM = Path(__file__).resolve().parents[2] / "platform"
KUBERNETES = PLATFORM / "kubernetes"

# patchMergeKey of the lists that strategic merge merges instead of replacing (Kubernetes API types).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


def load_documents(path: Path) -> list[dict]:
    """Every non-empty YAML document of ``path``."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def kustomization(directory: Path) -> dict:
    return load_documents(directory / "kustomization.yaml")[0]


def resource_files(directory: Path) -> list[Path]:
    """The files a kustomization's ``resources`` list names, following directories (other kustomizations)."""
    files = []
    for entry in kustomization(directory).get("resources", []):
        path = (directory / entry).resolve()
        files.extend(resource_files(path) if path.is_dir() else [path])
    return files


def patch_files(directory: Path) -> list[Path]:
    """The patch files of a kustomization and of the kustomizations it builds on."""
    files = []
    for entry in kustomization(directory).get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            files.extend(patch_files(path))
    return files + [(directory / p["path"]).resolve() for p in kustomization(directory).get("patches", [])]


def key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def merge(original, patch, field: str | None = None):
    """Strategic merge of ``patch`` into ``original`` (neither is modified)."""
    if isinstance(original, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(original)
        for name, value in patch.items():
            merged[name] = merge(original[name], value, name) if name in original else copy.deepcopy(value)
        return merged
    if isinstance(original, list) and isinstance(patch, list) and field in MERGE_KEYS:
        merge_key = MERGE_KEYS[field]
        by_key = {item[merge_key]: item for item in original}
        patched = [merge(by_key[item[merge_key]], item) if item[merge_key] in by_key else copy.deepcopy(item)
                   for item in patch]
        patched_keys = {item[merge_key] for item in patch}
        return patched + [copy.deepcopy(item) for item in original if item[merge_key] not in patched_keys]
    return copy.deepcopy(patch)


def set_images(obj: dict, images: list[dict]) -> None:
    """Kustomize's ``images``: a container image named ``name`` becomes ``newName:newTag``."""
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name = container["image"].split(":")[0]
        for image in images:
            if image["name"] == name:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"


def render(directory: Path) -> list[dict]:
    """The objects ``kubectl kustomize directory`` outputs (in resource order rather than by kind)."""
    spec = kustomization(directory)
    objects = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        objects.extend(render(path) if path.is_dir() else load_documents(path))
    for entry in spec.get("patches", []):
        for patch in load_documents((directory / entry["path"]).resolve()):
            index = [key(obj) for obj in objects].index(key(patch))
            if patch.get("$patch") == "delete":
                del objects[index]
            else:
                objects[index] = merge(objects[index], patch)
    for obj in objects:
        set_images(obj, spec.get("images", []))
        for replicas in spec.get("replicas", []):
            if obj["metadata"]["name"] == replicas["name"] and "replicas" in obj.get("spec", {}):
                obj["spec"]["replicas"] = replicas["count"]
    return objects


def kustomization_dirs() -> list[Path]:
    """Every directory under platform/kubernetes holding a kustomization.yaml."""
    return sorted(path.parent for path in KUBERNETES.rglob("kustomization.yaml"))
