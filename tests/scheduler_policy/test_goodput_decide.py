"""The allocator ranks an adaptive-batch job's replicas by its goodput, and no other job changes."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_policy.decision.pipeline import decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.vocabulary.state import BatchBounds, JobState, Reason, StepTimes
from tests.scheduler_policy.builders import make_job, make_observation, make_policy
from tests.scheduler_policy.goodput_builders import BOUNDS, statistics

# 64 to 128 samples, micro batches of 16 to 64, no accumulation: 9 workers or more cannot
# take 16 samples each within 128, so the worker would refuse to run there.
NARROW = BatchBounds(
    initial_batch_size=64, max_batch_size=128, local_batch_min=16, local_batch_max=64
)


def adaptive(job: JobState, *, bounds=BOUNDS, shapes=(), **stats) -> JobState:
    return dataclasses.replace(
        job, batch_bounds=bounds, batch_statistics=statistics(*shapes, **stats)
    )


def plan_of(*jobs: JobState, free: float = 8.0, **policy):
    observation = make_observation(*jobs, free=free)
    fitted = make_policy(**policy)
    return decide(observation, fitted, fits=ModelCache().fit(observation, fitted))


def by_job(plan):
    return {str(d.job): d for d in plan.decisions}


def test_an_adaptive_job_stops_where_its_workers_cannot_split_the_batch() -> None:
    job = make_job("a", current=8, max_replicas=16, sizes=(1, 2, 4, 8))
    grown = by_job(plan_of(job, free=8.0))["ns/a"]
    narrow = adaptive(job, bounds=NARROW, shapes=((1, 4, 29), (1, 8, 16)), batch_size=128)
    kept = by_job(plan_of(narrow, free=8.0))["ns/a"]
    assert grown.target_replicas > 8  # its throughput curve alone says grow
    assert kept.target_replicas == 8
    assert "goodput" in kept.message


@pytest.mark.parametrize(
    ("remaining_progress", "reason"),
    [(50.0, Reason.RESTART_COST_EXCEEDS_GAIN), (1e7, Reason.SCALE_UP_FOR_IDLE_GPUS)],
    ids=["about-to-finish", "long-run-left"],
)
def test_remaining_time_is_remaining_progress_over_goodput(remaining_progress, reason) -> None:
    # G is tens of iterations per second here: 50 iterations left finish within seconds, which
    # a 60 s restart never pays for; ten million do.
    job = adaptive(
        make_job("a", current=4, max_replicas=8, restart_cost_s=60.0),
        progress=0.0,
        planned_progress=remaining_progress,
    )
    (decision,) = plan_of(job, free=4.0).decisions
    assert decision.reason is reason
    assert decision.target_replicas == (4 if reason is Reason.RESTART_COST_EXCEEDS_GAIN else 8)


def _strip(job: JobState) -> JobState:
    return dataclasses.replace(job, batch_bounds=None, batch_statistics=None)


@pytest.mark.parametrize(
    "job",
    [
        dataclasses.replace(make_job("a", current=3), batch_statistics=statistics()),
        adaptive(make_job("a", current=3), grad_sqr=None),
        adaptive(make_job("a", current=3), grad_var=float("nan")),
        dataclasses.replace(
            adaptive(make_job("a", current=3)),
            batch_statistics=dataclasses.replace(
                statistics(),
                step_times=(StepTimes(nodes=1, replicas=3, local_batch_size=8, optim_step_s=0.0),),
            ),
        ),
    ],
    ids=["statistics-without-bounds", "no-grad-sqr", "nan-grad-var", "no-usable-step-time"],
)
def test_a_job_that_does_not_adapt_decides_exactly_as_without_goodput(job) -> None:
    other = make_job("b", current=2, remaining_samples=1e6)
    with_code = plan_of(job, other, free=6.0)
    without = plan_of(_strip(job), other, free=6.0)
    assert [(d.job, d.target_replicas, d.reason, d.message) for d in with_code.decisions] == [
        (d.job, d.target_replicas, d.reason, d.message) for d in without.decisions
    ]
    assert not any("goodput" in d.message for d in with_code.decisions)


def test_the_explanation_says_when_a_curve_is_goodput() -> None:
    plan = by_job(
        plan_of(adaptive(make_job("a", current=4, max_replicas=8)), make_job("b", current=2))
    )
    assert "goodput curve: progress per second at the batch its workers would take" in (
        plan["ns/a"].message
    )
    assert plan["ns/a"].message.endswith(f"at {plan['ns/a'].target_replicas} replicas)")
    assert "goodput" not in plan["ns/b"].message


def test_the_step_model_is_refitted_only_for_a_new_shape() -> None:
    cache = ModelCache()
    policy = make_policy()
    job = adaptive(make_job("a", current=4))
    cache.fit(make_observation(job), policy)
    cache.fit(make_observation(job), policy)
    assert cache.goodput.fits == 1
    moved = adaptive(make_job("a", current=4), shapes=((1, 2, 32), (1, 4, 32), (1, 6, 32)))
    cache.fit(make_observation(moved), policy)
    assert cache.goodput.fits == 2


def test_progress_moves_the_remaining_work_not_the_table() -> None:
    cache, policy = ModelCache(), make_policy()
    first = adaptive(make_job("a", current=4), progress=100.0, planned_progress=1000.0)
    later = adaptive(make_job("a", current=4), progress=400.0, planned_progress=1000.0)
    noisier = adaptive(make_job("a", current=4), progress=400.0, grad_var=500.0)
    curves = [
        cache.fit(make_observation(job), policy).curves[job.key].goodput
        for job in (first, later, noisier)
    ]
    assert [c.remaining_progress for c in curves] == [900.0, 600.0, 9600.0]
    assert curves[1].progress_per_s is curves[0].progress_per_s  # not rebuilt for progress
    assert curves[2].progress_per_s != curves[1].progress_per_s  # rebuilt for the statistics
