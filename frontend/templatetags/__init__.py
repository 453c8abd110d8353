"""Template filters of the web UI."""
