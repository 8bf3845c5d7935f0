"""Per-job freshness: a job whose own metrics are stale holds, the others proceed.

Each stale scenario sits next to the same cluster with fresh metrics, so that the table shows
what the staleness changes (and a test of it could not pass with the staleness ignored).
"""

from __future__ import annotations

import pytest

from scheduler_policy.decision.pipeline import decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.vocabulary.state import Reason
from tests.scheduler_policy.builders import make_job, make_observation, make_policy, make_queue

STALE = "throughput series of ns/a absent for 300 s"


def targets(observation, policy):
    plan = decide(observation, policy, fits=ModelCache().fit(observation, policy))
    return {d.job.removeprefix("ns/"): (d.target_replicas, d.reason) for d in plan.decisions}


def two_jobs(stale_a: str | None, *, free: float = 4):
    return make_observation(
        make_job("a", current=2, stale=stale_a), make_job("b", current=2), free=free
    )


def trade(*, stale: str | None, who: str):
    # linear's 2nd replica waits for a GPU (+100%); poor's 3rd gives +17%: a trade, when fresh.
    return make_observation(
        make_job("linear", current=2, scheduled=1, sigma=0.0,
                 stale=stale if who == "linear" else None),
        make_job("poor", current=3, sigma=0.4, stale=stale if who == "poor" else None),
        queues=(make_queue(capability=4),),
        free=4,
    )  # fmt: skip


def pending_gang(stale: str | None):
    return make_observation(
        make_job("a", current=6, stale=stale), queues=(make_queue(capability=8, pending=4),), free=0
    )


def slowing(stale: str | None):
    return make_observation(
        make_job("a", current=8, sizes=(1, 2, 4, 8), sigma=0.1, kappa=0.05, stale=stale), free=0
    )


SCENARIOS = {
    "fresh-both-grow": (
        two_jobs(None), {"a": (4, Reason.SCALE_UP_FOR_IDLE_GPUS),
                         "b": (4, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "stale-job-holds-while-a-fresh-job-in-its-queue-takes-the-idle-gpus": (
        two_jobs(STALE), {"a": (2, Reason.HOLD_METRICS_STALE),
                          "b": (6, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "fresh-shrinks-for-the-pending-gang": (
        pending_gang(None), {"a": (4, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
    "stale-job-still-shrinks-to-its-budget-for-the-pending-gang": (
        pending_gang(STALE), {"a": (4, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
    "fresh-giver-shrinks-for-better-use": (
        trade(stale=None, who="poor"), {"linear": (2, Reason.SCALE_UP_FOR_IDLE_GPUS),
                                        "poor": (2, Reason.SHRINK_FOR_BETTER_USE)},
    ),
    "stale-giver-is-never-shrunk-for-better-use": (
        trade(stale=STALE, who="poor"), {"linear": (1, Reason.WITHDRAW_UNPLACED),
                                         "poor": (3, Reason.HOLD_METRICS_STALE)},
    ),
    "stale-taker-takes-no-replica-from-another-job": (
        trade(stale=STALE, who="linear"), {"linear": (1, Reason.WITHDRAW_UNPLACED),
                                           "poor": (3, Reason.AT_TARGET)},
    ),
    "fresh-shrinks-when-replicas-slow-it-down": (
        slowing(None), {"a": (4, Reason.SHRINK_LOW_EFFICIENCY)},
    ),
    "stale-job-is-not-shrunk-for-low-efficiency": (
        slowing(STALE), {"a": (8, Reason.HOLD_METRICS_STALE)},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("observation", "expected"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenario(observation, expected):
    assert targets(observation, make_policy()) == expected


def test_the_hold_names_the_job_and_what_was_stale():
    observation, policy = two_jobs(STALE), make_policy()
    plan = decide(observation, policy, fits=ModelCache().fit(observation, policy))
    (held,) = [d for d in plan.decisions if d.reason is Reason.HOLD_METRICS_STALE]
    assert held.job == "ns/a"
    assert "ns/a" in held.message and STALE in held.message
    # Its memory-only write, if any, says the same.
    assert all(c.reason is Reason.HOLD_METRICS_STALE for c in plan.changes if c.job == "ns/a")


def test_a_stale_job_counts_its_held_gpus_in_its_queues_budget():
    # Capability 6: a holds 4 whatever its metrics say, so b may grow by 0 only.
    observation = make_observation(
        make_job("a", current=4, stale=STALE), make_job("b", current=2),
        queues=(make_queue(capability=6),), free=8,
    )  # fmt: skip
    assert targets(observation, make_policy()) == {
        "a": (4, Reason.HOLD_METRICS_STALE),
        "b": (2, Reason.AT_TARGET),
    }


def test_cluster_level_staleness_still_holds_everyone():
    observation = make_observation(make_job("a", current=6), make_job("b", current=2),
                                   queues=(make_queue(capability=8, pending=4),), free=0,
                                   fresh=False)  # fmt: skip
    assert {r for _, r in targets(observation, make_policy()).values()} == {
        Reason.HOLD_METRICS_STALE
    }
