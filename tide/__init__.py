"""tide: elastic GPU autoscaling for Kubernetes clusters scheduled by Volcano."""
