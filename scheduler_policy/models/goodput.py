"""An adaptive-batch job's goodput at every size: the curve the allocator ranks its replicas by.

Pollux (Qiao et al., OSDI 2021) co-adapts each job's batch with its GPUs by goodput: throughput
times statistical efficiency. At ``n`` replicas on the nodes they span when packed,

    G(n) = T(n, B*)·E(B*) / B0 = gain(B*) / step(n, B*)     scale-invariant iterations per s

with ``step`` the job's fitted Pollux step time (:mod:`scheduler_policy.models.step_model`),
``gain`` and ``E = gain / scale`` AdaScale's (:mod:`scheduler_policy.models.efficiency`) from the
job's latest ``grad_sqr``/``grad_var``, ``B0`` its initial batch, and ``B*`` the batch **the
worker itself would settle on** at that size: the worker's own candidates and choice
(:mod:`scheduler_policy.models.batch_choice`, the code the worker runs), started where the
worker starts (its current batch at its current size, else the candidate nearest the initial
batch) and re-chosen as the worker re-chooses, each time within twice the largest micro batch
measured at that size, until the choice holds. The 5 % switch rule is part of that choice, so
G(n) can sit up to 5 % under the best candidate's goodput: that is what the worker would run.

Growth is capped: beyond ``GROWTH_CAP_FACTOR`` times the largest replica count the job was
measured at, G stays at its value there (a fit is not trusted far from its data; the allocator
then sees no gain in growing further, and the next measurement moves the cap). A size where no
candidate fits the bounds (the worker would refuse to start there) has G = 0.

The remaining work of such a job is ``planned_progress − progress`` in the same unit, so the
allocator's remaining time is remaining progress / G(n). A job without bounds, without both
gradient statistics, or without a usable step time gets no goodput curve (:func:`goodput_curve`
returns None) and keeps its throughput curve: exactly as if this module did not exist.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_policy.models.batch_choice import (
    LOCAL_CANDIDATES,
    BatchChoice,
    StepTimePredictor,
    candidates,
    choose,
    first_choice,
    goodput,
)
from scheduler_policy.models.step_model import StepModel
from scheduler_policy.vocabulary.state import BatchBounds, BatchStatistics, StepTimes

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

GROWTH_CAP_FACTOR = 2
"""G is trusted up to twice the largest replica count measured; flat beyond."""


@dataclass(frozen=True, slots=True)
class GoodputCurve:
    """A job's goodput at each replica count, with the batch the worker would take there.

    Attributes:
        progress_per_s: G(n) for n = 0, 1, …, ``len − 1`` (G(0) = 0), iterations per second; flat
            beyond the last entry (the growth cap, or the job's maximum).
        batch_sizes: the predicted global batch at each n (0 where none fits the bounds).
        remaining_progress: ``planned_progress − progress`` (≥ 0), iterations; None when either
            is not reported.
        cap_replicas: the growth cap (``GROWTH_CAP_FACTOR`` × the largest measured size).
        measured_sizes: distinct replica counts among the step times.
    """

    progress_per_s: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    remaining_progress: float | None
    cap_replicas: int
    measured_sizes: int

    def at(self, replicas: int) -> float:
        """G at ``replicas`` (flat beyond the table), iterations per second."""
        if replicas <= 0:
            return 0.0
        return self.progress_per_s[min(replicas, len(self.progress_per_s) - 1)]

    def batch_at(self, replicas: int) -> int:
        """The predicted global batch at ``replicas`` (flat beyond the table)."""
        if replicas <= 0:
            return 0
        return self.batch_sizes[min(replicas, len(self.batch_sizes) - 1)]


def usable_step_times(statistics: BatchStatistics) -> tuple[StepTimes, ...]:
    """The step times a fit can use: a finite, positive ``optim_step_s`` at a valid shape."""
    return tuple(
        p
        for p in statistics.step_times
        if p.replicas >= 1
        and p.nodes >= 1
        and p.local_batch_size >= 1
        and math.isfinite(p.optim_step_s)
        and p.optim_step_s > 0
    )


def missing_input(bounds: BatchBounds | None, statistics: BatchStatistics | None) -> str | None:
    """Why a job gets no goodput curve, or None when it has all a curve needs.

    Args:
        bounds: the job's ``batch_bounds``.
        statistics: the job's ``batch_statistics``.

    Returns:
        A phrase naming what is missing, or None.
    """
    if bounds is None:
        return "no adaptive-batch bounds"
    if statistics is None:
        return "no batch statistics reported"
    sqr, var = statistics.grad_sqr, statistics.grad_var
    if sqr is None or var is None or not (math.isfinite(sqr) and math.isfinite(var)):
        return "no finite grad_sqr and grad_var"
    if not usable_step_times(statistics):
        return "no usable step time"
    return None


def predict_choice(
    *,
    model: StepTimePredictor,
    bounds: BatchBounds,
    replicas: int,
    grad_sqr: float,
    grad_var: float,
    current: BatchChoice | None = None,
    measured_local: Sequence[int] = (),
) -> BatchChoice | None:
    """The batch the worker settles on at ``replicas`` (see the module docstring).

    Each round is the worker's ``choose`` over the worker's ``candidates``, capped at twice the
    largest micro batch measured at this size so far (the rounds' own choices count as
    measured, as they will be once the worker runs them).

    Args:
        model: the step time at this size.
        bounds: the job's bounds.
        replicas: workers.
        grad_sqr: the job's ``grad_sqr``.
        grad_var: the job's ``grad_var``.
        current: the batch the workers run now at this size, None where they do not run at it.
        measured_local: micro batches already measured at this size.

    Returns:
        The settled choice, or None when no candidate fits the bounds at this size.
    """
    every = _candidates(bounds, replicas=replicas, largest=None)
    if not every:
        return None
    memo: dict[BatchChoice, float] = {}  # the rounds score mostly the same candidates
    choice = (
        current
        if current in every
        else first_choice(every, initial_batch_size=bounds.initial_batch_size)
    )
    assert choice is not None
    largest = max([*measured_local, choice.local_batch_size])
    for _ in range(LOCAL_CANDIDATES + 1):  # each round widens the cap; the candidates are finite
        largest = max(largest, choice.local_batch_size)
        options = _candidates(bounds, replicas=replicas, largest=largest)
        chosen = choose(
            current=choice,
            options=options,
            model=model,
            grad_sqr=grad_sqr,
            grad_var=grad_var,
            initial_batch_size=bounds.initial_batch_size,
            memo=memo,
        )
        if chosen == choice:
            break
        choice = chosen
    return choice


@functools.lru_cache(maxsize=4096)
def _candidates(
    bounds: BatchBounds, *, replicas: int, largest: int | None
) -> tuple[BatchChoice, ...]:
    # Cached: a curve asks for every size's candidates at each cap, every round the job's
    # statistics change, and building them cost more than scoring them.
    return candidates(
        replicas=replicas,
        initial_batch_size=bounds.initial_batch_size,
        max_batch_size=bounds.max_batch_size,
        local_batch_min=bounds.local_batch_min,
        local_batch_max=bounds.local_batch_max,
        accumulation=bounds.accumulation,
        largest_measured_local=largest,
    )


def packed_node_count(replicas: int, *, gpus_per_replica: float, gpus_per_node: float) -> int:
    """Nodes ``replicas`` span when packed (as ``node_scaling.packed_nodes``), at least 1."""
    if not (math.isfinite(gpus_per_node) and gpus_per_node > 0):
        return 1
    return max(1, math.ceil(replicas * gpus_per_replica / gpus_per_node - 1e-9))


def goodput_curve(
    *,
    bounds: BatchBounds,
    statistics: BatchStatistics,
    max_replicas: int,
    current_replicas: int,
    gpus_per_replica: float = 1.0,
    gpus_per_node: float = math.inf,
    model: StepModel | None = None,
) -> GoodputCurve | None:
    """G(n) of an adaptive-batch job for n = 0 … min(cap, max_replicas).

    Args:
        bounds: the job's ``batch_bounds``.
        statistics: the job's ``batch_statistics``.
        max_replicas: the job's maximum.
        current_replicas: the replicas its workers run at now (their current batch is kept
            there unless the worker would switch).
        gpus_per_replica: GPUs per replica, for the nodes a size spans when packed.
        gpus_per_node: the cluster's node size (inf: one node).
        model: a step model already fitted to ``statistics.step_times`` (None: fitted here).

    Returns:
        The curve, or None when ``missing_input`` names something missing.

    Raises:
        ModelFitError: the step model's fit failed (only when ``model`` is None).
    """
    if missing_input(bounds, statistics) is not None:
        return None
    assert statistics.grad_sqr is not None and statistics.grad_var is not None
    points = usable_step_times(statistics)
    fitted = model if model is not None else StepModel().fit(points)
    largest = max(p.replicas for p in points)
    cap = max(1, GROWTH_CAP_FACTOR * largest)
    top = max(1, min(cap, max_replicas))
    rates, batches = [0.0], [0]
    for n in range(1, top + 1):
        here = [p.local_batch_size for p in points if p.replicas == n]
        current = None
        if n == current_replicas:
            current = _current_choice(statistics.batch_size, replicas=n, measured_local=here)
        nodes = packed_node_count(n, gpus_per_replica=gpus_per_replica, gpus_per_node=gpus_per_node)
        shape = fitted.at(nodes=nodes, replicas=n)
        choice = predict_choice(
            model=shape,
            bounds=bounds,
            replicas=n,
            grad_sqr=statistics.grad_sqr,
            grad_var=statistics.grad_var,
            current=current,
            measured_local=here,
        )
        if choice is None:
            rates.append(0.0)
            batches.append(0)
            continue
        samples_per_s = goodput(
            choice,
            model=shape,
            grad_sqr=statistics.grad_sqr,
            grad_var=statistics.grad_var,
            initial_batch_size=bounds.initial_batch_size,
        )
        rates.append(max(0.0, samples_per_s / bounds.initial_batch_size))
        batches.append(choice.global_batch_size)
    return GoodputCurve(
        progress_per_s=tuple(rates),
        batch_sizes=tuple(batches),
        remaining_progress=remaining_progress(statistics),
        cap_replicas=cap,
        measured_sizes=len({p.replicas for p in points}),
    )


def remaining_progress(statistics: BatchStatistics) -> float | None:
    """``planned_progress − progress`` (at least 0), iterations; None unless both are finite."""
    done, planned = statistics.progress, statistics.planned_progress
    if done is None or planned is None or not (math.isfinite(done) and math.isfinite(planned)):
        return None
    return max(0.0, planned - done)


def _current_choice(
    batch_size: int, *, replicas: int, measured_local: Sequence[int]
) -> BatchChoice | None:
    """The batch the workers run now: ``batch_size`` split over ``replicas`` with the largest
    micro batch measured at this size that divides it (None where none does)."""
    for local in sorted(set(measured_local), reverse=True):
        per_worker = replicas * local
        if batch_size > 0 and batch_size % per_worker == 0:
            return BatchChoice(batch_size, local, batch_size // per_worker)
    return None


def tabulated(values: Sequence[float], replicas: npt.ArrayLike) -> FloatArray:
    """A table of G(0), G(1), … read at replica counts (flat beyond its end, 0 below 1).

    Args:
        values: G at 0, 1, …, non-empty.
        replicas: replica counts (whole numbers; any shape).

    Returns:
        G at each count, shaped as ``replicas``.
    """
    table = np.asarray(values, dtype=np.float64)
    n = np.asarray(replicas, dtype=np.float64)
    index = np.clip(np.floor(np.nan_to_num(n, nan=0.0) + 1e-9), 0, table.size - 1).astype(np.int64)
    result: FloatArray = np.where(n >= 1.0, table[index], 0.0)
    return result


@dataclass(frozen=True, slots=True)
class GoodputColumns:
    """The goodput curves of a round's jobs, as the decision core's columns.

    Attributes:
        rows: the jobs (row indices of the job table) whose curve is their goodput.
        table: G of each of those jobs at 0 … width − 1 replicas (flat-padded), one row each.
        batches: the predicted global batch at each size, aligned with ``table``.
        remaining_progress: each of those jobs' remaining progress, NaN where unknown.
    """

    rows: IntArray
    table: FloatArray
    batches: IntArray
    remaining_progress: FloatArray

    @classmethod
    def of(cls, curves: Sequence[GoodputCurve | None]) -> GoodputColumns | None:
        """The columns of the curves that are set; None when none is (no job adapts)."""
        rows = [i for i, c in enumerate(curves) if c is not None]
        if not rows:
            return None
        found = [c for c in curves if c is not None]
        width = max(len(c.progress_per_s) for c in found)

        def padded(values: Sequence[float]) -> list[float]:
            return [*values, *([values[-1]] * (width - len(values)))]

        return cls(
            rows=np.array(rows, dtype=np.int64),
            table=np.array([padded(c.progress_per_s) for c in found], dtype=np.float64),
            batches=np.array([padded(c.batch_sizes) for c in found], dtype=np.int64),
            remaining_progress=np.array(
                [math.nan if c.remaining_progress is None else c.remaining_progress for c in found],
                dtype=np.float64,
            ),
        )

    def throughput(self, n: FloatArray, base: FloatArray) -> FloatArray:
        """``base`` (one row per job) with the goodput jobs' rows read from their tables.

        Args:
            n: replica counts, one row per job (or one row broadcast to all).
            base: every job's throughput at ``n`` under its scaling curve.
        """
        result = np.array(base, dtype=np.float64, copy=True)
        counts = np.broadcast_to(n, base.shape)[self.rows]
        width = self.table.shape[1]
        index = np.clip(np.floor(np.nan_to_num(counts, nan=0.0) + 1e-9), 0, width - 1)
        picked = np.take_along_axis(self.table, index.astype(np.int64), axis=1)
        result[self.rows] = np.where(counts >= 1.0, picked, 0.0)
        return result

    def remaining(self, base: FloatArray) -> FloatArray:
        """``base`` (each job's remaining work) with the goodput jobs' remaining progress."""
        result = np.array(base, dtype=np.float64, copy=True)
        result[self.rows] = self.remaining_progress
        return result

    def batch(self, row: int, replicas: int) -> int | None:
        """The predicted global batch of job ``row`` at ``replicas``; None when its curve is
        not its goodput."""
        where = np.flatnonzero(self.rows == row)
        if where.size == 0:
            return None
        batches = self.batches[int(where[0])]
        return int(batches[min(max(replicas, 0), batches.size - 1)])
