"""tide's engine runs against SimulatedCluster exactly as in production."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_policy.adapters.memory_codec import MEMORY_ANNOTATION, decode_memory
from scheduler_policy.engine.reconcile import reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import ElasticPolicy, QueuePolicy
from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations import run as run_module
from simulations.api import PolicyRun, default_policy_for, run_policies
from simulations.cluster_config import BUILTIN_CLUSTER
from simulations.errors import SimulationError
from simulations.faults import FaultOptions, plan_faults
from simulations.report import summarize
from simulations.run import RunOptions
from simulations.volcano import run_session
from simulations.workload import Workload, generate_workload
from tests.simulations.helpers import make_job, make_sim

POLICY = ElasticPolicy(queues=(QueuePolicy(QueueName("a"), borrow=True),))


def test_tide_grows_into_idle_gpus_and_memory_is_stored() -> None:
    sim = make_sim([make_job("x", replicas=1, min_r=1, max_r=4, work=1e7)], nodes=1)
    run_session(sim)
    models = ModelCache()
    sim.advance(600.0)
    result = reconcile(metrics=sim, cluster=sim, policy=POLICY, now_s=600.0, models=models)
    job = sim.jobs[JobKey("ns/x")]
    assert [c.to_replicas for c in result.applied if c.to_replicas != c.from_replicas] == [
        job.spec_replicas
    ]
    assert job.spec_replicas > 1
    assert decode_memory(job.annotations[MEMORY_ANNOTATION]) == result.applied[0].memory
    again = reconcile(metrics=sim, cluster=sim, policy=POLICY, now_s=600.0, models=models)
    assert again.applied == ()  # reconciling twice on the same cluster writes nothing


def test_a_queue_that_does_not_borrow_grows_within_its_share() -> None:
    # Volcano's proportion plugin gives a queue no more than it requests, so a queue that may
    # not borrow grows past what its jobs ask only with the share it would deserve asking for
    # more: here the whole node, the only queue.
    sim = make_sim([make_job("x", replicas=1, min_r=1, max_r=4, work=1e7)], nodes=1)
    run_session(sim)
    (queue,) = sim.list_queues()
    assert (queue.deserved_gpus, queue.request_gpus, queue.weight) == (1.0, 1.0, 1.0)
    sim.advance(600.0)
    policy = ElasticPolicy(queues=(QueuePolicy(QueueName("a"), borrow=False),))
    result = reconcile(metrics=sim, cluster=sim, policy=policy, now_s=600.0, models=ModelCache())
    assert [(c.from_replicas, c.to_replicas) for c in result.applied] == [(1, 4)]


def test_stale_metrics_hold() -> None:
    from simulations.cluster import MetricsOptions, SimulatedCluster
    from simulations.workload import Workload
    from tests.simulations.helpers import make_cluster

    sim = SimulatedCluster(
        spec=make_cluster(),
        workload=Workload("t", (make_job("x", replicas=2, min_r=1, max_r=4, work=1e7),)),
        metrics=MetricsOptions(outages=((0.0, 1e9),)),
    )
    for job in sim.order:
        sim.submit(job)
    run_session(sim)
    sim.advance(600.0)
    result = reconcile(metrics=sim, cluster=sim, policy=POLICY, now_s=600.0, models=ModelCache())
    assert [d.reason.value for d in result.decisions] == ["HoldMetricsStale"]
    assert sim.jobs[JobKey("ns/x")].spec_replicas == 2


def test_builtin_comparison_runs_every_policy() -> None:
    workload = generate_workload(seed=0)
    policy = default_policy_for(BUILTIN_CLUSTER)
    runs = [
        PolicyRun(n, n, policy if n == "tide" else None)
        for n in ("tide", "static", "threshold", "hpa", "optimus", "tiresias")
    ]
    results = run_policies(runs, workload=workload, cluster=BUILTIN_CLUSTER, options=RunOptions())
    for result in results:
        s = summarize(result)
        assert s.finished == s.jobs == len(workload.jobs)
        assert abs(s.work_done_ratio - 1.0) < 1e-9
    assert results[1].writes == 0  # static never resizes
    assert results[0].writes > 0  # tide does, on this workload


def test_the_report_counts_the_faults_each_run_saw() -> None:
    workload = generate_workload(seed=2, duration_s=4 * 3600.0)
    faults = FaultOptions(node_mtbf_s=6 * 3600.0, outage_every_s=3600.0, seed=4)
    options = RunOptions(faults=faults)
    failures, outages = plan_faults(
        faults, nodes=BUILTIN_CLUSTER.nodes, span_s=workload.jobs[-1].submit_s + 30 * 86400.0
    )
    results = run_policies(
        [
            PolicyRun("tide", "tide", default_policy_for(BUILTIN_CLUSTER)),
            PolicyRun("static", "static"),
        ],
        workload=workload,
        cluster=BUILTIN_CLUSTER,
        options=options,
    )
    for result in results:
        seen = [f for f in failures if f.start_s < result.end_s]
        summary = summarize(result)
        assert summary.node_failures == len(seen) > 0
        down = sum(min(f.end_s, result.end_s) - f.start_s for f in seen)
        assert summary.node_down_hours == pytest.approx(down / 3600.0)
        assert summary.metrics_outages == sum(1 for start, _ in outages if start < result.end_s)
        assert summary.metrics_outages > 0


def test_policies_run_in_parallel_give_the_sequential_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Progress at every event (forked workers inherit the setting).
    monkeypatch.setattr(run_module, "PROGRESS_EVERY_S", 0.0)
    workload = generate_workload(seed=5, duration_s=3 * 3600.0)
    runs = [PolicyRun("tide", "tide", default_policy_for(BUILTIN_CLUSTER))]
    runs += [PolicyRun(name, name) for name in ("static", "threshold", "tiresias")]
    done: list[str] = []
    reports: dict[int, dict[int, list[tuple[int, int]]]] = {1: {}, 2: {}}

    def figures(workers: int) -> list[dict[str, object]]:
        results = run_policies(
            runs,
            workload=workload,
            cluster=BUILTIN_CLUSTER,
            options=RunOptions(),
            workers=workers,
            on_done=lambda r: done.append(r.policy),
            on_progress=lambda i, finished, total, _now_s: (
                reports[workers].setdefault(i, []).append((finished, total))
            ),
        )
        return [{k: v for k, v in summarize(r).as_dict().items() if k != "wall_s"} for r in results]

    sequential = figures(1)
    assert figures(2) == sequential
    assert [f["policy"] for f in sequential] == ["tide", "static", "threshold", "tiresias"]
    assert sorted(done[4:]) == sorted(done[:4])  # every run reported once each time
    total = len(workload.jobs)
    for workers, by_run in reports.items():
        assert sorted(by_run) == [0, 1, 2, 3]
        for got in by_run.values():
            assert got[-1] == (total, total)
            assert all(t == total for _, t in got)
            finished = [f for f, _ in got]
            if workers == 1:  # in order; from a worker, its last report may come after the final
                assert finished == sorted(finished)
            assert len(set(finished)) > total // 2  # as the jobs finished, not only at the end


def test_a_failing_parallel_run_raises_its_error() -> None:
    job = generate_workload(seed=0, duration_s=3600.0).jobs[0]
    bad = Workload(name="bad", jobs=(dataclasses.replace(job, queue=QueueName("nowhere")),))
    with pytest.raises(SimulationError, match="queue 'nowhere' is not in cluster"):
        run_policies(
            [PolicyRun("static", "static"), PolicyRun("tiresias", "tiresias")],
            workload=bad,
            cluster=BUILTIN_CLUSTER,
            options=RunOptions(),
            workers=2,
        )
    with pytest.raises(ValueError, match="workers must be >= 1"):
        run_policies([], workload=bad, cluster=BUILTIN_CLUSTER, options=RunOptions(), workers=0)
