"""The contract every cluster backend implements, and the registry that picks one per cluster.

A backend turns an attempt into objects on its cluster (processes for
``local``, Kubernetes objects for ``kubernetes``), reports what it sees in one
call per cluster, and deletes what it owns. Backends never change job states:
``jobs.reconcile`` does, from their observations.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


class DispatchError(Exception):
    """Creating an attempt's objects failed."""


class TransientDispatchError(DispatchError):
    """A failure worth retrying with backoff: timeout, connection refused, HTTP 429 or 5xx."""


class PermanentDispatchError(DispatchError):
    """A failure that a retry would repeat (HTTP 403, 422, a bad command); fails the attempt."""


class UnknownBackend(LookupError):
    """No backend is registered under the cluster's ``backend`` name (e.g. kubernetes before its runner exists)."""


class ClusterUnreachable(Exception):
    """The backend could not talk to the cluster at all."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a backend sees of one attempt.

    ``phase`` is one of ``pending`` (objects exist, not all nodes run),
    ``running``, ``succeeded``, ``failed`` (``end_reason`` and ``exit_code``
    say why), ``lost`` (the objects vanished or their node went away: the
    attempt should be recovered) and ``absent`` (no object of this attempt
    exists).
    """

    phase: str
    end_reason: str = ""
    exit_code: int | None = None
    message: str = ""


ABSENT = Observation("absent")


@dataclasses.dataclass(frozen=True)
class PoolCapacity:
    """A node pool as the backend discovers it: accelerator name, capacity type, nodes, GPUs per node.

    ``free_gpus``: GPUs not requested by running pods now, when the backend
    can tell (None: unknown).
    """

    name: str
    accelerator: str
    capacity_type: str
    nodes: int
    gpus_per_node: int
    free_gpus: int | None = None


class Backend:
    """Base class of cluster backends; subclasses set ``name`` and implement every method."""

    name: ClassVar[str]

    def discover(self, cluster) -> list[PoolCapacity]:
        """The cluster's GPU node pools as seen now. Raises ClusterUnreachable."""
        raise NotImplementedError

    def dispatch(self, attempt) -> dict:
        """Create ``attempt``'s objects; idempotent (what exists already is kept).

        Returns backend state to store in ``attempt.runner_state``. Raises
        TransientDispatchError or PermanentDispatchError.
        """
        raise NotImplementedError

    def observe(self, cluster, attempts) -> dict[int, Observation]:
        """One look at ``cluster``: an Observation for each attempt in ``attempts`` (keyed by attempt id).

        Raises ClusterUnreachable when the cluster does not answer.
        """
        raise NotImplementedError

    def owned_attempt_ids(self, cluster) -> set[int]:
        """Ids of every attempt that has live objects on ``cluster`` (to find orphans)."""
        raise NotImplementedError

    def delete(self, attempt) -> bool:
        """Delete ``attempt``'s objects (processes, pods); True once nothing of it is left running."""
        raise NotImplementedError

    def logs(self, attempt, node: int = 0, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of the log of node ``node`` of ``attempt``."""
        raise NotImplementedError


_BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make ``backend`` serve clusters whose ``backend`` field equals ``backend.name``."""
    _BACKENDS[backend.name] = backend
    return backend


def backend_for(cluster) -> Backend:
    """The backend serving ``cluster``. Raises UnknownBackend for a name no backend registered."""
    try:
        return _BACKENDS[cluster.backend]
    except KeyError:
        raise UnknownBackend(f"cluster {cluster.name}: no backend named {cluster.backend!r} is installed") from None
