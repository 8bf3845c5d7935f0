"""The engine loop: observe the cluster and the metrics, decide, apply the writes."""
