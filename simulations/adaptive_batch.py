"""Adaptive batch in the simulator: a Pollux job trains as an AdaptDL job does under Pollux.

A job that lets tide choose its batch (``WorkloadJob.adaptive``) counts its work in Pollux's
*progress*, scale-invariant iterations (steps at the initial batch its steps are worth), and
takes the batch its workers would take, as ``worker_runtime`` chooses it. The rules, each from
Pollux's own simulator (petuum/adaptdl, branch ``osdi21-artifact``, ``simulator/simulator.py``
and ``simulator/applications.py``):

- **Rate**: at global batch B on n replicas in epoch e a job makes
  ``gain(B, e) / iteration_s(n, B)`` progress per second (``simulator.py`` lines 116-131):
  ``gain = (var + sqr) / (var / scale + sqr)`` with ``scale = B / init_batch_size`` and
  ``(sqr, var)`` the epoch's gradient statistics at B, linearly interpolated between the two
  validated batches around B (``applications.py`` lines 186-200); an iteration takes
  ``step + accum x (step - sync)`` at the micro batch (``simulator.py`` lines 119-121, 130).
- **Epochs**: epoch e ends when progress reaches the least any validated batch had made by its
  end (``applications.py`` lines 132-136); the job is done after its last epoch (line 141,
  ``simulator.py`` lines 145-148). The rate changes at each boundary, so the simulator stops
  there (an event) and takes the new epoch's statistics (``simulator.py`` lines 133-149).
- **Batch**: the worker's own rule (``scheduler_policy.models.batch_choice``, which the worker
  runtime takes too): its candidates at the job's size within the bounds, the batch closest to
  the initial one at a size it never measured, and a switch only for a predicted goodput
  ``SWITCH_SPEEDUP`` times the current one's, from a step-time model fitted to the steps it
  measured at that size. The worker re-chooses every few dozen steps; the simulator re-chooses
  at each resize and each epoch boundary and lets the choice settle there (each new batch is
  measured, the model refitted, and the choice made again until it stays), so the few hundred
  steps a worker's exploration takes are not charged. Pollux re-chooses with its own fitted
  model at each resize and after each step (``simulator.py`` lines 64-83, 152); the choice
  rule is the worker's, since tide's jobs run the worker runtime.

A job that does not adapt keeps today's model: iterations at its submitted batch
(``simulations.pollux``).
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from scheduler_policy.models.batch_choice import (
    BatchChoice,
    StepSample,
    StepTimeModel,
    candidates,
    choose,
    first_choice,
)
from scheduler_policy.vocabulary.state import BatchBounds, BatchStatistics, StepTimes
from simulations.errors import TraceError
from simulations.pollux_model import (
    ApplicationTable,
    application_table,
    packed_placement,
    validation_curves,
)

SETTLE_ROUNDS = 8
"""Most re-choices at one resize or epoch boundary before the choice is taken as settled."""

RECENT_SHAPES = 16
"""Shapes (replicas, local batch) a job reports step times for: the ones it ran at last."""


@dataclass(frozen=True, eq=False)
class AdaptiveApplication:
    """One Pollux application as an adaptive job trains it (shared by its jobs; read once).

    Attributes:
        table: the application's step and sync times.
        bounds: the batch bounds the job declares: Pollux's (``simulator.py`` lines 72-75:
            initial and largest validated batch, the measured local batch range with Pollux's
            caps, accumulation allowed).
        validated: the validated global batches, ascending.
        grad_sqr: per validated batch, each epoch's ``grad_sqr``.
        grad_var: per validated batch, each epoch's ``grad_var``.
        epoch_ends: the progress at which each epoch ends, one per epoch trained.
        gpus_per_node: GPUs per node, for the packed placement step times are read at.
    """

    table: ApplicationTable
    bounds: BatchBounds
    validated: tuple[int, ...]
    grad_sqr: tuple[tuple[float, ...], ...]
    grad_var: tuple[tuple[float, ...], ...]
    epoch_ends: tuple[float, ...]
    gpus_per_node: int = 4

    @property
    def name(self) -> str:
        """The application's name."""
        return self.table.name

    @property
    def planned_progress(self) -> float:
        """Progress of the whole run: the end of its last epoch."""
        return self.epoch_ends[-1]

    @property
    def epochs(self) -> int:
        """Epochs the job trains."""
        return len(self.epoch_ends)

    def epoch_at(self, progress: float) -> int:
        """The epoch (0-based) a job at ``progress`` is in; the last one once it is done."""
        return min(bisect.bisect_right(self.epoch_ends, progress), len(self.epoch_ends) - 1)

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` of epoch ``epoch`` at ``batch_size``: linear between the
        validated batches around it (``applications.py`` lines 186-200); clamped to the
        validated range."""
        sizes = self.validated
        hi = min(max(bisect.bisect_left(sizes, batch_size), 0), len(sizes) - 1)
        if sizes[hi] == batch_size or hi == 0 or batch_size > sizes[hi]:
            return self.grad_sqr[hi][epoch], self.grad_var[hi][epoch]
        lo = hi - 1
        w = (batch_size - sizes[lo]) / (sizes[hi] - sizes[lo])
        sqr = (1 - w) * self.grad_sqr[lo][epoch] + w * self.grad_sqr[hi][epoch]
        var = (1 - w) * self.grad_var[lo][epoch] + w * self.grad_var[hi][epoch]
        return sqr, var

    def gain(self, batch_size: int, epoch: int) -> float:
        """Progress one step at ``batch_size`` makes in epoch ``epoch`` (``simulator.py`` lines
        117, 123-125; Pollux's formula, no floor on the variance)."""
        sqr, var = self.grad_stats(batch_size, epoch)
        scale = batch_size / self.bounds.initial_batch_size
        return (var + sqr) / (var / scale + sqr)

    def shape_times(self, replicas: int, local_batch_size: int) -> tuple[float, float]:
        """``(step_s, sync_s)`` of one micro step at ``local_batch_size`` on ``replicas``
        packed replicas (``applications.py`` lines 205-227); NaN outside every measurement."""
        return _shape_times(self.table, replicas, local_batch_size, self.gpus_per_node)

    def iteration_s(self, replicas: int, choice: BatchChoice) -> float:
        """Seconds of one optimizer step at ``choice``: ``step + accum x (step - sync)`` with
        ``accum`` the micro batches past the first (``simulator.py`` lines 119-121, 130)."""
        step, sync = self.shape_times(replicas, choice.local_batch_size)
        return step + (choice.accumulation_steps - 1) * (step - sync)

    def options(self, replicas: int, largest_measured_local: int | None) -> tuple[BatchChoice, ...]:
        """The worker's candidates at ``replicas`` that Pollux's measurements can time."""
        return _options(self, replicas, largest_measured_local)

    def timed_size(self, replicas: int) -> int:
        """The size whose step times a job on ``replicas`` replicas runs at: its own, or where
        Pollux's measurements time no candidate there, the largest smaller size they do (the
        extra replicas add nothing, as ``simulations.pollux.rates_fallback`` has it for a job
        at its submitted batch).

        Raises:
            ValueError: not even one replica can be timed.
        """
        return _timed_size(self, replicas)

    @property
    def max_replicas(self) -> int:
        """Most replicas a job may take: at least the smallest local batch each, within the
        largest batch and Pollux's 64 GPUs (``simulator.py`` lines 328-329)."""
        return max(1, min(64, self.bounds.max_batch_size // self.bounds.local_batch_min))


def _usable(seconds: float) -> bool:
    return math.isfinite(seconds) and seconds > 0


@functools.lru_cache(maxsize=65536)
def _options(
    app: AdaptiveApplication, replicas: int, largest_measured_local: int | None
) -> tuple[BatchChoice, ...]:
    b = app.bounds
    found = candidates(
        replicas=replicas,
        initial_batch_size=b.initial_batch_size,
        max_batch_size=b.max_batch_size,
        local_batch_min=b.local_batch_min,
        local_batch_max=b.local_batch_max,
        accumulation=b.accumulation,
        largest_measured_local=largest_measured_local,
    )
    return tuple(c for c in found if _usable(app.iteration_s(replicas, c)))


@functools.lru_cache(maxsize=4096)
def _timed_size(app: AdaptiveApplication, replicas: int) -> int:
    for size in range(replicas, 0, -1):
        if app.options(size, None):
            return size
    raise ValueError(
        f"application {app.name!r}: its measurements time no batch within {app.bounds} on one "
        "replica"
    )


@functools.lru_cache(maxsize=65536)
def _shape_times(
    table: ApplicationTable, replicas: int, local_batch_size: int, gpus_per_node: int
) -> tuple[float, float]:
    placement = packed_placement(replicas, gpus_per_node=gpus_per_node)
    if local_batch_size < table.min_local_bsz:
        return math.nan, math.nan  # Pollux never runs a micro batch this small (line 347)
    try:
        return table.step_and_sync_s(placement, float(local_batch_size))
    except ValueError:  # measurements on one plane: nothing beyond their own placements
        return math.nan, math.nan


@functools.lru_cache(maxsize=16)
def adaptive_application(
    traces_dir: Path, app: str, epochs: int, gpus_per_node: int = 4
) -> AdaptiveApplication:
    """Read ``app``'s tables as an adaptive job needs them.

    Args:
        traces_dir: Pollux's ``traces/`` folder.
        app: the application.
        epochs: epochs its jobs train, >= 1.
        gpus_per_node: GPUs per node.

    Returns:
        The application.

    Raises:
        TraceError: a file is missing or unreadable, has fewer than ``epochs`` rows, or the
            step times cover no batch within the bounds on one replica.
    """
    table = application_table(traces_dir, app)
    curves = validation_curves(traces_dir, app)
    validated = tuple(sorted(curves))
    for batch in validated:
        if len(curves[batch]) < epochs:
            raise TraceError(
                traces_dir / app / f"validation-{batch}.csv",
                len(curves[batch]) + 1,
                f"fewer than {epochs} epochs",
            )
    # Epoch e ends at the least progress any validated batch made by its end (lines 132-136).
    ends = tuple(min(curves[b][e][0] for b in validated) for e in range(epochs))
    bounds = BatchBounds(
        initial_batch_size=table.init_batch_size,
        max_batch_size=table.max_batch_size,
        local_batch_min=table.min_local_bsz,
        local_batch_max=table.max_local_bsz,
        accumulation=True,
    )
    adaptive = AdaptiveApplication(
        table=table,
        bounds=bounds,
        validated=validated,
        grad_sqr=tuple(tuple(r[1] for r in curves[b][:epochs]) for b in validated),
        grad_var=tuple(tuple(r[2] for r in curves[b][:epochs]) for b in validated),
        epoch_ends=ends,
        gpus_per_node=gpus_per_node,
    )
    try:
        adaptive.timed_size(1)
    except ValueError as e:
        raise TraceError(traces_dir / app / "placements.csv", 0, str(e)) from e
    return adaptive


class BatchRun:
    """One adaptive job's batch as it trains (mutable; internal to the simulator).

    Attributes:
        app: the application.
        replicas: the size the batch was chosen for and its steps are timed at
            (``AdaptiveApplication.timed_size`` of the placed replicas; 0 before the first
            start).
        epoch: the epoch it was chosen in.
        choice: the batch in use.
        measured: per size, each ``(local batch, micro batches)`` the job ran at and its step
            seconds, as the worker keeps them (checkpointed: they survive restarts).
        recent: ``(replicas, local batch)`` shapes it ran at, oldest first (at most
            ``RECENT_SHAPES``), for the step times it reports.
        switches: batch changes so far.
    """

    __slots__ = ("app", "choice", "epoch", "measured", "recent", "replicas", "switches")

    def __init__(self, app: AdaptiveApplication) -> None:
        self.app = app
        self.replicas = 0
        self.epoch = 0
        b = app.bounds
        self.choice = BatchChoice(b.initial_batch_size, b.initial_batch_size, 1)
        self.measured: dict[int, dict[tuple[int, int], float]] = {}
        self.recent: list[tuple[int, int]] = []
        self.switches = 0

    def follow(self, *, replicas: int, progress: float) -> bool:
        """Re-choose the batch when the size or the epoch changed (see the module docstring).

        Args:
            replicas: placed replicas now (0: nothing to choose).
            progress: the job's progress now.

        Returns:
            True when the size or the epoch changed (the rate must be recomputed).
        """
        epoch = self.app.epoch_at(progress)
        if replicas <= 0:
            return False
        app = self.app
        size = app.timed_size(replicas)
        if size == self.replicas and epoch == self.epoch:
            return False
        resized = size != self.replicas
        self.replicas, self.epoch = size, epoch
        before = self.choice
        seen = self.measured.setdefault(size, {})
        if resized:
            # A restart at a new size: the worker starts at the candidate closest to the
            # initial batch, then re-chooses once it has measured (below).
            options = app.options(size, max((b for b, _ in seen), default=None))
            options = options or app.options(size, None)
            self.choice = first_choice(options, initial_batch_size=app.bounds.initial_batch_size)
        for _ in range(SETTLE_ROUNDS):
            self._measure(self.choice)
            options = app.options(size, max(b for b, _ in seen))
            if not options:
                break
            chosen = self._best(options, current=self.choice)
            if chosen == self.choice:
                break
            self.choice = chosen
        self._measure(self.choice)
        if self.choice != before:
            self.switches += 1
        return True

    def _best(self, options: tuple[BatchChoice, ...], *, current: BatchChoice) -> BatchChoice:
        seen = self.measured[self.replicas]
        # The worker times each step's all-reduce too (none on one replica).
        model = StepTimeModel().fit(
            [StepSample(b, k, s, self._sync_s(b)) for (b, k), s in seen.items()]
        )
        # The worker's statistics: the current epoch's, at the batch it runs.
        sqr, var = self.app.grad_stats(current.global_batch_size, self.epoch)
        return choose(
            current=current,
            options=options,
            model=model,
            grad_sqr=sqr,
            grad_var=var,
            initial_batch_size=self.app.bounds.initial_batch_size,
        )

    def _sync_s(self, local_batch_size: int) -> float | None:
        if self.replicas <= 1:
            return None
        sync = self.app.shape_times(self.replicas, local_batch_size)[1]
        return sync if math.isfinite(sync) else None

    def _measure(self, choice: BatchChoice) -> None:
        seconds = self.app.iteration_s(self.replicas, choice)
        if not _usable(seconds):
            return
        self.measured[self.replicas][(choice.local_batch_size, choice.accumulation_steps)] = seconds
        shape = (self.replicas, choice.local_batch_size)
        if shape in self.recent:
            self.recent.remove(shape)
        self.recent.append(shape)
        del self.recent[:-RECENT_SHAPES]

    def iteration_s(self) -> float:
        """Seconds of one optimizer step at the current batch and size."""
        return self.app.iteration_s(self.replicas, self.choice)

    def progress_rate(self) -> float:
        """Progress per second at the current batch, size and epoch (0 where untimed)."""
        seconds = self.iteration_s()
        if not _usable(seconds):
            return 0.0
        gain = self.app.gain(self.choice.global_batch_size, self.epoch)
        return gain / seconds if math.isfinite(gain) and gain > 0 else 0.0

    def samples_per_s(self) -> float:
        """Training samples per second at the current batch and size (what the worker exports
        as throughput; 0 where untimed)."""
        seconds = self.iteration_s()
        return self.choice.global_batch_size / seconds if _usable(seconds) else 0.0

    def statistics(
        self, *, progress: float, noise: dict[tuple[int, int], float]
    ) -> BatchStatistics:
        """What the job's workers report (``BatchStatistics``): the current batch, the current
        epoch's statistics at it, progress and planned progress, and the step times of the
        shapes it ran at last (times ``noise[shape]``, the measurement's error).

        Args:
            progress: the job's progress now.
            noise: a factor per ``(replicas, local batch)`` shape (1.0 where missing).
        """
        app = self.app
        sqr, var = app.grad_stats(self.choice.global_batch_size, self.epoch)
        times = []
        for replicas, local in self.recent:
            step, sync = app.shape_times(replicas, local)
            factor = noise.get((replicas, local), 1.0)
            accumulated = any(b == local and k > 1 for b, k in self.measured.get(replicas, {}))
            times.append(
                StepTimes(
                    nodes=len(packed_placement(replicas, gpus_per_node=app.gpus_per_node)),
                    replicas=replicas,
                    local_batch_size=local,
                    optim_step_s=step * factor,
                    accumulation_step_s=(step - sync) * factor if accumulated else None,
                    sync_s=sync * factor if replicas > 1 else None,
                )
            )
        return BatchStatistics(
            batch_size=self.choice.global_batch_size,
            grad_sqr=sqr,
            grad_var=var,
            progress=progress,
            planned_progress=app.planned_progress,
            step_times=tuple(times),
        )
