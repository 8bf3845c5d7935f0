"""The average-JCT lower bound the quality benchmark quotes."""

from __future__ import annotations

import math

import pytest

from scheduler_policy.model import JobKey, QueueName
from simulations.profiles import ScalingProfile
from simulations.report import jct_lower_bound_h
from simulations.workload import Workload, WorkloadJob

PROFILE = ScalingProfile(name="t", units_per_s=(1.0, 1.8, 2.4, 2.2))  # peaks at 3 replicas


def job(name: str, *, lo: int, hi: int, work: float) -> WorkloadJob:
    return WorkloadJob(
        key=JobKey(f"ns/{name}"), submit_s=0.0, queue=QueueName("q"), elastic=lo != hi,
        gpus_per_replica=1, min_replicas=lo, max_replicas=hi, requested_replicas=lo,
        work_units=work, profile=PROFILE,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("jobs", "expected_h"),
    [
        ((job("rigid", lo=2, hi=2, work=3600 * 1.8),), 1.0),
        ((job("elastic", lo=1, hi=4, work=3600 * 2.4),), 1.0),  # fastest at 3, not at max 4
        ((job("a", lo=1, hi=1, work=3600.0), job("b", lo=2, hi=3, work=3600 * 7.2)), 2.0),
    ],
    ids=["rigid-at-its-size", "elastic-at-its-fastest-size", "mean-over-jobs"],
)
def test_jct_lower_bound(jobs, expected_h):
    assert jct_lower_bound_h(Workload(name="w", jobs=jobs)) == pytest.approx(expected_h)


def test_empty_workload_has_no_bound():
    assert math.isnan(jct_lower_bound_h(Workload(name="w", jobs=())))


def test_a_horizon_counts_the_wait_of_jobs_that_entered_the_run_only() -> None:
    from simulations.api import PolicyRun, run_one
    from simulations.report import summarize
    from simulations.run import RunOptions
    from tests.simulations.helpers import make_cluster, make_job

    jobs = (
        make_job("runs", replicas=4, work=4 * 7200.0),  # holds all 4 GPUs for 2 h
        make_job("waits", submit_s=600.0, replicas=2),  # waits from 600 s to the horizon
        make_job("later", submit_s=7200.0, replicas=1),  # submitted after the horizon
    )
    result = run_one(
        PolicyRun("static", "static"),
        workload=Workload("w", jobs),
        cluster=make_cluster(),
        options=RunOptions(horizon_s=3600.0),
    )
    summary = summarize(result)
    assert summary.finished == 0
    # Once the job submitted after the horizon counted -1 h; the delays are 0 h and 5/6 h.
    assert summary.avg_queue_h == pytest.approx((0.0 + 3000 / 3600) / 2)
    assert summary.p95_queue_h >= 0.0
