"""The adaptive example Job passes its adaptive-batch annotations to every trainer, `tide validate`
refuses a Job whose pods would not get them, and the example script opts in from that env."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from scheduler_policy.adapters.volcano_job import VolcanoJob, read_job
from scheduler_policy.policy.annotations import ADAPTIVE_ENV
from scheduler_policy.policy.validate import check_job
from worker_runtime.env import AdaptiveBatchSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"
ADAPTIVE_JOB = EXAMPLES / "adaptive-pytorch-job.yaml"
PLAIN_JOB = EXAMPLES / "elastic-pytorch-job.yaml"
SHARED = REPO.parent / "shared"
WIRE = SHARED / "volcano-wire" / "v1.15.1"
CRD = SHARED / "volcano-crds" / "batch.volcano.sh_jobs.yaml"
needs_shared = pytest.mark.skipif(
    not WIRE.exists() or not CRD.exists(), reason=f"Volcano recordings not found under {SHARED}"
)
FIELD = re.compile(r"metadata\.annotations\['(?P<key>[^']+)'\]")


def load_job(path: Path = ADAPTIVE_JOB) -> dict[str, Any]:
    jobs = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Job"]
    assert len(jobs) == 1
    job: dict[str, Any] = jobs[0]
    return job


def pod_env(task: dict[str, Any]) -> dict[str, str]:
    """The trainer's environment in a pod of ``task``: literal values, and the Downward API's
    ``metadata.annotations[...]`` read from the template's annotations (what the pod gets)."""
    annotations = task["template"]["metadata"].get("annotations", {})
    env = {}
    for entry in task["template"]["spec"]["containers"][0]["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif match := FIELD.fullmatch(entry["valueFrom"]["fieldRef"]["fieldPath"]):
            env[entry["name"]] = annotations.get(match["key"], "")
    return env


@needs_shared
def test_volcano_does_not_copy_a_jobs_annotations_to_its_pods() -> None:
    # Why the example repeats its annotations on the pod templates: the recorded Job carries
    # tide.io/elastic, the pod Volcano made for it none of the Job's annotations.
    job = json.loads((WIRE / "vcjob-running.json").read_text())
    pod = json.loads((WIRE / "pod-of-vcjob.json").read_text())
    assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert job["metadata"]["annotations"] == {"tide.io/elastic": "true"}
    assert not [k for k in pod["metadata"]["annotations"] if k.startswith("tide.io/")]
    assert {k.split("/")[0] for k in pod["metadata"]["annotations"]} == {
        "scheduling.k8s.io",
        "volcano.sh",
    }


@needs_shared
@pytest.mark.parametrize("path", [ADAPTIVE_JOB, PLAIN_JOB], ids=["adaptive", "plain"])
def test_the_example_jobs_validate_against_the_crd_schema(path: Path) -> None:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    jsonschema.validate(load_job(path), version["schema"]["openAPIV3Schema"])


def test_every_trainer_of_the_adaptive_example_reads_the_bounds_the_engine_reads() -> None:
    job = load_job()
    read = read_job(job)
    assert isinstance(read, VolcanoJob) and read.state.batch_bounds is not None
    bounds = read.state.batch_bounds
    declared = {k: v for k, v in job["metadata"]["annotations"].items() if k in ADAPTIVE_ENV}
    assert set(declared) == set(ADAPTIVE_ENV)  # the example sets every bound
    for task in job["spec"]["tasks"]:  # the master pod's worker too
        env = pod_env(task)
        assert {ADAPTIVE_ENV[k]: v for k, v in declared.items()}.items() <= env.items()
        settings = AdaptiveBatchSettings.from_environ(env)
        assert settings is not None, task["name"]
        assert (
            settings.initial_batch_size,
            settings.max_batch_size,
            settings.local_batch_min,
            settings.local_batch_max,
            settings.accumulation,
        ) == (
            bounds.initial_batch_size,
            bounds.max_batch_size,
            bounds.local_batch_min,
            bounds.local_batch_max,
            bounds.accumulation,
        )
    assert check_job(job) == ([], [])


def test_the_plain_example_does_not_opt_in() -> None:
    job = load_job(PLAIN_JOB)
    for task in job["spec"]["tasks"]:
        assert AdaptiveBatchSettings.from_environ(pod_env(task)) is None
    assert check_job(job) == ([], [])


Edit = Callable[[dict[str, Any]], None]
WORKER = "spec.tasks[1].template.spec.containers[0]"
MASTER = "spec.tasks[0].template.spec.containers[0]"


def env_of(job: dict[str, Any], task: int) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = job["spec"]["tasks"][task]["template"]["spec"]["containers"][0][
        "env"
    ]
    return env


def drop_adaptive_env(task: int) -> Edit:
    def edit(job: dict[str, Any]) -> None:
        env = env_of(job, task)
        env[:] = [e for e in env if e["name"] not in ADAPTIVE_ENV.values()]

    return edit


def set_env(task: int, name: str, entry: dict[str, Any]) -> Edit:
    def edit(job: dict[str, Any]) -> None:
        env = env_of(job, task)
        env[:] = [e for e in env if e["name"] != name] + [{"name": name, **entry}]

    return edit


def drop_template_annotation(task: int, key: str) -> Edit:
    def edit(job: dict[str, Any]) -> None:
        del job["spec"]["tasks"][task]["template"]["metadata"]["annotations"][key]

    return edit


def job_annotation(key: str, value: str | None) -> Edit:
    def edit(job: dict[str, Any]) -> None:
        annotations = job["metadata"]["annotations"]
        if value is None:
            del annotations[key]
        else:
            annotations[key] = value

    return edit


def not_adaptive(job: dict[str, Any]) -> None:
    annotations = job["metadata"]["annotations"]
    for key in ADAPTIVE_ENV:
        del annotations[key]
    for task in job["spec"]["tasks"]:
        template_annotations = task["template"]["metadata"]["annotations"]
        for key in ADAPTIVE_ENV:
            del template_annotations[key]


def then(*edits: Edit) -> Edit:
    def edit(job: dict[str, Any]) -> None:
        for e in edits:
            e(job)

    return edit


ADAPTIVE_ENV_NAMES = ", ".join(ADAPTIVE_ENV.values())


@pytest.mark.parametrize(
    ("edit", "errors"),
    [
        (drop_adaptive_env(1),
         [f"spec.tasks[1].template.spec.containers: no container passes the adaptive batch to "
          "the workers: the Job says tide.io/adaptive-batch: \"true\", but Volcano does not copy "
          f"a Job's annotations to its pods; set {ADAPTIVE_ENV_NAMES} in the trainer's env, each "
          "a value or a fieldRef to metadata.annotations['tide.io/...'] with the annotations on "
          "the pod template"]),
        (drop_adaptive_env(0),
         [f"{MASTER}.env: runs the scaling task's trainer without TIDE_ADAPTIVE_BATCH: its "
          "workers would keep their batch while the others change theirs; pass it the same "
          "variables"]),
        (drop_template_annotation(1, "tide.io/max-batch-size"),
         [f"{WORKER}.env: TIDE_MAX_BATCH_SIZE is '' in the pod; the Job says "
          "tide.io/max-batch-size: '768'"]),
        (set_env(1, "TIDE_LOCAL_BATCH_MAX", {"value": "128"}),
         [f"{WORKER}.env: TIDE_LOCAL_BATCH_MAX is '128' in the pod; the Job says "
          "tide.io/local-batch-max: '64'"]),
        (set_env(0, "TIDE_ACCUMULATION", {"value": "true"}), []),  # a literal that agrees
        (then(job_annotation("tide.io/local-batch-min", None),
              drop_template_annotation(0, "tide.io/local-batch-min"),
              drop_template_annotation(1, "tide.io/local-batch-min")), []),  # both default to 1
        (then(job_annotation("tide.io/accumulation", None), set_env(1, "TIDE_ACCUMULATION", {})),
         [f"{MASTER}.env: TIDE_ACCUMULATION is 'true' in the pod; the Job does not set "
          "tide.io/accumulation (its default is 'false')"]),
        (set_env(1, "TIDE_MAX_BATCH_SIZE",
                 {"valueFrom": {"fieldRef": {
                     "fieldPath": "metadata.annotations['tide.io/initial-batch-size']"}}}),
         [f"{WORKER}.env[10].valueFrom.fieldRef.fieldPath: must read "
          "metadata.annotations['tide.io/max-batch-size'], got "
          "\"metadata.annotations['tide.io/initial-batch-size']\"",
          f"{WORKER}.env: TIDE_MAX_BATCH_SIZE is '96' in the pod; the Job says "
          "tide.io/max-batch-size: '768'"]),
        (set_env(1, "TIDE_INITIAL_BATCH_SIZE",
                 {"valueFrom": {"configMapKeyRef": {"name": "bounds", "key": "initial"}}}),
         [f"{WORKER}.env[10].valueFrom: cannot be checked against the Job's "
          "tide.io/initial-batch-size annotation; pass a value, or fieldRef "
          "metadata.annotations['tide.io/initial-batch-size'] with the annotation on the pod "
          "template",
          f"{WORKER}.env: TIDE_INITIAL_BATCH_SIZE is '' in the pod; the Job says "
          "tide.io/initial-batch-size: '96'"]),
        (then(job_annotation("tide.io/elastic", None), drop_adaptive_env(0),
              drop_adaptive_env(1)),
         ["spec.tasks[*].template.spec.containers: no container passes the adaptive batch to "
          "the workers: the Job says tide.io/adaptive-batch: \"true\", but Volcano does not "
          f"copy a Job's annotations to its pods; set {ADAPTIVE_ENV_NAMES} in the trainer's "
          "env, each a value or a fieldRef to metadata.annotations['tide.io/...'] with the "
          "annotations on the pod template"]),
        (not_adaptive, []),  # fieldRefs to absent annotations read as "": no opt-in
        (then(not_adaptive, set_env(1, "TIDE_ADAPTIVE_BATCH", {"value": "true"})),
         [f"{WORKER}.env: TIDE_ADAPTIVE_BATCH is 'true' in the pod; the Job does not set "
          "tide.io/adaptive-batch (its default is 'false')"]),
    ],
    ids=[
        "worker-without-env",
        "master-without-env",
        "template-annotation-missing",
        "literal-disagrees",
        "literal-agrees",
        "default-on-both-sides",
        "default-disagrees",
        "fieldref-to-another-key",
        "unverifiable-source",
        "not-elastic-without-env",
        "not-adaptive-with-fieldrefs",
        "pods-opt-in-without-the-job",
    ],
)  # fmt: skip
def test_validate_refuses_a_job_whose_pods_do_not_get_its_adaptive_batch(
    edit: Edit, errors: list[str]
) -> None:
    job = copy.deepcopy(load_job())
    edit(job)
    assert check_job(job) == (errors, [])


def test_the_example_script_opts_in_from_the_adaptive_examples_env(tmp_path: Path) -> None:
    # One worker, no torchrun: the environment the manifest gives the worker pod, plus the
    # variables of a single-process run.
    worker = next(t for t in load_job()["spec"]["tasks"] if t["name"] == "worker")
    env = {k: v for k, v in pod_env(worker).items() if k in ADAPTIVE_ENV.values()}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_elastic.py"), "--ckpt-dir", str(tmp_path),
         "--epochs", "1", "--backend", "gloo"],
        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The fixed batch is 12 micro batches of 8; the adaptive run starts at the initial batch
    # (96) in the fewest micro batches its bounds allow: 2 of 48.
    assert re.search(r"epoch 0 done at step 42, loss [\d.]+, micro batch 48\n", done.stderr), (
        done.stderr[-2000:]
    )
