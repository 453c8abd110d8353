"""The local backend (stub, filled in by the local-runner work)."""

from ..base import Backend, register


class LocalBackend(Backend):
    name = "local"


register(LocalBackend())
