"""The Volcano Job translator on the Job a real Volcano v1.15.1 returned, and the patch back."""

from __future__ import annotations

import calendar
import copy
import json
import logging
from pathlib import Path

import pytest

from scheduler_policy.adapters.memory_codec import MEMORY_ANNOTATION, encode_memory
from scheduler_policy.adapters.volcano_job import (
    UnreadJob,
    VolcanoJob,
    read_job,
    read_jobs,
    replica_patch,
)
from scheduler_policy.vocabulary.protocols import ReplicaChange
from scheduler_policy.vocabulary.state import JobKey, JobMemory, JobPhase, Reason, Recommendation

WIRE = Path(__file__).resolve().parents[2] / ".." / "shared" / "volcano-wire" / "v1.15.1"
RECORDED = WIRE / "vcjob-running.json"
needs_wire = pytest.mark.skipif(
    not RECORDED.exists(), reason=f"recorded Volcano Jobs absent at {WIRE} (../shared absent)"
)
RUNNING_SINCE_S = calendar.timegm((2026, 12, 1, 9, 8, 53))
"""vcjob-running.json's Running condition: 2026-12-01T09:08:53Z."""
MEMORY = JobMemory(1700000000.25, (Recommendation(1699999940.5, 3),))
V1_MEMORY = '{"v":1,"lastRescaleS":1700000000.25,"recommendations":[[1699999940.5,3]]}'
"""``MEMORY`` as an engine wrote it before the asked size was stored (version 1)."""


def recorded() -> dict:
    return json.loads(RECORDED.read_text())


def annotate(**annotations: str):
    def change(job: dict) -> None:
        job["metadata"]["annotations"].update(annotations)

    return change


def container(job: dict) -> dict:
    return job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]


def gpus(requests: object | None, limits: object | None):
    def change(job: dict) -> None:
        resources = container(job)["resources"] = {}
        if requests is not None:
            resources["requests"] = {"nvidia.com/gpu": requests}
        if limits is not None:
            resources["limits"] = {"nvidia.com/gpu": limits}

    return change


def add_master(job: dict) -> None:
    master = copy.deepcopy(job["spec"]["tasks"][0])
    master.update(name="master", replicas=1, minAvailable=1)
    master["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 2}}
    job["spec"]["tasks"].insert(0, master)


def phase(value: str):
    def change(job: dict) -> None:
        job["status"]["state"]["phase"] = value

    return change


def no_status(job: dict) -> None:
    del job["status"]


def conditions(*entries: tuple[str, str]):
    def change(job: dict) -> None:
        job["status"]["conditions"] = [
            {"status": status, "lastTransitionTime": time} for status, time in entries
        ]

    return change


def not_elastic_no_worker(job: dict) -> None:
    job["metadata"]["annotations"] = {}
    job["spec"]["tasks"][0]["name"] = "trainer"


def init_container_asks_more(job: dict) -> None:
    init = copy.deepcopy(container(job))
    init["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    job["spec"]["tasks"][0]["template"]["spec"]["initContainers"] = [init]


# (changes to the recorded Job, expected JobState fields, a problem expected to be named)
CASES = {
    "as-recorded": (
        [], dict(key="default/elastic", queue="research", task="worker", current_replicas=2,
                 min_replicas=1, max_replicas=2, gpus_per_replica=1.0, phase=JobPhase.RUNNING,
                 elastic=True, nonelastic_gpus=0.0, last_rescale_s=None,
                 running_since_s=RUNNING_SINCE_S), None,
    ),
    "running-since-its-running-condition": (
        [conditions(("Pending", "2026-12-01T09:00:00Z"), ("Running", "2026-12-01T10:00:00Z"))],
        dict(running_since_s=RUNNING_SINCE_S + 3067.0), None,
    ),
    "never-running-has-no-age": (
        [conditions(("Pending", "2026-12-01T09:00:00Z"))], dict(running_since_s=None), None,
    ),
    "an-unreadable-time-is-no-age-not-a-problem": (
        [conditions(("Running", "soon"))], dict(running_since_s=None), None,
    ),
    "bounds-from-annotations": (
        [annotate(**{"tide.io/min-replicas": "2", "tide.io/max-replicas": "8",
                     "tide.io/restart-cost": "45s"})],
        dict(min_replicas=2, max_replicas=8, restart_cost_s=45.0), None,
    ),
    "memory-from-its-annotation": (
        [annotate(**{MEMORY_ANNOTATION: encode_memory(MEMORY)})],
        dict(last_rescale_s=MEMORY.last_rescale_s, recommendations=MEMORY.recommendations), None,
    ),
    "corrupt-memory-is-no-memory-not-a-problem": (
        [annotate(**{MEMORY_ANNOTATION: "{oops"})],
        dict(last_rescale_s=None, recommendations=(), read_problems=()), None,
    ),
    # The asked size: the memory's, else the task's replicas while tide has never rescaled it.
    "never-written-asks-its-replicas": ([], dict(requested_replicas=2), None),
    "asked-size-from-the-memory": (
        [annotate(**{MEMORY_ANNOTATION: encode_memory(MEMORY, requested_replicas=6)})],
        dict(current_replicas=2, requested_replicas=6, last_rescale_s=MEMORY.last_rescale_s),
        None,
    ),
    "memory-of-a-job-never-rescaled-asks-its-replicas": (
        [annotate(**{MEMORY_ANNOTATION: encode_memory(JobMemory(None, MEMORY.recommendations))})],
        dict(requested_replicas=2, last_rescale_s=None), None,
    ),
    "version-1-memory-of-a-rescaled-job-asked-size-unknown": (
        [annotate(**{MEMORY_ANNOTATION: V1_MEMORY})],
        dict(requested_replicas=None, last_rescale_s=MEMORY.last_rescale_s), None,
    ),
    "version-1-memory-of-a-job-never-rescaled-asks-its-replicas": (
        [annotate(**{MEMORY_ANNOTATION: '{"v":1,"lastRescaleS":null,"recommendations":[]}'})],
        dict(requested_replicas=2, last_rescale_s=None), None,
    ),
    "asked-size-of-the-scaling-task-not-another": (
        [add_master, annotate(**{MEMORY_ANNOTATION: encode_memory(MEMORY, requested_replicas=5)})],
        dict(task="worker", current_replicas=2, requested_replicas=5), None,
    ),
    "no-scaling-task-no-asked-size": (
        [not_elastic_no_worker], dict(elastic=False, requested_replicas=None), None,
    ),
    "gpus-from-the-limit-alone": ([gpus(None, 2)], dict(gpus_per_replica=2.0), None),
    "gpus-in-milli-units": ([gpus("500m", None)], dict(gpus_per_replica=0.5), None),
    "a-cpu-task-asks-no-gpus": ([gpus(None, None)], dict(gpus_per_replica=0.0), None),
    "init-container-asks-more": ([init_container_asks_more], dict(gpus_per_replica=4.0), None),
    "bad-gpu-quantity": (
        [gpus("lots", None)], {}, "spec.tasks[0].template.spec.containers[0].resources.requests",
    ),
    "another-tasks-gpus-are-nonelastic": (
        [add_master], dict(task="worker", current_replicas=2, nonelastic_gpus=2.0), None,
    ),
    "scaling-task-named-by-annotation-is-missing": (
        [annotate(**{"tide.io/task": "trainer"})], dict(task="trainer", elastic=True),
        "no task named 'trainer'",
    ),
    "bad-tide-annotation-keeps-it-elastic-and-named": (
        [annotate(**{"tide.io/min-replicas": "two"})], dict(elastic=True),
        'metadata.annotations["tide.io/min-replicas"]',
    ),
    "completing-is-finished": ([phase("Completing")], dict(phase=JobPhase.COMPLETED), None),
    "aborted-is-finished": ([phase("Aborted")], dict(phase=JobPhase.TERMINATED), None),
    "unknown-phase": ([phase("Dancing")], {}, "status.state.phase"),
    "no-status-yet-is-pending": ([no_status], dict(phase=JobPhase.PENDING), None),
    "non-elastic-without-the-task-holds-all-as-nonelastic": (
        [not_elastic_no_worker],
        dict(elastic=False, current_replicas=0, nonelastic_gpus=2.0, read_problems=()), None,
    ),
}  # fmt: skip


@needs_wire
@pytest.mark.parametrize(("changes", "expected", "problem"), CASES.values(), ids=CASES.keys())
def test_reads_the_recorded_job(changes, expected, problem):
    obj = recorded()
    for change in changes:
        change(obj)
    read = read_job(obj)
    assert isinstance(read, VolcanoJob)
    assert {name: getattr(read.state, name) for name in expected} == expected
    if problem is None:
        assert read.state.read_problems == ()
        assert read.state.spec_problems() == []
    else:
        assert any(problem in p for p in read.state.read_problems), read.state.read_problems
    assert read.task_index is not None or not read.state.elastic or problem is not None


@needs_wire
def test_a_corrupt_memory_annotation_warns_naming_the_job(caplog):
    obj = recorded()
    obj["metadata"]["annotations"][MEMORY_ANNOTATION] = '{"v":99}'
    with caplog.at_level(logging.WARNING):
        read_job(obj)
    assert "default/elastic" in caplog.text and "unknown version 99" in caplog.text


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        ("a string", "must be a mapping"),
        ({"metadata": {}}, "metadata.name"),
        ({"metadata": {"name": ""}}, "metadata.name"),
    ],
    ids=["not-a-mapping", "no-name", "empty-name"],
)
def test_an_object_without_a_name_is_unread(obj, problem):
    read = read_job(obj, source="items[3]")
    assert isinstance(read, UnreadJob)
    assert read.source == "items[3]" and problem in read.problem


def test_one_bad_job_in_a_list_never_stops_the_others():
    good = {
        "metadata": {"name": "a", "namespace": "ns", "annotations": {"tide.io/elastic": "true"}},
        "spec": {"queue": "q", "tasks": [{"name": "worker", "replicas": 3, "minAvailable": 1}]},
    }
    broken = {"metadata": {"name": "b", "namespace": "ns"}, "spec": {"tasks": "nope"}}
    jobs, unread = read_jobs([good, None, broken])
    assert [j.state.key for j in jobs] == [JobKey("ns/a"), JobKey("ns/b")]
    assert jobs[0].state.read_problems == () and jobs[0].state.current_replicas == 3
    assert any("spec.tasks" in p for p in jobs[1].state.read_problems)
    assert [u.source for u in unread] == ["items[1]"]  # fmt: skip


def change(*, to: int, frm: int = 2, task: str = "worker", job: str = "default/elastic"):
    return ReplicaChange(JobKey(job), task, frm, to, MEMORY, Reason.SCALE_UP_FOR_IDLE_GPUS, "")


def apply_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 ``test``, ``replace`` and ``add`` on object members and array indices."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key = int(last) if isinstance(node, list) else last
        if op["op"] == "test":
            if node[key] != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] == "replace":
            if isinstance(node, dict) and key not in node:
                raise ValueError(f"replace of a missing member at {op['path']}")
            node[key] = op["value"]
        else:
            node[key] = op["value"]
    return doc


@needs_wire
def test_the_patch_scales_by_task_index_and_stores_the_memory():
    obj = recorded()
    ops = replica_patch(read_job(obj), change(to=4))
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "289"},
        {"op": "test", "path": "/spec/tasks/0/name", "value": "worker"},
        {"op": "test", "path": "/spec/tasks/0/replicas", "value": 2},
        {"op": "replace", "path": "/spec/tasks/0/replicas", "value": 4},
        {"op": "add", "path": "/metadata/annotations/tide.io~1memory",
         "value": encode_memory(MEMORY, requested_replicas=2)},
    ]  # fmt: skip
    after = read_job(apply_patch(obj, ops))
    assert after.state.current_replicas == 4
    assert (after.state.last_rescale_s, after.state.recommendations) == (
        MEMORY.last_rescale_s, MEMORY.recommendations,
    )  # fmt: skip
    assert after.state.requested_replicas == 2  # the replicas asked before tide's change


# The asked size a write stores: the one read, carried over every later write.
ASKED_SIZE_WRITES = {
    "the first write stores the replicas it starts from": (None, [4], 2),
    "a later write keeps the stored asked size": (6, [4], 6),
    "writes one after another keep the first asked size": (None, [4, 1, 3], 2),
    "a version-1 memory of a rescaled job stays without one": (V1_MEMORY, [4], None),
}


@needs_wire
@pytest.mark.parametrize(
    ("stored", "targets", "asked"), ASKED_SIZE_WRITES.values(), ids=ASKED_SIZE_WRITES.keys()
)
def test_the_asked_size_survives_tides_own_writes(stored, targets, asked):
    obj = recorded()
    if isinstance(stored, int):
        obj["metadata"]["annotations"][MEMORY_ANNOTATION] = encode_memory(
            MEMORY, requested_replicas=stored
        )
    elif stored is not None:
        obj["metadata"]["annotations"][MEMORY_ANNOTATION] = stored
    for to in targets:
        frm = read_job(obj).state.current_replicas
        obj["metadata"].pop("resourceVersion", None)  # apply_patch does not bump it
        obj = apply_patch(obj, replica_patch(read_job(obj), change(frm=frm, to=to)))
        assert read_job(obj).state.current_replicas == to
    assert read_job(obj).state.requested_replicas == asked


@needs_wire
def test_a_memory_only_patch_writes_no_replicas_and_creates_the_annotations():
    obj = recorded()
    del obj["metadata"]["annotations"]
    obj["metadata"]["annotations"] = None  # the API omits an empty map; a manifest may say null
    job = read_job(obj)
    ops = replica_patch(job, change(to=2))
    assert not any(op["op"] == "replace" for op in ops)
    assert {"op": "add", "path": "/metadata/annotations", "value": {}} in ops
    after = read_job(apply_patch(obj, ops))
    assert (
        after.state.current_replicas == 2 and after.state.recommendations == MEMORY.recommendations
    )


@needs_wire
def test_a_stale_from_replicas_fails_the_patch_test():
    obj = recorded()
    ops = replica_patch(read_job(obj), change(to=5, frm=3))
    with pytest.raises(ValueError, match="/spec/tasks/0/replicas"):
        apply_patch(obj, ops)


@pytest.mark.parametrize(
    ("the_change", "message"),
    [
        (change(to=3, task="trainer"), "task 'trainer'"),
        (change(to=3, job="default/other"), "other"),
    ],
    ids=["another-task", "another-job"],
)
def test_a_patch_for_something_else_is_refused(the_change, message):
    job = read_job({"metadata": {"name": "elastic", "namespace": "default"},
                    "spec": {"tasks": [{"name": "worker", "replicas": 2}]}})  # fmt: skip
    with pytest.raises(ValueError, match=message):
        replica_patch(job, the_change)
