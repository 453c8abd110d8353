"""REST API of stored reports: ``/api/v1/reports/`` (mounted by ``costs.api.routes``)."""
