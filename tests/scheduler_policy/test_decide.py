"""Allocation scenarios through ``decide``: a table of named cases, each a small cluster."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_policy.adapters.observation_file import load_observation
from scheduler_policy.decision.pipeline import MAX_PASSES, decide
from scheduler_policy.models.cache import Fits, ModelCache
from scheduler_policy.policy.spec import Headroom, Objective, QueuePolicy
from scheduler_policy.vocabulary.errors import ObservationError
from scheduler_policy.vocabulary.state import (
    DemandPoint,
    JobKey,
    JobPhase,
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


def fit_and_decide(observation, policy):
    return decide(observation, policy, fits=ModelCache().fit(observation, policy))


def targets(observation, policy):
    plan = fit_and_decide(observation, policy)
    return {d.job.removeprefix("ns/"): (d.target_replicas, d.reason) for d in plan.decisions}


def linear_and_poor(linear, poor):
    """A job that scales linearly and one that scales poorly, in one queue of capability 4, with
    4 idle GPUs in the cluster: what the trade scenarios below share."""
    return make_observation(linear, poor, queues=(make_queue(capability=4),), free=4)


SCENARIOS = {
    "scale-up-into-idle-gpus": (
        make_observation(make_job("a", current=2, max_replicas=8), free=8),
        make_policy(),
        {"a": (8, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "growth-limited-by-idle-gpus": (
        make_observation(make_job("a", current=2), free=3),
        make_policy(),
        {"a": (5, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "growth-limited-by-capability": (
        make_observation(make_job("a", current=2), queues=(make_queue(capability=4),), free=8),
        make_policy(),
        {"a": (4, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "no-borrowing-beyond-deserved": (
        make_observation(
            make_job("a", current=2), queues=(make_queue(capability=16, deserved=3),), free=8
        ),
        make_policy(borrow=False),
        {"a": (3, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "borrowing-beyond-deserved": (
        make_observation(
            make_job("a", current=2), queues=(make_queue(capability=16, deserved=3),), free=8
        ),
        make_policy(borrow=True),
        {"a": (8, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "shrink-for-pending-work-in-own-queue": (
        make_observation(
            make_job("a", current=6), queues=(make_queue(capability=8, pending=4),), free=0
        ),
        make_policy(),
        {"a": (4, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
    "shrink-borrowed-gpus-for-another-queues-pending-work": (
        make_observation(
            make_job("a", queue="research", current=8),
            queues=(
                make_queue("research", capability=16, deserved=4),
                make_queue("prod", capability=16, deserved=12, pending=3),
            ),
            free=1,
        ),
        make_policy("research", "prod", borrow=True),
        {"a": (6, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
    "no-yield-that-cannot-start-the-pending-work": (
        make_observation(
            make_job("a", queue="research", current=8, min_replicas=4),
            queues=(
                make_queue("research", capability=16, deserved=4),
                make_queue("prod", capability=16, deserved=12, pending=8),
            ),
            free=1,
        ),
        make_policy("research", "prod", borrow=True),
        {"a": (8, Reason.AT_TARGET)},
    ),
    "yield-that-starts-the-pending-jobs-it-can": (
        # prod waits with jobs of 2, 2 and 8 GPUs; research can give 4 above its minimum: with
        # the idle GPU that starts the two small jobs (3 given back), not the 8-GPU one.
        make_observation(
            make_job("a", queue="research", current=8, min_replicas=4),
            make_job("p1", queue="prod", current=2, phase=JobPhase.PENDING, elastic=False),
            make_job("p2", queue="prod", current=8, phase=JobPhase.PENDING, elastic=False),
            make_job("p3", queue="prod", current=2, phase=JobPhase.PENDING, elastic=False),
            queues=(
                make_queue("research", capability=16, deserved=4),
                make_queue("prod", capability=16, deserved=12, pending=12),
            ),
            free=1,
        ),
        make_policy("research", "prod", borrow=True),
        {"a": (5, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
    "another-queues-headroom-kept-free-of-borrowed-growth": (
        # prod keeps 3 GPUs for its coming work: research borrows only 5 of the 8 idle.
        make_observation(
            make_job("a", queue="research", current=2, max_replicas=16),
            queues=(make_queue("research", capability=32), make_queue("prod", capability=32)),
            free=8,
        ),
        dataclasses.replace(
            make_policy("research", borrow=True),
            queues=(
                QueuePolicy(QueueName("research"), borrow=True),
                QueuePolicy(QueueName("prod"), elastic=False, headroom=Headroom(gpus=3.0)),
            ),
        ),
        {"a": (7, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "headroom-kept-free": (
        make_observation(make_job("a", current=2), queues=(make_queue(capability=8),), free=8),
        make_policy(headroom_gpus=3),
        {"a": (5, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "shrink-for-headroom": (
        make_observation(make_job("a", current=8), queues=(make_queue(capability=8),), free=0),
        make_policy(headroom_gpus=3),
        {"a": (5, Reason.SHRINK_FOR_HEADROOM)},
    ),
    "max-elastic-gpus-cap": (
        make_observation(make_job("a", current=2), free=8),
        make_policy(max_elastic_gpus=3),
        {"a": (3, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "better-scaling-job-gets-the-gpus": (
        make_observation(
            make_job("linear", current=1, sigma=0.0),
            make_job("poor", current=1, sigma=0.9),
            free=3,
        ),
        make_policy(),
        {"linear": (4, Reason.SCALE_UP_FOR_IDLE_GPUS), "poor": (1, Reason.AT_TARGET)},
    ),
    "running-replicas-are-not-taken-for-growth-worth-as-much": (
        make_observation(
            make_job("a", current=1, sigma=0.0),
            make_job("b", current=2, sigma=0.0),
            queues=(make_queue(capability=3),),
            free=4,
        ),
        make_policy(),
        {"a": (1, Reason.AT_TARGET), "b": (2, Reason.AT_TARGET)},
    ),
    "running-replicas-are-not-taken-for-growth-beyond-the-spec": (
        linear_and_poor(
            make_job("linear", current=1, sigma=0.0),
            make_job("poor", current=3, sigma=0.4),
        ),
        make_policy(),
        {"linear": (1, Reason.AT_TARGET), "poor": (3, Reason.AT_TARGET)},
    ),
    "running-replica-moves-to-a-waiting-one-worth-twice-as-much": (
        # linear's 2nd replica waits for a GPU: +100%; poor's 3rd: +17%. The move costs two
        # restarts, but the gain is six times as large.
        linear_and_poor(
            make_job("linear", current=2, scheduled=1, sigma=0.0),
            make_job("poor", current=3, sigma=0.4),
        ),
        make_policy(),
        {"linear": (2, Reason.SCALE_UP_FOR_IDLE_GPUS), "poor": (2, Reason.SHRINK_FOR_BETTER_USE)},
    ),
    "a-job-below-its-asked-size-takes-replicas-its-spec-no-longer-asks-for": (
        # linear's owner asked for 2; the replica that waited was withdrawn (its spec is 1).
        # It still takes poor's 3rd replica (+17% against +100%), and no more than it asked.
        linear_and_poor(
            make_job("linear", current=1, requested=2, sigma=0.0),
            make_job("poor", current=3, sigma=0.4),
        ),
        make_policy(),
        {"linear": (2, Reason.SCALE_UP_FOR_IDLE_GPUS), "poor": (2, Reason.SHRINK_FOR_BETTER_USE)},
    ),
    "no-trade-from-a-job-in-its-cooldown": (
        # The same, but "poor" was rescaled 100 s ago, in its 300 s cooldown: it would not give
        # its replica up this round, so "linear"'s waiting one gets none, and is withdrawn.
        linear_and_poor(
            make_job("linear", current=2, scheduled=1, sigma=0.0),
            make_job("poor", current=3, sigma=0.4, last_rescale_s=NOW_S - 100),
        ),
        make_policy(cooldown_s=300.0),
        {"linear": (1, Reason.WITHDRAW_UNPLACED), "poor": (3, Reason.AT_TARGET)},
    ),
    "hold-under-tolerance": (
        # The fifth replica adds 13% (sync's share grows with the ring): under a 15% tolerance.
        make_observation(make_job("a", current=4, max_replicas=5, sigma=0.2), free=8),
        make_policy(tolerance=0.15),
        {"a": (4, Reason.WITHIN_TOLERANCE)},
    ),
    "restart-cost-larger-than-the-gain": (
        make_observation(make_job("a", current=2, remaining_samples=5_000.0), free=8),
        make_policy(restart_cost_s=30.0),
        {"a": (2, Reason.RESTART_COST_EXCEEDS_GAIN)},
    ),
    "restart-cost-worth-paying-on-a-long-run": (
        make_observation(make_job("a", current=2, remaining_samples=1e8), free=8),
        make_policy(restart_cost_s=30.0),
        {"a": (8, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "one-point-history-uses-the-prior-shape": (
        make_observation(make_job("a", current=2, sizes=(2,)), free=2),
        make_policy(),
        {"a": (4, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "shrink-when-replicas-slow-the-job-down": (
        make_observation(
            make_job("a", current=8, sizes=(1, 2, 4, 8), sigma=0.1, kappa=0.05), free=0
        ),
        make_policy(),
        {"a": (4, Reason.SHRINK_LOW_EFFICIENCY)},
    ),
    "cooldown-holds-a-recent-rescale": (
        make_observation(make_job("a", current=2, last_rescale_s=1_000_000.0 - 60), free=8),
        make_policy(cooldown_s=300.0),
        {"a": (2, Reason.COOLDOWN)},
    ),
    "rate-limit-while-the-curve-is-the-priors-shape": (
        make_observation(make_job("a", current=2, sizes=(2,)), free=8),
        make_policy(max_step_up=2),
        {"a": (4, Reason.LIMITED_BY_RATE)},
    ),
    "no-rate-limit-once-measured-at-two-sizes": (
        make_observation(make_job("a", current=2, sizes=(1, 2)), free=8),
        make_policy(max_step_up=2),
        {"a": (8, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "fractional-gpus": (
        make_observation(make_job("a", current=2, gpus_per_replica=0.5), free=1.0),
        make_policy(),
        {"a": (4, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "metrics-stale-holds-even-under-pressure": (
        make_observation(
            make_job("a", current=6),
            queues=(make_queue(capability=8, pending=4),),
            free=0,
            fresh=False,
        ),
        make_policy(),
        {"a": (6, Reason.HOLD_METRICS_STALE)},
    ),
    "invalid-job-skipped-others-proceed": (
        make_observation(
            make_job("bad", min_replicas=5, max_replicas=2, current=2),
            make_job("good", current=2),
            free=2,
        ),
        make_policy(),
        {"bad": (2, Reason.INVALID_JOB_SPEC), "good": (4, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "unknown-queue-is-invalid": (
        make_observation(make_job("lost", queue="nowhere"), make_job("good", current=2), free=1),
        make_policy(),
        {"lost": (2, Reason.INVALID_JOB_SPEC), "good": (3, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    "negative-gpus-is-invalid": (
        make_observation(make_job("bad", gpus_per_replica=-1.0), free=1),
        make_policy(),
        {"bad": (2, Reason.INVALID_JOB_SPEC)},
    ),
    "queue-not-in-policy-left-alone": (
        make_observation(
            make_job("a", queue="other"), queues=(make_queue("q"), make_queue("other")), free=8
        ),
        make_policy("q"),
        {"a": (2, Reason.QUEUE_NOT_MANAGED)},
    ),
    "raised-to-its-minimum": (
        make_observation(make_job("a", current=1, min_replicas=3), free=0),
        make_policy(),
        {"a": (3, Reason.LIMITED_BY_BOUNDS)},
    ),
    "shrink-for-a-pending-elastic-jobs-gang": (
        make_observation(
            make_job("running", current=6),
            make_job("waiting", current=2, min_replicas=2, phase=JobPhase.PENDING),
            queues=(make_queue(capability=6),),
            free=0,
        ),
        make_policy(),
        {"running": (4, Reason.SHRINK_FOR_PENDING_WORK), "waiting": (2, Reason.NOT_RUNNING)},
    ),
    "non-elastic-jobs-get-no-decision": (
        make_observation(make_job("a", elastic=False), free=8),
        make_policy(),
        {},
    ),
}


@pytest.mark.parametrize(("observation", "policy", "expected"), SCENARIOS.values(),
                         ids=SCENARIOS.keys())  # fmt: skip
def test_scenario(observation, policy, expected):
    assert targets(observation, policy) == expected


@pytest.mark.parametrize(
    ("objective", "expected"),
    [
        (Objective.COMPLETION_TIME, {"long": (1, Reason.AT_TARGET),
                                     "short": (2, Reason.SCALE_UP_FOR_IDLE_GPUS)}),
        (Objective.SPEEDUP, {"long": (2, Reason.SCALE_UP_FOR_IDLE_GPUS),
                             "short": (1, Reason.AT_TARGET)}),
    ],
    ids=["completion-time-favours-the-job-nearer-completion", "speedup-ignores-remaining-time"],
)  # fmt: skip
def test_objective_decides_who_gets_the_last_gpu(objective, expected):
    # Same scaling, one idle GPU; the job that finishes sooner gains more under completionTime.
    # Under speedup the tie goes to the job whose key sorts first ("long").
    observation = make_observation(
        make_job("long", current=1, remaining_samples=1e9),
        make_job("short", current=1, remaining_samples=1e7),
        free=1,
    )
    policy = dataclasses.replace(make_policy(), objective=objective)
    assert targets(observation, policy) == expected


def test_forecast_demand_is_kept_free_as_headroom():
    # The queue's non-elastic work requested 6 GPUs all afternoon and holds none right now:
    # with a forecast quantile set, those 6 GPUs stay free of elastic growth.
    history = tuple(DemandPoint(NOW_S - 60.0 * m, 6.0) for m in range(180, 0, -1))
    queue = dataclasses.replace(make_queue(capability=10), demand_history=history)
    observation = make_observation(make_job("a", current=2), queues=(queue,), free=8)
    policy = dataclasses.replace(
        make_policy(),
        queues=(QueuePolicy(QueueName("q"), headroom=Headroom(forecast_quantile=0.9)),),
    )
    assert targets(observation, policy) == {"a": (4, Reason.SCALE_UP_FOR_IDLE_GPUS)}
    assert targets(observation, make_policy()) == {"a": (8, Reason.SCALE_UP_FOR_IDLE_GPUS)}


def test_decisions_carry_a_message_naming_the_cause():
    observation, policy, _ = SCENARIOS["shrink-for-pending-work-in-own-queue"]
    (decision,) = fit_and_decide(observation, policy).decisions
    assert decision.job == JobKey("ns/a")
    assert "pending work needs 4 GPU(s) of queue q" in decision.message


def test_replicas_waiting_for_gpus_are_withdrawn_not_made_room_for():
    # "new" asks for 6 but Volcano placed 2: the 4 waiting hold no GPUs, so "old" is not shrunk
    # to make room for them; with no idle GPU and no better use (new's 3rd replica, +22%, is
    # not worth twice old's 6th, +20%), they are withdrawn.
    observation = make_observation(
        make_job("new", current=6, scheduled=2, sigma=0.3),
        make_job("old", current=6, sigma=0.0),
        queues=(make_queue(capability=8),),
        free=0,
    )
    plan = fit_and_decide(observation, make_policy())
    decisions = {d.job.removeprefix("ns/"): d for d in plan.decisions}
    assert (decisions["new"].target_replicas, decisions["new"].reason) == (
        2, Reason.WITHDRAW_UNPLACED,
    )  # fmt: skip
    assert decisions["old"].target_replicas == 6
    assert "withdrawing 4 of 4 replica(s) still waiting for GPUs" in decisions["new"].message
    (change,) = plan.changes
    assert (change.job, change.from_replicas, change.to_replicas) == (JobKey("ns/new"), 6, 2)
    assert change.memory.last_rescale_s is None  # no restart: the cooldown clock does not start


def test_withdrawal_skips_damping_but_waits_one_interval_after_a_rescale():
    job = make_job("a", current=6, scheduled=2, last_rescale_s=NOW_S - 120)
    observation = make_observation(job, queues=(make_queue(capability=2),), free=0)
    damped = make_policy(cooldown_s=3600.0, window_down_s=3600.0, max_step_down=1)
    (decision,) = fit_and_decide(observation, damped).decisions
    assert (decision.target_replicas, decision.reason) == (2, Reason.WITHDRAW_UNPLACED)
    # Rescaled 30 s ago (tide's own growth may not be scheduled yet): no withdrawal.
    just_grown = make_observation(
        dataclasses.replace(job, last_rescale_s=NOW_S - 30),
        queues=(make_queue(capability=2),),
        free=0,
    )
    (decision,) = fit_and_decide(just_grown, damped).decisions
    assert decision.target_replicas == 6


def test_waiting_replicas_stay_while_pending_work_claims_the_idle_gpus():
    # Volcano starts the pending gang before it adds elastic pods: the 4 waiting replicas take
    # nothing from it, so they are left as asked rather than withdrawn.
    observation = make_observation(
        make_job("new", current=6, scheduled=2, sigma=0.3),
        make_job("old", current=4, sigma=0.0),
        queues=(make_queue(capability=8, pending=2),),
        free=1,
    )
    plan = fit_and_decide(observation, make_policy())
    decisions = {d.job.removeprefix("ns/"): d for d in plan.decisions}
    assert decisions["new"].target_replicas == 6


def test_observation_file_reads_scheduled_replicas(tmp_path):
    path = tmp_path / "obs.yaml"
    path.write_text(
        "time: 1000\nclusterFreeGpus: 0\nqueues: [{name: q, capabilityGpus: 8}]\n"
        "jobs:\n  - {key: ns/a, queue: q, currentReplicas: 6, scheduledReplicas: 2,"
        " minReplicas: 1, maxReplicas: 8, elastic: true}\n"
    )
    (job,) = load_observation(path).jobs
    assert (job.current_replicas, job.held_replicas) == (6, 2)


def test_observation_file_refuses_a_queue_or_a_job_given_twice(tmp_path):
    path = tmp_path / "obs.yaml"
    job = "{key: ns/a, queue: q, currentReplicas: 2, elastic: true}"
    path.write_text(
        "time: 0\nqueues: [{name: q}, {name: r}, {name: q}]\n"
        f"jobs:\n  - {job}\n  - {{key: ns/b, queue: q, currentReplicas: 1}}\n  - {job}\n"
    )
    with pytest.raises(ObservationError) as refused:
        load_observation(path)
    assert str(refused.value).splitlines()[1:] == [
        "  - queues[2].name: duplicate queue 'q', first defined at queues[0]",
        "  - jobs[2].key: duplicate job 'ns/a', first defined at jobs[0]",
    ]


FIXED_POINT_CASES = {
    # Nothing pending: no queue gives anything back, so what is released changes no budget.
    "nothing-short-one-pass": (
        make_observation(make_job("a", current=2), free=3),
        make_policy(),
        1,
        {"a": (5, Reason.SCALE_UP_FOR_IDLE_GPUS)},
    ),
    # "research" gives back what "prod" needs; the budgets with that release are the same.
    "yield-settles-in-one-pass": (
        *SCENARIOS["shrink-borrowed-gpus-for-another-queues-pending-work"][:2],
        1,
        {"a": (6, Reason.SHRINK_FOR_PENDING_WORK)},
    ),
    # "c" needs 1 GPU and "a" 4; 3 are idle. The first pass sees no yield from "b" that would
    # start them; "y" (above its maximum) gives back 0.5 GPU in it, which the second pass counts
    # as idle: with it, all of "x" starts both, and the budgets then stay the same.
    "release-counted-on-the-second-pass": (
        make_observation(
            make_job(
                "x", queue="b", gpus_per_replica=0.5, min_replicas=0, max_replicas=3, current=3
            ),
            make_job(
                "y", queue="a", gpus_per_replica=0.5, min_replicas=0, max_replicas=0, current=1
            ),
            queues=(make_queue("a", pending=4), make_queue("b"), make_queue("c", pending=1)),
            free=3,
        ),
        make_policy("a", "b", "c", borrow=True),
        2,
        {"x": (0, Reason.SHRINK_FOR_PENDING_WORK), "y": (0, Reason.LIMITED_BY_BOUNDS)},
    ),
    # Two borrowing queues give back whole 2-GPU replicas for "a" and "c": what one gives counts
    # as idle for the other, which then gives less, which the first then counts... The budgets
    # need not settle in whole replicas; the bound stops the passes (a second reconcile on the
    # cluster this leaves writes nothing: test_reconcile).
    "whole-replicas-stop-at-the-bound": (
        make_observation(
            make_job(
                "x",
                queue="b",
                gpus_per_replica=2,
                max_replicas=1,
                current=1,
                min_replicas=0,
                sizes=(),
            ),
            make_job(
                "y",
                queue="c",
                gpus_per_replica=2,
                max_replicas=1,
                current=1,
                min_replicas=0,
                sizes=(),
            ),
            queues=(
                make_queue("a", capability=None, pending=6),
                make_queue("b", capability=None),
                make_queue("c", capability=None, pending=1),
            ),
            free=4,
        ),
        make_policy("a", "b", "c", borrow=True, max_step_down=1),
        MAX_PASSES,
        None,
    ),
}


@pytest.mark.parametrize(
    ("observation", "policy", "passes", "expected"),
    FIXED_POINT_CASES.values(),
    ids=FIXED_POINT_CASES.keys(),
)
def test_allocate_and_stabilize_repeat_until_the_budgets_settle(
    observation, policy, passes, expected
):
    plan = fit_and_decide(observation, policy)
    assert plan.passes == passes
    if expected is not None:
        found = {d.job.removeprefix("ns/"): (d.target_replicas, d.reason) for d in plan.decisions}
        assert found == expected


def test_a_failed_fit_holds_the_job_and_names_the_error():
    broken = dataclasses.replace(
        make_job("broken", current=2),
        throughput_history=(
            ThroughputPoint(NOW_S - 10, 2, float("inf")),
            ThroughputPoint(NOW_S - 5, 1, 50.0),
        ),
    )
    observation = make_observation(broken, make_job("fine", current=2), free=2)
    fits = ModelCache().fit(observation, make_policy())
    assert list(fits.curves) == [JobKey("ns/fine")]
    plan = decide(observation, make_policy(), fits=fits)
    decisions = {d.job.removeprefix("ns/"): d for d in plan.decisions}
    assert (decisions["broken"].target_replicas, decisions["broken"].reason) == (
        2,
        Reason.MODEL_FIT_FAILED,
    )
    assert decisions["broken"].message.startswith("job ns/broken: scaling model fit failed: ")
    assert "samples_per_s must be finite" in decisions["broken"].message
    assert decisions["fine"].target_replicas == 4  # the other job proceeds, into both idle GPUs
    assert [c.job for c in plan.changes] == [JobKey("ns/fine")]


def test_a_job_the_fits_do_not_cover_is_held():
    observation = make_observation(make_job("a", current=2), free=2)
    plan = decide(observation, make_policy(), fits=Fits(curves={}))
    (decision,) = plan.decisions
    assert (decision.target_replicas, decision.reason) == (2, Reason.MODEL_FIT_FAILED)
    assert "no scaling curve was fitted" in decision.message
    assert plan.changes == ()


def test_a_rounds_decisions_share_one_explanation_that_writes_each_jobs_own_sentence():
    observation = make_observation(
        make_job("a", current=2, max_replicas=8),
        make_job("b", current=2, max_replicas=2),
        free=8,
    )
    decisions = {
        d.job.removeprefix("ns/"): d for d in fit_and_decide(observation, make_policy()).decisions
    }
    assert decisions["a"].why is decisions["b"].why
    assert decisions["a"].reason is Reason.SCALE_UP_FOR_IDLE_GPUS
    assert decisions["a"].message.startswith("queue q has room for elastic growth; 8 replicas")
    assert decisions["b"].message == "2 replicas fit queue q's budget and are worth their GPUs"
    with pytest.raises(KeyError, match="ns/other has no decision"):
        decisions["a"].why.render(JobKey("ns/other"))


def _reclaim_pressure(*jobs, pending: float):
    """Queue "r" holds 8 GPUs over a deserved share of 4; queue "p" waits for ``pending`` GPUs
    and none is idle: Volcano's reclaim takes from "r" what tide does not give back."""
    return make_observation(
        *jobs,
        queues=(
            make_queue("r", capability=None, deserved=4),
            make_queue("p", capability=None, deserved=4, pending=pending),
        ),
        free=0,
    )


@pytest.mark.parametrize(
    ("others", "expected"),
    [
        # Alone in its queue, "x" (measured at 8 only: on the prior's shape, rate-limited to 2
        # replicas a round) would hold 6 GPUs against a budget of 4: reclaim would kill the
        # other 2 within seconds, so the budget takes all 4 now.
        ((), {"x": (4, Reason.SHRINK_FOR_PENDING_WORK)}),
        # With a measured job beside it that can give back the rest, the rate limit holds:
        # "x" (6) gives its 2, "y" both its replicas.
        (
            (make_job("y", queue="r", min_replicas=0, current=2, sizes=(1, 2)),),
            {"x": (4, Reason.SHRINK_FOR_PENDING_WORK), "y": (0, Reason.SHRINK_FOR_PENDING_WORK)},
        ),
    ],
    ids=["the-floor-yields-where-it-would-overfill-the-budget", "the-floor-holds-where-others-can"],
)
def test_the_rate_limit_yields_to_reclaim_only_where_the_budget_cannot_be_met(others, expected):
    x = make_job("x", queue="r", min_replicas=1, current=8 - 2 * len(others), sizes=(8,))
    observation = _reclaim_pressure(x, *others, pending=4)
    found = targets(observation, make_policy("r", "p", borrow=True, max_step_down=2))
    assert found == expected


def test_observation_file_reads_a_queues_weight_and_request(tmp_path):
    path = tmp_path / "obs.yaml"
    path.write_text(
        "time: 0\nqueues: [{name: q, weight: 2, requestGpus: 6}, {name: r}]\njobs: []\n"
    )
    q, r = load_observation(path).queues
    assert (q.weight, q.request_gpus, r.weight, r.request_gpus) == (2.0, 6.0, 1.0, None)


def test_observation_file_refuses_a_negative_weight(tmp_path):
    path = tmp_path / "obs.yaml"
    path.write_text("time: 0\nqueues: [{name: q, weight: -1}]\njobs: []\n")
    with pytest.raises(ObservationError, match=r"queues\[0\]\.weight"):
        load_observation(path)


def _asking(request_research: float, request_prod: float, deserved_research: float):
    """research (weight 2, does not borrow) and prod (weight 1) on 12 GPUs, research's job at 2
    of its 12 replicas, 8 GPUs idle: what the share scenarios below share."""
    return make_observation(
        make_job(
            "a", queue="research", current=2, max_replicas=12, sigma=0.0, sizes=(1, 2, 4, 8, 12)
        ),
        queues=(
            dataclasses.replace(
                make_queue("research", capability=None, deserved=deserved_research),
                allocated_gpus=2.0,
                weight=2.0,
                request_gpus=request_research,
            ),
            dataclasses.replace(
                make_queue("prod", capability=None, deserved=2.0),
                allocated_gpus=2.0,
                weight=1.0,
                request_gpus=request_prod,
            ),
        ),
        free=8,
    )


SHARES = {
    # The scheduler's share is all research asks (2 GPUs): asking for more, it would deserve 2/3
    # of the 12 GPUs and what prod, asking for 2, leaves: 10, and the job grows to 10.
    "given-all-it-asks-grows-within-the-share-it-would-deserve": ((2.0, 2.0, 2.0), 10),
    # prod asks for 9: by weight research deserves 8 of the 12 if it asks for them.
    "the-weights-bound-the-share": ((2.0, 9.0, 2.0), 8),
    # research asks for more than it is given: the scheduler's share (3) binds.
    "share-limited-by-the-scheduler": ((6.0, 9.0, 3.0), 3),
    # No request known (an older Volcano, or no Prometheus): the scheduler's share stands.
    "request-unknown-the-scheduler-share-stands": ((None, None, 2.0), 2),
}


@pytest.mark.parametrize(("figures", "target"), SHARES.values(), ids=SHARES.keys())
def test_a_queue_that_does_not_borrow_grows_within_its_share(figures, target):
    observation = _asking(*figures)
    found = targets(observation, make_policy("research", "prod", borrow=False))
    assert found["a"][0] == target
