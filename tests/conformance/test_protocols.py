"""What every ``ClusterClient`` and ``MetricsSource`` must do, whichever it is.

Parametrized over the implementations in ``conftest.py``.
"""

from __future__ import annotations

import logging

import pytest

from scheduler_policy.engine.reconcile import observe
from scheduler_policy.vocabulary.errors import ConflictError, PermanentError
from scheduler_policy.vocabulary.protocols import MetricsSample, ReplicaChange
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobMemory,
    JobPhase,
    JobState,
    Reason,
    Recommendation,
)
from tests.conformance.conftest import Harness

MEMORY = JobMemory(last_rescale_s=512.25, recommendations=(Recommendation(480.125, 3),))


def job(h: Harness) -> JobState:
    (found,) = [j for j in h.client.list_jobs() if j.key == h.job]
    return found


def change(h: Harness, *, to: int | None = None, frm: int | None = None,
           memory: JobMemory = MEMORY) -> ReplicaChange:  # fmt: skip
    now = job(h)
    return ReplicaChange(
        job=h.job, task=now.task,
        from_replicas=now.current_replicas if frm is None else frm,
        to_replicas=now.current_replicas if to is None else to,
        memory=memory, reason=Reason.SCALE_UP_FOR_IDLE_GPUS, why="conformance",
    )  # fmt: skip


def test_list_jobs_gives_job_states_with_unique_keys(harness):
    jobs = harness.client.list_jobs()
    assert all(isinstance(j, JobState) for j in jobs)
    assert len({j.key for j in jobs}) == len(jobs)
    target = job(harness)
    assert target.elastic and target.phase is JobPhase.RUNNING
    assert target.min_replicas <= target.current_replicas < target.max_replicas


def test_list_queues_names_the_queue_of_every_job(harness):
    queues = {q.name for q in harness.client.list_queues()}
    assert {j.queue for j in harness.client.list_jobs()} <= queues


def test_apply_stores_the_memory_that_the_next_list_returns_exactly(harness):
    before = job(harness).current_replicas
    harness.client.apply(change(harness, to=before + 1))
    after = job(harness)
    assert after.current_replicas == before + 1
    assert (after.last_rescale_s, after.recommendations) == (
        MEMORY.last_rescale_s, MEMORY.recommendations,
    )  # fmt: skip
    assert [repr(r.time_s) for r in after.recommendations] == ["480.125"]


def test_a_memory_only_change_writes_no_replicas(harness):
    before = job(harness)
    harness.client.apply(change(harness))
    after = job(harness)
    assert after.current_replicas == before.current_replicas
    assert after.recommendations == MEMORY.recommendations


def test_a_stale_from_replicas_is_a_conflict_and_changes_nothing(harness):
    before = job(harness)
    with pytest.raises(ConflictError):
        harness.client.apply(change(harness, frm=before.current_replicas + 1,
                                    to=before.current_replicas))  # fmt: skip
    assert job(harness) == before


def test_a_write_to_a_job_that_does_not_exist_is_permanent(harness):
    ghost = ReplicaChange(JobKey("ns/ghost"), "worker", 1, 2, MEMORY,
                          Reason.SCALE_UP_FOR_IDLE_GPUS, "")  # fmt: skip
    with pytest.raises(PermanentError):
        harness.client.apply(ghost)


def test_memory_that_cannot_be_stored_is_refused_and_changes_nothing(harness):
    before = job(harness)
    bad = JobMemory(last_rescale_s=float("nan"))
    with pytest.raises(PermanentError):
        harness.client.apply(change(harness, to=before.current_replicas + 1, memory=bad))
    assert job(harness) == before


def test_a_spoiled_memory_lists_as_no_memory_with_a_warning(harness, caplog):
    harness.client.apply(change(harness))
    harness.spoil_memory()
    with caplog.at_level(logging.WARNING):
        spoiled = job(harness)
    assert (spoiled.last_rescale_s, spoiled.recommendations) == (None, ())
    assert harness.job in caplog.text


def test_sample_never_raises_and_names_a_job_whose_metrics_are_missing(harness):
    assert isinstance(harness.metrics.sample(now_s=harness.now_s), MetricsSample)
    harness.lose_metrics()
    sample = harness.metrics.sample(now_s=harness.now_s)
    assert isinstance(sample, MetricsSample)
    assert harness.job in sample.stale_jobs and sample.stale_jobs[harness.job].strip()
    assert harness.job not in sample.job_throughput or not sample.job_throughput[harness.job]


def test_observe_marks_the_job_whose_metrics_are_missing(harness):
    harness.lose_metrics()
    observation = observe(metrics=harness.metrics, cluster=harness.client, now_s=harness.now_s)
    (seen,) = [j for j in observation.jobs if j.key == harness.job]
    assert seen.stale_reason is not None and seen.stale_reason.strip()
