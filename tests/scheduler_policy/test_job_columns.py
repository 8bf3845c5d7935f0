"""The columns a decision reads its jobs and curves from agree with the objects they come from."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.decision.job_table import (
    OTHER_QUEUE,
    PHASE_CODES,
    UNKNOWN_QUEUE,
    JobColumns,
)
from scheduler_policy.decision.triage import NOT_MEASURED, triage
from scheduler_policy.models.curve import CurveColumns, JobCurve
from scheduler_policy.vocabulary.state import JobKey, JobPhase, JobState, QueueName, Reason
from tests.scheduler_policy.builders import make_job, make_observation, make_policy, make_queue

VALIDITY = {
    "valid": {},
    "valid-with-restart-cost": {"restart_cost_s": 30.0},
    "nan-restart-cost": {"restart_cost_s": math.nan},
    "negative-restart-cost": {"restart_cost_s": -1.0},
    "negative-minimum": {"min_replicas": -1},
    "minimum-above-maximum": {"min_replicas": 5, "max_replicas": 2},
    "negative-current": {"current": -1},
    "nan-gpus": {"gpus_per_replica": math.nan},
    "infinite-gpus": {"gpus_per_replica": math.inf},
    "negative-gpus": {"gpus_per_replica": -1.0},
}


@pytest.mark.parametrize("fields", list(VALIDITY.values()), ids=list(VALIDITY))
def test_a_job_reads_valid_only_when_it_has_no_spec_problem(fields: dict[str, object]) -> None:
    job = make_job(**fields)  # type: ignore[arg-type]
    columns = JobColumns.read([job], queue_names=[QueueName("q")])
    assert bool(columns.valid[0]) == (job.spec_problems() == [])


def test_a_read_problem_makes_a_job_invalid() -> None:
    job = dataclasses.replace(make_job(), read_problems=("bad tide.io/min-replicas",))
    assert not JobColumns.read([job], queue_names=[QueueName("q")]).valid[0]


QUEUES = {
    "managed": ("q", 0),
    "present-not-managed": ("other", OTHER_QUEUE),
    "absent": ("nowhere", UNKNOWN_QUEUE),
}


@pytest.mark.parametrize("queue, index", list(QUEUES.values()), ids=list(QUEUES))
def test_a_job_s_queue_is_indexed_among_the_managed_ones(queue: str, index: int) -> None:
    columns = JobColumns.read(
        [make_job(queue=queue)],
        queue_names=[QueueName("q")],
        other_queues={QueueName("q"), QueueName("other")},
    )
    assert int(columns.queue_index[0]) == index


@pytest.mark.parametrize("phase", list(JobPhase), ids=[p.value for p in JobPhase])
def test_a_job_s_phase_reads_back(phase: JobPhase) -> None:
    columns = JobColumns.read([make_job(phase=phase)], queue_names=[QueueName("q")])
    assert PHASE_CODES[int(columns.phase[0])] is phase


def _one_by_one(
    jobs: list[JobState], *, managed: set[str], present: set[str], fresh: bool
) -> list[str]:
    """What triage decides of each elastic job, asked of the job itself."""
    out = []
    for job in jobs:
        if not job.elastic:
            continue
        if job.spec_problems() or job.queue not in present:
            out.append(Reason.INVALID_JOB_SPEC.value)
        elif job.queue not in managed:
            if job.phase is JobPhase.RUNNING:
                out.append(Reason.QUEUE_NOT_MANAGED.value)
        elif job.phase is not JobPhase.RUNNING:
            if not job.phase.finished:
                out.append(Reason.NOT_RUNNING.value)
        else:
            out.append("ready" if fresh else Reason.HOLD_METRICS_STALE.value)
    return out


_jobs = st.lists(
    st.builds(
        make_job,
        queue=st.sampled_from(["q", "other", "nowhere"]),
        phase=st.sampled_from(list(JobPhase)),
        elastic=st.booleans(),
        min_replicas=st.integers(-1, 3),
        max_replicas=st.integers(0, 4),
        current=st.integers(-1, 4),
        restart_cost_s=st.sampled_from([None, 0.0, 30.0, -1.0, math.nan]),
        sizes=st.sampled_from([(), (1,), (1, 2)]),
        stale=st.sampled_from([None, "throughput 20 min old"]),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(jobs=_jobs, fresh=st.booleans())
def test_triage_on_columns_decides_each_job_as_the_job_itself_says(
    jobs: list[JobState], fresh: bool
) -> None:
    jobs = [dataclasses.replace(j, key=JobKey(f"ns/job-{i}")) for i, j in enumerate(jobs)]
    observation = make_observation(
        *jobs, queues=(make_queue("q"), make_queue("other")), fresh=fresh
    )
    ready, held, stale, rows = triage(observation, make_policy("q"))
    by_key = {d.job: d.reason.value for d in held} | {j.key: "ready" for j in ready}
    decided = [by_key[j.key] for j in jobs if j.key in by_key]
    assert decided == _one_by_one(jobs, managed={"q"}, present={"q", "other"}, fresh=fresh)
    assert [jobs[i] for i in rows.tolist()] == ready
    assert stale == {
        j.key: j.stale_reason or NOT_MEASURED
        for j in ready
        if j.stale_reason is not None or not j.throughput_history
    }


CURVES = {
    "prior-usl": JobCurve(1.0, 0.0, 0.0, measured=False),
    "measured-usl": JobCurve(120.0, 0.05, 0.001, measured=True, sizes=3),
    "measured-on-nodes": JobCurve(
        80.0,
        0.1,
        0.0,
        measured=True,
        sizes=2,
        sync=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
        cross_node_max_samples_per_s=300.0,
        gpus_per_node=8.0,
    ),
}


def test_curve_columns_read_back_every_curve_s_figures() -> None:
    curves = list(CURVES.values())
    columns = CurveColumns.of(curves)
    for i, curve in enumerate(curves):
        assert columns.lam[i] == curve.lambda_samples_per_s
        assert columns.sigma[i] == curve.sigma
        assert columns.kappa[i] == curve.kappa
        assert bool(columns.measured[i]) is curve.measured
        assert int(columns.sizes[i]) == curve.sizes
        assert columns.cross_node_max[i] == curve.cross_node_max_samples_per_s
        assert columns.gpus_per_node[i] == curve.gpus_per_node
        assert bool(columns.placed[i]) is bool(curve.sync)
        assert tuple(columns.sync[i]) == (curve.sync or (0.0,) * 7)
    assert CurveColumns.of([]).sync.shape == (0, 7)


def test_a_curve_with_the_wrong_number_of_sync_terms_is_refused_naming_sync() -> None:
    with pytest.raises(ValueError, match="sync: expected the 7 terms"):
        JobCurve(1.0, 0.0, 0.0, measured=True, sync=(0.1, 0.2))


def test_a_replaced_curve_packs_its_new_figures() -> None:
    curve = dataclasses.replace(CURVES["measured-usl"], lambda_samples_per_s=7.0)
    assert CurveColumns.of([curve]).lam.tolist() == [7.0]
    assert curve == dataclasses.replace(curve)
    assert np.isfinite(CurveColumns.of([curve]).sigma).all()
