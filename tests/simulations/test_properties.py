"""Conservation invariants over random workloads, for every policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_policy.vocabulary.state import QueueName
from simulations.api import default_policy_for
from simulations.bounds import alone_jct_bound_h, jct_lower_bound_h
from simulations.cluster_config import ClusterSpec, QueueSpec
from simulations.controllers import make_controller
from simulations.faults import FaultOptions
from simulations.run import RunOptions, simulate
from simulations.state import Status
from simulations.volcano import run_session
from simulations.workload import Workload
from tests.simulations.helpers import make_job

CLUSTER = ClusterSpec(
    name="prop",
    nodes=2,
    gpus_per_node=4,
    queues=(
        QueueSpec(QueueName("a")),
        QueueSpec(QueueName("b"), guarantee_gpus=2, elastic=False, reclaimable=False),
    ),
)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    jobs = []
    for i in range(draw(st.integers(1, 8))):
        elastic = draw(st.booleans())
        replicas = draw(st.integers(1, 4))
        min_r = draw(st.integers(1, replicas)) if elastic else replicas
        jobs.append(
            make_job(
                f"j{i}",
                queue="a" if elastic else "b",
                submit_s=draw(st.floats(0, 3600)),
                replicas=replicas,
                min_r=min_r,
                max_r=replicas + (draw(st.integers(0, 4)) if elastic else 0),
                work=draw(st.floats(50, 20000)),
                elastic=elastic,
                restart_s=draw(st.sampled_from([0.0, 30.0])),
                ckpt_s=draw(st.sampled_from([60.0, 600.0])),
            )
        )
    jobs.sort(key=lambda j: j.submit_s)
    return Workload("random", tuple(jobs))


@pytest.mark.parametrize("policy", ["tide", "static", "threshold", "hpa", "optimus", "tiresias"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(), mtbf=st.sampled_from([None, 4 * 3600.0]))
def test_every_job_finishes_and_work_is_conserved(
    policy: str, workload: Workload, mtbf: float | None
) -> None:
    controller = make_controller(policy, workload=workload, policy=default_policy_for(CLUSTER))
    options = RunOptions(faults=FaultOptions(node_mtbf_s=mtbf, node_repair_s=600.0, seed=1))
    result = simulate(workload=workload, cluster=CLUSTER, controller=controller, options=options)
    assert all(j.end_s is not None for j in result.jobs)
    for job in result.jobs:
        assert job.done_units == pytest.approx(job.work_units)
        assert job.start_s is not None and job.submit_s <= job.start_s <= job.end_s  # type: ignore[operator]
    assert result.alloc_gpu_s <= CLUSTER.total_gpus * result.end_s + 1e-6
    # No policy beats the lower bound the comparison prints.
    jct_h = [(j.end_s - j.submit_s) / 3600.0 for j in result.jobs]  # type: ignore[operator]
    bound = jct_lower_bound_h(workload, CLUSTER)
    assert sum(jct_h) / len(jct_h) >= bound - 1e-6
    assert bound >= alone_jct_bound_h(workload) - 1e-9


@settings(max_examples=30, deadline=None)
@given(
    workload=workloads(),
    steps=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 8)), max_size=12),
)
def test_no_gpu_is_allocated_twice(workload: Workload, steps: list[tuple[int, int]]) -> None:
    from simulations.cluster import SimulatedCluster

    sim = SimulatedCluster(spec=CLUSTER, workload=workload)
    for job in sim.order:
        sim.submit(job)
    t = 0.0
    for index, replicas in steps:
        run_session(sim)
        held = sim.releasing_on_nodes()  # pods still saving and exiting hold their GPUs
        for job in sim.running.values():
            assert len(job.pods) >= job.spec.min_replicas
            for node in job.pods:
                held[node] += job.spec.gpus_per_replica
        for node in range(CLUSTER.nodes):
            assert held[node] + sim.nodes.free[node] == CLUSTER.gpus_per_node
        job = sim.order[index % len(sim.order)]
        if job.status is Status.RUNNING and job.spec.elastic:
            sim.resize(job, max(job.spec.min_replicas, min(job.spec.max_replicas, replicas)))
        t += 10.0
        sim.advance(min(t, sim.next_completion()[0]))
        sim.finish_due()
        sim.free_released()


@settings(max_examples=40, deadline=None)
@given(
    workload=workloads(),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["resize", "kill", "suspend", "fail", "repair", "wait"]),
            st.integers(0, 7),
            st.integers(0, 8),
            st.floats(0.5, 900.0),
        ),
        max_size=25,
    ),
)
def test_next_completion_is_what_a_scan_of_the_running_jobs_gives(
    workload: Workload, steps: list[tuple[str, int, int, float]]
) -> None:
    # The core keeps completions in a queue pushed at each change of a job; whatever happens to
    # the jobs, the queue must name the completion a scan of every running job finds, and each
    # job's stored size, GPUs and rate must be its pods'.
    from simulations.cluster import SimulatedCluster

    sim = SimulatedCluster(spec=CLUSTER, workload=workload)
    for job in sim.order:
        sim.submit(job)
    for action, index, size, wait_s in steps:
        run_session(sim)
        job = sim.order[index % len(sim.order)]
        running = job.status is Status.RUNNING
        if action == "resize" and running and job.spec.elastic:
            sim.resize(job, max(job.spec.min_replicas, min(job.spec.max_replicas, size)))
        elif action == "kill" and running:
            sim.remove_pods(job, 1 + size % 2, graceful=False)
        elif action == "suspend":
            sim.suspend(job)
        elif action == "fail":
            sim.fail_node(size % CLUSTER.nodes)
        elif action == "repair":
            sim.repair_node(size % CLUSTER.nodes)
        for held in sim.order:
            assert held.gpus == len(held.pods) * held.spec.gpus_per_replica
            assert held.rate == held.spec.profile.rate(len(held.pods))
        scan = min((j.completion_s(sim.now_s) for j in sim.running.values()), default=math.inf)
        t_done, first = sim.next_completion()
        assert t_done == pytest.approx(scan, rel=1e-9)
        assert first is None or first.completion_s(sim.now_s) == pytest.approx(scan, rel=1e-9)
        sim.advance(min(sim.now_s + wait_s, t_done))
        finished = sim.finish_due()
        assert all(j.status is Status.DONE for j in finished)
        assert all(j.remaining_units > 1e-9 * j.spec.work_units for j in sim.running.values())
