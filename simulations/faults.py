"""Seeded fault injection: node failures and metrics outages."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class FaultOptions:
    """Which faults to inject.

    Attributes:
        node_mtbf_s: mean time between failures of one node (exponential); None for none.
        node_repair_s: how long a failed node stays down.
        outage_every_s: mean time between metrics outages (exponential); None for none.
        outage_s: how long a metrics outage lasts.
        seed: the faults' random seed.
    """

    node_mtbf_s: float | None = None
    node_repair_s: float = 1800.0
    outage_every_s: float | None = None
    outage_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("node_mtbf_s", "node_repair_s", "outage_every_s", "outage_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                # NaN would never pass the end of the span: the draws would fill the memory.
                raise ValueError(f"FaultOptions.{name} must be a finite number > 0, got {value}")
        if self.seed < 0:
            raise ValueError(f"FaultOptions.seed must be >= 0, got {self.seed}")


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """Node ``node`` is down from ``start_s`` to ``end_s``."""

    node: int
    start_s: float
    end_s: float


def plan_faults(
    options: FaultOptions, *, nodes: int, span_s: float
) -> tuple[tuple[NodeFailure, ...], tuple[tuple[float, float], ...]]:
    """Draw the node failures and metrics outages of one run.

    Args:
        options: what to inject.
        nodes: how many nodes the cluster has.
        span_s: how far ahead to draw, seconds.

    Returns:
        ``(node failures by start time, metrics outage intervals)``.
    """
    rng = np.random.default_rng(options.seed)
    failures: list[NodeFailure] = []
    if options.node_mtbf_s is not None:
        for node in range(nodes):
            t = 0.0
            while True:
                t += float(rng.exponential(options.node_mtbf_s))
                if t >= span_s:
                    break
                failures.append(NodeFailure(node, t, t + options.node_repair_s))
                t += options.node_repair_s
    outages: list[tuple[float, float]] = []
    if options.outage_every_s is not None:
        t = 0.0
        while True:
            t += float(rng.exponential(options.outage_every_s))
            if t >= span_s:
                break
            outages.append((t, t + options.outage_s))
            t += options.outage_s
    failures.sort(key=lambda f: f.start_s)
    return tuple(failures), tuple(outages)
