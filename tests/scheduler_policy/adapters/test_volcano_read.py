"""The Volcano readers on what a real Volcano v1.15.1 returned, and the patch's admission."""

from __future__ import annotations

import calendar
import copy
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_policy.adapters.volcano.read import (
    PodRead,
    ReadProblem,
    read_node,
    read_pod,
    read_podgroup,
    read_queue,
    timestamp_s,
)
from scheduler_policy.adapters.volcano_job import VolcanoJob, read_job, replica_patch
from scheduler_policy.vocabulary.protocols import ReplicaChange
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobMemory,
    NodeState,
    PendingGang,
    PodPlacement,
    QueueName,
    QueueState,
    Reason,
    Sentence,
)
from tests.scheduler_policy.test_volcano_job import apply_patch

WIRE = Path(__file__).resolve().parents[3] / ".." / "shared" / "volcano-wire" / "v1.15.1"
needs_wire = pytest.mark.skipif(
    not (WIRE / "queues.json").exists(),
    reason=f"recorded Volcano objects absent at {WIRE} (../shared absent)",
)


def recorded(name: str) -> dict:
    return json.loads((WIRE / name).read_text())


def queue_named(name: str) -> dict:
    (found,) = [q for q in recorded("queues.json")["items"] if q["metadata"]["name"] == name]
    return found


def podgroup_of(job: str) -> dict:
    (found,) = [
        pg
        for pg in recorded("podgroups-with-pending-gang.json")["items"]
        if pg["metadata"]["ownerReferences"][0]["name"] == job
    ]
    return found


# -- queues ---------------------------------------------------------------------------------


def with_spec(**spec: object):
    def change(queue: dict) -> None:
        queue["spec"].update(spec)

    return change


def allocated(value: object):
    def change(queue: dict) -> None:
        queue["status"]["allocated"]["nvidia.com/gpu"] = value

    return change


QUEUES = {
    "research-as-recorded": (
        "research", [], 0.0,
        QueueState(QueueName("research"), None, None, 0.0, 5.0, 0.0),
    ),
    "production-has-no-gpus-allocated": (
        "production", [], 0.0,
        QueueState(QueueName("production"), None, None, 0.0, 0.0, 0.0, weight=3.0),
    ),
    "default-empty-guarantee": (
        "default", [], 0.0, QueueState(QueueName("default"), None, None, 0.0, 0.0, 0.0),
    ),
    "capability-deserved-guarantee": (
        "research",
        [with_spec(capability={"nvidia.com/gpu": "16", "cpu": "64"},
                   deserved={"nvidia.com/gpu": 8},
                   guarantee={"resource": {"nvidia.com/gpu": "2"}})],
        0.0, QueueState(QueueName("research"), 16.0, 8.0, 2.0, 5.0, 0.0),
    ),
    "milli-units-quantity": (
        "research", [with_spec(capability={"nvidia.com/gpu": "1500m"})], 0.0,
        QueueState(QueueName("research"), 1.5, None, 0.0, 5.0, 0.0),
    ),
    "allocated-is-a-count-not-milli-units": (
        "research", [allocated("28")], 0.0,
        QueueState(QueueName("research"), None, None, 0.0, 28.0, 0.0),
    ),
    "pending-gangs-from-the-client": (
        "production", [], 24.0,
        QueueState(QueueName("production"), None, None, 0.0, 0.0, 24.0, weight=3.0),
    ),
    "weight-the-proportion-plugin-shares-by": (
        "research", [with_spec(weight=3)], 0.0,
        QueueState(QueueName("research"), None, None, 0.0, 5.0, 0.0, weight=3.0),
    ),
}  # fmt: skip


@needs_wire
@pytest.mark.parametrize(("name", "changes", "pending", "expected"), QUEUES.values(),
                         ids=QUEUES.keys())  # fmt: skip
def test_reads_the_recorded_queue(name, changes, pending, expected):
    queue = queue_named(name)
    for change in changes:
        change(queue)
    assert read_queue(queue, pending_gpus=pending) == expected


BAD_QUEUES = {
    "gpu-capability-not-a-quantity": (
        [with_spec(capability={"nvidia.com/gpu": "lots"})], "spec.capability[nvidia.com/gpu]",
    ),
    "guarantee-not-a-mapping": ([with_spec(guarantee="2")], "spec.guarantee"),
    "weight-a-string": ([with_spec(weight="3")], "spec.weight"),
    "allocated-negative": ([allocated(-1)], "status.allocated[nvidia.com/gpu]"),
}  # fmt: skip


@needs_wire
@pytest.mark.parametrize(("changes", "field"), BAD_QUEUES.values(), ids=BAD_QUEUES.keys())
def test_a_malformed_queue_is_a_problem_naming_it_and_the_field(changes, field):
    queue = queue_named("research")
    for change in changes:
        change(queue)
    read = read_queue(queue)
    assert isinstance(read, ReadProblem)
    assert read.source == "Queue research" and field in read.problem


@pytest.mark.parametrize(
    "obj", [None, {"metadata": {}}, {"metadata": {"name": 3}}], ids=["none", "no-name", "int"]
)
def test_an_object_without_a_name_is_a_problem_from_every_reader(obj):
    for read in (read_queue(obj), read_podgroup(obj, elastic_jobs=()), read_pod(obj),
                 read_node(obj, 0.0)):  # fmt: skip
        assert isinstance(read, ReadProblem) and "metadata.name" in read.problem


# -- podgroups ------------------------------------------------------------------------------


def pg_phase(value: str | None):
    def change(pg: dict) -> None:
        if value is None:
            pg["status"].pop("phase")
        else:
            pg["status"]["phase"] = value

    return change


def pg_spec(**spec: object):
    def change(pg: dict) -> None:
        pg["spec"].update(spec)

    return change


GANG = PendingGang(
    key="default/prod-75e0849f-cd55-46e3-b958-1f15f2fd3688", queue=QueueName("production"),
    min_member=3, gpus=24.0, phase="Inqueue", since_s=timestamp_s("2026-12-01T09:08:57Z"),
)  # fmt: skip

PODGROUPS = {
    "inqueue-gang-as-recorded": ("prod", [], (), GANG),
    "a-running-podgroup-is-no-demand": ("elastic", [], (), None),
    "pending-is-demand": (
        "prod", [pg_phase("Pending")], (), dataclasses.replace(GANG, phase="Pending"),
    ),
    "no-phase-yet-is-pending": (
        "prod", [pg_phase(None)], (), dataclasses.replace(GANG, phase="Pending"),
    ),
    "an-elastic-jobs-own-podgroup-is-no-demand": (
        "elastic", [pg_phase("Pending")], ("default/elastic",), None,
    ),
    "owner-elastic-in-another-namespace-is-demand": (
        "prod", [], ("other/prod",), GANG,
    ),
    "a-gang-asking-no-gpus-is-no-gpu-demand": (
        "prod", [pg_spec(minResources={"cpu": "3"})], (), None,
    ),
    "a-completed-gang-is-no-demand": ("prod", [pg_phase("Completed")], (), None),
}  # fmt: skip


@needs_wire
@pytest.mark.parametrize(("job", "changes", "elastic", "expected"), PODGROUPS.values(),
                         ids=PODGROUPS.keys())  # fmt: skip
def test_reads_the_recorded_podgroups(job, changes, elastic, expected):
    pg = podgroup_of(job)
    for change in changes:
        change(pg)
    assert read_podgroup(pg, elastic_jobs=elastic) == expected


def test_the_recorded_creation_time_is_read_in_seconds():
    assert timestamp_s("2026-12-01T09:08:57Z") == timestamp_s("2026-12-01T09:08:57+00:00")
    assert timestamp_s("2026-12-01T09:08:57Z") == calendar.timegm((2026, 12, 1, 9, 8, 57))
    assert timestamp_s("yesterday") is None and timestamp_s(None) is None


@needs_wire
@pytest.mark.parametrize(
    ("changes", "field"),
    [([pg_spec(minMember="3")], "spec.minMember"),
     ([pg_spec(minResources={"nvidia.com/gpu": "x"})], "spec.minResources[nvidia.com/gpu]"),
     ([pg_spec(queue=7)], "spec.queue")],
    ids=["min-member-a-string", "gpus-not-a-quantity", "queue-not-a-name"],
)  # fmt: skip
def test_a_malformed_pending_podgroup_is_a_problem_naming_it(changes, field):
    pg = podgroup_of("prod")
    for change in changes:
        change(pg)
    read = read_podgroup(pg, elastic_jobs=())
    assert isinstance(read, ReadProblem)
    assert read.source == f"PodGroup {GANG.key}" and field in read.problem


# -- pods -----------------------------------------------------------------------------------


def drop_labels(pod: dict) -> None:
    pod["metadata"]["labels"] = {}


def drop_volcano(pod: dict) -> None:
    pod["metadata"]["labels"] = {}
    pod["metadata"]["annotations"] = {}


def unbound(pod: dict) -> None:
    del pod["spec"]["nodeName"]


def deleting(pod: dict) -> None:
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T09:10:00Z"


def succeeded(pod: dict) -> None:
    pod["status"]["phase"] = "Succeeded"


def index(value: str):
    def change(pod: dict) -> None:
        pod["metadata"]["labels"]["volcano.sh/task-index"] = value

    return change


POD = PodRead(name="default/elastic-worker-0", node="gpu-2", gpus=1.0,
              job=JobKey("default/elastic"), task="worker", index=0)  # fmt: skip
PODS = {
    "as-recorded": ([], POD, PodPlacement(0, "gpu-2", 1.0), True),
    "labels-gone-annotations-say-it": ([drop_labels], POD, PodPlacement(0, "gpu-2", 1.0), True),
    "waiting-for-a-node": (
        [unbound], dataclasses.replace(POD, node=None), PodPlacement(0, None, 1.0), False,
    ),
    "terminating-stays-placed-and-holds-its-gpus": (
        [deleting], dataclasses.replace(POD, terminating=True), PodPlacement(0, "gpu-2", 1.0),
        True,
    ),
    "finished-holds-nothing": (
        [succeeded], dataclasses.replace(POD, finished=True), None, False,
    ),
    "not-a-volcano-pod": (
        [drop_volcano], PodRead(name=POD.name, node="gpu-2", gpus=1.0), None, True,
    ),
}  # fmt: skip


@needs_wire
@pytest.mark.parametrize(("changes", "expected", "placement", "holds"), PODS.values(),
                         ids=PODS.keys())  # fmt: skip
def test_reads_the_recorded_pod(changes, expected, placement, holds):
    pod = recorded("pod-of-vcjob.json")
    for change in changes:
        change(pod)
    read = read_pod(pod)
    assert read == expected
    assert isinstance(read, PodRead)
    assert (read.placement, read.holds_gpus) == (placement, holds)


def gpu_request(value: object):
    def change(pod: dict) -> None:
        pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = value

    return change


@needs_wire
@pytest.mark.parametrize(
    ("changes", "field"),
    [([index("first")], "labels[volcano.sh/task-index]"),
     ([gpu_request("two")], "spec.containers[0].resources.requests[nvidia.com/gpu]")],
    ids=["task-index-not-a-number", "gpus-not-a-quantity"],
)  # fmt: skip
def test_a_malformed_pod_is_a_problem_naming_it_and_the_field(changes, field):
    pod = recorded("pod-of-vcjob.json")
    for change in changes:
        change(pod)
    read = read_pod(pod)
    assert isinstance(read, ReadProblem)
    assert read.source == "Pod default/elastic-worker-0"
    assert read.problem.startswith(field), read.problem


# -- nodes ----------------------------------------------------------------------------------


def node(gpus: object = "8", *, cordoned: bool = False) -> dict:
    allocatable: dict[str, object] = {"cpu": "32", "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    return {"metadata": {"name": "gpu-1"}, "spec": {"unschedulable": cordoned},
            "status": {"allocatable": allocatable}}  # fmt: skip


NODES = {
    "free-is-allocatable-minus-bound": (node(), 3.0, NodeState("gpu-1", 8.0, 5.0)),
    "nothing-bound": (node(), 0.0, NodeState("gpu-1", 8.0, 8.0)),
    "over-bound-is-none-free-not-negative": (node(), 10.0, NodeState("gpu-1", 8.0, 0.0)),
    "cordoned-has-none-free": (node(cordoned=True), 0.0, NodeState("gpu-1", 8.0, 0.0)),
    "integer-quantity": (node(4), 1.0, NodeState("gpu-1", 4.0, 3.0)),
    "no-gpus-is-not-a-gpu-node": (node(None), 0.0, None),
    "zero-gpus-is-not-a-gpu-node": (node("0"), 0.0, None),
}  # fmt: skip


@pytest.mark.parametrize(("obj", "bound", "expected"), NODES.values(), ids=NODES.keys())
def test_reads_a_node(obj, bound, expected):
    assert read_node(obj, bound) == expected


def test_a_malformed_node_is_a_problem_naming_it():
    read = read_node(node("eight"), 0.0)
    assert isinstance(read, ReadProblem)
    assert read.source == "Node gpu-1" and "status.allocatable[nvidia.com/gpu]" in read.problem


# -- the patch against Volcano's admission rules --------------------------------------------


def job_obj(*, replicas: int, task_least: int | None, job_least: int | None,
            master: bool = False, min_replicas: int | None = None) -> dict:  # fmt: skip
    annotations = {"tide.io/elastic": "true", "tide.io/max-replicas": "64"}
    if min_replicas is not None:
        annotations["tide.io/min-replicas"] = str(min_replicas)
    worker: dict[str, object] = {"name": "worker", "replicas": replicas}
    if task_least is not None:
        worker["minAvailable"] = task_least
    tasks = [worker]
    if master:
        tasks.insert(0, {"name": "master", "replicas": 1, "minAvailable": 1})
    spec: dict[str, object] = {"queue": "research", "tasks": tasks}
    if job_least is not None:
        spec["minAvailable"] = job_least
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns", "annotations": annotations,
                         "resourceVersion": "7"},
            "spec": spec}  # fmt: skip


def admitted(obj: dict) -> list[str]:
    """What Volcano's job-validation-policy (jobs-validating.yaml) would refuse of ``obj``."""
    tasks = obj["spec"]["tasks"]
    refused = []
    for task in tasks:
        if "minAvailable" in task and task["minAvailable"] > task["replicas"]:
            refused.append(f"task {task['name']}: 'minAvailable' is greater than 'replicas'")
    least = obj["spec"].get("minAvailable")
    if least is not None and least > sum(t["replicas"] for t in tasks):
        refused.append("job 'minAvailable' must not be greater than total replicas")
    return refused


def a_change(job: VolcanoJob, to: int) -> ReplicaChange:
    return ReplicaChange(job.state.key, job.state.task, job.state.current_replicas, to,
                         JobMemory(), Reason.SHRINK_FOR_PENDING_WORK, Sentence("test"))  # fmt: skip


BOUNDS = {
    "the-task-minimum": (dict(replicas=6, task_least=2, job_least=None), 2),
    "the-job-minimum-is-a-floor": (dict(replicas=6, task_least=1, job_least=4), 4),
    "the-job-minimum-less-the-master": (
        dict(replicas=6, task_least=1, job_least=4, master=True), 3,
    ),
    "min-replicas-annotation-cannot-go-below-the-job-minimum": (
        dict(replicas=6, task_least=3, job_least=3, min_replicas=1), 3,
    ),
    "min-replicas-annotation-below-the-task-minimum": (
        dict(replicas=6, task_least=3, job_least=1, min_replicas=1), 1,
    ),
}  # fmt: skip


@pytest.mark.parametrize(("fields", "least"), BOUNDS.values(), ids=BOUNDS.keys())
def test_the_fewest_replicas_respect_the_jobs_gang_minimum(fields, least):
    read = read_job(job_obj(**fields))
    assert isinstance(read, VolcanoJob)
    assert read.state.min_replicas == least and read.state.read_problems == ()


def test_a_shrink_below_the_tasks_min_available_lowers_it_in_the_same_patch():
    read = read_job(job_obj(replicas=6, task_least=3, job_least=1, min_replicas=1))
    assert isinstance(read, VolcanoJob)
    ops = replica_patch(read, a_change(read, 2))
    assert ops[-3:-1] == [
        {"op": "test", "path": "/spec/tasks/0/minAvailable", "value": 3},
        {"op": "replace", "path": "/spec/tasks/0/minAvailable", "value": 2},
    ]
    after = apply_patch(job_obj(replicas=6, task_least=3, job_least=1, min_replicas=1), ops)
    assert after["spec"]["tasks"][0] == {"name": "worker", "replicas": 2, "minAvailable": 2}


def test_a_shrink_that_keeps_the_tasks_min_available_leaves_it_alone():
    read = read_job(job_obj(replicas=6, task_least=2, job_least=None))
    assert isinstance(read, VolcanoJob)
    ops = replica_patch(read, a_change(read, 3))
    assert not any("minAvailable" in str(op["path"]) for op in ops)


@given(
    replicas=st.integers(0, 12), task_least=st.none() | st.integers(0, 12),
    job_least=st.none() | st.integers(0, 13), master=st.booleans(),
    min_replicas=st.none() | st.integers(0, 12), pick=st.integers(0, 1000),
)  # fmt: skip
def test_every_change_within_the_bounds_passes_volcanos_admission_rules(
    replicas, task_least, job_least, master, min_replicas, pick
):
    obj = job_obj(replicas=replicas, task_least=task_least, job_least=job_least,
                  master=master, min_replicas=min_replicas)  # fmt: skip
    if admitted(obj):
        return  # a Job the API server would never have admitted in the first place
    read = read_job(copy.deepcopy(obj))
    assert isinstance(read, VolcanoJob)
    state = read.state
    if state.read_problems:
        return  # triage holds it: nothing is written
    targets = range(state.min_replicas, state.max_replicas + 1)
    to = targets[pick % len(targets)]
    after = apply_patch(obj, replica_patch(read, a_change(read, to)))
    assert admitted(after) == []
    assert after["spec"]["tasks"][-1]["replicas"] == to
    assert after["spec"].get("minAvailable") == obj["spec"].get("minAvailable")
