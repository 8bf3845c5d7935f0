"""Invariants of ``decide`` and ``reconcile`` over random observations and policies."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_policy.engine.reconcile import decide, reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.state import JobPhase, Observation, Reason, Recommendation
from tests.scheduler_policy.builders import (
    NOW_S,
    make_job,
    make_observation,
    make_policy,
    make_queue,
)

QUEUES = ("a", "b", "c")


def fit_and_decide(observation, policy):
    return decide(observation, policy, fits=ModelCache().fit(observation, policy))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Observation, ElasticPolicy]:
    queues = tuple(
        make_queue(
            name,
            capability=draw(st.one_of(st.none(), st.integers(0, 32).map(float))),
            deserved=draw(st.one_of(st.none(), st.integers(0, 16).map(float))),
            pending=float(draw(st.integers(0, 8))),
        )
        for name in QUEUES[: draw(st.integers(1, 3))]
    )
    jobs = []
    for i in range(draw(st.integers(0, 8))):
        lo = draw(st.integers(0, 4))
        hi = draw(st.integers(lo, 10))
        current = draw(st.integers(lo, 12))
        phase = draw(st.sampled_from([JobPhase.RUNNING, JobPhase.RUNNING, JobPhase.PENDING]))
        # A running job has its gang minimum bound to nodes: Volcano starts a gang whole.
        least_scheduled = min(lo, current) if phase is JobPhase.RUNNING else 0
        jobs.append(
            make_job(
                f"j{i}",
                queue=draw(st.sampled_from([q.name for q in queues])),
                gpus_per_replica=draw(st.sampled_from([0.5, 1.0, 2.0, 4.0])),
                min_replicas=lo,
                max_replicas=hi,
                # Volcano's webhook refuses replicas below the gang minimum; a job raised to
                # its minimum is a scenario of its own in test_decide.
                current=current,
                # Pods beyond the scheduled ones wait for GPUs.
                scheduled=draw(st.one_of(st.none(), st.integers(least_scheduled, current))),
                elastic=draw(st.booleans()),
                phase=phase,
                sizes=tuple(sorted(draw(st.sets(st.integers(1, 8), max_size=3)))),
                sigma=draw(st.floats(0.0, 0.5)),
                kappa=draw(st.floats(0.0, 0.05)),
                remaining_samples=draw(st.one_of(st.none(), st.floats(1e3, 1e8))),
                # What the owner asked for, which tide's withdrawals may have left the spec
                # below (a taker of trades up to it).
                requested=draw(st.one_of(st.none(), st.integers(lo, hi + 2))),
            )
        )
    policy = make_policy(
        *[q.name for q in queues],
        borrow=draw(st.booleans()),
        headroom_gpus=float(draw(st.integers(0, 4))),
        tolerance=draw(st.sampled_from([0.0, 0.05, 0.2])),
        restart_cost_s=draw(st.sampled_from([0.0, 30.0, 600.0])),
        max_step_up=draw(st.integers(1, 8)),
        max_step_down=draw(st.integers(1, 8)),
    )
    observation = make_observation(
        *jobs, queues=queues, free=float(draw(st.integers(0, 24))), fresh=draw(st.booleans())
    )
    return observation, policy


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


@SETTINGS
@given(scenarios())
def test_targets_respect_bounds_budgets_and_idle_gpus(scenario):
    observation, policy = scenario
    plan = fit_and_decide(observation, policy)
    jobs = {job.key: job for job in observation.jobs}
    moved = [d for d in plan.decisions if d.changes]
    for d in moved:
        job = jobs[d.job]
        assert job.min_replicas <= d.target_replicas <= job.max_replicas
    # New pods asked for (raising a job to its own minimum is its gang, not elastic growth)
    # take idle GPUs, or GPUs other jobs give up for them.
    growth = sum(
        max(0, d.target_replicas - max(d.current_replicas, jobs[d.job].min_replicas))
        * jobs[d.job].gpus_per_replica
        for d in moved
    )
    traded = sum(
        max(0, jobs[d.job].held_replicas - d.target_replicas) * jobs[d.job].gpus_per_replica
        for d in moved
        if d.reason is Reason.SHRINK_FOR_BETTER_USE
    )
    assert growth <= observation.cluster_free_gpus + traded + 1e-9
    targets = {d.job: d.target_replicas for d in plan.decisions}
    for queue in observation.queues:
        in_queue = [j for j in observation.jobs if j.queue == queue.name and not j.phase.finished]
        grew = any(
            targets.get(j.key, j.current_replicas) > max(j.current_replicas, j.min_replicas)
            for j in in_queue
        )
        if grew and queue.capability_gpus is not None:
            used = sum(
                targets.get(j.key, j.current_replicas) * j.gpus_per_replica
                for j in in_queue
                if j.phase is JobPhase.RUNNING
            )
            assert used <= queue.capability_gpus + 1e-9


@SETTINGS
@given(scenarios())
def test_the_same_input_gives_the_same_output(scenario):
    observation, policy = scenario
    assert fit_and_decide(observation, policy) == fit_and_decide(observation, policy)


@SETTINGS
@given(scenarios())
def test_stale_metrics_never_shrink(scenario):
    observation, policy = scenario
    stale = Observation(observation.time_s, observation.queues, observation.jobs,
                        observation.cluster_free_gpus, metrics_fresh=False)  # fmt: skip
    plan = fit_and_decide(stale, policy)
    assert all(d.target_replicas >= d.current_replicas for d in plan.decisions)
    assert not any(c.to_replicas < c.from_replicas for c in plan.changes)


@st.composite
def damped_scenarios(draw: st.DrawFn) -> tuple[Observation, ElasticPolicy, float]:
    """A scenario with the damping's memory and settings drawn too, and terminating GPUs."""
    observation, policy = draw(scenarios())
    jobs = []
    for job in observation.jobs:
        rescaled = draw(st.one_of(st.none(), st.sampled_from([10.0, 90.0, 400.0, 4000.0])))
        recent = draw(st.lists(st.tuples(st.sampled_from([30.0, 200.0, 900.0]),
                                         st.integers(0, 12)), max_size=2))  # fmt: skip
        jobs.append(
            dataclasses.replace(
                job,
                last_rescale_s=None if rescaled is None else NOW_S - rescaled,
                recommendations=tuple(
                    Recommendation(NOW_S - age, replicas)
                    for age, replicas in sorted(recent, reverse=True)
                ),
            )
        )
    defaults = dataclasses.replace(
        policy.defaults,
        cooldown_s=draw(st.sampled_from([0.0, 60.0, 300.0])),
        window_up_s=draw(st.sampled_from([0.0, 120.0])),
        window_down_s=draw(st.sampled_from([0.0, 300.0])),
    )
    terminating = float(draw(st.integers(0, 4)))
    return (
        dataclasses.replace(observation, jobs=tuple(jobs)),
        dataclasses.replace(policy, defaults=defaults),
        terminating,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damped_scenarios())
def test_reconcile_then_apply_then_reconcile_writes_nothing(scenario):
    # The house rule: whatever the first reconcile wrote, a second one on the cluster it left
    # (same time, same observation of it) writes nothing, and holds every job where it is.
    observation, policy, terminating = scenario
    cluster = FakeCluster(observation)
    cluster.terminating_gpus = terminating
    models = ModelCache()
    reconcile(metrics=cluster, cluster=cluster, policy=policy, now_s=NOW_S, models=models)
    after_first = {job.key: job for job in cluster.list_jobs()}
    second = reconcile(metrics=cluster, cluster=cluster, policy=policy, now_s=NOW_S, models=models)
    assert second.applied == ()
    assert second.failed == ()
    assert [d.job for d in second.decisions if d.changes] == []
    assert {job.key: job for job in cluster.list_jobs()} == after_first
