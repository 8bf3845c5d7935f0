"""``reconcile`` through the FakeCluster: writes, idempotence, holds and failures."""

from __future__ import annotations

import dataclasses

from scheduler_policy.engine import reconcile
from scheduler_policy.fake import FakeCluster
from scheduler_policy.model import JobKey, Reason, ThroughputPoint
from scheduler_policy.models_cache import ModelCache
from tests.scheduler_policy.builders import (
    NOW_S,
    make_job,
    make_observation,
    make_policy,
    make_queue,
)


def run(cluster, policy, *, now_s=NOW_S, models=None):
    return reconcile(metrics=cluster, cluster=cluster, policy=policy, now_s=now_s,
                     models=models or ModelCache())  # fmt: skip


def test_applies_the_decision_and_stores_memory():
    cluster = FakeCluster(make_observation(make_job("a", current=2), free=4))
    result = run(cluster, make_policy(window_down_s=300.0))
    assert [(c.job, c.from_replicas, c.to_replicas) for c in result.applied] == [
        (JobKey("ns/a"), 2, 6)
    ]
    job = cluster.job(JobKey("ns/a"))
    assert job.current_replicas == 6
    assert job.last_rescale_s == NOW_S
    assert [r.replicas for r in job.recommendations] == [6]
    assert cluster.free_gpus == 0


def test_reconciling_twice_writes_nothing_the_second_time():
    cluster = FakeCluster(
        make_observation(make_job("a", current=2), make_job("b", current=6), free=4,
                         queues=(make_queue(capability=10, pending=2),))
    )  # fmt: skip
    policy = make_policy(window_down_s=300.0, cooldown_s=300.0)
    models = ModelCache()
    first = run(cluster, policy, models=models)
    assert first.applied
    second = run(cluster, policy, models=models)
    assert second.applied == ()
    assert all(not d.changes for d in second.decisions)


def test_steady_state_refits_no_model():
    cluster = FakeCluster(make_observation(make_job("a", current=2), make_job("b", current=2)))
    models = ModelCache(refit_s=600.0)
    policy = make_policy()
    for minute in range(5):
        run(cluster, policy, now_s=NOW_S + 60 * minute, models=models)
    assert models.curve_fits == 2


def test_a_new_replica_count_triggers_a_refit():
    job = make_job("a", current=2, sizes=(1, 2))
    cluster = FakeCluster(make_observation(job, free=0))
    models = ModelCache(refit_s=600.0)
    run(cluster, make_policy(), models=models)
    measured = dataclasses.replace(
        job, throughput_history=(*job.throughput_history, ThroughputPoint(NOW_S, 4, 390.0))
    )
    run(FakeCluster(make_observation(measured, free=0)), make_policy(), now_s=NOW_S + 60,
        models=models)  # fmt: skip
    assert models.curve_fits == 2


def test_stale_metrics_hold_every_job_and_write_nothing():
    cluster = FakeCluster(
        make_observation(make_job("a", current=6), queues=(make_queue(capability=8, pending=4),),
                         free=0, fresh=False)
    )  # fmt: skip
    result = run(cluster, make_policy())
    assert [d.reason for d in result.decisions] == [Reason.HOLD_METRICS_STALE]
    assert result.applied == ()
    assert cluster.job(JobKey("ns/a")).current_replicas == 6


def test_nan_throughput_counts_as_stale():
    job = make_job("a", current=6)
    broken = dataclasses.replace(
        job, throughput_history=(ThroughputPoint(NOW_S - 10, 6, float("nan")),)
    )
    cluster = FakeCluster(make_observation(broken, queues=(make_queue(capability=8, pending=4),),
                                           free=0))  # fmt: skip
    result = run(cluster, make_policy())
    assert not result.observation.metrics_fresh
    assert [(d.target_replicas, d.reason) for d in result.decisions] == [
        (6, Reason.HOLD_METRICS_STALE)
    ]


def test_a_refused_write_does_not_stop_the_others():
    cluster = FakeCluster(
        make_observation(make_job("a", current=1), make_job("b", current=1), free=4),
        refuse=[JobKey("ns/a")],
    )
    result = run(cluster, make_policy())
    assert [c.job for c in result.applied] == [JobKey("ns/b")]
    assert [(c.job, "refused" in why) for c, why in result.failed] == [(JobKey("ns/a"), True)]
    assert cluster.job(JobKey("ns/b")).current_replicas > 1


def test_a_conflicting_write_is_reported_for_retry():
    class MovesUnderneath(FakeCluster):
        def apply(self, change):
            job = self.job(change.job)
            self._jobs[change.job] = dataclasses.replace(job, current_replicas=7)
            super().apply(change)

    cluster = MovesUnderneath(make_observation(make_job("a", current=1), free=4))
    result = run(cluster, make_policy())
    assert result.applied == ()
    assert "conflict" in result.failed[0][1]
