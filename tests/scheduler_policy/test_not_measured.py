"""A job without a throughput measurement never grows, but still shrinks to its queue's budget.

Each unmeasured scenario sits next to the same cluster with the job measured, so that the table
shows what the missing measurement changes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.decision.pipeline import decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.vocabulary.state import Reason
from tests.scheduler_policy.builders import make_job, make_observation, make_policy, make_queue

NEVER = ()  # no throughput point at all
STALE = "throughput of ns/a: no samples; newest sample 900 s old"


def plan_of(observation):
    policy = make_policy()
    return decide(observation, policy, fits=ModelCache().fit(observation, policy))


def targets(observation):
    return {
        d.job.removeprefix("ns/"): (d.target_replicas, d.reason)
        for d in plan_of(observation).decisions
    }


def idle(sizes_a, *, stale: str | None = None):
    return make_observation(
        make_job("a", current=2, sizes=sizes_a, stale=stale), make_job("b", current=2), free=4
    )


def alone(sizes_a):
    return make_observation(make_job("a", current=2, sizes=sizes_a), free=6)


def pending_gang(sizes_a):
    return make_observation(
        make_job("a", current=6, sizes=sizes_a),
        queues=(make_queue(capability=8, pending=4),),
        free=0,
    )


SCENARIOS = {
    "measured-grows-into-idle-gpus": (
        alone((1, 2)), {"a": (8, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "never-measured-holds-with-idle-gpus": (
        alone(NEVER), {"a": (2, Reason.HOLD_NOT_MEASURED)},
    ),
    "measured-both-grow": (
        idle((1, 2)), {"a": (4, Reason.SCALE_UP_FOR_IDLE_GPUS),
                       "b": (4, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "never-measured-holds-while-a-measured-job-takes-the-idle-gpus": (
        idle(NEVER), {"a": (2, Reason.HOLD_NOT_MEASURED),
                      "b": (6, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "measured-long-ago-and-stale-holds-as-stale": (
        idle((1, 2), stale=STALE), {"a": (2, Reason.HOLD_METRICS_STALE),
                                    "b": (6, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "measured-shrinks-for-the-pending-gang": (
        pending_gang((1, 2, 4)), {"a": (4, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
    "never-measured-still-shrinks-to-its-budget-for-the-pending-gang": (
        pending_gang(NEVER), {"a": (4, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("observation", "expected"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenario(observation, expected):
    assert targets(observation) == expected


def test_the_hold_names_the_job_and_says_it_waits_for_a_measurement():
    plan = plan_of(idle(NEVER))
    (held,) = [d for d in plan.decisions if d.reason is Reason.HOLD_NOT_MEASURED]
    assert held.job == "ns/a"
    assert "ns/a" in held.message and "no throughput measured yet" in held.message
    assert all(c.reason is Reason.HOLD_NOT_MEASURED for c in plan.changes if c.job == "ns/a")


@settings(max_examples=60, deadline=None)
@given(
    current=st.integers(1, 8),
    free=st.integers(0, 16),
    capability=st.integers(1, 16),
    pending=st.integers(0, 8),
    measured_neighbour=st.booleans(),
)
def test_a_job_never_measured_never_grows(current, free, capability, pending, measured_neighbour):
    jobs = [make_job("a", current=current, sizes=NEVER)]
    if measured_neighbour:
        jobs.append(make_job("b", current=1))
    observation = make_observation(
        *jobs, queues=(make_queue(capability=capability, pending=pending),), free=free
    )
    (decision,) = [d for d in plan_of(observation).decisions if d.job == "ns/a"]
    assert decision.target_replicas <= current
