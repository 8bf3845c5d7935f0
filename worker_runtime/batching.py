"""How the batch and the learning rate follow the world size.

Default (:attr:`ScalingMode.FIXED_GLOBAL_BATCH`): the global batch is fixed and the gradient
accumulation absorbs the world size, ``micro_batch_size * world_size * accumulation_steps ==
global_batch_size``, with the learning rate unchanged; training is then the same optimisation
problem at every size. Opt-in modes keep the per-worker batch (micro batch × accumulation) fixed,
so the global batch grows with the world size, and scale the learning rate by
``world_size / base_world_size`` (linear, Goyal et al. 2017) or its square root (Krizhevsky 2014).
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
        accumulation_steps: Micro batches per worker per optimizer step.
        global_batch_size: Samples per optimizer step over all workers.
        lr_scale: Factor applied to the base learning rate.
    """

    world_size: int
    micro_batch_size: int
    accumulation_steps: int
    global_batch_size: int
    lr_scale: float

    @property
    def samples_per_worker_per_step(self) -> int:
        """Samples one worker consumes per optimizer step."""
        return self.micro_batch_size * self.accumulation_steps


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
        BatchConfigError: When a size is not positive, an argument the mode needs is missing, or
            the global batch is not divisible by ``micro_batch_size * world_size``.
    """
    _positive("world_size", world_size)
    _positive("micro_batch_size", micro_batch_size)
    if mode is ScalingMode.FIXED_GLOBAL_BATCH:
        if global_batch_size is None:
            raise BatchConfigError("global_batch_size: required with mode=fixed_global_batch")
        _positive("global_batch_size", global_batch_size)
        per_pass = micro_batch_size * world_size
        if global_batch_size % per_pass != 0:
            raise BatchConfigError(
                f"global_batch_size={global_batch_size} is not divisible by micro_batch_size="
                f"{micro_batch_size} x world_size={world_size} = {per_pass}; choose a global batch "
                f"that is a multiple of micro_batch_size x every world size the job may run at"
            )
        return BatchPlan(
            world_size=world_size,
            micro_batch_size=micro_batch_size,
            accumulation_steps=global_batch_size // per_pass,
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


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise BatchConfigError(f"{name}: must be >= 1, got {value}")
