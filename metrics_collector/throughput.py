"""A job's throughput history: from a grid of (time, world size, rate) to one point per size.

The scaling model fits throughput against replicas; what it needs from Prometheus is, for each
world size the job has run at, one recent and representative measurement. Pure: no network.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scheduler_policy.vocabulary.state import ThroughputPoint

RECENT_POINTS = 10
"""Grid points per size whose median is the size's throughput: recent, and robust to a blip."""


@dataclass(slots=True)
class JobGrid:
    """One job's range-query points on the source's grid, within the lookback.

    Attributes:
        rates: samples per second at each grid time.
        sizes: world size at each grid time.
    """

    rates: dict[float, float] = field(default_factory=dict)
    sizes: dict[float, float] = field(default_factory=dict)

    def merge(self, *, rates: Mapping[float, float], sizes: Mapping[float, float]) -> None:
        """Add (or overwrite) points fetched in a later round."""
        self.rates.update(rates)
        self.sizes.update(sizes)

    def trim(self, oldest_s: float) -> None:
        """Forget points older than ``oldest_s``."""
        for grid in (self.rates, self.sizes):
            for t in [t for t in grid if t < oldest_s]:
                del grid[t]

    def __bool__(self) -> bool:
        return bool(self.rates or self.sizes)


def representative_points(
    points: Iterable[tuple[float, float, float]],
    *,
    rate_window_s: float,
    grid_start_s: float = math.inf,
) -> tuple[ThroughputPoint, ...]:
    """One throughput point per world size the job ran at, oldest first.

    A rate at time t averages the window [t - rate_window_s, t]; right after the world size
    changed, that window mixes two sizes (and the restart between them), and right after a
    job's series began it reaches back before the first sample, so such points are left out.
    Of the rest, each size's point is the median rate of its latest
    ``RECENT_POINTS``, stamped with the newest one's time.

    Args:
        points: ``(time_s, world_size, samples_per_s)`` in any order; points with a size below
            1, a rate that is not positive, or either not finite are left out.
        rate_window_s: the window of the rates.
        grid_start_s: the first time the grid was read at: a job whose first point is later
            began within it, and its first window is not settled either (by default every
            job ran before the grid began).

    Returns:
        The points, sorted by time; empty when no size has a settled point.
    """
    usable = sorted(
        (t, round(size), rate)
        for t, size, rate in points
        if math.isfinite(size) and size >= 1 and math.isfinite(rate) and rate > 0
    )
    settled: dict[int, list[tuple[float, float]]] = {}
    # The first grid point of the current size; unknown when the job ran before the grid began.
    size_since = -math.inf
    if usable and usable[0][0] > grid_start_s:
        size_since = usable[0][0]
    previous: int | None = None
    for t, size, rate in usable:
        if previous is not None and size != previous:
            size_since = t
        previous = size
        if t - size_since >= rate_window_s:
            settled.setdefault(size, []).append((t, rate))
    result = [
        ThroughputPoint(
            time_s=taken[-1][0],
            replicas=size,
            samples_per_s=statistics.median(rate for _, rate in taken[-RECENT_POINTS:]),
        )
        for size, taken in settled.items()
    ]
    result.sort(key=lambda p: p.time_s)
    return tuple(result)
