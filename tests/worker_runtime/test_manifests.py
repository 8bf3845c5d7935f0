"""The example Volcano Job validates against the CRD schema and follows the elastic pattern."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "manifests" / "examples" / "elastic-pytorch-job.yaml"
CRD = REPO.parent / "shared" / "volcano-crds" / "batch.volcano.sh_jobs.yaml"


def load_job() -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all(JOB.read_text()) if d]
    jobs = [d for d in documents if d["kind"] == "Job"]
    assert len(jobs) == 1
    job: dict[str, Any] = jobs[0]
    return job


@pytest.mark.skipif(not CRD.exists(), reason=f"Volcano CRDs not found at {CRD} (../shared absent)")
def test_job_validates_against_the_crd_schema() -> None:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    jsonschema.validate(load_job(), version["schema"]["openAPIV3Schema"])


def test_job_follows_the_elastic_pattern() -> None:
    job = load_job()
    annotations = job["metadata"]["annotations"]
    assert annotations["tide.io/elastic"] == "true"
    worker = next(t for t in job["spec"]["tasks"] if t["name"] == annotations["tide.io/task"])
    low, high = int(annotations["tide.io/min-replicas"]), int(annotations["tide.io/max-replicas"])
    assert low <= worker["replicas"] <= high
    assert worker["minAvailable"] <= low
    fixed = sum(t["replicas"] for t in job["spec"]["tasks"] if t is not worker)
    assert job["spec"]["minAvailable"] == fixed + low
    assert "policies" not in job["spec"]
    args = worker["template"]["spec"]["containers"][0]["args"]
    assert f"--nnodes={fixed + low}:{fixed + high}" in args
    assert "--rdzv-backend=c10d" in args
    env = {e["name"] for e in worker["template"]["spec"]["containers"][0]["env"]}
    assert {"TIDE_METRICS_PORT", "VOLCANO_JOB_NAME", "POD_NAMESPACE"} <= env


def test_every_pod_runs_torchrun_with_a_fresh_store_per_round() -> None:
    # Without it a rescale can hang: see the comment on the variable in the manifest.
    for task in load_job()["spec"]["tasks"]:
        env = {e["name"]: e.get("value") for e in task["template"]["spec"]["containers"][0]["env"]}
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1", task["name"]
