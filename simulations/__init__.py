"""tide's trace-driven simulator of a Volcano cluster, its baselines and the tuning core."""
