"""Builders for the goodput tests: exact step times from known Pollux parameters."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_policy.models.step_model import StepParams
from scheduler_policy.vocabulary.state import BatchBounds, BatchStatistics, StepTimes

TRUE = StepParams(
    compute_alpha_s=0.01,
    compute_beta_s=0.001,
    intra_alpha_s=0.02,
    intra_beta_s=0.002,
    inter_alpha_s=0.08,
    inter_beta_s=0.01,
    gamma=2.0,
)

BOUNDS = BatchBounds(
    initial_batch_size=64, max_batch_size=4096, local_batch_min=8, local_batch_max=256,
    accumulation=True,
)  # fmt: skip


def exact_times(
    shapes: Iterable[tuple[int, int, int]],
    *,
    params: StepParams = TRUE,
    accumulation: bool = True,
    sync: bool = True,
) -> tuple[StepTimes, ...]:
    """What a worker would measure at each (nodes, replicas, local batch) under ``params``."""
    return tuple(
        StepTimes(
            nodes=m,
            replicas=r,
            local_batch_size=b,
            optim_step_s=float(params.optim_s(nodes=m, replicas=r, local_batch_size=b)),
            accumulation_step_s=float(params.grad_s(b)) if accumulation else None,
            sync_s=float(params.sync_s(nodes=m, replicas=r)) if sync and r > 1 else None,
        )
        for m, r, b in shapes
    )


def statistics(
    *shapes: tuple[int, int, int],
    batch_size: int = 128,
    grad_sqr: float | None = 1.0,
    grad_var: float | None = 50.0,
    progress: float | None = 100.0,
    planned_progress: float | None = 10_000.0,
    params: StepParams = TRUE,
) -> BatchStatistics:
    """A job's batch statistics with exact step times at ``shapes`` (default: 2 and 4 workers
    on one node at micro batch 32)."""
    return BatchStatistics(
        batch_size=batch_size,
        grad_sqr=grad_sqr,
        grad_var=grad_var,
        progress=progress,
        planned_progress=planned_progress,
        step_times=exact_times(shapes or ((1, 2, 32), (1, 4, 32)), params=params),
    )
