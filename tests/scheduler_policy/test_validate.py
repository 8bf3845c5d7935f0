"""Tests for the checks behind ``tide validate``: policy files and elastic Volcano Job manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler_policy.policy.annotations import ADAPTIVE_ENV
from scheduler_policy.policy.validate import FileReport, check_job, validate_file, validate_paths

POLICIES_DIR = Path(__file__).resolve().parents[2] / "manifests" / "policies"

POLICY_DOC = {
    "apiVersion": "tide.io/v1alpha1",
    "kind": "ElasticPolicy",
    "metadata": {"name": "p"},
    "spec": {"queues": [{"name": "research", "borrowIdleGpus": True}]},
}
NOTHING_TO_CHECK = (
    "holds no tide.io/v1alpha1 ElasticPolicy and no batch.volcano.sh/v1alpha1 Job to validate"
)
NOT_AN_OBJECT = (
    "document 1: not a Kubernetes object (no apiVersion and kind); tide validates "
    "tide.io/v1alpha1 ElasticPolicy and batch.volcano.sh/v1alpha1 Job"
)
UNSET_MIN = (
    "spec.tasks[1].minAvailable: unset, so it defaults to replicas and the job cannot shrink; "
    "set it to the fewest workers the job can run with"
)


def make_task(
    name: str, replicas: Any, *, min_available: Any = None, policies: Any = None
) -> dict[str, Any]:
    task: dict[str, Any] = {"name": name, "replicas": replicas, "template": {"spec": {}}}
    if min_available is not None:
        task["minAvailable"] = min_available
    if policies is not None:
        task["policies"] = policies
    return task


def make_job(
    *,
    annotations: Any = None,
    tasks: Any = None,
    min_available: Any = 2,
    policies: Any = None,
    elastic: bool = True,
) -> dict[str, Any]:
    """A valid elastic Volcano Job: one master and a worker task of 4 replicas, minAvailable 1."""
    metadata: dict[str, Any] = {"name": "bert", "namespace": "ml", "annotations": {}}
    if elastic:
        metadata["annotations"]["tide.io/elastic"] = "true"
    metadata["annotations"].update(annotations or {})
    spec: dict[str, Any] = {
        "queue": "research",
        "tasks": tasks
        if tasks is not None
        else [make_task("master", 1), make_task("worker", 4, min_available=1)],
    }
    if min_available is not None:
        spec["minAvailable"] = min_available
    if policies is not None:
        spec["policies"] = policies
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": metadata,
            "spec": spec}  # fmt: skip


def write(tmp_path: Path, name: str, *documents: object) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")
    return path


JOB_CASES = [
    (make_job(), [], []),
    (make_job(elastic=False, tasks=[make_task("master", 1), make_task("worker", 4)]), [], []),
    (make_job(tasks=[make_task("master", 1), make_task("worker", 2, min_available=4)]),
     ["spec.tasks[1].minAvailable: must not exceed spec.tasks[1].replicas (2), got 4"], []),
    (make_job(elastic=False, tasks=[make_task("worker", 2, min_available=3)], min_available=1),
     ["spec.tasks[0].minAvailable: must not exceed spec.tasks[0].replicas (2), got 3"], []),
    (make_job(min_available=6),
     ["spec.minAvailable: must not exceed the sum of spec.tasks[*].replicas (5), got 6"], []),
    (make_job(tasks=[make_task("master", 1), make_task("trainer", 4, min_available=1)]),
     ["spec.tasks: no task named 'worker' (the default; name another with tide.io/task); "
      "found 'master', 'trainer'"], []),
    (make_job(annotations={"tide.io/task": "trainer"}),
     ["metadata.annotations[\"tide.io/task\"]: no task named 'trainer'; found 'master', 'worker'"],
     []),
    (make_job(annotations={"tide.io/task": "trainer"},
              tasks=[make_task("master", 1), make_task("trainer", 4, min_available=1)]), [], []),
    (make_job(tasks=[make_task("master", 1), make_task("worker", 4)]), [], [UNSET_MIN]),
    (make_job(policies=[{"event": "PodEvicted", "action": "RestartJob"}]), [],
     ["spec.policies[0]: PodEvicted -> RestartJob restarts the whole job whenever tide scales it "
      "down; remove it or choose another action"]),
    (make_job(policies=[{"event": "TaskCompleted", "action": "CompleteJob"},
                        {"event": "*", "action": "RestartJob"}]), [],
     ["spec.policies[1]: * -> RestartJob restarts the whole job whenever tide scales it down; "
      "remove it or choose another action"]),
    (make_job(tasks=[make_task("master", 1),
                     make_task("worker", 4, min_available=1, policies=[
                         {"events": ["PodPending", "PodFailed"], "action": "RestartJob"}])]), [],
     ["spec.tasks[1].policies[0]: PodFailed -> RestartJob restarts the whole job whenever tide "
      "scales it down; remove it or choose another action"]),
    (make_job(policies=[{"event": "PodEvicted", "action": "AbortJob"},
                        {"event": "PodPending", "action": "RestartJob"}]), [], []),
    (make_job(tasks=[make_task("master", 1, policies=[{"event": "PodFailed",
                                                       "action": "RestartJob"}]),
                     make_task("worker", 4, min_available=1)]), [], []),
    (make_job(elastic=False, policies=[{"event": "PodEvicted", "action": "RestartJob"}]), [], []),
    (make_job(annotations={"tide.io/min-replicas": "two"}),
     ["metadata.annotations[\"tide.io/min-replicas\"]: must be a non-negative integer, "
      "got 'two'"], []),
    (make_job(annotations={"tide.io/elastic": True}),
     ["metadata.annotations[\"tide.io/elastic\"]: must be a string (quote it in YAML), got true"],
     []),
    (make_job(tasks=[make_task("master", 1), make_task("worker", "four", min_available=1)]),
     ["spec.tasks[1].replicas: must be a non-negative integer, got 'four'"], []),
    ({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "x"}},
     ["spec: must be a mapping, got null"], []),
    (make_job(tasks=[]), ["spec.tasks: must be a non-empty list of tasks, got []"], []),
]  # fmt: skip
JOB_IDS = [
    "elastic-clean", "plain-job-unchecked-for-elasticity", "task-min-above-replicas",
    "plain-job-webhook-checked", "job-min-above-total", "default-task-missing",
    "named-task-missing", "named-task-found", "worker-min-unset-warns", "job-evicted-restart",
    "job-any-event-restart", "task-failed-restart", "harmless-policies",
    "other-task-policies-ignored", "plain-job-policies-ignored", "bad-annotation",
    "annotation-not-string", "replicas-not-int", "spec-missing", "tasks-empty",
]  # fmt: skip


@pytest.mark.parametrize(("job", "errors", "warnings"), JOB_CASES, ids=JOB_IDS)
def test_check_job(job: dict[str, Any], errors: list[str], warnings: list[str]) -> None:
    assert check_job(job) == (errors, warnings)


def test_check_job_reports_several_problems_at_once() -> None:
    job = make_job(
        annotations={"tide.io/max-replica": "8"},
        tasks=[make_task("master", 1), make_task("worker", 2)],
        min_available=5,
        policies=[{"event": "PodEvicted", "action": "RestartJob"}],
    )
    assert check_job(job) == (
        [
            'metadata.annotations["tide.io/max-replica"]: unknown tide.io annotation; '
            "did you mean 'tide.io/max-replicas'?",
            "spec.minAvailable: must not exceed the sum of spec.tasks[*].replicas (3), got 5",
        ],
        [
            UNSET_MIN,
            "spec.policies[0]: PodEvicted -> RestartJob restarts the whole job whenever tide "
            "scales it down; remove it or choose another action",
        ],
    )


@pytest.mark.parametrize(
    ("documents", "errors", "warnings"),
    [
        ([POLICY_DOC], [], []),
        ([{**POLICY_DOC, "spec": {"interval": 60}}],
         ["spec.interval: must be a duration string such as '60s', got 60"], []),
        ([{**POLICY_DOC, "spec": {}}], [], ["spec.queues: empty, so tide manages no queue"]),
        ([{**POLICY_DOC, "spec": {"queues": [{"name": "prod", "elastic": False,
                                              "borrowIdleGpus": True}]}}], [],
         ["spec.queues[0].borrowIdleGpus: has no effect on a queue with elastic: false, "
          "got true"]),
        ([POLICY_DOC, make_job()],
         ["document 1: an ElasticPolicy file must hold exactly one YAML document, found 2"], []),
        ([make_job(), make_job(min_available=9)],
         ["document 2: spec.minAvailable: must not exceed the sum of spec.tasks[*].replicas (5), "
          "got 9"], []),
        ([{"apiVersion": "v1", "kind": "ConfigMap"}], [NOTHING_TO_CHECK], []),
        ([make_job(), {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}], [], []),
        ([{"nodes": 8, "gpus_per_node": 4}], [NOT_AN_OBJECT], []),
        ([["a list"]], ["document 1: must be a mapping, got ['a list']"], []),
    ],
    ids=["policy-clean", "policy-error", "policy-no-queues", "policy-borrow-not-elastic",
         "policy-with-other-documents", "jobs-name-their-document", "only-other-kinds",
         "other-kinds-beside-a-job-pass", "not-a-kubernetes-object", "not-a-mapping"],
)  # fmt: skip
def test_validate_file(
    tmp_path: Path, documents: list[object], errors: list[str], warnings: list[str]
) -> None:
    path = write(tmp_path, "manifest.yaml", *documents)
    assert validate_file(path) == FileReport(
        path=path, errors=tuple(errors), warnings=tuple(warnings)
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("kind: [Job\n", "line 2, column 1: invalid YAML: expected ',' or ']', but got "
                         "'<stream end>'"),
        ("", "file holds no YAML document"),
        ("---\n---\n", "file holds no YAML document"),
    ],
    ids=["invalid-yaml", "empty", "only-separators"],
)  # fmt: skip
def test_validate_file_unreadable_yaml(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    assert validate_file(path) == FileReport(path=path, errors=(error,))


def test_validate_paths_reports_a_missing_file(tmp_path: Path) -> None:
    (report,) = validate_paths([tmp_path / "absent.yaml"])
    assert not report.ok
    assert report.errors[0].startswith("cannot read file: [Errno 2]")


def test_validate_paths_expands_directories_in_order(tmp_path: Path) -> None:
    write(tmp_path, "b.yml", make_job())
    write(tmp_path, "a.yaml", POLICY_DOC)
    (tmp_path / "notes.txt").write_text("not yaml", encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    reports = validate_paths([tmp_path, empty])
    assert [(r.path.name, r.errors) for r in reports] == [
        ("a.yaml", ()),
        ("b.yml", ()),
        ("empty", ("directory holds no .yaml or .yml file",)),
    ]


def test_every_example_policy_validates_clean() -> None:
    reports = validate_paths([POLICIES_DIR])
    assert len(reports) >= 2
    assert [(r.path.name, r.errors, r.warnings) for r in reports] == [
        (r.path.name, (), ()) for r in reports
    ]


def test_the_example_elastic_job_passes_tide_validate() -> None:
    example = POLICIES_DIR.parent / "examples" / "elastic-pytorch-job.yaml"
    report = validate_file(example)
    assert (report.errors, report.warnings) == ((), ())


def test_check_job_reads_the_job_as_the_engine_does() -> None:
    # One reader (adapters.volcano_job) for `tide validate` and the engine: a GPU request the
    # engine could not read is an error here too, and tide's own memory annotation is no
    # unknown annotation.
    worker = make_task("worker", 4, min_available=1)
    worker["template"]["spec"] = {
        "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}]
    }
    job = make_job(tasks=[make_task("master", 1), worker],
                   annotations={"tide.io/memory": '{"v":1,"recommendations":[]}'})  # fmt: skip
    assert check_job(job) == (
        [
            "spec.tasks[1].template.spec.containers[0].resources.limits[nvidia.com/gpu]: "
            "must be a non-negative quantity, got 'lots'"
        ],
        [],
    )


ADAPTIVE_JOB = {
    "tide.io/adaptive-batch": "true",
    "tide.io/initial-batch-size": "64",
    "tide.io/max-batch-size": "1024",
    "tide.io/local-batch-max": "128",
}


@pytest.mark.parametrize(
    ("annotations", "errors"),
    [
        (ADAPTIVE_JOB, []),
        (ADAPTIVE_JOB | {"tide.io/local-batch-min": "0"},
         ["metadata.annotations[\"tide.io/local-batch-min\"]: must be at least 1, got '0'"]),
        ({"tide.io/local-batch-max": "128"},
         ["metadata.annotations[\"tide.io/local-batch-max\"]: set without "
          "tide.io/adaptive-batch: \"true\", so it would do nothing"]),
    ],
    ids=["adaptive-clean", "adaptive-bad-bound", "adaptive-bound-without-opt-in"],
)  # fmt: skip
def test_check_job_checks_the_adaptive_batch_annotations(
    annotations: dict[str, str], errors: list[str]
) -> None:
    # The worker's container passes the same values (tests/manifests/test_adaptive_example.py
    # checks what happens when it does not).
    worker = make_task("worker", 4, min_available=1)
    env = [{"name": ADAPTIVE_ENV[k], "value": v} for k, v in annotations.items()]
    worker["template"]["spec"] = {"containers": [{"name": "t", "env": env}]}
    job = make_job(annotations=annotations, tasks=[make_task("master", 1), worker])
    assert check_job(job) == (errors, [])
