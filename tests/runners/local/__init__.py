"""The platform's /metrics and the local runner's dcgm-exporter look-alike."""
