"""Progress, restart cost and lost work."""

from __future__ import annotations

import random

import pytest

from scheduler_policy.vocabulary.state import JobKey
from simulations.controllers import make_controller
from simulations.faults import FaultOptions
from simulations.report import summarize
from simulations.run import RunOptions, simulate
from simulations.state import Nodes
from simulations.volcano import run_session
from simulations.workload import Workload
from tests.simulations.helpers import make_cluster, make_job, make_sim


@pytest.mark.parametrize(
    ("restart_s", "expected_done_s"),
    [(0.0, 50.0), (30.0, 80.0)],
    ids=["no-restart-cost", "30s-start-up"],
)
def test_restart_cost_delays_completion(restart_s: float, expected_done_s: float) -> None:
    sim = make_sim([make_job("x", replicas=2, work=100.0, restart_s=restart_s)])
    run_session(sim)
    t, _ = sim.next_completion()
    assert t == pytest.approx(expected_done_s)
    sim.advance(t)
    assert [j.key for j in sim.finish_due()] == [JobKey("ns/x")]


@pytest.mark.parametrize(
    ("graceful", "expected_done", "expected_killed"),
    [(True, 200.0, 0.0), (False, 200.0 - 4 * 40.0, 4 * 40.0)],
    ids=["graceful-shrink-keeps-work", "abrupt-kill-loses-since-checkpoint"],
)
def test_lost_work(graceful: bool, expected_done: float, expected_killed: float) -> None:
    # 4 replicas at 1 unit/s each, checkpoint every 60 s; at t=100 the last checkpoint was t=60.
    sim = make_sim([make_job("x", replicas=4, min_r=1, max_r=4, work=1e6, ckpt_s=60.0)])
    run_session(sim)
    sim.advance(50.0)
    job = sim.jobs[JobKey("ns/x")]
    assert job.done_units == pytest.approx(200.0)
    sim.advance(100.0)
    sim.remove_pods(job, 2, graceful=graceful)
    assert job.done_units == pytest.approx(400.0 - (0 if graceful else 160.0))
    assert job.killed_units == pytest.approx(expected_killed and 160.0)
    assert job.rescales == 1
    assert len(job.pods) == 2
    del expected_done


def test_shrink_costs_one_restart_without_progress() -> None:
    sim = make_sim([make_job("x", replicas=4, min_r=1, max_r=4, work=1e6, restart_s=30.0)])
    run_session(sim)
    sim.advance(130.0)  # 30 s start-up, then 100 s at 4 units/s
    job = sim.jobs[JobKey("ns/x")]
    assert job.done_units == pytest.approx(400.0)
    sim.resize(job, 2)
    sim.advance(160.0)  # restarting: no progress
    assert job.done_units == pytest.approx(400.0)
    sim.advance(170.0)
    assert job.done_units == pytest.approx(420.0)
    assert job.restart_gpu_s == pytest.approx(2 * 30.0)


def test_node_failure_below_min_requeues_the_job() -> None:
    sim = make_sim([make_job("x", replicas=4, min_r=4, max_r=4, work=1e6)], nodes=1)
    run_session(sim)
    sim.advance(10.0)
    sim.fail_node(0)
    job = sim.jobs[JobKey("ns/x")]
    assert job.pods == [] and job.key not in sim.running
    run_session(sim)
    assert job.pods == []  # no healthy node
    sim.repair_node(0)
    run_session(sim)
    assert len(job.pods) == 4


@pytest.mark.parametrize(
    "bad",
    [
        {"node_mtbf_s": float("nan")},
        {"node_mtbf_s": -1.0},
        {"outage_every_s": float("nan")},
        {"node_repair_s": 0.0},
        {"outage_s": float("inf")},
        {"seed": -1},
    ],
)
def test_fault_options_refuse_what_would_never_end(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="FaultOptions"):
        FaultOptions(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", [{"interval_s": 0.0}, {"quiet_interval_s": -5.0}, {"horizon_s": float("nan")}]
)
def test_run_options_refuse_times_that_would_not_move_on(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RunOptions"):
        RunOptions(**bad)


def test_nodes_keep_their_free_and_healthy_totals_through_any_operations() -> None:
    rng = random.Random(7)
    nodes = Nodes(count=6, gpus_per_node=4)
    placed: list[tuple[int, list[int]]] = []
    for _ in range(3000):
        op = rng.random()
        if op < 0.45:
            gpus = rng.choice((1, 2, 4))
            got = nodes.place(gpus, rng.randint(1, 3))
            if got is not None:
                placed.append((gpus, got))
        elif op < 0.8 and placed:
            gpus, where = placed.pop(rng.randrange(len(placed)))
            nodes.release(gpus, where)
        elif op < 0.9:
            node = rng.randrange(6)
            # As ClusterCore.fail_node does: the node's pods go first, then the node.
            for gpus, where in [p for p in placed if node in p[1]]:
                placed.remove((gpus, where))
                nodes.release(gpus, where)
            nodes.set_down(node)
        elif not all(nodes.up):
            nodes.set_up(rng.choice([i for i, u in enumerate(nodes.up) if not u]))
        assert nodes.total_free == sum(f for f, u in zip(nodes.free, nodes.up, strict=True) if u)
        assert nodes.healthy_gpus == 4 * sum(nodes.up)


def test_gpus_idle_while_a_job_waits_are_counted_and_only_then() -> None:
    # One node of 4 GPUs at 1 unit/s per replica: x holds 3 GPUs for 1,200 s; y (2 GPUs) waits
    # for it with 1 GPU idle, then runs alone for 100 s with 2 idle but nothing waiting.
    jobs = (make_job("x", replicas=3, work=3600.0), make_job("y", replicas=2, work=200.0))
    workload = Workload("t", jobs)
    result = simulate(
        workload=workload,
        cluster=make_cluster(),
        controller=make_controller("static", workload=workload),
        options=RunOptions(),
    )
    assert result.idle_waiting_gpu_s == pytest.approx(1 * 1200.0)
    assert summarize(result).idle_while_waiting_gpu_hours == pytest.approx(1200.0 / 3600.0)
