"""Volcano Queues, PodGroups, pods and nodes as the engine's vocabulary: pure, no client.

Each reader takes one object as the Kubernetes API returns it (a dict, the JSON of a list's
``items``) and gives the engine's view of it, ``None`` when the object is not the engine's
concern (a PodGroup that runs, a pod of no Volcano Job, a node without GPUs), or a
``ReadProblem`` naming the object and the field that is wrong. None of them raises: a list
reads one bad object as a problem and the rest as usual. Jobs have their own translator,
``scheduler_policy.adapters.volcano_job``.

What is read, as Volcano v1.15.1 writes it (``../shared/volcano-wire/v1.15.1/``):

- Queue: ``spec.capability``, ``spec.deserved`` and ``spec.guarantee.resource`` GPUs
  (``nvidia.com/gpu``, Kubernetes quantities), ``status.allocated["nvidia.com/gpu"]`` (a
  count, ``"28"``: not the milli-units of the scheduler's metrics), ``spec.weight`` and
  ``status.state`` (checked, not kept: the engine's budget has no use for them yet);
- PodGroup: phase ``Pending`` or ``Inqueue`` (none yet counts as ``Pending``), ``spec.queue``,
  ``spec.minMember``, ``spec.minResources["nvidia.com/gpu"]``, ``metadata.creationTimestamp``;
  the PodGroup of an elastic Volcano Job is not demand (the job is tide's to scale);
- pod: ``volcano.sh/job-name``, ``volcano.sh/job-namespace``, ``volcano.sh/task-spec`` and
  ``volcano.sh/task-index`` (labels, else annotations), ``spec.nodeName``, its GPUs as the
  scheduler counts them (``volcano_job.pod_gpus``), ``metadata.deletionTimestamp``,
  ``status.phase``;
- node: ``status.allocatable["nvidia.com/gpu"]``, ``spec.unschedulable``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from scheduler_policy.adapters.volcano_job import (
    API_VERSION,
    DEFAULT_QUEUE,
    GPU_RESOURCE,
    pod_gpus,
    quantity,
    timestamp_s,
)
from scheduler_policy.policy.fields import show
from scheduler_policy.vocabulary.state import (
    JobKey,
    NodeState,
    PendingGang,
    PodPlacement,
    QueueName,
    QueueState,
)

__all__ = [
    "JOB_NAME",
    "JOB_NAMESPACE",
    "PENDING_PHASES",
    "TASK_INDEX",
    "TASK_SPEC",
    "PodRead",
    "ReadProblem",
    "podgroup_owner",
    "read_node",
    "read_pod",
    "read_podgroup",
    "read_queue",
    "timestamp_s",
]

JOB_NAME = "volcano.sh/job-name"
JOB_NAMESPACE = "volcano.sh/job-namespace"
TASK_SPEC = "volcano.sh/task-spec"
TASK_INDEX = "volcano.sh/task-index"

PENDING_PHASES = frozenset(("Pending", "Inqueue"))
"""PodGroup phases of a gang that waits for GPUs (``Inqueue``: admitted, not yet placed)."""

_QUEUE_STATES = frozenset(("Open", "Closed", "Closing", "Unknown"))
_FINISHED_POD_PHASES = frozenset(("Succeeded", "Failed"))


@dataclass(frozen=True, slots=True)
class ReadProblem:
    """An object that cannot be read, and why.

    Attributes:
        source: the object, as ``Kind namespace/name`` (or its place in a list when it has no
            name).
        problem: what is wrong, naming the field and the value.
    """

    source: str
    problem: str

    def __str__(self) -> str:
        return f"{self.source}: {self.problem}"


@dataclass(frozen=True, slots=True)
class PodRead:
    """One pod as the client keeps it: where it runs, what it asks, and whose it is.

    Attributes:
        name: ``namespace/name``.
        node: ``spec.nodeName``; None while it waits for a node.
        gpus: GPUs it asks for.
        terminating: it has a ``deletionTimestamp``: it still holds its GPUs, which come free
            shortly.
        finished: its phase is ``Succeeded`` or ``Failed``: it holds nothing.
        job: the Volcano Job it belongs to; None for a pod of anything else.
        task: its task's name (``volcano.sh/task-spec``); None when ``job`` is.
        index: its task index (``volcano.sh/task-index``); None when ``job`` is.
    """

    name: str
    node: str | None
    gpus: float
    terminating: bool = False
    finished: bool = False
    job: JobKey | None = None
    task: str | None = None
    index: int | None = None

    @property
    def placement(self) -> PodPlacement | None:
        """The pod as one of its job's ``pods``; None for a pod of no job, or finished.

        A terminating pod stays one of its job's pods until it is gone: it still holds its GPUs
        on its node (``read_node`` counts them), and placement must see them as the job's
        (index at or above its replicas: on their way out), not as another tenant's.
        """
        if self.index is None or self.finished:
            return None
        return PodPlacement(index=self.index, node=self.node, gpus=self.gpus)

    @property
    def holds_gpus(self) -> bool:
        """Whether its GPUs count against its node (bound and not finished)."""
        return self.node is not None and not self.finished and self.gpus > 0


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _identity(kind: str, obj: object, *, namespaced: bool) -> tuple[str, str | None]:
    """``("Kind ns/name", name)``; the name is None when the object has none."""
    metadata = _mapping(_mapping(obj).get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return f"{kind} without a name", None
    if not namespaced:
        return f"{kind} {name}", name
    namespace = metadata.get("namespace")
    namespace = namespace if isinstance(namespace, str) and namespace else "default"
    return f"{kind} {namespace}/{name}", name


def _namespace(obj: Mapping[str, object]) -> str:
    namespace = _mapping(obj.get("metadata")).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else "default"


def _gpus(resources: object, *, path: str, problems: list[str]) -> float | None:
    """``resources["nvidia.com/gpu"]`` as a number; None when absent."""
    if resources is None:
        return None
    if not isinstance(resources, Mapping):
        problems.append(f"{path}: must be a mapping of resources, got {show(resources)}")
        return None
    if GPU_RESOURCE not in resources:
        return None
    return quantity(resources[GPU_RESOURCE], path=f"{path}[{GPU_RESOURCE}]", problems=problems)


def read_queue(obj: object, *, pending_gpus: float = 0.0) -> QueueState | ReadProblem:
    """Read one Volcano Queue (``scheduling.volcano.sh/v1beta1``).

    Args:
        obj: the Queue as the API returns it.
        pending_gpus: GPUs of the queue's pending gangs (the client sums them); the queue's
            ``pending_nonelastic_gpus``.

    Returns:
        The queue; a ``ReadProblem`` naming the queue and every bad field when a field the
        budget reads is malformed.
    """
    source, name = _identity("Queue", obj, namespaced=False)
    if name is None or not isinstance(obj, Mapping):
        return ReadProblem(source, "metadata.name: must be a non-empty string")
    problems: list[str] = []
    spec = obj.get("spec", {})
    if not isinstance(spec, Mapping):
        return ReadProblem(source, f"spec: must be a mapping, got {show(spec)}")
    weight = spec.get("weight")
    if weight is not None and (
        isinstance(weight, bool) or not isinstance(weight, int) or weight < 0
    ):
        problems.append(f"spec.weight: must be a non-negative integer, got {show(weight)}")
    capability = _gpus(spec.get("capability"), path="spec.capability", problems=problems)
    deserved = _gpus(spec.get("deserved"), path="spec.deserved", problems=problems)
    guarantee_spec = spec.get("guarantee")
    if guarantee_spec is not None and not isinstance(guarantee_spec, Mapping):
        problems.append(f"spec.guarantee: must be a mapping, got {show(guarantee_spec)}")
        guarantee_spec = None
    guarantee = _gpus(
        _mapping(guarantee_spec).get("resource"), path="spec.guarantee.resource", problems=problems
    )
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    allocated = _gpus(status.get("allocated"), path="status.allocated", problems=problems)
    state = status.get("state")
    if state is not None and state not in _QUEUE_STATES:
        problems.append(
            f"status.state: must be one of {', '.join(sorted(_QUEUE_STATES))}, got {show(state)}"
        )
    if not math.isfinite(pending_gpus) or pending_gpus < 0:
        problems.append(f"pending GPUs must be a finite number >= 0, got {pending_gpus!r}")
    if problems:
        return ReadProblem(source, "; ".join(problems))
    return QueueState(
        name=QueueName(name),
        capability_gpus=capability,
        deserved_gpus=deserved,
        guarantee_gpus=guarantee or 0.0,
        allocated_gpus=allocated or 0.0,
        pending_nonelastic_gpus=pending_gpus,
        weight=float(weight) if weight is not None else 1.0,  # Volcano's default weight
    )


def _owner_job(obj: Mapping[str, object]) -> str | None:
    """The name of the Volcano Job that controls ``obj``; None when no Job does."""
    owners = _mapping(obj.get("metadata")).get("ownerReferences")
    if not isinstance(owners, list):
        return None
    for owner in owners:
        owner = _mapping(owner)
        api = owner.get("apiVersion")
        if (
            owner.get("kind") == "Job"
            and isinstance(api, str)
            and api.split("/")[0] == API_VERSION.split("/")[0]
            and isinstance(owner.get("name"), str)
        ):
            return str(owner["name"])
    return None


def podgroup_owner(obj: object) -> JobKey | None:
    """The Volcano Job (``namespace/name``) that controls a PodGroup; None when none does."""
    if not isinstance(obj, Mapping):
        return None
    owner = _owner_job(obj)
    return None if owner is None else JobKey(f"{_namespace(obj)}/{owner}")


def read_podgroup(
    obj: object, *, elastic_jobs: Collection[str]
) -> PendingGang | ReadProblem | None:
    """Read one PodGroup as demand: a gang of non-elastic work waiting for GPUs.

    Args:
        obj: the PodGroup (``scheduling.volcano.sh/v1beta1``) as the API returns it.
        elastic_jobs: keys (``namespace/name``) of the elastic Volcano Jobs: their own
            PodGroups are not demand.

    Returns:
        The pending gang, keyed ``namespace/<PodGroup name>``; None for a PodGroup that is
        not waiting (phase other than ``Pending``/``Inqueue``), that belongs to an elastic
        Job, or that asks for no GPUs; a ``ReadProblem`` when a field is malformed.
    """
    source, name = _identity("PodGroup", obj, namespaced=True)
    if name is None or not isinstance(obj, Mapping):
        return ReadProblem(source, "metadata.name: must be a non-empty string")
    namespace = _namespace(obj)
    phase = _mapping(obj.get("status")).get("phase") or "Pending"  # not yet seen: pending
    if phase not in PENDING_PHASES:
        return None
    owner = podgroup_owner(obj)
    if owner is not None and owner in elastic_jobs:
        return None
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return ReadProblem(source, f"spec: must be a mapping, got {show(spec)}")
    problems: list[str] = []
    queue = spec.get("queue", DEFAULT_QUEUE)
    if not isinstance(queue, str) or not queue:
        problems.append(f"spec.queue: must be a queue name, got {show(queue)}")
    members = spec.get("minMember", 1)
    if isinstance(members, bool) or not isinstance(members, int) or members < 0:
        problems.append(f"spec.minMember: must be a non-negative integer, got {show(members)}")
    gpus = _gpus(spec.get("minResources"), path="spec.minResources", problems=problems)
    if problems:
        return ReadProblem(source, "; ".join(problems))
    if not gpus:
        return None
    assert isinstance(queue, str) and isinstance(members, int)  # checked above
    created = _mapping(obj.get("metadata")).get("creationTimestamp")
    return PendingGang(
        key=f"{namespace}/{name}",
        queue=QueueName(queue),
        min_member=members,
        gpus=gpus,
        phase=str(phase),
        since_s=timestamp_s(created),
    )


def _label(metadata: Mapping[str, object], key: str) -> object:
    """A Volcano pod label, else the annotation of the same name (the controller writes both)."""
    for where in ("labels", "annotations"):
        found = _mapping(metadata.get(where)).get(key)
        if found is not None:
            return found
    return None


def read_pod(obj: object) -> PodRead | ReadProblem:
    """Read one pod: its node, its GPUs, and the Volcano Job task it belongs to if any.

    Args:
        obj: the Pod (core v1) as the API returns it.

    Returns:
        The pod (``job`` None for a pod of no Volcano Job); a ``ReadProblem`` naming the pod
        and the field when its GPUs or its Volcano labels are malformed.
    """
    source, name = _identity("Pod", obj, namespaced=True)
    if name is None or not isinstance(obj, Mapping):
        return ReadProblem(source, "metadata.name: must be a non-empty string")
    namespace = _namespace(obj)
    metadata = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    problems: list[str] = []
    gpus = pod_gpus({"spec": spec}, path="", problems=problems)
    node = spec.get("nodeName")
    if node is not None and (not isinstance(node, str) or not node):
        problems.append(f"spec.nodeName: must be a node name, got {show(node)}")
    job_name = _label(metadata, JOB_NAME)
    job: JobKey | None = None
    task: str | None = None
    index: int | None = None
    if job_name is not None:
        job_namespace = _label(metadata, JOB_NAMESPACE) or namespace
        task_name = _label(metadata, TASK_SPEC)
        raw_index = _label(metadata, TASK_INDEX)
        if not isinstance(job_name, str) or not job_name or not isinstance(job_namespace, str):
            problems.append(f"labels[{JOB_NAME}]: must be a job name, got {show(job_name)}")
        elif not isinstance(task_name, str) or not task_name:
            problems.append(f"labels[{TASK_SPEC}]: must be a task name, got {show(task_name)}")
        elif not isinstance(raw_index, str) or not raw_index.isdigit():
            problems.append(
                f"labels[{TASK_INDEX}]: must be a non-negative integer, got {show(raw_index)}"
            )
        else:
            job, task, index = JobKey(f"{job_namespace}/{job_name}"), task_name, int(raw_index)
    if problems:
        # pod_gpus names its paths from the template's root; here that is the pod.
        return ReadProblem(source, "; ".join(p.lstrip(".") for p in problems))
    return PodRead(
        name=f"{namespace}/{name}",
        node=node if isinstance(node, str) else None,
        gpus=gpus,
        terminating=metadata.get("deletionTimestamp") is not None,
        finished=_mapping(obj.get("status")).get("phase") in _FINISHED_POD_PHASES,
        job=job,
        task=task,
        index=index,
    )


def read_node(obj: object, bound_gpus: float) -> NodeState | ReadProblem | None:
    """Read one node with GPUs.

    Args:
        obj: the Node (core v1) as the API returns it.
        bound_gpus: GPUs of the pods bound to it that have not finished (terminating ones
            included: they hold their GPUs until they are gone).

    Returns:
        The node, its free GPUs ``allocatable − bound`` (never below 0; 0 when it is cordoned,
        ``spec.unschedulable``); None for a node without ``nvidia.com/gpu`` allocatable; a
        ``ReadProblem`` when that figure is malformed.
    """
    source, name = _identity("Node", obj, namespaced=False)
    if name is None or not isinstance(obj, Mapping):
        return ReadProblem(source, "metadata.name: must be a non-empty string")
    problems: list[str] = []
    status = _mapping(obj.get("status"))
    allocatable = _gpus(status.get("allocatable"), path="status.allocatable", problems=problems)
    if not math.isfinite(bound_gpus) or bound_gpus < 0:
        problems.append(f"bound GPUs must be a finite number >= 0, got {bound_gpus!r}")
    if problems:
        return ReadProblem(source, "; ".join(problems))
    if not allocatable:
        return None
    cordoned = _mapping(obj.get("spec")).get("unschedulable") is True
    free = 0.0 if cordoned else max(0.0, allocatable - bound_gpus)
    return NodeState(name=name, allocatable_gpus=allocatable, free_gpus=free)
