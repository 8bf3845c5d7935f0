"""ElasticSampler: every sample once per epoch across any sequence of world sizes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_runtime import ConfigError, ElasticSampler, ScalingMode, plan_batch
from worker_runtime.sampler import ElasticBatchSampler


def run_epoch(size: int, global_batch: int, worlds: list[int], *, shuffle: bool) -> list[int]:
    """Consume one epoch, switching world size after each listed step (last size repeats)."""
    seen: list[int] = []
    consumed, step = 0, 0
    while True:
        world = worlds[min(step, len(worlds) - 1)]
        ranks = [
            ElasticSampler(
                range(size),
                rank=r,
                world_size=world,
                seed=3,
                shuffle=shuffle,
                global_batch_size=global_batch,
                drop_last=True,
            )
            for r in range(world)
        ]
        for s in ranks:
            s.set_position(epoch=1, consumed_samples=consumed)
        if ranks[0].remaining_samples() == 0:
            return seen
        per_rank = global_batch // world
        for s in ranks:  # one global step: each rank takes its first per_rank indices
            seen += list(s)[:per_rank]
        consumed += global_batch
        step += 1


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 200),
    per_world=st.sampled_from([1, 2, 3]),
    worlds=st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=30),
    shuffle=st.booleans(),
)
def test_every_sample_once_per_epoch_for_any_world_sequence(
    size: int, per_world: int, worlds: list[int], shuffle: bool
) -> None:
    global_batch = 12 * per_world  # divisible by every world size drawn
    seen = run_epoch(size, global_batch, worlds, shuffle=shuffle)
    kept = size - size % global_batch
    assert len(seen) == len(set(seen)) == kept
    order = ElasticSampler(range(size), rank=0, world_size=1, seed=3, shuffle=shuffle)
    order.set_position(epoch=1, consumed_samples=0)
    assert sorted(seen) == sorted(order.order()[:kept])


def run_epoch_uneven(size: int, micro: int, micro_batches: int, worlds: list[int]) -> list[int]:
    """One epoch in micro batches, each rank taking its plan's share of every step."""
    global_batch = micro * micro_batches
    seen: list[int] = []
    consumed, step = 0, 0
    while True:
        world = worlds[min(step, len(worlds) - 1)]
        plan = plan_batch(
            mode=ScalingMode.FIXED_GLOBAL_BATCH,
            world_size=world,
            micro_batch_size=micro,
            global_batch_size=global_batch,
        )
        ranks = [
            ElasticSampler(
                range(size),
                rank=r,
                world_size=world,
                seed=3,
                global_batch_size=global_batch,
                micro_batch_size=micro,
                drop_last=True,
            )
            for r in range(world)
        ]
        for s in ranks:
            s.set_position(epoch=1, consumed_samples=consumed)
        if ranks[0].remaining_samples() == 0:
            return seen
        for r, s in enumerate(ranks):  # one global step: each rank takes its share
            mine = list(s)
            assert len(mine) == len(s)
            seen += mine[: plan.samples_of(r)]
        consumed += global_batch
        step += 1


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 300),
    micro=st.integers(1, 4),
    micro_batches=st.integers(8, 16),
    worlds=st.lists(st.integers(1, 8), min_size=1, max_size=30),
)
def test_every_sample_once_per_epoch_with_uneven_shares(
    size: int, micro: int, micro_batches: int, worlds: list[int]
) -> None:
    # World sizes 1 to 8 against 8 to 16 micro batches a step: most splits are uneven.
    seen = run_epoch_uneven(size, micro, micro_batches, worlds)
    global_batch = micro * micro_batches
    kept = size - size % global_batch
    assert len(seen) == len(set(seen)) == kept
    order = ElasticSampler(range(size), rank=0, world_size=1, seed=3)
    order.set_position(epoch=1, consumed_samples=0)
    assert sorted(seen) == sorted(order.order()[:kept])


def test_a_step_of_micro_batches_is_dealt_round_robin() -> None:
    # 12 samples in micro batches of 2 over 5 ranks: micro batch j goes to rank j % 5.
    got = []
    for rank in range(5):
        s = ElasticSampler(
            range(12),
            rank=rank,
            world_size=5,
            shuffle=False,
            global_batch_size=12,
            micro_batch_size=2,
            drop_last=True,
        )
        got.append(list(s))
    assert got == [[0, 1, 10, 11], [2, 3], [4, 5], [6, 7], [8, 9]]


@settings(max_examples=100, deadline=None)
@given(
    size=st.integers(0, 100),
    world=st.integers(1, 5),
    consumed=st.integers(0, 100),
    micro=st.sampled_from([None, 1, 3]),
)
def test_ranks_partition_the_rest_without_drop_last(
    size: int, world: int, consumed: int, micro: int | None
) -> None:
    consumed = min(consumed, size)
    batch = None if micro is None else micro * 6  # 6 micro batches: at least one per rank
    samplers = [
        ElasticSampler(
            range(size), rank=r, world_size=world, global_batch_size=batch, micro_batch_size=micro
        )
        for r in range(world)
    ]
    for s in samplers:
        s.set_position(epoch=0, consumed_samples=consumed)
    got = [i for s in samplers for i in s]
    assert sorted(got) == sorted(samplers[0].order()[consumed:])
    assert [len(s) for s in samplers] == [len(list(s)) for s in samplers]


@pytest.mark.parametrize(
    ("shuffle", "epochs_differ"), [(True, True), (False, False)], ids=["shuffled", "identity"]
)
def test_epoch_selects_the_permutation(shuffle: bool, epochs_differ: bool) -> None:
    s = ElasticSampler(range(50), rank=0, world_size=1, shuffle=shuffle, seed=1)
    first = s.order()
    s.set_position(epoch=1, consumed_samples=0)
    assert (s.order() != first) is epochs_differ
    assert sorted(s.order()) == list(range(50))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 2, "world_size": 2}, "rank: must be in [0, world_size=2), got 2"),
        ({"rank": 0, "world_size": 0}, "world_size: must be >= 1, got 0"),
        ({"rank": 0, "world_size": 1, "drop_last": True}, "global_batch_size: required"),
        ({"rank": 0, "world_size": 3, "global_batch_size": 8}, "global_batch_size=8"),
        ({"rank": 0, "world_size": 1, "micro_batch_size": 2}, "global_batch_size: required"),
        (
            {"rank": 0, "world_size": 4, "global_batch_size": 6, "micro_batch_size": 2},
            "world_size=4 exceeds the 3 micro batches of a step",
        ),
        (
            {"rank": 0, "world_size": 2, "global_batch_size": 6, "micro_batch_size": 4},
            "global_batch_size=6 is not a multiple of micro_batch_size=4",
        ),
    ],
    ids=[
        "rank-out-of-range",
        "zero-world",
        "drop-last-without-batch",
        "batch-not-divisible",
        "micro-without-global",
        "more-ranks-than-micro-batches",
        "not-whole-micro-batches",
    ],
)
def test_invalid_arguments_are_named(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ElasticSampler(range(10), **kwargs)  # type: ignore[arg-type]


def test_position_beyond_dataset_is_refused() -> None:
    s = ElasticSampler(range(10), rank=0, world_size=1)
    with pytest.raises(ConfigError, match="consumed_samples: must be in \\[0, 10\\], got 11"):
        s.set_position(epoch=0, consumed_samples=11)


def test_a_batch_changed_mid_epoch_continues_from_the_same_sample() -> None:
    sampler = ElasticSampler(
        range(48), rank=1, world_size=2, seed=5, global_batch_size=8, micro_batch_size=4,
        drop_last=True,
    )  # fmt: skip
    batches = ElasticBatchSampler(sampler)
    order = sampler.order()
    sampler.set_position(epoch=0, consumed_samples=16)
    sampler.set_batch(global_batch_size=16, micro_batch_size=8)
    # Rank 1 takes micro batch 1 of each 16-sample step from sample 16 on: 24-32, 40-48.
    assert list(batches) == [order[24:32], order[40:48]]
    assert len(batches) == 2


def test_set_batch_refuses_a_batch_that_does_not_split() -> None:
    sampler = ElasticSampler(
        range(48), rank=0, world_size=2, global_batch_size=8, micro_batch_size=4
    )
    with pytest.raises(ConfigError, match="not a multiple of micro_batch_size"):
        sampler.set_batch(global_batch_size=12, micro_batch_size=8)
