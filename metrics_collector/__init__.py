"""Turns Prometheus metrics into the engine's observation and exports the engine's metrics."""
