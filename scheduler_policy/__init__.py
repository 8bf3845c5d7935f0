"""The policy engine: observe, decide, stabilize and apply elastic scaling of Volcano Jobs."""
