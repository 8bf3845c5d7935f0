"""The batch a worker group takes at its size: the candidate with the best goodput (pure, no torch).

One definition for the worker, which takes the batch (``worker_runtime.goodput`` re-exports
this module), and the engine, which predicts the worker's choice at every size it may give the
job (:mod:`scheduler_policy.models.goodput`).

Goodput = throughput x statistical efficiency (Pollux, OSDI 2021): samples per second times the
progress each sample buys (:func:`worker_runtime.adascale.efficiency`). Both parts are estimated
here only to compare candidates; the metrics export them apart.

Candidates (:func:`candidates`): local batches geometrically spaced between the local bounds
(and at most twice the largest local batch already measured, so the model is never trusted far
from its data), times 1 to :data:`MAX_ACCUMULATION` micro batches per worker when accumulation is
allowed, times the replicas; kept when the global batch is within the job's bounds. Every
candidate splits evenly (each worker takes the same micro batches).

Step time (:class:`StepTimeModel`): ``k (alpha + beta b) + sync_s`` for ``k`` micro batches of ``b``
samples at the current size: a compute time linear in the micro batch, plus what the step's
synchronisation adds. Fitted from the measured steps at this size (least squares, each parameter
non-negative); with one measured local batch, the split of its compute time between ``alpha`` and
``beta`` is pinned to half and half (a prior: the data cannot tell the fixed part). Steps that all
took as many micro batches cannot tell the synchronisation from the compute either: there ``sync_s``
is the synchronisation the worker timed (the gradient all-reduce), so that accumulation, which pays
it once for several micro batches, is weighed before it is ever tried. DDP overlaps the all-reduce
with the backward, so the timed figure may overstate what accumulating saves; once a step with
several micro batches is measured, the fit tells the two apart itself. Without the timed sync, a
worker on two nodes whose micro batch is at its bound never accumulated: in Pollux's yolov3
measurements it kept 64 samples a step on 8 replicas and made 40% less progress than on 4, where 448
samples would have made 70% more.

Switching (:func:`choose`): the current batch is kept unless the best candidate's goodput is at
least :data:`SWITCH_SPEEDUP` times the current one's, so estimation noise does not make the batch
oscillate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler_policy.models.efficiency import efficiency

SWITCH_SPEEDUP = 1.05
"""Switch batch only for a predicted goodput at least 5 % above the current batch's."""
MAX_ACCUMULATION = 8
LOCAL_CANDIDATES = 8
EXPLORE_FACTOR = 2


@dataclass(frozen=True, slots=True, order=True)
class BatchChoice:
    """A batch for one world size.

    Attributes:
        global_batch_size: Samples per optimizer step, ``replicas * local * accumulation``.
        local_batch_size: Samples per micro batch of one worker.
        accumulation_steps: Micro batches per worker per step.
    """

    global_batch_size: int
    local_batch_size: int
    accumulation_steps: int


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured step at the current world size.

    Attributes:
        local_batch_size: Samples per micro batch.
        accumulation_steps: Micro batches per worker.
        step_s: Wall time of the step.
        sync_s: The step's gradient synchronisation as the worker timed it; None where it timed
            none (one worker, or no synchronisation watched).
    """

    local_batch_size: int
    accumulation_steps: int
    step_s: float
    sync_s: float | None = None


def geometric_sizes(*, low: int, high: int, count: int) -> tuple[int, ...]:
    """About ``count`` integers geometrically spaced from ``low`` to ``high``, both included.

    Args:
        low: Smallest, ``>= 1``.
        high: Largest, ``>= low``.
        count: How many points to space (fewer remain after rounding merges some).

    Returns:
        The distinct sizes, ascending.

    Raises:
        ValueError: When the bounds are not ``1 <= low <= high`` or ``count < 1``.
    """
    if not 1 <= low <= high:
        raise ValueError(f"bounds: must satisfy 1 <= low <= high, got low={low}, high={high}")
    if count < 1:
        raise ValueError(f"count: must be >= 1, got {count}")
    if count == 1 or low == high:
        return (low,) if low == high else (low, high)
    ratio = (high / low) ** (1.0 / (count - 1))
    sizes = {low, high} | {round(low * ratio**i) for i in range(count)}
    return tuple(sorted(s for s in sizes if low <= s <= high))


def candidates(
    *,
    replicas: int,
    initial_batch_size: int,
    max_batch_size: int,
    local_batch_min: int,
    local_batch_max: int,
    accumulation: bool,
    largest_measured_local: int | None = None,
) -> tuple[BatchChoice, ...]:
    """The batches the group may take at ``replicas`` workers (see the module docstring).

    Args:
        replicas: Workers.
        initial_batch_size: Smallest global batch.
        max_batch_size: Largest global batch.
        local_batch_min: Smallest micro batch.
        local_batch_max: Largest micro batch.
        accumulation: Whether a worker may take several micro batches per step.
        largest_measured_local: Largest micro batch already measured; candidates stay within
            twice it (``None``: no cap).

    Returns:
        The candidates, ascending by global batch; empty when no split fits the bounds.

    Raises:
        ValueError: When ``replicas < 1`` or the local bounds are inconsistent.
    """
    if replicas < 1:
        raise ValueError(f"replicas: must be >= 1, got {replicas}")
    high = local_batch_max
    if largest_measured_local is not None:
        high = max(local_batch_min, min(high, EXPLORE_FACTOR * largest_measured_local))
    locals_ = geometric_sizes(low=local_batch_min, high=high, count=LOCAL_CANDIDATES)
    steps = range(1, (MAX_ACCUMULATION if accumulation else 1) + 1)
    found = {
        BatchChoice(replicas * b * k, b, k)
        for b in locals_
        for k in steps
        if initial_batch_size <= replicas * b * k <= max_batch_size
    }
    return tuple(sorted(found))


def first_choice(options: Sequence[BatchChoice], *, initial_batch_size: int) -> BatchChoice:
    """The batch to start with before anything is measured: the one closest to the initial batch.

    Ties go to the fewest micro batches per worker (the least accumulation), then the larger
    global batch.

    Args:
        options: Candidates (non-empty).
        initial_batch_size: The job's initial global batch.

    Returns:
        The chosen candidate.

    Raises:
        ValueError: When ``options`` is empty.
    """
    if not options:
        raise ValueError("options: no candidate batch")
    return min(
        options,
        key=lambda c: (
            abs(c.global_batch_size - initial_batch_size),
            c.accumulation_steps,
            -c.global_batch_size,
        ),
    )


class StepTimePredictor(Protocol):
    """What :func:`goodput` and :func:`choose` need of a step-time model at one world size."""

    def predict(self, *, local_batch_size: int, accumulation_steps: int) -> float:
        """Predicted wall time of one step, seconds."""
        ...


class StepTimeModel:
    """Step time ``k (alpha + beta b) + sync_s`` at one world size (see the module docstring)."""

    def __init__(self) -> None:
        pass

    def fit(self, samples: Sequence[StepSample]) -> StepTimeModel:
        """Fit the parameters to measured steps.

        ``alpha`` (s per micro batch), ``beta`` (s per sample) and ``sync_s`` (s per step) solve
        the least-squares problem over the samples' mean step times per ``(b, k)``, each clamped
        at 0 (a negative one is refitted without it); with one local batch measured, its compute
        time is split half and half between ``alpha`` and ``beta``. Where no two samples differ
        in their micro batches per worker, the steps cannot tell ``sync_s`` apart from the
        compute: it is then the mean synchronisation the samples timed (at most their shortest
        step), or 0 where they timed none, and the compute is fitted to the rest of each step.

        Args:
            samples: Measured steps (non-empty).

        Returns:
            ``self``.

        Raises:
            ValueError: When ``samples`` is empty or a time is not positive and finite.
        """
        if not samples:
            raise ValueError("samples: no measured step to fit")
        groups: dict[tuple[int, int], list[float]] = {}
        for s in samples:
            if not (math.isfinite(s.step_s) and s.step_s > 0):
                raise ValueError(f"step_s: must be positive and finite, got {s.step_s}")
            groups.setdefault((s.local_batch_size, s.accumulation_steps), []).append(s.step_s)
        points = [(b, k, sum(ts) / len(ts)) for (b, k), ts in groups.items()]
        timed = [
            s.sync_s
            for s in samples
            if s.sync_s is not None and math.isfinite(s.sync_s) and s.sync_s >= 0
        ]
        free = ["beta"]
        if len({b for b, _, _ in points}) > 1:
            free.append("alpha")
        sync = 0.0
        if len({k for _, k, _ in points}) > 1:
            free.append("sync")  # the steps tell the synchronisation from the compute
        elif timed:
            sync = min(sum(timed) / len(timed), min(t for _, _, t in points))
            points = [(b, k, t - sync) for b, k, t in points]
        params = _nonnegative_least_squares(points, free)
        self.alpha_s_ = params.get("alpha", 0.0)
        self.beta_s_ = params.get("beta", 0.0)
        self.sync_s_ = params.get("sync", sync)
        if "alpha" not in free:
            # One local batch b0 measured: its compute time c0 = beta b0 is split evenly between
            # a fixed part and a per-sample part (the prior: the data cannot tell them apart).
            # Larger micro batches then look up to twice as fast per sample, which makes the run
            # try one (within EXPLORE_FACTOR of b0) and measure instead of guessing further.
            b0 = points[0][0]
            self.alpha_s_ = self.beta_s_ * b0 / 2
            self.beta_s_ /= 2
        return self

    def predict(self, *, local_batch_size: int, accumulation_steps: int) -> float:
        """Predicted wall time of one step.

        Args:
            local_batch_size: Samples per micro batch.
            accumulation_steps: Micro batches per worker.

        Returns:
            Seconds.

        Raises:
            RuntimeError: When the model is not fitted.
        """
        if not hasattr(self, "beta_s_"):
            raise RuntimeError("StepTimeModel: call fit() before predict()")
        compute = self.alpha_s_ + self.beta_s_ * local_batch_size
        return accumulation_steps * compute + self.sync_s_


def _nonnegative_least_squares(
    points: Sequence[tuple[int, int, float]], free: list[str]
) -> dict[str, float]:
    # Features per point (b, k, t): alpha -> k, beta -> k b, sync -> 1; solve the normal
    # equations, and drop a parameter that comes out negative (it is then 0) and solve again.
    while free:
        rows = [[_feature(name, b, k) for name in free] for b, k, _ in points]
        ys = [t for _, _, t in points]
        solution = _solve_normal_equations(rows, ys)
        if solution is not None and all(v >= 0 for v in solution):
            return dict(zip(free, solution, strict=True))
        if solution is None:
            free = free[:-1]
            continue
        worst = min(range(len(free)), key=lambda i: solution[i])
        free = [n for i, n in enumerate(free) if i != worst]
    return {}


def _feature(name: str, b: int, k: int) -> float:
    return float(k) if name == "alpha" else float(k * b) if name == "beta" else 1.0


def _solve_normal_equations(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    c = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(n)]
    # Gaussian elimination with partial pivoting; a singular system (parameters the data cannot
    # tell apart) returns None.
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for row in a for v in row)):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        c[col], c[pivot] = c[pivot], c[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
                c[r] -= f * c[col]
    return [c[i] / a[i][i] for i in range(n)]


def goodput(
    choice: BatchChoice,
    *,
    model: StepTimePredictor,
    grad_sqr: float,
    grad_var: float,
    initial_batch_size: int,
) -> float:
    """Predicted progress per second of a candidate, in initial batches' worth of samples per s.

    Args:
        choice: The candidate.
        model: Fitted step-time model at the current size (any :class:`StepTimePredictor`).
        grad_sqr: Averaged ``grad_sqr``.
        grad_var: Averaged ``grad_var`` (at the initial batch).
        initial_batch_size: The job's initial global batch.

    Returns:
        ``throughput x efficiency``, samples per second.
    """
    step_s = model.predict(
        local_batch_size=choice.local_batch_size, accumulation_steps=choice.accumulation_steps
    )
    throughput = choice.global_batch_size / step_s
    scale = choice.global_batch_size / initial_batch_size
    return throughput * efficiency(grad_sqr=grad_sqr, grad_var=grad_var, scale=scale)


def choose(
    *,
    current: BatchChoice,
    options: Sequence[BatchChoice],
    model: StepTimePredictor,
    grad_sqr: float,
    grad_var: float,
    initial_batch_size: int,
    switch_speedup: float = SWITCH_SPEEDUP,
    memo: dict[BatchChoice, float] | None = None,
) -> BatchChoice:
    """The batch to take next: the best candidate when it beats the current one enough.

    Args:
        current: The batch in use (kept if no longer a candidate only when nothing else is).
        options: Candidates at the current size.
        model: Fitted step-time model at the current size (any :class:`StepTimePredictor`).
        grad_sqr: Averaged ``grad_sqr``.
        grad_var: Averaged ``grad_var``.
        initial_batch_size: The job's initial global batch.
        switch_speedup: Predicted goodput ratio, best over current, needed to switch.
        memo: Goodputs already computed with this model and these statistics, by candidate;
            filled as they are computed (the engine's repeated choices at one size share it).

    Returns:
        ``current`` or the best candidate.
    """
    if not options:
        return current

    # Each candidate's goodput once (the engine asks at every size it may give the job).
    known: dict[BatchChoice, float] = {} if memo is None else memo
    scores = []
    for c in options:
        score = known.get(c)
        if score is None:
            score = known[c] = goodput(
                c,
                model=model,
                grad_sqr=grad_sqr,
                grad_var=grad_var,
                initial_batch_size=initial_batch_size,
            )
        scores.append(score)
    top = max(
        range(len(options)),
        key=lambda i: (scores[i], -options[i].accumulation_steps, -options[i].global_batch_size),
    )
    best = options[top]
    if current not in options:
        return best
    if best != current and scores[top] >= switch_speedup * scores[options.index(current)]:
        return best
    return current
