"""How the batch and the learning rate follow the world size.

Default (:attr:`ScalingMode.FIXED_GLOBAL_BATCH`): the global batch is fixed and the learning rate
unchanged, so training is the same optimisation problem at every world size. A step's global batch
is ``global_batch_size / micro_batch_size`` micro batches; micro batch ``j`` of a step goes to rank
``j % world_size``, so when the world size does not divide that count the ranks take different
numbers of micro batches (uneven accumulation): at world size 5, a global batch of 96 in micro
batches of 8 is 12 micro batches, 3 each on ranks 0 and 1 and 2 each on ranks 2 to 4. The global
batch stays exact, and so does the gradient: each micro batch's mean loss is multiplied by
:attr:`BatchPlan.loss_scale` (``world_size / micro_batches_per_step``) before ``backward``, so that
DDP's average over ranks weights every micro batch, hence every sample, by the same
``1 / global_batch_size``. A world size above the micro batches of a step is refused: a rank
without a micro batch would have no gradient to contribute.

Opt-in modes keep the per-worker batch (micro batch × accumulation) fixed, so the global batch
grows with the world size, and scale the learning rate by ``world_size / base_world_size``
(linear, Goyal et al. 2017) or its square root (Krizhevsky 2014).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from worker_runtime.errors import BatchConfigError


class ScalingMode(enum.Enum):
    """What changes when the world size changes."""

    FIXED_GLOBAL_BATCH = "fixed_global_batch"
    LINEAR_LR = "linear_lr"
    SQRT_LR = "sqrt_lr"


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Batch sizes and learning-rate factor for one world size.

    Attributes:
        world_size: Number of workers the plan is for.
        micro_batch_size: Samples per forward/backward pass on one worker.
        accumulation_steps: Micro batches per optimizer step of the busiest worker (rank 0);
            with uneven accumulation the last ranks take one fewer (see
            :meth:`accumulation_steps_of`).
        global_batch_size: Samples per optimizer step over all workers.
        lr_scale: Factor applied to the base learning rate.
    """

    world_size: int
    micro_batch_size: int
    accumulation_steps: int
    global_batch_size: int
    lr_scale: float

    @property
    def micro_batches_per_step(self) -> int:
        """Micro batches of one optimizer step, over all workers."""
        return self.global_batch_size // self.micro_batch_size

    @property
    def even(self) -> bool:
        """Whether every worker takes the same number of micro batches per step."""
        return self.micro_batches_per_step % self.world_size == 0

    @property
    def loss_scale(self) -> float:
        """Factor for each micro batch's mean loss before ``backward``.

        ``world_size / micro_batches_per_step``: DDP averages the ranks' gradients, so each micro
        batch then weighs ``1 / micro_batches_per_step`` in the step's gradient, on every rank
        alike; with even accumulation it is ``1 / accumulation_steps``.
        """
        return self.world_size / self.micro_batches_per_step

    def accumulation_steps_of(self, rank: int) -> int:
        """Micro batches per optimizer step of one worker.

        Args:
            rank: The worker's global rank.

        Returns:
            The count, ``accumulation_steps`` or one fewer.

        Raises:
            BatchConfigError: When the rank is outside the plan's world size.
        """
        return len(
            step_micro_batches(
                rank=rank,
                world_size=self.world_size,
                micro_batches_per_step=self.micro_batches_per_step,
            )
        )

    def samples_of(self, rank: int) -> int:
        """Samples one worker trains on per optimizer step.

        Args:
            rank: The worker's global rank.

        Returns:
            ``micro_batch_size`` times its micro batches.

        Raises:
            BatchConfigError: When the rank is outside the plan's world size.
        """
        return self.micro_batch_size * self.accumulation_steps_of(rank)


def step_micro_batches(*, rank: int, world_size: int, micro_batches_per_step: int) -> range:
    """Which micro batches of a step (numbered from 0 in the step's sample order) a rank takes.

    Micro batch ``j`` goes to rank ``j % world_size``: the ranks below
    ``micro_batches_per_step % world_size`` take one more than the others.

    Args:
        rank: Global rank, ``0 <= rank < world_size``.
        world_size: Number of workers.
        micro_batches_per_step: Micro batches of one step over all workers.

    Returns:
        The rank's micro batch numbers, ascending.

    Raises:
        BatchConfigError: When a count is not positive or the rank is out of range.
    """
    _positive("world_size", world_size)
    _positive("micro_batches_per_step", micro_batches_per_step)
    if not 0 <= rank < world_size:
        raise BatchConfigError(f"rank: must be in [0, world_size={world_size}), got {rank}")
    return range(rank, micro_batches_per_step, world_size)


def plan_batch(
    *,
    mode: ScalingMode,
    world_size: int,
    micro_batch_size: int,
    global_batch_size: int | None = None,
    accumulation_steps: int = 1,
    base_world_size: int | None = None,
) -> BatchPlan:
    """Compute the batch plan for a world size.

    Args:
        mode: Scaling rule.
        world_size: Current number of workers.
        micro_batch_size: Samples per forward/backward pass on one worker.
        global_batch_size: Samples per optimizer step; required for ``FIXED_GLOBAL_BATCH``,
            ignored otherwise.
        accumulation_steps: Micro batches per optimizer step in the learning-rate modes.
        base_world_size: World size the base learning rate was tuned for; required for the
            learning-rate modes.

    Returns:
        The plan.

    Raises:
        BatchConfigError: When a size is not positive, an argument the mode needs is missing,
            the global batch is not a multiple of the micro batch, or (fixed global batch) the
            world size exceeds the micro batches of a step.
    """
    _positive("world_size", world_size)
    _positive("micro_batch_size", micro_batch_size)
    if mode is ScalingMode.FIXED_GLOBAL_BATCH:
        if global_batch_size is None:
            raise BatchConfigError("global_batch_size: required with mode=fixed_global_batch")
        micro_batches = check_global_batch(
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            world_size=world_size,
        )
        return BatchPlan(
            world_size=world_size,
            micro_batch_size=micro_batch_size,
            accumulation_steps=-(-micro_batches // world_size),
            global_batch_size=global_batch_size,
            lr_scale=1.0,
        )
    _positive("accumulation_steps", accumulation_steps)
    if base_world_size is None:
        raise BatchConfigError(f"base_world_size: required with mode={mode.value}")
    _positive("base_world_size", base_world_size)
    ratio = world_size / base_world_size
    return BatchPlan(
        world_size=world_size,
        micro_batch_size=micro_batch_size,
        accumulation_steps=accumulation_steps,
        global_batch_size=micro_batch_size * world_size * accumulation_steps,
        lr_scale=ratio if mode is ScalingMode.LINEAR_LR else math.sqrt(ratio),
    )


def check_global_batch(*, global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """Check that a global batch splits into whole micro batches, at least one per worker.

    Args:
        global_batch_size: Samples per optimizer step.
        micro_batch_size: Samples per forward/backward pass on one worker.
        world_size: Number of workers.

    Returns:
        The micro batches of one step, ``global_batch_size / micro_batch_size``.

    Raises:
        BatchConfigError: When a size is not positive, the global batch is not a multiple of the
            micro batch, or there are fewer micro batches than workers.
    """
    _positive("global_batch_size", global_batch_size)
    _positive("micro_batch_size", micro_batch_size)
    _positive("world_size", world_size)
    if global_batch_size % micro_batch_size != 0:
        raise BatchConfigError(
            f"global_batch_size={global_batch_size} is not a multiple of micro_batch_size="
            f"{micro_batch_size}: a step must be whole micro batches"
        )
    micro_batches = global_batch_size // micro_batch_size
    if world_size > micro_batches:
        raise BatchConfigError(
            f"world_size={world_size} exceeds the {micro_batches} micro batches of a step "
            f"(global_batch_size={global_batch_size} / micro_batch_size={micro_batch_size}): "
            f"every worker needs at least one; lower micro_batch_size or cap the job's replicas"
        )
    return micro_batches


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise BatchConfigError(f"{name}: must be >= 1, got {value}")
