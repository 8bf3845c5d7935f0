"""tide's ``tiresias`` baseline follows Pollux's Tiresias: two queues, a 16 GPU-hour threshold,
arrival order in the high queue, demotion order in the low one, no promotion back."""

from __future__ import annotations

import pytest

from scheduler_policy.vocabulary.state import JobPhase, JobState, QueueName, QueueState
from simulations.baselines import LOW_QUEUE_OFFSET_S, TiresiasBaseline
from tests.scheduler_policy.builders import make_job, make_observation

HOUR_S = 3600.0


def rigid(name: str, gpus: int, *, phase: JobPhase = JobPhase.RUNNING) -> JobState:
    """A rigid job of ``gpus`` one-GPU replicas."""
    return make_job(name, min_replicas=gpus, max_replicas=gpus, current=gpus, phase=phase)


def queue(allocated: float) -> QueueState:
    return QueueState(
        name=QueueName("q"),
        capability_gpus=None,
        deserved_gpus=None,
        guarantee_gpus=0.0,
        allocated_gpus=allocated,
        pending_nonelastic_gpus=0.0,
    )


@pytest.mark.parametrize(
    ("gpus", "ran_s", "demoted"),
    [
        (4, 15 * 60, False),  # 1 GPU-hour: the old threshold demoted here
        (4, 4 * HOUR_S - 60, False),  # 15.9 GPU-hours
        (4, 4 * HOUR_S, True),  # 16 GPU-hours exactly
        (16, HOUR_S, True),  # 16 GPUs for an hour
        (1, 15 * HOUR_S, False),
    ],
    ids=["one-gpu-hour", "just-below", "sixteen-gpu-hours", "wide-job", "narrow-job"],
)
def test_demotion_at_sixteen_gpu_hours(gpus: int, ran_s: float, demoted: bool) -> None:
    tiresias = TiresiasBaseline()
    job = rigid("a", gpus)
    tiresias.decide(make_observation(job, queues=(queue(gpus),), free=0.0, now_s=0.0), now_s=0.0)
    plan = tiresias.decide(
        make_observation(job, queues=(queue(gpus),), free=0.0, now_s=ran_s), now_s=ran_s
    )
    expected = LOW_QUEUE_OFFSET_S + ran_s if demoted else 0.0
    assert plan.priority[job.key] == expected


def test_low_queue_follows_demotion_order_and_a_newcomer_preempts() -> None:
    tiresias = TiresiasBaseline()
    first, second = rigid("first", 2), rigid("second", 8)  # first arrived first
    obs = make_observation(first, second, queues=(queue(10),), free=0.0, now_s=0.0)
    tiresias.decide(obs, now_s=0.0)
    # second reaches 16 GPU-hours at 2 h, first (2 GPUs) at 8 h.
    for at_s in (2 * HOUR_S, 8 * HOUR_S):
        obs = make_observation(first, second, queues=(queue(10),), free=0.0, now_s=at_s)
        assert tiresias.decide(obs, now_s=at_s).suspend == frozenset()
    newcomer = rigid("new", 8, phase=JobPhase.PENDING)
    at_s = 8 * HOUR_S + 60
    obs = make_observation(first, second, newcomer, queues=(queue(10),), free=0.0, now_s=at_s)
    plan = tiresias.decide(obs, now_s=at_s)
    order = sorted(plan.priority, key=lambda k: plan.priority[k])
    assert order == [newcomer.key, second.key, first.key]
    # The newcomer takes 8 of the 10 GPUs; second (8) no longer fits and is preempted, first
    # (2) still fits behind it and keeps running.
    assert plan.suspend == frozenset({second.key})


def test_a_demoted_job_is_not_promoted_back_however_long_it_waits() -> None:
    tiresias = TiresiasBaseline()
    job = rigid("a", 16)
    tiresias.decide(make_observation(job, queues=(queue(16),), free=0.0, now_s=0.0), now_s=0.0)
    tiresias.decide(
        make_observation(job, queues=(queue(16),), free=0.0, now_s=HOUR_S), now_s=HOUR_S
    )
    waiting = rigid("a", 16, phase=JobPhase.PENDING)
    plan = tiresias.decide(
        make_observation(waiting, queues=(queue(0),), free=0.0, now_s=100 * HOUR_S),
        now_s=100 * HOUR_S,
    )
    assert plan.priority[waiting.key] == LOW_QUEUE_OFFSET_S + HOUR_S
