"""The ``tide engine`` service: the reconcile loop, its HTTP server and leader election."""
