"""Utilization and cost reports: how one is computed and stored as a ``costs.models.Report`` (``build``), its
renderings (``render``), e-mail (``mail``), the scheduled task (``tasks``), its default schedules (``schedules``)
and the REST API (``api``). The web UI only shows stored reports."""
