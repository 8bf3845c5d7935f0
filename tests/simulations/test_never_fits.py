"""A job whose gang cannot fit the empty cluster ends the run instead of stalling it."""

from __future__ import annotations

import pytest

from simulations.api import PolicyRun, run_one
from simulations.report import summarize
from simulations.run import RunOptions
from simulations.workload import Workload
from tests.simulations.helpers import make_cluster, make_job


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["static", "tiresias"])
def test_a_gang_larger_than_the_cluster_never_runs_and_the_run_ends(policy: str) -> None:
    workload = Workload(
        "t",
        (
            make_job("fits", replicas=2, work=100.0, elastic=False),
            make_job("too-big", submit_s=10.0, replicas=8, work=100.0, elastic=False),
        ),
    )
    result = run_one(PolicyRun(policy, policy), workload=workload,
                     cluster=make_cluster(nodes=1, gpus=4), options=RunOptions())  # fmt: skip
    by_key = {job.key: job for job in result.jobs}
    assert by_key["ns/fits"].end_s is not None
    assert by_key["ns/too-big"].start_s is None
    summary = summarize(result)
    assert (summary.jobs, summary.finished) == (2, 1)
