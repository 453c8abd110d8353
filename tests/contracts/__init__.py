"""Contracts that hold across the whole API: team scoping per persona, and no 500 on bad input."""
