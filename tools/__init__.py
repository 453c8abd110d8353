"""Tools that check the repository (not part of the server, its CLI or its benchmarks)."""
