"""The local runner: supervised processes on this machine, their logs, and its dcgm-exporter look-alike."""
