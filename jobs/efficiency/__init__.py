"""Training efficiency, computed without Django: model FLOPs and MFU (``flops``), memory per GPU (``memory``) and
the workload-metrics protocol (``protocol``).

Pure functions over numbers and plain mappings; the Django side (storing reports per attempt, the API, the
reports) lives in ``jobs.workload``. The import contract (``.importlinter``) keeps this package free of Django
and of the apps.
"""
