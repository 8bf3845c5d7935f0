"""The objects Volcano v1.15.1 writes, as the stand-in Volcano (``standin.py``) makes them.

Pure functions over the API's JSON, each citing the recording it follows
(``../shared/volcano-wire/v1.15.1/``): the names, labels and annotations of the pods the job
controller makes, a PodGroup's ``minResources``, the Job's and PodGroup's status, the
Kubernetes quantities they are written in, and the node order pods are placed by. No client
and no network here.
"""

from __future__ import annotations

import datetime
import enum
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

logger = logging.getLogger(__name__)

BATCH = ("batch.volcano.sh", "v1alpha1")
SCHEDULING = ("scheduling.volcano.sh", "v1beta1")
GPU = "nvidia.com/gpu"
SCHEDULER_NAME = "volcano"
JSON_PATCH = "application/json-patch+json"


# Pod labels and annotations the job controller sets (pod-of-vcjob.json).
GROUP_NAME = "scheduling.k8s.io/group-name"
JOB_NAME = "volcano.sh/job-name"
JOB_NAMESPACE = "volcano.sh/job-namespace"
QUEUE_NAME = "volcano.sh/queue-name"
TASK_INDEX = "volcano.sh/task-index"
TASK_SPEC = "volcano.sh/task-spec"
JOB_VERSION = "volcano.sh/job-version"
RETRY_COUNT = "volcano.sh/job-retry-count"
TEMPLATE_UID = "volcano.sh/template-uid"


class NodeOrder(enum.Enum):
    """How the scheduler ranks the nodes a pod fits on (README, "Placement")."""

    # Volcano's default `nodeorder` plugin (leastrequested): the node with the most free GPUs
    # first; the README: 24 one-GPU pods of one job went 6 to each of the 4 nodes.
    SPREAD = "spread"
    # `binpack` with `binpack.resources: nvidia.com/gpu` and leastrequested's weight 0: the
    # fullest node that fits first; the README: after a scale-down the 8 left were on one node.
    BINPACK = "binpack"


TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})


_SUFFIXES = {
    "": Fraction(1), "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
    "G": Fraction(10**9), "T": Fraction(10**12), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
    "Gi": Fraction(2**30), "Ti": Fraction(2**40),
}  # fmt: skip


def parse_quantity(value: object, *, path: str) -> Fraction:
    """A Kubernetes quantity (``"1"``, ``"500m"``, ``"8Gi"``, or a number) as an exact fraction.

    Raises:
        ValueError: ``value`` is not a quantity; the message names ``path``.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Fraction(value)
    if isinstance(value, str):
        text = value.strip()
        for suffix in sorted(_SUFFIXES, key=len, reverse=True):
            if suffix and text.endswith(suffix):
                number = text[: -len(suffix)]
                break
        else:
            suffix, number = "", text
        try:
            return Fraction(number) * _SUFFIXES[suffix]
        except (ValueError, ZeroDivisionError):
            pass
    raise ValueError(f"{path}: not a Kubernetes quantity: {value!r}")


def format_quantity(value: Fraction) -> str:
    """An exact quantity as the API writes counts: ``"24"``; ``"1500m"`` for a fraction."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{int(value * 1000)}m"


def pod_requests(pod_spec: Mapping[str, Any], *, path: str) -> dict[str, Fraction]:
    """What a pod asks for: the sum of its containers' requests, or an init container's when
    more (the scheduler's rule); a resource given only as a limit requests its limit (the
    API's defaulting of container requests).

    Raises:
        ValueError: a quantity is malformed; the message names where.
    """

    def container(c: Mapping[str, Any], where: str) -> dict[str, Fraction]:
        resources = c.get("resources") or {}
        asked = dict(resources.get("limits") or {})
        asked.update(resources.get("requests") or {})
        return {k: parse_quantity(v, path=f"{where}.resources[{k}]") for k, v in asked.items()}

    total: dict[str, Fraction] = defaultdict(Fraction)
    for i, c in enumerate(pod_spec.get("containers") or []):
        for k, v in container(c, f"{path}.containers[{i}]").items():
            total[k] += v
    for i, c in enumerate(pod_spec.get("initContainers") or []):
        for k, v in container(c, f"{path}.initContainers[{i}]").items():
            total[k] = max(total[k], v)
    return dict(total)


def min_resources(
    tasks: Sequence[Mapping[str, Any]], *, min_available: int, path: str
) -> dict[str, str]:
    """A Job's PodGroup ``minResources``: the quota usage of its first ``min_available`` pods.

    podgroups-with-pending-gang.json: the elastic job (minAvailable 1, replicas 2 and more, one
    GPU and one CPU per pod) has ``minResources`` of one pod, the gang (3 × 8 GPUs) of three;
    the README: "minResources follows minAvailable, not replicas". The keys are those recorded:
    ``count/pods`` and ``pods``, and each requested resource both bare and as ``requests.*``.

    Raises:
        ValueError: a task's template has a malformed quantity.
    """
    total: dict[str, Fraction] = defaultdict(Fraction)
    pods = 0
    for t, task in enumerate(tasks):
        spec = (task.get("template") or {}).get("spec") or {}
        requests = pod_requests(spec, path=f"{path}.spec.tasks[{t}].template.spec")
        for _ in range(int(task.get("replicas", 0))):
            if pods >= min_available:
                break
            pods += 1
            for k, v in requests.items():
                total[k] += v
    out = {"count/pods": str(pods), "pods": str(pods)}
    for k, v in total.items():
        out[k] = format_quantity(v)
        out[f"requests.{k}"] = format_quantity(v)
    return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod as the stand-in reads it (from the API's JSON)."""

    name: str
    group: str | None
    job: str | None
    task: str | None
    index: int | None
    node: str | None
    phase: str
    terminating: bool
    gpus: Fraction
    requests: Mapping[str, Fraction]


def now_stamp() -> str:
    """Now, as the API writes times (vcjob-running.json: ``2026-12-01T09:08:51Z``)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def body_json(response: Any) -> Any:
    """The body of a response read with ``_preload_content=False``, as plain JSON."""
    return json.loads(response.data)


def read_pod(item: Mapping[str, Any]) -> Pod | None:
    """A pod of the API as the stand-in needs it; None (logged) when its requests are malformed."""
    meta, spec = item["metadata"], item.get("spec") or {}
    name = f"{meta.get('namespace')}/{meta['name']}"
    try:
        requests = pod_requests(spec, path=f"pod {name}: spec")
    except ValueError as e:
        logger.warning("stand-in Volcano: skipping pod: %s", e)
        return None
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    index = annotations.get(TASK_INDEX, labels.get(TASK_INDEX))
    return Pod(
        name=meta["name"],
        group=annotations.get(GROUP_NAME),
        job=labels.get(JOB_NAME),
        task=labels.get(TASK_SPEC),
        index=int(index) if isinstance(index, str) and index.isdigit() else None,
        node=spec.get("nodeName"),
        phase=(item.get("status") or {}).get("phase", "Pending"),
        terminating=meta.get("deletionTimestamp") is not None,
        gpus=requests.get(GPU, Fraction(0)),
        requests=requests,
    )


SCHEDULED = {"type": "Scheduled", "reason": "tasks in gang are ready to be scheduled"}


def min_gpus(group: Mapping[str, Any]) -> Fraction:
    """A PodGroup's ``minResources`` GPUs."""
    name = group["metadata"]["name"]
    value = (group["spec"].get("minResources") or {}).get(GPU, "0")
    return parse_quantity(value, path=f"podgroup {name}: spec.minResources[{GPU}]")


def creation_order(obj: Mapping[str, Any]) -> tuple[str, str]:
    """Oldest first, then by name."""
    meta = obj["metadata"]
    return (meta.get("creationTimestamp", ""), meta["name"])


def pod_body(
    job: Mapping[str, Any],
    task: Mapping[str, Any],
    index: int,
    *,
    group_name: str,
    queue: str,
) -> dict[str, Any]:
    """One pod of a task, as Volcano's job controller makes it (pod-of-vcjob.json): its name,
    labels, annotations and owner reference; the template's spec with ``schedulerName`` and no
    ``nodeName``."""
    meta = job["metadata"]
    template = task.get("template") or {}
    tmeta = template.get("metadata") or {}
    name, namespace, task_name = meta["name"], meta["namespace"], task["name"]
    labels = {
        **(tmeta.get("labels") or {}),
        JOB_NAME: name,
        JOB_NAMESPACE: namespace,
        QUEUE_NAME: queue,
        TASK_INDEX: str(index),
        TASK_SPEC: task_name,
    }
    annotations = {
        **(tmeta.get("annotations") or {}),
        GROUP_NAME: group_name,
        JOB_NAME: name,
        RETRY_COUNT: "0",
        JOB_VERSION: "0",
        QUEUE_NAME: queue,
        TASK_INDEX: str(index),
        TASK_SPEC: task_name,
        TEMPLATE_UID: f"{name}-{task_name}",
    }
    spec = dict(template.get("spec") or {})
    spec.pop("nodeName", None)
    spec["schedulerName"] = job["spec"].get("schedulerName", SCHEDULER_NAME)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{task_name}-{index}",
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": f"{BATCH[0]}/{BATCH[1]}",
                    "kind": "Job",
                    "name": name,
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def job_status(job: Mapping[str, Any], pods: Sequence[Pod]) -> dict[str, Any] | None:
    """The Job's whole ``status`` as vcjob-running.json shows it, or None when unchanged.

    ``running``, ``minAvailable``, ``taskStatusCount`` per task and pod phase, ``state.phase``
    (``Pending`` until ``minAvailable`` pods run, then ``Running`` for good) and one condition
    per phase entered (recorded: Pending, then Running). Terminating pods are not counted.
    """
    spec = job["spec"]
    status = dict(job.get("status") or {})
    live = [p for p in pods if not p.terminating]
    running = sum(1 for p in live if p.phase == "Running")
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for pod in live:
        if pod.task is None:
            continue
        phases = counts.setdefault(pod.task, {"phase": {}})["phase"]
        phases[pod.phase] = phases.get(pod.phase, 0) + 1
    old_phase = (status.get("state") or {}).get("phase")
    reached = old_phase == "Running" or running >= spec["minAvailable"]
    phase = "Running" if reached else "Pending"
    wanted = {"minAvailable": spec["minAvailable"], "running": running, "taskStatusCount": counts}
    if all(status.get(k) == v for k, v in wanted.items()) and old_phase == phase:
        return None
    conditions = list(status.get("conditions") or [])
    state = status.get("state") or {}
    if old_phase != phase:
        now = now_stamp()
        conditions.append({"status": phase, "lastTransitionTime": now})
        state = {"phase": phase, "lastTransitionTime": now}
    return {**wanted, "state": state, "conditions": conditions}


def podgroup_status(
    status: Mapping[str, Any],
    *,
    phase: str,
    condition: Mapping[str, str] | None,
    pods: Sequence[Pod],
) -> dict[str, Any]:
    """The fields of a PodGroup's ``status`` to write, as podgroups-with-pending-gang.json shows
    them: ``phase``, ``running`` (its pods Running) and one condition (``Scheduled`` once
    placed, ``Unschedulable``/``NotEnoughResources`` while its gang does not fit), a new
    condition only when its type, reason or message changed.

    Args:
        status: the PodGroup's status now.
        phase: its phase after this session.
        condition: its condition after this session (type, reason, message); None for none.
        pods: its pods.
    """
    wanted: dict[str, Any] = {"phase": phase}
    running = sum(1 for p in pods if p.phase == "Running" and not p.terminating)
    if running or "running" in status:
        wanted["running"] = running
    conditions = status.get("conditions") or []
    if condition is not None:
        same = conditions and all(conditions[-1].get(k) == v for k, v in condition.items())
        if not same:
            wanted["conditions"] = [
                {
                    **condition,
                    "status": "True",
                    "transitionID": str(uuid.uuid4()),
                    "lastTransitionTime": now_stamp(),
                }
            ]
    return wanted


def place(
    pods: Sequence[Pod], free: Mapping[str, Fraction], *, order: NodeOrder
) -> list[tuple[Pod, str]] | None:
    """Where each of ``pods`` goes, in turn, by the node order; None if one does not fit.

    Args:
        pods: the pods to place together (a gang's, or one).
        free: free GPUs per node; not changed.
        order: how nodes are ranked; ties go to the node named first.
    """
    left = dict(free)
    plan = []
    for pod in pods:
        fits = [n for n, gpus in left.items() if gpus >= pod.gpus]
        if not fits:
            return None
        if order is NodeOrder.SPREAD:
            node = min(fits, key=lambda n: (-left[n], n))
        else:
            node = min(fits, key=lambda n: (left[n], n))
        left[node] -= pod.gpus
        plan.append((pod, node))
    return plan
