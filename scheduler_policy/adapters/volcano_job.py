"""Volcano Jobs (``batch.volcano.sh/v1alpha1``) as the engine's ``JobState``, and the JSON patch
of a replica change: pure, no Kubernetes client.

The input is the dict the Kubernetes client returns for a Job (or a manifest loaded from YAML,
which has the same shape without ``status``). What is read:

- key ``namespace/name``; queue ``spec.queue`` (Volcano's default: ``default``);
- the scaling task, named by ``tide.io/task`` (default ``worker``): its ``replicas`` are the
  job's replicas, its pod template's ``nvidia.com/gpu`` its GPUs per replica (a container's
  request, or its limit when it has no request; a pod asks the sum over its containers, or
  more if an init container asks more), every other task's GPUs are ``nonelastic_gpus``;
- bounds: ``tide.io/min-replicas``, else the task's ``minAvailable``, else its replicas (as
  Volcano defaults it); ``tide.io/max-replicas``, else the larger of replicas and minimum (no
  growth until the owner says how far);
- ``status.state.phase``; the ``tide.io/*`` overrides; the engine's memory (``memory_codec``);
- the asked size (``requested_replicas``): the memory's (tide stores the task's replicas there
  with its first write, before it changes them), else the task's replicas while tide has never
  rescaled the Job.

Pods the scheduler has bound are not in the Job object, so ``scheduled_replicas`` stays None
(taken as all of them); a client that lists the pods sets it.

A Job that cannot be planned for is still returned, with ``read_problems`` naming what is wrong
(triage then holds it with ``InvalidJobSpec``); only an object with no name to give it is
returned as ``UnreadJob``. Nothing here raises out of a list of jobs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from scheduler_policy.adapters.memory_codec import (
    MEMORY_ANNOTATION,
    encode_memory,
    stored_from_annotations,
)
from scheduler_policy.policy.annotations import (
    ELASTIC,
    MAX_REPLICAS,
    TASK,
    annotation_path,
    job_overrides,
)
from scheduler_policy.policy.fields import show
from scheduler_policy.vocabulary.errors import PolicyError
from scheduler_policy.vocabulary.protocols import ReplicaChange
from scheduler_policy.vocabulary.state import JobKey, JobPhase, JobState, QueueName

__all__ = [
    "API_VERSION",
    "DEFAULT_QUEUE",
    "DEFAULT_TASK",
    "GPU_RESOURCE",
    "KIND",
    "TaskRead",
    "UnreadJob",
    "VolcanoJob",
    "annotated_job",
    "missing_task_problem",
    "pod_gpus",
    "quantity",
    "read_job",
    "read_jobs",
    "read_tasks",
    "replica_patch",
    "running_since_s",
    "timestamp_s",
]

API_VERSION = "batch.volcano.sh/v1alpha1"
KIND = "Job"
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_TASK = "worker"
DEFAULT_QUEUE = "default"

# Volcano's Job phases (the CRD's enum) onto the engine's: a job on its way out is gone.
_PHASES = {
    "Pending": JobPhase.PENDING,
    "Running": JobPhase.RUNNING,
    "Restarting": JobPhase.RESTARTING,
    "Completing": JobPhase.COMPLETED,
    "Completed": JobPhase.COMPLETED,
    "Aborting": JobPhase.TERMINATED,
    "Aborted": JobPhase.TERMINATED,
    "Terminating": JobPhase.TERMINATED,
    "Terminated": JobPhase.TERMINATED,
    "Failed": JobPhase.FAILED,
}

# A Kubernetes quantity, as far as GPUs go: a decimal with an optional SI or binary suffix.
_QUANTITY = re.compile(r"\+?(?P<number>\d+(?:\.\d*)?|\.\d+)(?P<suffix>m|k|M|G|T|Ki|Mi|Gi|Ti)?")
_SUFFIX = {
    None: 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class VolcanoJob:
    """One Volcano Job as read: the engine's view, and what a write to it needs.

    Attributes:
        state: the engine's view; ``state.read_problems`` lists what makes it unplannable.
        task_index: the scaling task's index in ``spec.tasks``; None when it has none.
        resource_version: ``metadata.resourceVersion``; None when absent (a manifest).
        has_annotations: whether ``metadata.annotations`` exists (a patch must create it first
            when it does not).
        tasks: every task of ``spec.tasks`` that is a mapping, as read.
        min_available: the job's own ``spec.minAvailable`` (its gang minimum); None when
            unset or invalid.
        uid: ``metadata.uid``; None when absent (a manifest).
    """

    state: JobState
    task_index: int | None
    resource_version: str | None = None
    has_annotations: bool = True
    tasks: tuple[TaskRead, ...] = ()
    min_available: int | None = None
    uid: str | None = None


@dataclass(frozen=True, slots=True)
class TaskRead:
    """One task of a Volcano Job, as read.

    Attributes:
        index: its index in ``spec.tasks``.
        name: its name.
        replicas: its ``replicas``; None when invalid (a problem says so).
        min_available: its ``minAvailable``; None when unset or invalid.
        gpus_per_pod: GPUs each of its pods asks for (``pod_gpus``).
        spec: the task as given (its ``policies``, for ``tide validate``).
    """

    index: int
    name: str
    replicas: int | None
    min_available: int | None
    gpus_per_pod: float
    spec: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class UnreadJob:
    """An object that cannot be read as a Volcano Job at all: no name to give it.

    Attributes:
        source: where it was (its index in the list, and whatever name it has).
        problem: what is wrong.
    """

    source: str
    problem: str


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def quantity(value: object, *, path: str, problems: list[str]) -> float:
    """A Kubernetes quantity (``"8"``, ``"500m"``, ``2``) as a number.

    Args:
        value: the quantity as the API gives it.
        path: where it is, named in the problem.
        problems: where a problem is appended.

    Returns:
        The number; 0 (and a problem) when ``value`` is not a non-negative quantity.
    """
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if value >= 0:
            return float(value)
    elif isinstance(value, str) and (match := _QUANTITY.fullmatch(value.strip())) is not None:
        return float(match["number"]) * _SUFFIX[match["suffix"]]
    problems.append(f"{path}: must be a non-negative quantity, got {show(value)}")
    return 0.0


def _container_gpus(container: Mapping[str, object], *, path: str, problems: list[str]) -> float:
    resources = _mapping(container.get("resources"))
    requests = _mapping(resources.get("requests"))
    limits = _mapping(resources.get("limits"))
    # An extended resource's request defaults to its limit, and the API refuses them unequal.
    if GPU_RESOURCE in requests:
        return quantity(
            requests[GPU_RESOURCE], path=f"{path}.resources.requests[{GPU_RESOURCE}]",
            problems=problems,
        )  # fmt: skip
    if GPU_RESOURCE in limits:
        return quantity(
            limits[GPU_RESOURCE], path=f"{path}.resources.limits[{GPU_RESOURCE}]",
            problems=problems,
        )  # fmt: skip
    return 0.0


def pod_gpus(template: object, *, path: str, problems: list[str]) -> float:
    """GPUs one pod of a task's template asks for.

    The sum over its containers, or the largest init container's when that is more (init
    containers run one at a time, before the others), as the scheduler counts a pod's request.

    Args:
        template: the task's ``template`` (a PodTemplateSpec).
        path: where it is, named in problems.
        problems: where problems are appended.

    Returns:
        GPUs per pod; 0 for a template that asks for none.
    """
    spec = _mapping(_mapping(template).get("spec"))
    total = 0.0
    for i, container in enumerate(_list(spec.get("containers"))):
        total += _container_gpus(
            _mapping(container), path=f"{path}.spec.containers[{i}]", problems=problems
        )
    init = 0.0
    for i, container in enumerate(_list(spec.get("initContainers"))):
        init = max(
            init,
            _container_gpus(
                _mapping(container), path=f"{path}.spec.initContainers[{i}]", problems=problems
            ),
        )
    return max(total, init)


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _count(value: object, *, path: str, problems: list[str]) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        problems.append(f"{path}: must be a non-negative integer, got {show(value)}")
        return None
    return value


def _annotations(metadata: Mapping[str, object], problems: list[str]) -> dict[str, str]:
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        problems.append(f"metadata.annotations: must be a mapping, got {show(annotations)}")
        return {}
    strings: dict[str, str] = {}
    for key, value in annotations.items():
        if isinstance(value, str):
            strings[str(key)] = value
        else:
            problems.append(
                f"{annotation_path(str(key))}: must be a string (quote it in YAML), "
                f"got {show(value)}"
            )
    return strings


def read_tasks(spec: Mapping[str, object], problems: list[str]) -> list[TaskRead]:
    """Every task of a Job's ``spec.tasks``, each problem appended to ``problems``."""
    tasks = spec.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        problems.append(f"spec.tasks: must be a non-empty list of tasks, got {show(tasks)}")
        return []
    read = []
    for index, task in enumerate(tasks):
        path = f"spec.tasks[{index}]"
        if not isinstance(task, Mapping):
            problems.append(f"{path}: must be a mapping, got {show(task)}")
            continue
        replicas = _count(task.get("replicas", 0), path=f"{path}.replicas", problems=problems)
        least = task.get("minAvailable")
        read.append(
            TaskRead(
                index=index,
                name=str(task.get("name", "")),
                replicas=replicas,
                min_available=None
                if least is None
                else _count(least, path=f"{path}.minAvailable", problems=problems),
                gpus_per_pod=pod_gpus(task.get("template"), path=f"{path}.template",
                                      problems=problems),
                spec=task,
            )
        )  # fmt: skip
    return read


def missing_task_problem(tasks: Iterable[TaskRead], *, name: str, named: bool) -> str:
    """The problem of an elastic job with no task ``name`` (``named``: by ``tide.io/task``)."""
    listing = ", ".join(repr(t.name) for t in tasks)
    where = annotation_path(TASK) if named else "spec.tasks"
    hint = "" if named else f" (the default; name another with {TASK})"
    return f"{where}: no task named {name!r}{hint}; found {listing}"


def annotated_job(job: JobState, annotations: Mapping[str, str], *, source: str) -> JobState:
    """``job`` with what its annotations say: the ``tide.io/*`` overrides and tide's memory.

    The one place a job's annotations are applied, for the Volcano Jobs read here and the jobs
    of an observation file alike.

    Args:
        job: the job as its other fields say.
        annotations: its ``metadata.annotations`` (strings).
        source: the job or file, named in the problems.

    Returns:
        The job with its overrides and, when ``tide.io/memory`` is there, its memory (a corrupt
        one reads as none, with a warning). A bad override adds the problems to
        ``read_problems`` instead (the job then holds with ``InvalidJobSpec``); a job marked
        ``tide.io/elastic: "true"`` stays elastic, so that the hold is said. Never raises.

        Its ``requested_replicas`` (the asked size): the memory's when it stores one; else
        ``job.requested_replicas`` as given while tide has never rescaled the job (no memory,
        or a memory without a rescale: the replicas are still the owner's); else None (tide
        rescaled it before it stored the asked size, so that is unknown).
    """
    if MEMORY_ANNOTATION in annotations:
        stored = stored_from_annotations(annotations, job=job.key)
        memory = stored.memory
        requested = stored.requested_replicas
        if requested is None and memory.last_rescale_s is None:
            requested = job.requested_replicas
        job = dataclasses.replace(
            job,
            last_rescale_s=memory.last_rescale_s,
            recommendations=memory.recommendations,
            requested_replicas=requested,
        )
    try:
        overrides = job_overrides(annotations, source=source)
    except PolicyError as e:
        marked = annotations.get(ELASTIC, "").lower() == "true"
        return dataclasses.replace(
            job, elastic=job.elastic or marked, read_problems=(*job.read_problems, *e.problems)
        )
    return dataclasses.replace(
        job,
        elastic=job.elastic if overrides.elastic is None else overrides.elastic,
        task=overrides.task or job.task,
        min_replicas=job.min_replicas if overrides.min_replicas is None else overrides.min_replicas,
        max_replicas=job.max_replicas if overrides.max_replicas is None else overrides.max_replicas,
        restart_cost_s=(
            job.restart_cost_s if overrides.restart_cost_s is None else overrides.restart_cost_s
        ),
        batch_bounds=overrides.adaptive_batch or job.batch_bounds,
    )


def timestamp_s(value: object) -> float | None:
    """A Kubernetes timestamp (RFC 3339, ``2026-12-01T09:08:57Z``) as seconds since the epoch.

    Returns:
        The seconds; None when ``value`` is not such a timestamp.
    """
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def running_since_s(status: Mapping[str, object]) -> float | None:
    """When a Volcano Job last became Running: its ``Running`` condition's ``lastTransitionTime``.

    Volcano's job controller keeps one condition per status, the latest transition
    (``appendJobCondition`` replaces the earlier one), and a rescale by replicas alone does not
    leave Running, so this is when the job first ran unless Volcano restarted the whole job.

    Returns:
        Seconds since the epoch; None when the job has no readable Running condition.
    """
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return None
    times = [
        timestamp_s(c.get("lastTransitionTime"))
        for c in conditions
        if isinstance(c, Mapping) and c.get("status") == "Running"
    ]
    known = [t for t in times if t is not None]
    return min(known) if known else None


def read_job(obj: object, *, source: str = "job") -> VolcanoJob | UnreadJob:
    """Read one Volcano Job.

    Args:
        obj: the Job as the Kubernetes client returns it (or as a manifest holds it).
        source: where it came from, named when it has no name.

    Returns:
        The job, its problems in ``state.read_problems``; an ``UnreadJob`` when it has no
        name. Never raises.
    """
    if not isinstance(obj, Mapping):
        return UnreadJob(source, f"must be a mapping (a Volcano Job), got {show(obj)}")
    metadata = _mapping(obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return UnreadJob(source, f"metadata.name: must be a non-empty string, got {show(name)}")
    namespace = metadata.get("namespace")
    key = JobKey(f"{namespace if isinstance(namespace, str) and namespace else 'default'}/{name}")
    problems: list[str] = []
    if (obj.get("apiVersion"), obj.get("kind")) not in ((API_VERSION, KIND), (None, None)):
        problems.append(
            f"not a {API_VERSION} {KIND}: apiVersion {show(obj.get('apiVersion'))}, "
            f"kind {show(obj.get('kind'))}"
        )
    annotations = _annotations(metadata, problems)
    elastic = annotations.get(ELASTIC) == "true"  # as a bad annotation elsewhere leaves it
    # Read directly too, so that a bad annotation elsewhere does not hide the task.
    named_task = bool(annotations.get(TASK, "").strip())
    task_name = annotations[TASK] if named_task else DEFAULT_TASK

    spec = obj.get("spec")
    tasks: list[TaskRead] = []
    queue: object = DEFAULT_QUEUE
    job_least: int | None = None
    if isinstance(spec, Mapping):
        queue = spec.get("queue", DEFAULT_QUEUE)
        tasks = read_tasks(spec, problems)
        if spec.get("minAvailable") is not None:
            job_least = _count(spec["minAvailable"], path="spec.minAvailable", problems=problems)
    else:
        problems.append(f"spec: must be a mapping, got {show(spec)}")
    if not isinstance(queue, str) or not queue:
        problems.append(f"spec.queue: must be a queue name, got {show(queue)}")
        queue = ""
    # In a job tide does not scale and that has no such task, every task's GPUs are held as
    # they are (``nonelastic_gpus``).
    found = next((t for t in tasks if t.name == task_name), None)
    if found is None and elastic and tasks:
        problems.append(missing_task_problem(tasks, name=task_name, named=named_task))
    replicas, gpus_per_replica, least = 0, 0.0, None
    nonelastic_gpus = 0.0
    for task in tasks:
        if task is found:
            replicas, gpus_per_replica = task.replicas or 0, task.gpus_per_pod
            least = task.min_available
        else:
            nonelastic_gpus += (task.replicas or 0) * task.gpus_per_pod

    min_replicas = replicas if least is None else least
    status = _mapping(obj.get("status"))
    state = _mapping(status.get("state"))
    phase_name = state.get("phase")
    phase = JobPhase.PENDING
    if phase_name is not None:
        if isinstance(phase_name, str) and phase_name in _PHASES:
            phase = _PHASES[phase_name]
        else:
            problems.append(
                f"status.state.phase: must be one of {', '.join(_PHASES)}, got {show(phase_name)}"
            )
    resource_version = metadata.get("resourceVersion")
    base = JobState(
        key=key,
        queue=QueueName(queue),
        gpus_per_replica=gpus_per_replica,
        min_replicas=min_replicas,
        max_replicas=max(replicas, min_replicas),
        current_replicas=replicas,
        phase=phase,
        elastic=elastic,
        task=task_name,
        nonelastic_gpus=nonelastic_gpus,
        running_since_s=running_since_s(status),
        # The asked size, until the memory says otherwise (``annotated_job``).
        requested_replicas=None if found is None else found.replicas,
        read_problems=tuple(problems),
    )
    job = annotated_job(base, annotations, source=key)
    if found is not None and job_least is not None:
        # The admission rules refuse ``spec.minAvailable`` above the total replicas, and that
        # minimum is the owner's gang minimum (fixed, in the elastic pattern): the scaling
        # task never goes below what it leaves to the task, whatever the annotations say.
        floor = job_least - sum(t.replicas or 0 for t in tasks if t is not found)
        if job.min_replicas < floor:
            job = dataclasses.replace(job, min_replicas=floor)
    if MAX_REPLICAS not in annotations and job.max_replicas < job.min_replicas:
        # Without a maximum the job may not grow beyond its replicas, or its minimum if above.
        job = dataclasses.replace(job, max_replicas=job.min_replicas)
    uid = metadata.get("uid")
    return VolcanoJob(
        state=job,
        task_index=None if found is None else found.index,
        resource_version=resource_version if isinstance(resource_version, str) else None,
        has_annotations=isinstance(metadata.get("annotations"), Mapping),
        tasks=tuple(tasks),
        min_available=job_least,
        uid=uid if isinstance(uid, str) else None,
    )


def read_jobs(objs: Iterable[object]) -> tuple[list[VolcanoJob], list[UnreadJob]]:
    """Read a list of Volcano Jobs (the ``items`` of a list response), one bad job at a time.

    Returns:
        ``(jobs, unread)``: every job with a name, and the objects without one.
    """
    jobs: list[VolcanoJob] = []
    unread: list[UnreadJob] = []
    for index, obj in enumerate(objs):
        read = read_job(obj, source=f"items[{index}]")
        if isinstance(read, VolcanoJob):
            jobs.append(read)
        else:
            unread.append(read)
    return jobs, unread


def _pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): ``~`` and ``/`` in a part are escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def replica_patch(job: VolcanoJob, change: ReplicaChange) -> list[dict[str, object]]:
    """The JSON patch (RFC 6902) that writes ``change`` to ``job``.

    By task index, as Volcano's webhook allows (a merge patch would replace the whole
    ``tasks`` array): ``test`` the task's name and its replicas (``from_replicas``; a failed
    test is a conflict), ``replace`` the replicas unless the change is memory-only, and set
    the memory annotation in the same patch, so that replicas and memory never disagree. With
    a ``resource_version``, that is tested too. The memory carries the job's asked size
    (``state.requested_replicas`` as read: at the first write, its replicas then), so that a
    restarted engine still knows it after tide has changed the replicas.

    Volcano's admission rules (its ValidatingAdmissionPolicy ``job-validation-policy`` and its
    webhook) refuse a task's ``minAvailable`` above its ``replicas``. A job whose
    ``tide.io/min-replicas`` lets it go below the task's ``minAvailable`` therefore has that
    ``minAvailable`` lowered to the new replicas in the same patch (tested first). The job's
    own ``spec.minAvailable`` is never changed: ``read_job`` keeps ``min_replicas`` above what
    it requires, so a change within the job's bounds passes the rule that the job's
    ``minAvailable`` is at most the total replicas.

    Args:
        job: the job as read.
        change: the write.

    Returns:
        The operations, for ``application/json-patch+json``.

    Raises:
        ValueError: the job has no scaling task, the change names another job or task, or its
            memory cannot be encoded; the message names the job.
    """
    state = job.state
    if change.job != state.key:
        raise ValueError(f"job {state.key}: the change is for job {change.job}")
    if job.task_index is None:
        raise ValueError(f"job {state.key}: has no task {state.task!r} to scale")
    if change.task != state.task:
        raise ValueError(f"job {state.key}: the change is for task {change.task!r}, "
                         f"the job scales {state.task!r}")  # fmt: skip
    task = ("spec", "tasks", job.task_index)
    ops: list[dict[str, object]] = []
    if job.resource_version is not None:
        ops.append({"op": "test", "path": "/metadata/resourceVersion",
                    "value": job.resource_version})  # fmt: skip
    ops.append({"op": "test", "path": _pointer(*task, "name"), "value": state.task})
    ops.append({"op": "test", "path": _pointer(*task, "replicas"), "value": change.from_replicas})
    if change.to_replicas != change.from_replicas:
        ops.append({"op": "replace", "path": _pointer(*task, "replicas"),
                    "value": change.to_replicas})  # fmt: skip
        least = next((t.min_available for t in job.tasks if t.index == job.task_index), None)
        if least is not None and change.to_replicas < least:
            ops.append({"op": "test", "path": _pointer(*task, "minAvailable"), "value": least})
            ops.append({"op": "replace", "path": _pointer(*task, "minAvailable"),
                        "value": change.to_replicas})  # fmt: skip
    if not job.has_annotations:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append({
        "op": "add",  # adds the member, or replaces it when present
        "path": _pointer("metadata", "annotations", MEMORY_ANNOTATION),
        "value": encode_memory(
            change.memory, job=state.key, requested_replicas=state.requested_replicas
        ),
    })  # fmt: skip
    return ops
