"""``tide plan`` on observation files with a per-job metrics verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tide.cli import app

POLICY = """\
apiVersion: tide.io/v1alpha1
kind: ElasticPolicy
metadata: {name: test}
spec:
  defaults: {cooldown: 0s, tolerance: 0, restartCost: 0s}
  queues: [{name: research}]
"""


def observation(**stale_job: object) -> dict:
    def job(name: str, **extra: object) -> dict:
        return {
            "key": f"team/{name}", "queue": "research", "gpusPerReplica": 1, "minReplicas": 1,
            "maxReplicas": 8, "currentReplicas": 2, "phase": "Running", "elastic": True,
            "throughput": [{"time": 1699999000 + i, "replicas": n, "samplesPerS": 100 * n}
                           for i, n in enumerate((1, 2))],
            **extra,
        }  # fmt: skip

    return {
        "time": 1700000000,
        "clusterFreeGpus": 4,
        "queues": [{"name": "research", "capabilityGpus": 16}],
        "jobs": [job("stale", **stale_job), job("fresh")],
    }


def plan(tmp_path: Path, data: dict, *args: str):
    (tmp_path / "obs.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    (tmp_path / "policy.yaml").write_text(POLICY, encoding="utf-8")
    return CliRunner().invoke(
        app, ["plan", "-o", str(tmp_path / "obs.yaml"), "-p", str(tmp_path / "policy.yaml"), *args]
    )


@pytest.mark.parametrize(
    ("stale_job", "says"),
    [
        ({"metricsFresh": False, "staleReason": "samples counter absent for 10m"},
         "samples counter absent for 10m"),
        ({"metricsFresh": False}, "the metrics source marked them stale"),
    ],
    ids=["with-a-reason", "without-a-reason"],
)  # fmt: skip
def test_a_stale_job_holds_while_the_fresh_one_scales_up(tmp_path, stale_job, says):
    result = plan(tmp_path, observation(**stale_job), "--json")
    assert result.exit_code == 0, result.output
    decisions = {d["job"]: d for d in json.loads(result.output)["decisions"]}
    stale, fresh = decisions["team/stale"], decisions["team/fresh"]
    assert (stale["target_replicas"], stale["reason"]) == (2, "HoldMetricsStale")
    assert "team/stale" in stale["message"] and says in stale["message"]
    assert (fresh["target_replicas"], fresh["reason"]) == (6, "ScaleUpForIdleGpus")


def test_the_table_shows_the_stale_reason(tmp_path):
    data = observation(metricsFresh=False, staleReason="throughput series absent")
    result = plan(tmp_path, data)
    assert result.exit_code == 0, result.output
    assert "HoldMetricsStale" in result.output and "ScaleUpForIdleGpus" in result.output
    assert "absent" in result.output


def test_both_fresh_both_grow(tmp_path):
    result = plan(tmp_path, observation(), "--json")
    assert {d["reason"] for d in json.loads(result.output)["decisions"]} == {"ScaleUpForIdleGpus"}


@pytest.mark.parametrize(
    ("stale_job", "error"),
    [
        ({"throughput": [{"time": 1, "replicas": 2, "samplesPerS": float("nan")}]},
         "jobs[0].throughput[0].samplesPerS"),
        ({"metricsFresh": "no"}, "jobs[0].metricsFresh"),
        ({"staleReason": "late"}, "jobs[0].staleReason: given for a job whose metricsFresh"),
        ({"metricsFresh": False, "staleReason": 3}, "jobs[0].staleReason: must be a sentence"),
    ],
    ids=["nan-throughput", "fresh-not-a-boolean", "reason-without-stale", "reason-not-text"],
)  # fmt: skip
def test_a_bad_verdict_or_a_nan_is_a_clear_error(tmp_path, stale_job, error):
    result = plan(tmp_path, observation(**stale_job))
    assert result.exit_code == 1
    assert error in " ".join(result.output.split())
