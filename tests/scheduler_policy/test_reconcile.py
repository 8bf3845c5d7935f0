"""``reconcile`` through the FakeCluster: writes, idempotence, holds and failures."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scheduler_policy.engine.reconcile import observe, reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobPhase,
    NodeState,
    QueueName,
    Reason,
    ThroughputPoint,
)
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


# Job "a" (8 replicas of 1 GPU, measured at 1, 2 and 4) was shrunk 20 s ago, within the 60 s
# interval; now 2 GPUs of non-elastic work wait in its queue (capability 8). Only a need the idle
# and releasing GPUs leave unmet moves it a second time in the interval (the reconcile a new
# gang triggers a second after the last shrink), and a second reconcile then writes nothing.
SECOND_SHRINKS = {
    "unmet-need-shrinks-again": (0.0, 0.0, 6),
    "need-covered-by-idle-gpus-holds": (2.0, 0.0, 8),
    "need-covered-by-releasing-gpus-holds": (0.0, 2.0, 8),
}


@pytest.mark.parametrize(
    ("free", "releasing", "target"), SECOND_SHRINKS.values(), ids=SECOND_SHRINKS.keys()
)
def test_a_forced_shrink_moves_a_job_twice_in_an_interval_only_for_an_unmet_need(
    free, releasing, target
):
    cluster = FakeCluster(
        make_observation(
            make_job("a", current=8, last_rescale_s=NOW_S - 20.0),
            queues=(make_queue(capability=8.0, pending=2.0),),
            free=free,
        )
    )
    cluster.terminating_gpus = releasing
    policy = make_policy(cooldown_s=300.0)
    models = ModelCache()
    first = run(cluster, policy, models=models)
    assert cluster.job(JobKey("ns/a")).current_replicas == target
    assert [c.reason for c in first.applied if c.to_replicas != c.from_replicas] == (
        [Reason.SHRINK_FOR_PENDING_WORK] if target < 8 else []
    )
    assert run(cluster, policy, models=models).applied == ()


def test_the_yield_counts_replicas_a_job_gives_back_for_its_maximum():
    # "c" needs 1 GPU and "a" 4, 3 are idle. "x" holds 1.5 GPUs of borrowed growth in "b";
    # "y" in "a" holds a replica above its maximum, which this round removes. With its 0.5
    # GPU, the idle GPUs and all of "x" start both: "x" yields in the same round, not in the
    # next one, when the GPU of "y" shows up as terminating.
    cluster = FakeCluster(
        make_observation(
            make_job("x", queue="b", gpus_per_replica=0.5, min_replicas=0, max_replicas=3,
                     current=3),
            make_job("y", queue="a", gpus_per_replica=0.5, min_replicas=0, max_replicas=0,
                     current=1),
            queues=(make_queue("a", pending=4), make_queue("b"), make_queue("c", pending=1)),
            free=3,
        )
    )  # fmt: skip
    policy = make_policy("a", "b", "c", borrow=True)
    models = ModelCache()
    first = run(cluster, policy, models=models)
    assert {(c.job, c.to_replicas) for c in first.applied} == {
        (JobKey("ns/x"), 0),
        (JobKey("ns/y"), 0),
    }
    assert run(cluster, policy, models=models).applied == ()


def _cases():
    # Cases hypothesis found where a second reconcile on the same cluster wrote again. Jobs
    # with sizes=() are still on the prior's curve (rate-limited, never traded away).
    unmeasured = {"sizes": (), "min_replicas": 0}
    # 18 GPUs of non-elastic work in queue "c", for the trade cases.
    fixed = make_job(
        "fixed", queue="c", gpus_per_replica=2, min_replicas=0, max_replicas=0, current=9,
        elastic=False,
    )  # fmt: skip
    yield pytest.param(
        # Two borrowing queues give back whole 2-GPU replicas for "a" (6) and "c" (1): what
        # "c" gives back counts as idle for "b" in the same round, not the next.
        make_observation(
            make_job("x", queue="b", gpus_per_replica=2, max_replicas=1, current=1, **unmeasured),
            make_job("y", queue="c", gpus_per_replica=2, max_replicas=1, current=1, **unmeasured),
            queues=(
                make_queue("a", capability=None, pending=6),
                make_queue("b", capability=None),
                make_queue("c", capability=None, pending=1),
            ),
            free=4,
        ),
        make_policy("a", "b", "c", borrow=True, max_step_down=1),
        id="two-borrowing-queues-whole-replicas",
    )
    yield pytest.param(
        # The budget (3) cannot hold "y"'s 2-GPU replica; next round that replica is growth
        # that ranks first and does not fit, so this round must not keep "x"'s waiting one.
        make_observation(
            make_job("x", min_replicas=2, max_replicas=3, current=3, scheduled=2, sizes=()),
            make_job("y", gpus_per_replica=2, max_replicas=1, current=1, **unmeasured),
            queues=(make_queue(capability=None, deserved=3),),
            free=1,
        ),
        make_policy(max_step_down=1),
        id="dropped-replica-ranks-among-growth",
    )
    yield pytest.param(
        # The budget (7, less 0.5 for "w" to start) cannot hold "x" and "y" (8 GPUs). "y" is
        # still on the prior's curve: the rate limit lets it give back one replica only, so the
        # budget takes the rest from "x", and nothing is left for "z"'s waiting replica.
        make_observation(
            make_job(
                "x", gpus_per_replica=2, min_replicas=0, max_replicas=2, current=2, sizes=(1, 2)
            ),
            make_job("y", gpus_per_replica=2, max_replicas=2, current=3, **unmeasured),
            make_job("z", max_replicas=1, current=1, scheduled=0, **unmeasured),
            make_job(
                "w",
                gpus_per_replica=0.5,
                max_replicas=0,
                current=0,
                phase=JobPhase.PENDING,
                **unmeasured,
            ),
            queues=(make_queue(capability=None, deserved=7),),
            free=1,
        ),
        make_policy(max_step_down=1),
        id="rate-limit-leaves-budget-to-others",
    )
    yield pytest.param(
        # Headroom takes a freed GPU before growth does: no trade while it is not kept free.
        make_observation(
            make_job(
                "x",
                queue="b",
                gpus_per_replica=0.5,
                max_replicas=1,
                current=1,
                scheduled=0,
                **unmeasured,
            ),
            make_job(
                "y",
                queue="b",
                gpus_per_replica=0.5,
                min_replicas=0,
                max_replicas=2,
                current=2,
                sizes=(1, 2),
            ),
            queues=(make_queue("a", capability=None), make_queue("b", capability=None)),
            free=0,
        ),
        make_policy("a", "b", headroom_gpus=1.0, max_step_down=1),
        id="no-trade-before-headroom",
    )

    yield pytest.param(
        # "y" gives a 2-GPU replica to "x"'s waiting 0.5-GPU one; "x" may grow into the 1.5
        # GPUs of budget the trade leaves in the same round, as it would in the next.
        make_observation(
            fixed,
            make_job(
                "y",
                queue="c",
                gpus_per_replica=2,
                min_replicas=0,
                max_replicas=2,
                current=2,
                sizes=(1, 2),
            ),
            make_job(
                "x",
                queue="c",
                gpus_per_replica=0.5,
                max_replicas=2,
                current=1,
                scheduled=0,
                **unmeasured,
            ),
            queues=(make_queue("c", capability=22),),
            free=1,
        ),
        make_policy("c", max_step_down=1),
        id="growth-after-a-trade",
    )

    yield pytest.param(
        # "y" could give its third 4-GPU replica to "x"'s waiting one, but next round "y" is in
        # its cooldown (it cannot give again), "z"'s first replica outranks "x"'s in the room
        # left, and "x" would keep its place only through a trade that cannot happen, so "z"
        # would grow then. The trade is undone this round: "x"'s waiting replica is withdrawn.
        make_observation(
            fixed,
            make_job(
                "y",
                queue="c",
                gpus_per_replica=4,
                min_replicas=0,
                max_replicas=3,
                current=3,
                sizes=(1, 2),
            ),
            make_job("z", queue="c", gpus_per_replica=0.5, max_replicas=1, current=0, **unmeasured),
            make_job(
                "x",
                queue="c",
                gpus_per_replica=4,
                max_replicas=1,
                current=1,
                scheduled=0,
                **unmeasured,
            ),
            queues=(
                make_queue("a", capability=None),
                make_queue("b", capability=None),
                make_queue("c", capability=31),
            ),
            free=4,
        ),
        make_policy("a", "b", "c", headroom_gpus=1.0, max_step_down=1),
        id="trade-whose-giver-cools-down",
    )


@pytest.mark.parametrize(("observation", "policy"), list(_cases()))
def test_found_cases_write_nothing_the_second_time(observation, policy):
    cluster = FakeCluster(observation)
    models = ModelCache()
    run(cluster, policy, models=models)
    assert run(cluster, policy, models=models).applied == ()


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


def test_nan_throughput_makes_that_job_stale_and_it_still_shrinks_for_pending_work():
    job = make_job("a", current=6)
    broken = dataclasses.replace(
        job,
        throughput_history=(*job.throughput_history, ThroughputPoint(NOW_S - 10, 6, float("nan"))),
    )
    cluster = FakeCluster(make_observation(broken, queues=(make_queue(capability=8, pending=4),),
                                           free=0))  # fmt: skip
    result = run(cluster, make_policy())
    assert result.observation.metrics_fresh  # the cluster's figures are fine
    (seen,) = result.observation.jobs
    assert "not finite" in seen.stale_reason and "nan" in seen.stale_reason
    assert seen.throughput_history == job.throughput_history  # the NaN point is dropped
    assert [(d.target_replicas, d.reason) for d in result.decisions] == [
        (4, Reason.SHRINK_FOR_PENDING_WORK)
    ]


def test_a_stale_job_holds_while_a_fresh_job_in_its_queue_scales_up():
    cluster = FakeCluster(make_observation(make_job("a", current=2), make_job("b", current=2),
                                           free=4))  # fmt: skip
    cluster.stale_jobs[JobKey("ns/a")] = "throughput series absent for 300 s"
    result = run(cluster, make_policy())
    decisions = {d.job: (d.target_replicas, d.reason) for d in result.decisions}
    assert decisions == {
        JobKey("ns/a"): (2, Reason.HOLD_METRICS_STALE),
        JobKey("ns/b"): (6, Reason.SCALE_UP_FOR_IDLE_GPUS),
    }
    held = next(d for d in result.decisions if d.job == "ns/a")
    assert "ns/a" in held.message and "absent for 300 s" in held.message
    assert cluster.job(JobKey("ns/a")).current_replicas == 2
    assert cluster.job(JobKey("ns/b")).current_replicas == 6
    # When the metrics recover, the job is planned for again.
    del cluster.stale_jobs[JobKey("ns/a")]
    cluster.free_gpus = 2.0
    again = run(cluster, make_policy(), now_s=NOW_S + 60)
    assert {d.job: d.reason for d in again.decisions}[JobKey("ns/a")] is not (
        Reason.HOLD_METRICS_STALE
    )


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


def test_joining_metrics_keeps_every_other_field_of_the_job():
    # JobState.with_metrics lists the fields by hand (dataclasses.replace made observe half as
    # slow again at 10,000 jobs): a field added to JobState and not to it would be dropped.
    from scheduler_policy.vocabulary.state import (
        BatchBounds,
        BatchStatistics,
        JobState,
        PodPlacement,
        QueueName,
        Recommendation,
        StepTimes,
    )

    values = {
        "key": JobKey("ns/a"),
        "queue": QueueName("q"),
        "gpus_per_replica": 2.0,
        "min_replicas": 2,
        "max_replicas": 9,
        "current_replicas": 5,
        "phase": JobPhase.RUNNING,
        "elastic": False,
        "throughput_history": (ThroughputPoint(NOW_S - 60, 5, 10.0),),
        "last_rescale_s": NOW_S - 300,
        "restart_cost_s": 45.0,
        "remaining_samples": 7.0,
        "task": "trainer",
        "recommendations": (Recommendation(NOW_S - 30, 5),),
        "nonelastic_gpus": 1.0,
        "read_problems": ("bad annotation",),
        "scheduled_replicas": 4,
        "stale_reason": "throughput absent",
        "pods": (PodPlacement(0, "node-a", 2.0),),
        "running_since_s": NOW_S - 3600,
        "requested_replicas": 6,
        "batch_bounds": BatchBounds(64, 1024, 8, 128, True),
        "batch_statistics": BatchStatistics(
            batch_size=128, grad_sqr=1.0, step_times=(StepTimes(1, 2, 64, 0.3),)
        ),
    }
    assert set(values) == {f.name for f in dataclasses.fields(JobState)}
    job = JobState(**values)
    history = (ThroughputPoint(NOW_S, 5, 12.0),)
    assert job.with_metrics(history, 3.0) == dataclasses.replace(
        job, throughput_history=history, remaining_samples=3.0
    )
    for name, value in values.items():
        if name not in ("throughput_history", "remaining_samples"):
            assert getattr(JobState(**values).with_metrics((), None), name) == value
    statistics = BatchStatistics(batch_size=512)
    assert job.with_metrics(history, 3.0, statistics).batch_statistics == statistics


@pytest.mark.parametrize(
    "figure", ["queue_allocated_gpus", "queue_deserved_gpus", "queue_request_gpus"]
)
def test_non_finite_queue_figures_hold_every_job(figure):
    cluster = FakeCluster(make_observation(make_job("a", current=2), free=4))
    real_sample = cluster.sample

    def sample(*, now_s):
        return dataclasses.replace(real_sample(now_s=now_s), **{figure: {QueueName("q"): math.nan}})

    cluster.sample = sample  # type: ignore[method-assign]
    result = run(cluster, make_policy())
    assert not result.observation.metrics_fresh
    assert [d.reason for d in result.decisions] == [Reason.HOLD_METRICS_STALE]


def test_the_schedulers_deserved_share_and_request_come_before_the_queues_spec():
    # FakeCluster's queue "q" has no ``spec.deserved`` (None), as under the proportion plugin.
    cluster = FakeCluster(make_observation(make_job("a", current=2), free=4))
    assert [(q.deserved_gpus, q.request_gpus) for q in cluster.list_queues()] == [(None, None)]
    real_sample = cluster.sample

    def sample(*, now_s):
        return dataclasses.replace(
            real_sample(now_s=now_s),
            queue_deserved_gpus={QueueName("q"): 6.0},
            queue_request_gpus={QueueName("q"): 2.0},
        )

    cluster.sample = sample  # type: ignore[method-assign]
    observation = observe(metrics=cluster, cluster=cluster, now_s=NOW_S)
    assert [(q.deserved_gpus, q.request_gpus) for q in observation.queues] == [(6.0, 2.0)]
    assert observation.metrics_fresh


class Releasing(FakeCluster):
    """A cluster whose API reports ``api_releasing_gpus`` of terminating pods, while its
    metrics report ``terminating_gpus``."""

    api_releasing_gpus = 0.0

    def releasing_gpus(self) -> float:
        return self.api_releasing_gpus


RELEASING = {
    "nodes-known-the-apis-terminating-pods-count": ((NodeState("n0", 8.0, 2.0),), 3.0),
    "no-nodes-the-metrics-figure-counts": ((), 5.0),
}


@pytest.mark.parametrize(("nodes", "expected"), RELEASING.values(), ids=RELEASING.keys())
def test_releasing_gpus_come_from_where_the_free_gpus_come_from(nodes, expected):
    cluster = Releasing(dataclasses.replace(make_observation(make_job("a")), nodes=nodes))
    cluster.terminating_gpus, cluster.api_releasing_gpus = 5.0, 3.0
    observation = observe(metrics=cluster, cluster=cluster, now_s=NOW_S)
    assert observation.releasing_gpus == expected


def test_observe_joins_each_adaptive_jobs_batch_statistics_and_keeps_the_others():
    from scheduler_policy.vocabulary.state import BatchStatistics, StepTimes

    statistics = BatchStatistics(
        batch_size=256, grad_sqr=0.5, grad_var=2.0, step_times=(StepTimes(1, 2, 64, 0.3),)
    )
    cluster = FakeCluster(make_observation(make_job("a"), make_job("b")))
    real_sample = cluster.sample

    def sample(*, now_s):
        return dataclasses.replace(
            real_sample(now_s=now_s), job_batch_statistics={JobKey("ns/a"): statistics}
        )

    cluster.sample = sample  # type: ignore[method-assign]
    observation = observe(metrics=cluster, cluster=cluster, now_s=NOW_S)
    assert [j.batch_statistics for j in observation.jobs] == [statistics, None]
