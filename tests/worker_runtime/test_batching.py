"""Batch and learning-rate rules across world sizes."""

from __future__ import annotations

import pytest

from worker_runtime import BatchConfigError, BatchPlan, ScalingMode, plan_batch


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {
                "mode": ScalingMode.FIXED_GLOBAL_BATCH,
                "world_size": 1,
                "micro_batch_size": 2,
                "global_batch_size": 12,
            },
            BatchPlan(1, 2, 6, 12, 1.0),
        ),
        (
            {
                "mode": ScalingMode.FIXED_GLOBAL_BATCH,
                "world_size": 3,
                "micro_batch_size": 2,
                "global_batch_size": 12,
            },
            BatchPlan(3, 2, 2, 12, 1.0),
        ),
        (
            {
                "mode": ScalingMode.LINEAR_LR,
                "world_size": 4,
                "micro_batch_size": 8,
                "base_world_size": 2,
            },
            BatchPlan(4, 8, 1, 32, 2.0),
        ),
        (
            {
                "mode": ScalingMode.SQRT_LR,
                "world_size": 8,
                "micro_batch_size": 8,
                "accumulation_steps": 2,
                "base_world_size": 2,
            },
            BatchPlan(8, 8, 2, 128, 2.0),
        ),
        (
            {
                "mode": ScalingMode.LINEAR_LR,
                "world_size": 1,
                "micro_batch_size": 8,
                "base_world_size": 4,
            },
            BatchPlan(1, 8, 1, 8, 0.25),
        ),
    ],
    ids=["fixed-1", "fixed-3", "linear-double", "sqrt-quadruple", "linear-shrink"],
)
def test_plan(kwargs: dict[str, object], expected: BatchPlan) -> None:
    assert plan_batch(**kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {
                "mode": ScalingMode.FIXED_GLOBAL_BATCH,
                "world_size": 5,
                "micro_batch_size": 2,
                "global_batch_size": 12,
            },
            "global_batch_size=12 is not divisible by micro_batch_size=2 x world_size=5 = 10",
        ),
        (
            {"mode": ScalingMode.FIXED_GLOBAL_BATCH, "world_size": 1, "micro_batch_size": 2},
            "global_batch_size: required",
        ),
        (
            {"mode": ScalingMode.LINEAR_LR, "world_size": 2, "micro_batch_size": 2},
            "base_world_size: required with mode=linear_lr",
        ),
        (
            {
                "mode": ScalingMode.SQRT_LR,
                "world_size": 0,
                "micro_batch_size": 2,
                "base_world_size": 1,
            },
            "world_size: must be >= 1, got 0",
        ),
    ],
    ids=["not-divisible", "missing-global", "missing-base", "zero-world"],
)
def test_errors_name_the_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(BatchConfigError, match=message):
        plan_batch(**kwargs)  # type: ignore[arg-type]
