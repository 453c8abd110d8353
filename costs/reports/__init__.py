"""Utilization and cost reports: the stored Report (``models``), how one is computed and stored (``build``), its
renderings (``render``), e-mail (``mail``), the scheduled task (``tasks``), its default schedules (``schedules``)
and the REST API (``api``). The web UI only shows stored reports."""
