"""Adaptive batch: gradient statistics, AdaScale learning rate and the batch chosen by goodput.

Opt-in per job (``tide.io/adaptive-batch: "true"``, read from ``TIDE_ADAPTIVE_BATCH`` and the bounds
beside it, see :mod:`worker_runtime.env`); :class:`~worker_runtime.run.ElasticRun` drives an
:class:`AdaptiveBatch` when the job opts in, and nothing here runs otherwise. The ideas are
AdaptDL's (Qiao et al., Pollux, OSDI 2021): the statistics of
:mod:`worker_runtime.gradient_stats`, the rule of :mod:`worker_runtime.adascale` and the choice of
:mod:`worker_runtime.goodput`.

Per optimizer step:

1. each micro batch's backward adds, in parameter hooks (before DDP's all-reduce), the squared norm
   of this worker's micro-batch gradient; the autograd engine then calls back after the backward;
2. after the step's last backward (DDP has averaged the gradients), one all-reduce sums the
   workers' squared norms, the statistics are updated, and every parameter group's learning rate
   is set to ``base_lr x schedule(progress) x factor`` (:func:`~worker_runtime.adascale.lr_factor`),
   before the script's ``optimizer.step()``;
3. when the step ends, progress grows by the step's gain, and the step's times are recorded.

Every ``rechoose_every_steps`` steps, and at the start of every pass over the data, rank 0 picks the
batch with the best goodput among the candidates at the current size and broadcasts it; a change
ends the data loader's pass there (the sampler keeps its position in samples) and the next pass
draws micro batches of the new size, without a restart.

What it keeps (in ``optimizer.state["tide_adaptive"]``, so checkpoints carry it): the progress,
the averaged statistics, the base learning rates, the scale of the last step and the measured
step times per world size, each with its timed all-reduce.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Variable

from worker_runtime import collectives
from worker_runtime.adascale import OptimizerKind, gain, lr_factor
from worker_runtime.batching import BatchPlan
from worker_runtime.env import AdaptiveBatchSettings
from worker_runtime.errors import ConfigError
from worker_runtime.goodput import (
    BatchChoice,
    StepSample,
    StepTimeModel,
    candidates,
    choose,
    first_choice,
)
from worker_runtime.gradient_stats import SmoothedStats, estimate
from worker_runtime.sampler import ElasticBatchSampler

logger = logging.getLogger(__name__)

STATE_KEY = "tide_adaptive"
_KEPT_SAMPLES = 64  # measured steps kept per world size
_ADAM_LIKE = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
)

LrSchedule = Callable[[float], float]
"""Factor on the base learning rate as a function of progress (scale-invariant iterations)."""
Clock = Callable[[], float]
"""Seconds on a monotonic clock (``time.perf_counter``), what step and sync times are taken with."""


def optimizer_kind(optimizer: torch.optim.Optimizer) -> OptimizerKind:
    """Which AdaScale rule an optimizer follows.

    Args:
        optimizer: The script's optimizer.

    Returns:
        ``SGD`` for ``torch.optim.SGD``, ``ADAM`` for Adam-like optimizers.

    Raises:
        ConfigError: For any other optimizer (its rule is unknown).
    """
    if isinstance(optimizer, torch.optim.SGD):
        return OptimizerKind.SGD
    if isinstance(optimizer, _ADAM_LIKE):
        return OptimizerKind.ADAM
    raise ConfigError(
        f"optimizer: adaptive batch supports SGD and Adam-like optimizers, got "
        f"{type(optimizer).__name__}"
    )


def plan_of(choice: BatchChoice, *, world_size: int) -> BatchPlan:
    """The batch plan of a choice: an adaptive batch always splits evenly.

    Args:
        choice: The chosen batch.
        world_size: Workers.

    Returns:
        The plan ``global = world_size x local x accumulation``; its learning-rate scale is 1,
        since AdaScale sets the rate.
    """
    return BatchPlan(
        world_size=world_size,
        micro_batch_size=choice.local_batch_size,
        accumulation_steps=choice.accumulation_steps,
        global_batch_size=choice.global_batch_size,
        lr_scale=1.0,
    )


def reset_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Forget every parameter's moment estimates; the optimizer starts them afresh at its next step.

    Args:
        optimizer: An Adam-like optimizer.
    """
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param in optimizer.state:
                optimizer.state[param].clear()


class SyncTimer:
    """Times each step's gradient all-reduce: first bucket sent to last bucket reduced.

    Args:
        clock: The clock read at the first bucket sent and at each bucket reduced.
    """

    def __init__(self, *, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self.started_s: float | None = None
        self.ended_s: float | None = None

    def reset(self) -> None:
        """Forget the last step's times."""
        self.started_s = self.ended_s = None

    @property
    def sync_s(self) -> float | None:
        """Seconds of the last step's all-reduce, ``None`` when none ran."""
        if self.started_s is None or self.ended_s is None:
            return None
        return self.ended_s - self.started_s


def timed_allreduce_hook(timer: SyncTimer, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: DDP's own averaging all-reduce, timed by ``timer``.

    Args:
        timer: Where the times go.
        bucket: The ``GradBucket`` DDP hands over.

    Returns:
        The future of the averaged bucket.
    """
    now = timer.clock()
    if timer.started_s is None:
        timer.started_s = now
    tensor = bucket.buffer().div_(dist.get_world_size())
    future = dist.all_reduce(tensor, async_op=True).get_future()

    def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        timer.ended_s = timer.clock()
        reduced: torch.Tensor = fut.value()[0]
        return reduced

    chained: torch.futures.Future[torch.Tensor] = future.then(done)
    return chained


class AdaptiveBatch:
    """The adaptive-batch state of one worker (see the module docstring).

    Args:
        settings: The job's bounds.
        optimizer: The script's optimizer (SGD or Adam-like); its learning rates at
            construction are the base rates, tuned for the initial batch.
        world_size: Workers.
        nodes: Pods (torchrun agents) of the job.
        rank: This worker's rank.
        lr_schedule: Factor on the base rates as a function of progress; constant 1 when
            ``None``.
        rechoose_every_steps: Steps between two choices of the batch.
        clock: What the micro batches' and the all-reduce's ends are timed with; the run
            passes its own, the clock of the step's start and end.

    Raises:
        ConfigError: For an unsupported optimizer, or when no batch within the bounds splits
            over ``world_size`` workers.
    """

    def __init__(
        self,
        *,
        settings: AdaptiveBatchSettings,
        optimizer: torch.optim.Optimizer,
        world_size: int,
        nodes: int,
        rank: int,
        lr_schedule: LrSchedule | None = None,
        rechoose_every_steps: int = 50,
        clock: Clock = time.perf_counter,
    ) -> None:
        if rechoose_every_steps < 1:
            raise ConfigError(f"rechoose_every_steps: must be >= 1, got {rechoose_every_steps}")
        self.settings = settings
        self.optimizer = optimizer
        self.kind = optimizer_kind(optimizer)
        self.world_size = world_size
        self.nodes = nodes
        self.rank = rank
        self.lr_schedule = lr_schedule
        self.rechoose_every_steps = rechoose_every_steps
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.progress = 0.0
        self.stats = SmoothedStats()
        self.prev_scale = 0.0
        self.measured: dict[str, list[list[float]]] = {}
        self.last_gain = 1.0
        self.last_lr_factor = 1.0
        self.clock = clock
        self.sync_timer = SyncTimer(clock=clock)
        self.options = self._options()
        self.choice = first_choice(self.options, initial_batch_size=settings.initial_batch_size)
        self._hooked_ddp: set[int] = set()
        self._local_sqr: list[torch.Tensor] = []
        self._backwards = 0
        self._loss_scale = 1.0
        self._backward_ends_s: list[float] = []
        self._prev_grads: list[torch.Tensor] | None = None
        self._callback_queued = False
        self._handles = [p.register_hook(self._grad_hook) for p in self.params]

    # ------------------------------------------------------------------ checkpointed state

    def load(self) -> None:
        """Take the state a restored optimizer holds, if any (after the checkpoint loaded)."""
        saved = self.optimizer.state.get(STATE_KEY)  # type: ignore[call-overload]
        if not isinstance(saved, dict):
            self.store()
            return
        self.progress = float(saved["progress"])
        self.stats = SmoothedStats.from_dict(saved["stats"])
        self.base_lrs = [float(lr) for lr in saved["base_lrs"]]
        self.prev_scale = float(saved["prev_scale"])
        self.measured = {k: [list(s) for s in v] for k, v in saved["measured"].items()}

    def store(self) -> None:
        """Write the state into ``optimizer.state`` (saved with the optimizer)."""
        self.optimizer.state[STATE_KEY] = {  # type: ignore[index]
            "progress": self.progress,
            "stats": self.stats.to_dict(),
            "base_lrs": list(self.base_lrs),
            "prev_scale": self.prev_scale,
            "measured": {k: [list(s) for s in v] for k, v in self.measured.items()},
        }

    def close(self) -> None:
        """Remove the parameter hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ per step

    @property
    def scale(self) -> float:
        """Current global batch over the initial batch."""
        return self.choice.global_batch_size / self.settings.initial_batch_size

    def watch(self, model: torch.nn.Module) -> None:
        """Time the all-reduce of a DDP model (once per model, before its first forward).

        Args:
            model: The model the script runs; anything but DDP is left alone.
        """
        register = getattr(model, "register_comm_hook", None)
        if register is None or id(model) in self._hooked_ddp or self.world_size == 1:
            return
        # DDP checks the hook's annotations at run time, and this module's are strings (postponed
        # evaluation): a lambda has none to check.
        register(self.sync_timer, lambda state, bucket: timed_allreduce_hook(state, bucket))
        self._hooked_ddp.add(id(model))

    def begin_step(self, *, loss_scale: float) -> None:
        """Start counting a step's micro batches.

        Args:
            loss_scale: The factor the script puts on each micro batch's loss.
        """
        self._local_sqr = []
        self._backwards = 0
        self._loss_scale = loss_scale
        self._backward_ends_s = []
        self.sync_timer.reset()

    def end_step(self, *, started_s: float, ended_s: float) -> StepTimes:
        """Count the step: progress, measured times.

        Args:
            started_s: The clock at the step's start.
            ended_s: The clock at its end.

        Returns:
            The step's times.
        """
        self.progress += self.last_gain
        step_s = ended_s - started_s
        ends = [started_s, *self._backward_ends_s]
        accumulation = [b - a for a, b in itertools.pairwise(ends)][:-1]
        last_s = ended_s - (ends[-2] if len(ends) >= 2 else started_s)
        times = StepTimes(
            step_s=step_s,
            optim_step_s=last_s,
            accumulation_s=tuple(accumulation),
            sync_s=self.sync_timer.sync_s,
        )
        if step_s > 0:
            kept = self.measured.setdefault(str(self.world_size), [])
            sync_s = times.sync_s if times.sync_s is not None else math.nan
            kept.append(
                [self.choice.local_batch_size, self.choice.accumulation_steps, step_s, sync_s]
            )
            del kept[:-_KEPT_SAMPLES]
        self.store()
        return times

    def due(self, step: int) -> bool:
        """Whether the batch is chosen again after step ``step``."""
        return step % self.rechoose_every_steps == 0

    def check_loader(self, loader: object) -> None:
        """Refuse a data loader whose micro batch cannot follow the choice.

        Args:
            loader: The loader the script iterates.

        Raises:
            ConfigError: When its batch sampler is not the run's ``ElasticBatchSampler``.
        """
        batch_sampler = getattr(loader, "batch_sampler", None)
        if batch_sampler is not None and not isinstance(batch_sampler, ElasticBatchSampler):
            raise ConfigError(
                "steps(): with the adaptive batch the micro batch may change; build the "
                "DataLoader with batch_sampler=run.make_batch_sampler(dataset)"
            )

    def after_step(self, step: int) -> BatchChoice | None:
        """The batch to change to after step ``step``, if it is due to be chosen and changes.

        Every rank must call it after every step (a due choice is a collective, :meth:`rechoose`).

        Args:
            step: Steps done.

        Returns:
            The new batch, or ``None`` to go on with the current one.
        """
        if not self.due(step):
            return None
        before = self.choice
        return None if self.rechoose() == before else self.choice

    def rechoose(self) -> BatchChoice:
        """Choose the batch on rank 0 from its measurements; every rank takes that choice.

        Every rank must call it at the same step.

        Returns:
            The batch to take from now on (possibly the current one).
        """
        choice = self.choice
        if self.rank == 0:
            choice = self._best()
        shared: BatchChoice = collectives.broadcast_from_rank0(choice)
        choice = shared
        if choice != self.choice:
            logger.info(
                "adaptive batch: %s -> %s at world_size=%s progress=%.1f grad_sqr=%s grad_var=%s",
                self.choice,
                choice,
                self.world_size,
                self.progress,
                self.stats.grad_sqr,
                self.stats.grad_var,
            )
        self.choice = choice
        return choice

    def planned_progress(self, planned_samples: int) -> float:
        """Progress the whole run is worth: its samples in initial batches."""
        return planned_samples / self.settings.initial_batch_size

    def lr_multiplier(self) -> float:
        """The schedule's factor at the current progress."""
        return 1.0 if self.lr_schedule is None else float(self.lr_schedule(self.progress))

    # ------------------------------------------------------------------ internals

    def _options(self) -> tuple[BatchChoice, ...]:
        s = self.settings
        measured = self.measured.get(str(self.world_size), [])
        largest = max((int(m[0]) for m in measured), default=None)
        options = candidates(
            replicas=self.world_size,
            initial_batch_size=s.initial_batch_size,
            max_batch_size=s.max_batch_size,
            local_batch_min=s.local_batch_min,
            local_batch_max=s.local_batch_max,
            accumulation=s.accumulation,
            largest_measured_local=largest,
        )
        if not options:
            raise ConfigError(
                f"adaptive batch: no global batch in [{s.initial_batch_size}, {s.max_batch_size}] "
                f"splits over world_size={self.world_size} workers with micro batches in "
                f"[{s.local_batch_min}, {s.local_batch_max}] (accumulation "
                f"{'allowed' if s.accumulation else 'not allowed'}); widen the bounds or cap "
                f"the job's replicas"
            )
        return options

    def _best(self) -> BatchChoice:
        measured = self.measured.get(str(self.world_size), [])
        if not measured or not self.stats.ready:
            return self.choice
        self.options = self._options()
        model = StepTimeModel().fit([_step_sample(m) for m in measured])
        return choose(
            current=self.choice,
            options=self.options,
            model=model,
            grad_sqr=self.stats.grad_sqr,
            grad_var=self.stats.grad_var,
            initial_batch_size=self.settings.initial_batch_size,
        )

    def _grad_hook(self, grad: torch.Tensor) -> None:
        # Called for each parameter during backward with this worker's micro-batch gradient
        # (times the loss scale), before DDP reduces it.
        # Summed as tensors, read once per step: no device synchronisation per parameter.
        self._local_sqr.append((grad.detach().double() / self._loss_scale).pow(2).sum())
        if not self._callback_queued:
            self._callback_queued = True
            Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        # Runs once the backward is over; DDP's own callback (which waits for the all-reduce) may
        # not have run yet, so the statistics are read in a callback queued behind it.
        self._callback_queued = False
        self._backwards += 1
        self._backward_ends_s.append(self.clock())
        if self._backwards == self.choice.accumulation_steps:
            Variable._execution_engine.queue_callback(self._after_sync)

    def _after_sync(self) -> None:
        grads = [p.grad.detach() for p in self.params if p.grad is not None]
        total_sqr = float(sum(g.double().pow(2).sum() for g in grads))
        mine = float(torch.stack(self._local_sqr).sum()) if self._local_sqr else 0.0
        local_sqr, count = collectives.all_reduce_sum([mine, float(self._backwards)])
        count_i = round(count)
        scale = self.scale
        if not (math.isfinite(local_sqr) and math.isfinite(total_sqr)):
            # An overflowed gradient (mixed precision skips such steps) would poison the
            # averages for good: this step is left out of them.
            logger.warning("adaptive batch: non-finite gradient norms, statistics not updated")
        elif count_i > 1:
            est = estimate(
                local_sqr=local_sqr / count_i, total_sqr=total_sqr, count=count_i, scale=scale
            )
            self.stats = self.stats.update(est, scale=scale, differenced=False)
            self._prev_grads = None
        else:
            self._difference(grads, total_sqr=total_sqr, scale=scale)
        self._set_lr(scale)

    def _difference(self, grads: Sequence[torch.Tensor], *, total_sqr: float, scale: float) -> None:
        # One gradient this step: the previous one stands in for a second (module docstring of
        # worker_runtime.gradient_stats); the first step only keeps its gradient.
        previous = self._prev_grads
        self._prev_grads = [g.clone() for g in grads]
        if previous is None or len(previous) != len(grads):
            return
        prev_sqr = float(sum(p.double().pow(2).sum() for p in previous))
        pairs = zip(grads, previous, strict=True)
        mean_sqr = float(sum(((g.double() + p.double()) / 2).pow(2).sum() for g, p in pairs))
        est = estimate(
            local_sqr=(prev_sqr + total_sqr) / 2, total_sqr=mean_sqr, count=2, scale=2 * scale
        )
        self.stats = self.stats.update(est, scale=2 * scale, differenced=True)

    def _set_lr(self, scale: float) -> None:
        if self.stats.ready:
            self.last_gain = gain(
                grad_sqr=self.stats.grad_sqr, grad_var=self.stats.grad_var, scale=scale
            )
        else:
            # No statistics yet: count the step as one initial batch's worth, the cautious end.
            self.last_gain = 1.0
        if self.kind is OptimizerKind.ADAM and not math.isclose(scale, self.prev_scale):
            reset_adam_state(self.optimizer)
        self.prev_scale = scale
        self.last_lr_factor = lr_factor(kind=self.kind, gain_value=self.last_gain, scale=scale)
        multiplier = self.lr_multiplier() * self.last_lr_factor
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * multiplier


def _step_sample(kept: list[float]) -> StepSample:
    """A measured step as kept in the state: ``[local batch, micro batches, step s, sync s]``,
    the sync NaN where none was timed (a state saved before syncs were kept has three)."""
    sync = float(kept[3]) if len(kept) > 3 and math.isfinite(kept[3]) else None
    return StepSample(int(kept[0]), int(kept[1]), float(kept[2]), sync)


@dataclass(frozen=True, slots=True)
class StepTimes:
    """One step's measured times (seconds).

    Attributes:
        step_s: The whole step.
        optim_step_s: From the end of the last accumulation micro batch (or the step's start) to
            the end of the step: the synchronising micro batch and the optimizer update.
        accumulation_s: Each accumulation micro batch (forward and backward without
            synchronisation), data loading included.
        sync_s: The gradient all-reduce, first bucket to last (``None`` without a DDP model
            watched or with one worker).
    """

    step_s: float
    optim_step_s: float
    accumulation_s: tuple[float, ...]
    sync_s: float | None
