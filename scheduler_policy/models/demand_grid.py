"""A queue's demand on a regular grid, the targets a headroom forecast is scored on, its features.

Everything here is causal: a feature at grid point i reads grid points 0 .. i only, so features
computed once over a whole series serve a rolling-origin evaluation without look-ahead. Targets
read the future: the peak target at i is the most demand in (i, i + h], the point target the
demand at i + h (NaN where the series ends first).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

DAY_S = 86400.0
MAX_GRID_POINTS = 2_000_000  # about 4 years per minute: a guard against a wrong unit


class Target(enum.Enum):
    """What a forecast at time t is scored against."""

    PEAK = "peak"  # the most demand in (t, t + horizon]: what headroom must hold
    POINT = "point"  # the demand at t + horizon


@dataclass(frozen=True, slots=True, eq=False)
class DemandGrid:
    """A queue's non-elastic demand on a regular grid, with the job-level signals beside it.

    Attributes:
        start_s: time of grid point 0, seconds since the epoch.
        step_s: seconds between grid points.
        gpus: demand (running plus pending) at each point, GPUs: the most seen within the step,
            gaps carried forward.
        pending_gpus: GPUs of the pending part at each point; NaN where unknown.
        running_jobs: running jobs at each point; NaN where unknown.
    """

    start_s: float
    step_s: float
    gpus: FloatArray
    pending_gpus: FloatArray = field(default_factory=lambda: np.empty(0))
    running_jobs: FloatArray = field(default_factory=lambda: np.empty(0))

    def __post_init__(self) -> None:
        n = self.gpus.size
        # Unknown signals are NaN columns of the same length, so features never branch on size.
        if self.pending_gpus.size != n:
            object.__setattr__(self, "pending_gpus", np.full(n, np.nan))
        if self.running_jobs.size != n:
            object.__setattr__(self, "running_jobs", np.full(n, np.nan))

    @property
    def size(self) -> int:
        """Grid points."""
        return int(self.gpus.size)

    def steps(self, seconds: float) -> int:
        """Whole grid steps in `seconds`, at least one."""
        return max(1, round(seconds / self.step_s))


def _fill_forward(grid: FloatArray) -> FloatArray:
    filled = ~np.isnan(grid)
    last = np.maximum.accumulate(np.where(filled, np.arange(grid.size), 0))
    result: FloatArray = grid[last]
    return result


def resample(
    *,
    times_s: FloatArray,
    gpus: FloatArray,
    step_s: float,
    pending_gpus: FloatArray | None = None,
    running_jobs: FloatArray | None = None,
    what: str = "demand",
) -> DemandGrid:
    """Put samples on a regular grid from the first sample's time.

    Args:
        times_s: sample times, seconds since the epoch, finite and non-decreasing.
        gpus: demand at those times, GPUs, finite and ≥ 0.
        step_s: the grid's step, seconds (> 0).
        pending_gpus: the pending part of the demand at those times, or None.
        running_jobs: running jobs at those times, or None.
        what: names the input in error messages.

    Returns:
        The grid: the most demand within each step; the last pending and running figures.

    Raises:
        ValueError: empty, mismatched, unsorted or non-finite input, negative demand, a step
            that is not > 0, or a span too long for the grid.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"{what}: step_s must be > 0 seconds, got {step_s}")
    if times_s.size == 0:
        raise ValueError(f"{what}: no samples")
    if gpus.size != times_s.size:
        raise ValueError(f"{what}: {times_s.size} times but {gpus.size} demands")
    if not np.all(np.isfinite(times_s)):
        raise ValueError(f"{what}: times must be finite")
    if np.any(np.diff(times_s) < 0):
        raise ValueError(f"{what}: times must be sorted (non-decreasing)")
    bad = ~np.isfinite(gpus) | (gpus < 0)
    if np.any(bad):
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{what}: demand must be finite and >= 0, got {float(gpus[first])} at sample {first}"
        )
    idx = np.floor((times_s - times_s[0]) / step_s).astype(np.int64)
    size = int(idx[-1]) + 1
    if size > MAX_GRID_POINTS:
        raise ValueError(
            f"{what}: {size} grid points of {step_s} s, over the limit of {MAX_GRID_POINTS}"
        )
    grid = np.full(size, np.nan)
    np.fmax.at(grid, idx, gpus)
    extras = []
    for values in (pending_gpus, running_jobs):
        column = np.full(size, np.nan)
        if values is not None:
            if values.size != times_s.size:
                raise ValueError(f"{what}: {times_s.size} times but {values.size} signal values")
            column[idx] = values  # the last sample in each step wins
            column = _fill_forward(column) if not np.all(np.isnan(column)) else column
        extras.append(column)
    return DemandGrid(
        start_s=float(times_s[0]),
        step_s=float(step_s),
        gpus=_fill_forward(grid),
        pending_gpus=extras[0],
        running_jobs=extras[1],
    )


def rolling_max(values: FloatArray, window: int) -> FloatArray:
    """out[i] = max(values[max(0, i − window + 1) .. i]), window ≥ 1."""
    out = values.copy()
    shift = 1
    # Doubling: after k rounds each out[i] covers 2^k trailing points; the last round is clipped.
    while shift < window:
        span = min(shift, window - shift)
        out[span:] = np.maximum(out[span:], out[:-span])
        shift += span
    return out


def rolling_mean(values: FloatArray, window: int) -> FloatArray:
    """out[i] = mean(values[max(0, i − window + 1) .. i])."""
    total = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(values.size)
    lo = np.maximum(0, index - window + 1)
    result: FloatArray = (total[index + 1] - total[lo]) / (index + 1 - lo)
    return result


def lagged(values: FloatArray, lag: int) -> FloatArray:
    """values shifted back by lag steps, NaN where there is no history."""
    out = np.full_like(values, np.nan)
    if lag < values.size:
        out[lag:] = values[: values.size - lag]
    return out


def target(grid: DemandGrid, *, horizon_steps: int, kind: Target) -> FloatArray:
    """The value each origin's forecast is scored against, GPUs; NaN where the series ends first."""
    x = grid.gpus
    out = np.full(x.size, np.nan)
    h = horizon_steps
    if h < x.size:
        ahead = rolling_max(x, h)[h:] if kind is Target.PEAK else x[h:]
        out[: x.size - h] = ahead
    return out


def recent_peak(grid: DemandGrid, *, horizon_steps: int) -> FloatArray:
    """The most demand over the last horizon up to each point: the engine's fallback forecast."""
    return rolling_max(grid.gpus, horizon_steps)


def seasonal_naive(grid: DemandGrid, *, horizon_steps: int, kind: Target) -> FloatArray:
    """The target a day earlier (known at the origin for horizons under a day); NaN before."""
    return lagged(target(grid, horizon_steps=horizon_steps, kind=kind), grid.steps(DAY_S))


def _since_change_steps(values: FloatArray) -> FloatArray:
    """Grid steps since the value last changed (the age of the current state)."""
    changed = np.concatenate([[True], np.diff(values) != 0])
    last = np.maximum.accumulate(np.where(changed, np.arange(values.size), 0))
    result: FloatArray = (np.arange(values.size) - last).astype(np.float64)
    return result


def _window_sum(values: FloatArray, window: int) -> FloatArray:
    total = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(values.size)
    lo = np.maximum(0, index - window + 1)
    result: FloatArray = total[index + 1] - total[lo]
    return result


def features(grid: DemandGrid, *, horizon_steps: int) -> FloatArray:
    """The forecaster's inputs at every grid point, each from points up to it only.

    Columns, all relative to the demand now where they are GPUs: the demand now; its change
    over 10, 30 and 60 minutes; the recent peak and trough over one and four horizons; the
    mean of the last day; how long the current level has lasted (the running jobs' age, as a
    log) and the size of the change that began it; GPUs that arrived (rises) and left (falls)
    over the last 2 and 12 hours (recent arrivals and ends); the pending GPUs and running jobs
    now; the target a day ago; the time of day.
    """
    x = grid.gpus
    h = horizon_steps
    step = np.diff(x, prepend=x[0])
    rises = np.maximum(step, 0.0)
    falls = np.maximum(-step, 0.0)
    since = _since_change_steps(x)
    last_change = np.zeros_like(x)
    if np.any(step != 0):
        last_index = np.maximum.accumulate(np.where(step != 0, np.arange(x.size), -1))
        known = last_index >= 0
        last_change[known] = step[last_index[known]]
    columns = [x]
    columns += [x - lagged(x, grid.steps(s)) for s in (600.0, 1800.0, 3600.0)]
    columns += [rolling_max(x, w) - x for w in (h + 1, 4 * h + 1)]
    columns += [x + rolling_max(-x, w) for w in (h + 1, 4 * h + 1)]  # now − trough
    columns.append(rolling_mean(x, grid.steps(DAY_S)) - x)
    columns.append(np.log1p(since * grid.step_s / 60.0))
    columns.append(last_change)
    for span_s in (7200.0, 43200.0):
        columns.append(_window_sum(rises, grid.steps(span_s)))
        columns.append(_window_sum(falls, grid.steps(span_s)))
    columns.append(grid.pending_gpus)
    columns.append(grid.running_jobs)
    columns.append(seasonal_naive(grid, horizon_steps=h, kind=Target.PEAK) - x)
    phase = 2.0 * np.pi * np.mod(grid.start_s + np.arange(x.size) * grid.step_s, DAY_S) / DAY_S
    columns += [np.sin(phase), np.cos(phase)]
    result: FloatArray = np.column_stack(columns)
    return result
