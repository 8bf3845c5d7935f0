"""``tide engine``: the long-running service (the reconcile loop) and its HTTP server."""
