"""``cpctl``, the command-line client of the control plane: it talks to the REST API over HTTP only."""
