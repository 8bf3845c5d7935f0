"""A job's throughput history: from a grid of (time, world size, rate, nodes) to one point per
size and node count.

The scaling model fits throughput against replicas; what it needs from Prometheus is, for each
world size the job has run at, one recent and representative measurement. ``JobThroughput``
takes the grid points in time order, one round's worth at a time, and keeps only what the answer
needs (each size's latest settled rates), so a round costs the new points, not the lookback.
Pure: no network.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler_policy.vocabulary.state import ThroughputPoint

RECENT_POINTS = 10
"""Grid points per size whose median is the size's throughput: recent, and robust to a blip."""


@dataclass(slots=True)
class JobThroughput:
    """One job's settled throughput per world size, fed grid points in time order.

    A rate at time t averages the window [t - rate_window_s, t]. Right after the world size
    changed, that window mixes two sizes (and the restart between them), and right after a job's
    series began it reaches back before the first sample: such points are not settled. Each
    (size, nodes)'s point is the median of its latest ``RECENT_POINTS`` settled rates, stamped
    with the newest one's time; a change of nodes at one size is a restart too. Nodes are
    unknown (None) where the grid has no node count.

    Attributes:
        rate_window_s: the window of the rates.
        grid_start_s: the first time the grid was read at: a job whose first point is later
            began within it, and its first window is not settled either.
        newest_s: the time of the newest point fed, usable or not.
        newest_rate: the rate at ``newest_s`` (NaN when it had none or it was NaN).
        newest_size: the world size at ``newest_s`` (NaN when it had none).
        newest_rate_s: the time of the newest finite rate fed.
    """

    rate_window_s: float
    grid_start_s: float = math.inf
    newest_s: float = -math.inf
    newest_rate: float = math.nan
    newest_size: float = math.nan
    newest_rate_s: float | None = None
    _previous: tuple[int, int | None] | None = None
    _size_since: float = -math.inf
    _settled: dict[tuple[int, int | None], deque[tuple[float, float]]] = field(default_factory=dict)

    def add(self, time_s: float, size: float, rate: float, *, nodes: float = math.nan) -> None:
        """Take one grid point; points must come in increasing time.

        ``nodes`` is the node count the membership spans (NaN or below 1: unknown).

        Points with a size below 1, a rate that is not positive, or either not finite, count
        for ``newest_*`` only.

        Raises:
            ValueError: ``time_s`` is not after the newest point fed.
        """
        if time_s <= self.newest_s:
            raise ValueError(
                f"time_s: points must come in order, got {time_s} after {self.newest_s}"
            )
        self.newest_s, self.newest_rate, self.newest_size = time_s, rate, size
        if math.isfinite(rate):
            self.newest_rate_s = time_s
        if not (math.isfinite(size) and size >= 1 and math.isfinite(rate) and rate > 0):
            return
        whole = (round(size), round(nodes) if math.isfinite(nodes) and nodes >= 1 else None)
        if self._previous is None:
            if time_s > self.grid_start_s:
                self._size_since = time_s
        elif whole != self._previous:
            self._size_since = time_s
        self._previous = whole
        if time_s - self._size_since >= self.rate_window_s:
            taken = self._settled.get(whole)
            if taken is None:
                taken = self._settled[whole] = deque(maxlen=RECENT_POINTS)
            taken.append((time_s, rate))

    def points(self, *, oldest_s: float = -math.inf) -> tuple[ThroughputPoint, ...]:
        """One point per (size, nodes) with settled rates at or after ``oldest_s``, oldest
        first."""
        result = []
        for (size, nodes), taken in self._settled.items():
            kept = [(t, r) for t, r in taken if t >= oldest_s]
            if kept:
                median = statistics.median(r for _, r in kept)
                result.append(ThroughputPoint(time_s=kept[-1][0], replicas=size,
                                              samples_per_s=median, nodes=nodes))  # fmt: skip
        result.sort(key=lambda p: p.time_s)
        return tuple(result)

    def forget_before(self, oldest_s: float) -> None:
        """Drop the sizes with no settled rate at or after ``oldest_s``."""
        for size in [s for s, taken in self._settled.items() if taken[-1][0] < oldest_s]:
            del self._settled[size]

    @property
    def empty(self) -> bool:
        return not self._settled and self.newest_rate_s is None


def representative_points(
    points: Iterable[tuple[float, float, float] | tuple[float, float, float, float]],
    *,
    rate_window_s: float,
    grid_start_s: float = math.inf,
) -> tuple[ThroughputPoint, ...]:
    """One throughput point per world size the job ran at, oldest first (see ``JobThroughput``).

    Args:
        points: ``(time_s, world_size, samples_per_s)`` or ``(..., nodes)``, in any order.
        rate_window_s: the window of the rates.
        grid_start_s: the first time the grid was read at (by default every job ran before it).

    Returns:
        The points, sorted by time; empty when no size has a settled point.
    """
    tracker = JobThroughput(rate_window_s=rate_window_s, grid_start_s=grid_start_s)
    for point in sorted(points, key=lambda p: p[0]):
        t, size, rate = point[0], point[1], point[2]
        tracker.add(t, size, rate, nodes=point[3] if len(point) > 3 else math.nan)
    return tracker.points()
