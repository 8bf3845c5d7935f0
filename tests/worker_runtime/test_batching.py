"""Batch and learning-rate rules across world sizes, uneven accumulation included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_runtime import BatchConfigError, BatchPlan, ScalingMode, plan_batch
from worker_runtime.batching import step_micro_batches


def fixed(world_size: int, *, micro: int = 8, global_batch: int = 96) -> BatchPlan:
    return plan_batch(
        mode=ScalingMode.FIXED_GLOBAL_BATCH,
        world_size=world_size,
        micro_batch_size=micro,
        global_batch_size=global_batch,
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"mode": ScalingMode.FIXED_GLOBAL_BATCH, "world_size": 1, "micro_batch_size": 2,
             "global_batch_size": 12},
            BatchPlan(world_size=1, micro_batch_size=2, accumulation_steps=6,
                      global_batch_size=12, lr_scale=1.0),
        ),
        (
            {"mode": ScalingMode.FIXED_GLOBAL_BATCH, "world_size": 3, "micro_batch_size": 2,
             "global_batch_size": 12},
            BatchPlan(world_size=3, micro_batch_size=2, accumulation_steps=2,
                      global_batch_size=12, lr_scale=1.0),
        ),
        (
            {"mode": ScalingMode.FIXED_GLOBAL_BATCH, "world_size": 5, "micro_batch_size": 8,
             "global_batch_size": 96},
            BatchPlan(world_size=5, micro_batch_size=8, accumulation_steps=3,
                      global_batch_size=96, lr_scale=1.0),
        ),
        (
            {"mode": ScalingMode.LINEAR_LR, "world_size": 4, "micro_batch_size": 8,
             "base_world_size": 2},
            BatchPlan(world_size=4, micro_batch_size=8, accumulation_steps=1,
                      global_batch_size=32, lr_scale=2.0),
        ),
        (
            {"mode": ScalingMode.SQRT_LR, "world_size": 8, "micro_batch_size": 8,
             "accumulation_steps": 2, "base_world_size": 2},
            BatchPlan(world_size=8, micro_batch_size=8, accumulation_steps=2,
                      global_batch_size=128, lr_scale=2.0),
        ),
        (
            {"mode": ScalingMode.LINEAR_LR, "world_size": 1, "micro_batch_size": 8,
             "base_world_size": 4},
            BatchPlan(world_size=1, micro_batch_size=8, accumulation_steps=1,
                      global_batch_size=8, lr_scale=0.25),
        ),
    ],
    ids=["fixed-1", "fixed-3", "fixed-5-uneven", "linear-double", "sqrt-quadruple",
         "linear-shrink"],
)  # fmt: skip
def test_plan(kwargs: dict[str, object], expected: BatchPlan) -> None:
    assert plan_batch(**kwargs) == expected  # type: ignore[arg-type]


# The example job's batch (96 samples, micro batches of 8 = 12 per step) at world sizes 1 to 8:
# each rank's micro batches per step; ranks below 12 % world take one more.
@pytest.mark.parametrize(
    ("world", "per_rank"),
    [
        (1, [12]),
        (2, [6, 6]),
        (3, [4, 4, 4]),
        (4, [3, 3, 3, 3]),
        (5, [3, 3, 2, 2, 2]),
        (6, [2, 2, 2, 2, 2, 2]),
        (7, [2, 2, 2, 2, 2, 1, 1]),
        (8, [2, 2, 2, 2, 1, 1, 1, 1]),
    ],
    ids=[f"world-{w}" for w in range(1, 9)],
)
def test_every_world_size_from_1_to_8_splits_the_example_batch_exactly(
    world: int, per_rank: list[int]
) -> None:
    plan = fixed(world)
    assert [plan.accumulation_steps_of(r) for r in range(world)] == per_rank
    assert plan.accumulation_steps == per_rank[0]
    assert sum(plan.samples_of(r) for r in range(world)) == 96
    assert plan.even is (len(set(per_rank)) == 1)
    # Every micro batch of a step goes to exactly one rank.
    owned = sorted(j for r in range(world) for j in step_micro_batches(
        rank=r, world_size=world, micro_batches_per_step=12))  # fmt: skip
    assert owned == list(range(12))
    # Each micro batch weighs 1/12 in the DDP-averaged gradient, on every rank.
    assert plan.loss_scale / world == pytest.approx(1 / 12)


@settings(max_examples=200, deadline=None)
@given(micro=st.integers(1, 16), micro_batches=st.integers(1, 40), world=st.integers(1, 40))
def test_shares_cover_the_global_batch_and_differ_by_at_most_one(
    micro: int, micro_batches: int, world: int
) -> None:
    if world > micro_batches:
        with pytest.raises(BatchConfigError, match=f"world_size={world} exceeds"):
            fixed(world, micro=micro, global_batch=micro * micro_batches)
        return
    plan = fixed(world, micro=micro, global_batch=micro * micro_batches)
    shares = [plan.accumulation_steps_of(r) for r in range(world)]
    assert sum(shares) == micro_batches
    assert max(shares) - min(shares) <= 1
    assert min(shares) >= 1
    assert shares == sorted(shares, reverse=True)


def ddp_gradient(world: int, x: torch.Tensor, y: torch.Tensor, *, micro: int) -> torch.Tensor:
    """The gradient DDP would give: each rank's scaled micro-batch losses, averaged over ranks."""
    plan = fixed(world, micro=micro, global_batch=len(x))
    weight = torch.zeros(x.shape[1], 1, dtype=torch.float64)
    per_rank = []
    for rank in range(world):
        w = weight.clone().requires_grad_(True)
        for j in step_micro_batches(
            rank=rank, world_size=world, micro_batches_per_step=plan.micro_batches_per_step
        ):
            xb, yb = x[j * micro : (j + 1) * micro], y[j * micro : (j + 1) * micro]
            (torch.nn.functional.mse_loss(xb @ w, yb) * plan.loss_scale).backward()
        assert w.grad is not None
        per_rank.append(w.grad)
    return torch.stack(per_rank).mean(0)


@pytest.mark.parametrize("world", range(1, 9), ids=[f"world-{w}" for w in range(1, 9)])
def test_the_averaged_gradient_is_the_global_batch_gradient(world: int) -> None:
    gen = torch.Generator().manual_seed(world)
    x = torch.randn(96, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(96, 1, generator=gen, dtype=torch.float64)
    w = torch.zeros(4, 1, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.mse_loss(x @ w, y).backward()
    assert w.grad is not None
    torch.testing.assert_close(ddp_gradient(world, x, y, micro=8), w.grad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"mode": ScalingMode.FIXED_GLOBAL_BATCH, "world_size": 13, "micro_batch_size": 8,
             "global_batch_size": 96},
            "world_size=13 exceeds the 12 micro batches of a step (global_batch_size=96 / "
            "micro_batch_size=8)",
        ),
        (
            {"mode": ScalingMode.FIXED_GLOBAL_BATCH, "world_size": 2, "micro_batch_size": 5,
             "global_batch_size": 12},
            "global_batch_size=12 is not a multiple of micro_batch_size=5",
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
            {"mode": ScalingMode.SQRT_LR, "world_size": 0, "micro_batch_size": 2,
             "base_world_size": 1},
            "world_size: must be >= 1, got 0",
        ),
    ],
    ids=["more-workers-than-micro-batches", "not-whole-micro-batches", "missing-global",
         "missing-base", "zero-world"],
)  # fmt: skip
def test_errors_name_the_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(BatchConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_batch(**kwargs)  # type: ignore[arg-type]


def test_a_rank_outside_the_plan_is_named() -> None:
    with pytest.raises(BatchConfigError, match=r"rank: must be in \[0, world_size=5\), got 5"):
        fixed(5).accumulation_steps_of(5)
