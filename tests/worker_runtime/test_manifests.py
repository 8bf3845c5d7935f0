"""The example Volcano Job validates against the CRD schema and follows the elastic pattern."""

from __future__ import annotations

import json
import re
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


DOCKERFILE = REPO / "manifests" / "examples" / "Dockerfile"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of each line of the example's Dockerfile, comments dropped."""
    found = []
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            instruction, _, rest = line.strip().partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def test_the_dockerfile_copies_files_that_exist_and_runs_what_the_job_runs() -> None:
    instructions = dockerfile_instructions()
    copies = [args.split() for name, args in instructions if name == "COPY"]
    for *sources, _ in copies:
        for source in sources:
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which does not exist"
    # Every package pyproject.toml installs is in the build.
    copied = {source for *sources, _ in copies for source in sources}
    assert {"scheduler_policy", "metrics_collector", "simulations", "tide", "worker_runtime"} <= (
        copied
    )
    script_destinations = {dest for *sources, dest in copies if sources == [
        "manifests/examples/train_elastic.py"]}  # fmt: skip
    entrypoint = next(json.loads(args) for name, args in instructions if name == "ENTRYPOINT")
    assert any(name == "RUN" and '".[worker]"' in args for name, args in instructions)
    for task in load_job()["spec"]["tasks"]:
        container = task["template"]["spec"]["containers"][0]
        assert container["image"] == "ghcr.io/tide/train-elastic:0.1.0"
        assert container["command"] == entrypoint, task["name"]
        scripts = [a for a in container["args"] if a.endswith(".py")]
        assert len(scripts) == 1 and scripts[0] in script_destinations, task["name"]


def test_the_base_image_carries_the_torch_release_the_worker_extra_pins() -> None:
    base = next(args for name, args in dockerfile_instructions() if name == "FROM")
    # tomllib is Python 3.11+; the project supports 3.10. The worker extra is one line.
    extra = re.search(r"^worker = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.M)
    assert extra is not None
    pins = re.findall(r'"torch==([^"]+)"', extra.group(1))
    assert len(pins) == 1, extra.group(0)
    version = pins[0]
    assert re.fullmatch(rf"pytorch/pytorch:{re.escape(version)}-cuda[\d.]+-cudnn\d+-runtime", base)
