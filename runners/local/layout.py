"""The files of a local attempt directory, shared by the runner (Django side) and the node supervisor.

``<LOCAL_RUNNER_DIR>/<attempt object name>/`` holds ``attempt.json`` (who
the attempt is, its master port), per node ``node-<i>.claim`` (created with
O_EXCL by the one dispatch that launches the node), ``node-<i>.pid``
(written by the supervisor once the command runs), ``node-<i>.exit`` (how
it ended), ``node-<i>.log``, and ``stop`` once the control plane stopped
the attempt. Standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ATTEMPT_FILE = "attempt.json"
STOP_FILE = "stop"


def node_path(attempt_dir: Path, node: int, kind: str) -> Path:
    """``<attempt_dir>/node-<node>.<kind>`` for kind ``claim``, ``pid``, ``exit`` or ``log``."""
    return attempt_dir / f"node-{node}.{kind}"


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``; None when the file is missing, empty or not (yet) a JSON object."""
    try:
        data = json.loads(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part.

    Writes a temporary file in the same directory, fsyncs it and renames it
    over ``path``. Raises OSError.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def create_exclusive(path: Path, data: dict) -> bool:
    """Create ``path`` holding ``data`` only if it does not exist (O_CREAT|O_EXCL); True when this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return True
