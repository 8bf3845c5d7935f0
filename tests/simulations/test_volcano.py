"""Volcano semantics of the simulated scheduler, on small hand-computed cases."""

from __future__ import annotations

import pytest

from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations.cluster_config import QueueSpec
from simulations.state import Status
from simulations.volcano import deserved_shares, queue_usage, real_capability, run_session
from tests.simulations.helpers import make_job, make_sim

A, B = QueueName("a"), QueueName("b")
TWO_QUEUES = (
    QueueSpec(A, weight=1.0, reclaimable=True),
    QueueSpec(B, weight=1.0, reclaimable=True, elastic=False),
)


@pytest.mark.parametrize(
    ("jobs", "gpus", "expected_pods"),
    [
        ([make_job("x", replicas=3)], 4, {"x": 3}),
        ([make_job("x", replicas=5)], 4, {"x": 0}),  # gang of 5 never fits 4 GPUs
        ([make_job("x", replicas=3), make_job("y", replicas=2)], 4, {"x": 3, "y": 0}),
        ([make_job("x", replicas=3), make_job("y", replicas=1)], 4, {"x": 3, "y": 1}),
        # backfill: the big job does not block the small one behind it
        ([make_job("x", replicas=6), make_job("y", replicas=2)], 4, {"x": 0, "y": 2}),
    ],
    ids=["fits", "gang-too-big", "second-waits", "both-fit", "backfill"],
)
def test_gang_start(jobs: list, gpus: int, expected_pods: dict[str, int]) -> None:
    sim = make_sim(jobs, gpus=gpus)
    run_session(sim)
    assert {k.split("/")[1]: len(j.pods) for k, j in sim.jobs.items()} == expected_pods


def test_elastic_pods_are_placed_after_every_gang() -> None:
    # x asks 4 (min 1), y asks 2 (min 2): y's gang goes before x's elastic pods.
    sim = make_sim([make_job("x", replicas=4, min_r=1, max_r=4), make_job("y", replicas=2)])
    run_session(sim)
    assert len(sim.jobs[JobKey("ns/y")].pods) == 2
    assert len(sim.jobs[JobKey("ns/x")].pods) == 2


def test_deserved_water_fills_by_weight_and_request() -> None:
    sim = make_sim(
        [make_job("x", replicas=8, queue="a"), make_job("y", queue="b", replicas=1)],
        nodes=2,
        queues=TWO_QUEUES,
    )
    _, request = queue_usage(sim)
    deserved = deserved_shares(sim, request, real_capability(sim))
    assert deserved == {A: 7.0, B: 1.0}  # b only asks 1; a gets the rest of 8


def test_guarantee_is_kept_out_of_other_queues_capability() -> None:
    queues = (QueueSpec(A), QueueSpec(B, guarantee_gpus=3.0, elastic=False))
    sim = make_sim([make_job("x", replicas=1)], nodes=2, queues=queues)
    assert real_capability(sim) == {A: 5.0, B: 8.0}


@pytest.mark.parametrize(
    ("min_r", "reclaimable", "expected_x_pods", "expected_kills"),
    [(1, True, 2, 1), (3, True, 4, 0), (1, False, 4, 0)],
    ids=["kills-elastic-pods", "never-below-min", "not-reclaimable"],
)
def test_reclaim(min_r: int, reclaimable: bool, expected_x_pods: int, expected_kills: int) -> None:
    queues = (QueueSpec(A, reclaimable=reclaimable), QueueSpec(B, elastic=False))
    x = make_job("x", replicas=4, min_r=min_r, max_r=4, queue="a")
    sim = make_sim([x], queues=queues, overcommit=2.0)  # let y through the enqueue gate
    run_session(sim)
    assert len(sim.jobs[JobKey("ns/x")].pods) == 4
    y = make_job("y", replicas=2, queue="b")
    sim.jobs[y.key] = job = type(sim.jobs[x.key])(y, queue=B, restart_cost_s=0.0)
    sim.order.append(job)
    sim.submit(job)
    run_session(sim)
    assert len(sim.jobs[x.key].pods) == expected_x_pods
    assert sim.jobs[x.key].kills == expected_kills
    assert (job.status is Status.RUNNING) == (expected_kills > 0)


def test_overcommit_gate_keeps_a_full_cluster_from_admitting() -> None:
    sim = make_sim([make_job("x", replicas=4), make_job("y", replicas=2)], overcommit=1.2)
    run_session(sim)
    assert sim.jobs[JobKey("ns/y")].status is Status.PENDING  # 4 used + 2 > 1.2 x 4
