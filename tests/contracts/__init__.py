"""Contracts that hold across the whole API (team scoping per persona, no 500 on bad input) and across the
repository (every citation names a file it holds)."""
