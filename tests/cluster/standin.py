"""A stand-in for Volcano v1.15.1's job controller and scheduler, on a real kube-apiserver.

CI runs a real kube-apiserver with Volcano's CRDs and admission policies and KWOK's fake nodes,
but not Volcano's controller-manager and scheduler. This module plays those two, doing what
the recordings in ``../shared/volcano-wire/v1.15.1/`` show Volcano doing, and nothing more;
each behaviour cites the recording file or the README bullet it follows. It talks to the
apiserver only through the official kubernetes client, and is driven step by step:
``step()`` is one controller sync and one scheduling session, ``run_until`` steps in a bounded
loop, so the tests that use it are deterministic.

What it does:

- **Job controller**: for every ``batch.volcano.sh/v1alpha1`` Job of its namespace, a PodGroup
  ``<job>-<job uid>`` owned by the Job, with ``minMember`` = the job's ``minAvailable`` and
  ``minResources`` summed over the first ``minAvailable`` pods; once the PodGroup has left
  ``Pending``, a pod ``<job>-<task>-<i>`` per task index ``i < replicas`` with the recorded
  labels, annotations and owner reference; the pods of indices ``>= replicas`` deleted, the
  others kept; the Job's ``status`` (running count, phase).
- **Scheduler session**: enqueue (``Pending`` → ``Inqueue``), with the ``overcommit`` plugin's
  check when asked for; allocate: a gang is bound only when all its ``minMember`` pods fit at
  once, the pods beyond ``minMember`` one by one while GPUs are free; nodes chosen by the node
  order (``spread``, Volcano's default, or ``binpack``); pods bound through the ``pods/binding``
  subresource; the PodGroups' ``status`` and the Queues' ``status.allocated`` and ``state``.

What it never does: reclaim and preemption. It never evicts a pod, whatever the queues' shares
(Volcano's reclaim, and the extender that votes on it, are tested on recorded request bodies
elsewhere); it knows no queue shares (``proportion``), priorities, predicates other than free
GPUs, or job policies (restarts, retries). A scenario that needs any of these is testing
something this stand-in does not play.

The objects it writes and the placement rule are pure functions of ``standin_objects.py``.
It sees only the Jobs, PodGroups and pods of one namespace and the nodes matching one label
selector, so that tests sharing one control plane do not see each other's work.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.standin_objects import (
    BATCH,
    GPU,
    JSON_PATCH,
    SCHEDULED,
    SCHEDULING,
    TERMINAL_POD_PHASES,
    NodeOrder,
    Pod,
    body_json,
    creation_order,
    format_quantity,
    job_status,
    min_gpus,
    min_resources,
    parse_quantity,
    place,
    pod_body,
    podgroup_status,
    read_pod,
)

logger = logging.getLogger(__name__)

# Volcano's overcommit plugin multiplies the idle resources by its `overcommit-factor`
# argument, 1.2 when the argument is not given (pkg/scheduler/plugins/overcommit:
# defaultOverCommitFactor = 1.2).
DEFAULT_OVERCOMMIT_FACTOR = 1.2


class StandInError(Exception):
    """The stand-in cannot do what a step needs (the API refused it, or timed out)."""


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one step did.

    Attributes:
        created_pods: pods the controller created.
        deleted_pods: pods the controller deleted (indices at or above replicas).
        bound: ``(pod, node)`` pairs the scheduler bound.
        enqueued: PodGroups that went ``Pending`` → ``Inqueue``.
        refused_enqueue: PodGroups the overcommit check kept ``Pending``, with why.
        unschedulable: Inqueue PodGroups whose gang did not fit, with why.
        problems: Jobs the controller skipped, with what is wrong (one bad Job never stops
            the step).
    """

    created_pods: tuple[str, ...] = ()
    deleted_pods: tuple[str, ...] = ()
    bound: tuple[tuple[str, str], ...] = ()
    enqueued: tuple[str, ...] = ()
    refused_enqueue: tuple[tuple[str, str], ...] = ()
    unschedulable: tuple[tuple[str, str], ...] = ()
    problems: tuple[tuple[str, str], ...] = ()


@dataclass
class _Report:
    created_pods: list[str] = field(default_factory=list)
    deleted_pods: list[str] = field(default_factory=list)
    bound: list[tuple[str, str]] = field(default_factory=list)
    enqueued: list[str] = field(default_factory=list)
    refused_enqueue: list[tuple[str, str]] = field(default_factory=list)
    unschedulable: list[tuple[str, str]] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def freeze(self) -> StepReport:
        return StepReport(
            created_pods=tuple(self.created_pods),
            deleted_pods=tuple(self.deleted_pods),
            bound=tuple(self.bound),
            enqueued=tuple(self.enqueued),
            refused_enqueue=tuple(self.refused_enqueue),
            unschedulable=tuple(self.unschedulable),
            problems=tuple(self.problems),
        )


# --- the stand-in ---------------------------------------------------------------------------


class StandInVolcano:
    """Volcano's job controller and scheduler for one namespace and one set of nodes.

    Args:
        api: an admin ``ApiClient`` of the control plane.
        namespace: the namespace whose Jobs, PodGroups and pods it manages.
        node_selector: a label selector naming its nodes (e.g. ``tide-test=<namespace>``).
        node_order: how nodes are ranked (Volcano's default is ``SPREAD``).
        overcommit: whether the ``overcommit`` plugin is enabled (its enqueue check).
        overcommit_factor: the plugin's ``overcommit-factor``.
        queues: Queues whose status it keeps, besides those its PodGroups name.
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str,
        node_selector: str,
        node_order: NodeOrder = NodeOrder.SPREAD,
        overcommit: bool = False,
        overcommit_factor: float = DEFAULT_OVERCOMMIT_FACTOR,
        queues: Iterable[str] = (),
    ) -> None:
        if overcommit_factor < 1:
            raise ValueError(f"overcommit_factor: must be at least 1, got {overcommit_factor}")
        self.namespace = namespace
        self.node_selector = node_selector
        self.node_order = node_order
        self.overcommit = overcommit
        self.overcommit_factor = Fraction(overcommit_factor).limit_denominator(1000)
        self.queues = frozenset(queues)
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self.steps = 0

    # --- the loop ---------------------------------------------------------------------------

    def step(self) -> StepReport:
        """One controller sync, then one scheduling session.

        Returns:
            What the step did.

        Raises:
            StandInError: the API refused a request the step needed.
        """
        report = _Report()
        try:
            self._sync_jobs(report)
            self._session(report)
        except ApiException as e:
            raise StandInError(
                f"stand-in Volcano, namespace {self.namespace}: the API answered "
                f"{e.status} {e.reason}: {e.body}"
            ) from e
        self.steps += 1
        frozen = report.freeze()
        logger.debug("stand-in step %d: %s", self.steps, frozen)
        return frozen

    def run_until(
        self,
        predicate: Callable[[], bool],
        *,
        timeout_s: float,
        interval_s: float = 0.1,
        what: str = "the condition",
    ) -> int:
        """Step until ``predicate()`` holds, at most ``timeout_s`` seconds.

        Args:
            predicate: checked after each step.
            timeout_s: the bound, seconds.
            interval_s: pause between steps, seconds (KWOK marks pods Running in between).
            what: what the predicate means, for the timeout's message.

        Returns:
            The steps taken.

        Raises:
            TimeoutError: the predicate did not hold in time; names ``what`` and the last step.
        """
        deadline = time.monotonic() + timeout_s
        taken = 0
        while True:
            last = self.step()
            taken += 1
            if predicate():
                return taken
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"stand-in Volcano, namespace {self.namespace}: {what} did not hold after "
                    f"{taken} steps in {timeout_s} s; last step: {last}"
                )
            time.sleep(interval_s)

    # --- reads ------------------------------------------------------------------------------

    def _jobs(self) -> list[dict[str, Any]]:
        body = self._custom.list_namespaced_custom_object(*BATCH, self.namespace, "jobs")
        return sorted(body["items"], key=creation_order)

    def _podgroups(self) -> list[dict[str, Any]]:
        body = self._custom.list_namespaced_custom_object(*SCHEDULING, self.namespace, "podgroups")
        return sorted(body["items"], key=creation_order)

    def _pods(self) -> list[Pod]:
        body = body_json(self._core.list_namespaced_pod(self.namespace, _preload_content=False))
        return [p for item in body["items"] if (p := read_pod(item)) is not None]

    def _free_gpus(self) -> dict[str, Fraction]:
        """Each of its nodes' allocatable GPUs minus the GPUs of the pods bound there (of any
        namespace, terminating ones included: their GPUs are not free until they are gone)."""
        nodes = body_json(
            self._core.list_node(label_selector=self.node_selector, _preload_content=False)
        )
        free: dict[str, Fraction] = {}
        for node in nodes["items"]:
            name = node["metadata"]["name"]
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            try:
                free[name] = parse_quantity(
                    allocatable.get(GPU, "0"), path=f"node {name}: status.allocatable[{GPU}]"
                )
            except ValueError as e:
                logger.warning("stand-in Volcano: skipping node: %s", e)
                continue
            pods = body_json(
                self._core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={name}", _preload_content=False
                )
            )
            for item in pods["items"]:
                pod = read_pod(item)
                if pod is not None and pod.phase not in TERMINAL_POD_PHASES:
                    free[name] -= pod.gpus
        return free

    # --- the job controller -----------------------------------------------------------------

    def _sync_jobs(self, report: _Report) -> None:
        groups = {g["metadata"]["name"]: g for g in self._podgroups()}
        pods = self._pods()
        for job in self._jobs():
            name = job["metadata"]["name"]
            try:
                self._sync_job(job, groups, pods, report)
            except (ValueError, KeyError, TypeError) as e:
                report.problems.append((name, str(e)))
                logger.warning("stand-in Volcano: job %s/%s skipped: %s", self.namespace, name, e)

    def _sync_job(
        self,
        job: Mapping[str, Any],
        groups: Mapping[str, Mapping[str, Any]],
        pods: Sequence[Pod],
        report: _Report,
    ) -> None:
        meta, spec = job["metadata"], job["spec"]
        name, uid = meta["name"], meta["uid"]
        tasks = spec["tasks"]
        min_available = spec.get("minAvailable")
        if not isinstance(min_available, int):
            raise ValueError(f"job {self.namespace}/{name}: spec.minAvailable: not set")
        queue = spec.get("queue", "default")
        # The PodGroup is named <job>-<job uid> and owned by the Job (podgroups-with-pending-
        # gang.json: "elastic-dd2d2710-…", ownerReferences kind Job, controller true).
        group_name = f"{name}-{uid}"
        owner = {
            "apiVersion": f"{BATCH[0]}/{BATCH[1]}",
            "kind": "Job",
            "name": name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        wanted = {
            "minMember": min_available,
            "minResources": min_resources(
                tasks, min_available=min_available, path=f"job {self.namespace}/{name}"
            ),
            # minTaskMember: each task's minAvailable (recorded {"worker": 1}); a task without
            # one defaults to its replicas (DESIGN.md: "it defaults to replicas").
            "minTaskMember": {t["name"]: t.get("minAvailable", t["replicas"]) for t in tasks},
            "queue": queue,
        }
        group = groups.get(group_name)
        if group is None:
            body = {
                "apiVersion": f"{SCHEDULING[0]}/{SCHEDULING[1]}",
                "kind": "PodGroup",
                "metadata": {
                    "name": group_name,
                    "namespace": self.namespace,
                    "ownerReferences": [owner],
                    # The Job's annotations are copied (the elastic PodGroup carries the Job's
                    # tide.io/elastic: podgroups-with-pending-gang.json).
                    "annotations": dict(meta.get("annotations") or {}),
                },
                "spec": wanted,
            }
            # Created without a status (its managedFields: the controller owns "f:status": {});
            # the scheduler sets the phase.
            self._custom.create_namespaced_custom_object(
                *SCHEDULING, self.namespace, "podgroups", body
            )
            return
        # The controller rewrites the PodGroup's spec from the Job on every sync (DESIGN.md:
        # "patch a Volcano Job, never the PodGroup it owns").
        current = {k: group.get("spec", {}).get(k) for k in wanted}
        if current != wanted:
            self._custom.patch_namespaced_custom_object(
                *SCHEDULING, self.namespace, "podgroups", group_name, {"spec": wanted}
            )
        phase = (group.get("status") or {}).get("phase")
        mine = [p for p in pods if p.job == name]
        # Pods are made once the scheduler has let the PodGroup out of Pending: the recorded
        # Inqueue gang had its 3 pods ("3 Pipelined", podgroups-with-pending-gang.json), and
        # the gang kept Pending by overcommit never ran (README).
        if phase not in (None, "", "Pending"):
            gone = self._sync_pods(job, group_name, queue, mine, report)
            mine = [p for p in mine if p.name not in gone]
        self._sync_status(job, mine)

    def _sync_pods(
        self,
        job: Mapping[str, Any],
        group_name: str,
        queue: str,
        pods: Sequence[Pod],
        report: _Report,
    ) -> set[str]:
        """Create and delete the Job's pods; return the names of those deleted."""
        gone: set[str] = set()
        replicas = {t["name"]: int(t["replicas"]) for t in job["spec"]["tasks"]}
        existing = {(p.task, p.index) for p in pods}
        # Scale-down: the pods whose index is at or above replicas go, the others keep their
        # UIDs (README: "28 → 20: the pods with task index 20–27 were deleted; the other 20
        # kept their UIDs").
        for pod in pods:
            if pod.terminating:
                continue
            if pod.task not in replicas or pod.index is None or pod.index >= replicas[pod.task]:
                try:
                    self._core.delete_namespaced_pod(
                        pod.name, self.namespace, _preload_content=False
                    )
                except ApiException as e:
                    if e.status != 404:
                        raise
                report.deleted_pods.append(pod.name)
                gone.add(pod.name)
        # Scale-up: new pods for the missing indices only (README: "2 → 28: the 2 first pods
        # kept their UIDs").
        for task in job["spec"]["tasks"]:
            for index in range(replicas[task["name"]]):
                if (task["name"], index) in existing:
                    continue
                body = pod_body(job, task, index, group_name=group_name, queue=queue)
                try:
                    self._core.create_namespaced_pod(self.namespace, body, _preload_content=False)
                except ApiException as e:
                    # A pod of that name still terminating: made again once it is gone.
                    if e.status != 409:
                        raise
                    continue
                report.created_pods.append(body["metadata"]["name"])
        return gone

    def _sync_status(self, job: Mapping[str, Any], pods: Sequence[Pod]) -> None:
        status = job_status(job, pods)
        if status is None:
            return
        # The whole status at once (a merge patch would keep a task's phase count that is gone).
        self._custom.patch_namespaced_custom_object_status(
            *BATCH, self.namespace, "jobs", job["metadata"]["name"],
            [{"op": "add", "path": "/status", "value": status}], _content_type=JSON_PATCH,
        )  # fmt: skip

    # --- the scheduler ----------------------------------------------------------------------

    def _session(self, report: _Report) -> None:
        free = self._free_gpus()
        groups = self._podgroups()
        pods = self._pods()
        by_group: dict[str, list[Pod]] = defaultdict(list)
        for pod in pods:
            if pod.group is not None:
                by_group[pod.group].append(pod)
        for members in by_group.values():
            members.sort(key=lambda p: (p.task or "", p.index if p.index is not None else -1))
        phases: dict[str, str] = {}
        conditions: dict[str, dict[str, str] | None] = {}
        # Enqueue.
        waiting_gpus = Fraction(0)  # minResources of gangs Inqueue but not yet placed
        for group in groups:
            name = group["metadata"]["name"]
            phase = (group.get("status") or {}).get("phase") or "Pending"
            phases[name] = phase
            if phase == "Inqueue":
                bound = sum(1 for p in by_group[name] if p.node and not p.terminating)
                if bound < group["spec"]["minMember"]:
                    waiting_gpus += min_gpus(group)
        for group in groups:
            name = group["metadata"]["name"]
            if phases[name] != "Pending":
                continue
            need = min_gpus(group)
            if self.overcommit:
                # overcommit's enqueue check compares the idle GPUs × factor with the job's
                # minResources (README: with research at 28 of 32 GPUs the 3 × 8 gang never
                # became Inqueue); gangs already Inqueue and unplaced count as taken.
                idle = sum(free.values(), Fraction(0)) - waiting_gpus
                if idle * self.overcommit_factor < need:
                    report.refused_enqueue.append(
                        (
                            name,
                            f"idle {format_quantity(idle)} GPUs × {float(self.overcommit_factor)}"
                            f" < minResources {format_quantity(need)} GPUs",
                        )
                    )
                    continue
            # Without overcommit the gang became Inqueue at once (README).
            phases[name] = "Inqueue"
            waiting_gpus += need
            report.enqueued.append(name)
        # Allocate the gangs: all minMember pods at once, or none.
        for group in groups:
            name = group["metadata"]["name"]
            if phases[name] not in ("Inqueue", "Running"):
                continue
            members = [p for p in by_group[name] if not p.terminating]
            bound = sum(1 for p in members if p.node)
            min_member = int(group["spec"]["minMember"])
            if bound >= min_member:
                phases[name] = "Running"
                conditions[name] = SCHEDULED
                continue
            unbound = [p for p in members if not p.node]
            if len(unbound) + bound < min_member:
                continue  # the controller has not made its pods yet (it does on its next sync)
            plan = place(unbound[: min_member - bound], free, order=self.node_order)
            if plan is None:
                conditions[name] = {
                    "type": "Unschedulable",
                    "reason": "NotEnoughResources",
                    # The recorded message said "3 Pipelined": there the pods waited for GPUs
                    # that reclaim was freeing, which the stand-in never does.
                    "message": (
                        f"{min_member - bound}/{len(members)} tasks in gang unschedulable: "
                        f"pod group is not ready, {min_member - bound} Pending, "
                        f"{min_member} minAvailable"
                    ),
                }
                report.unschedulable.append((name, conditions[name]["message"]))
                continue
            for pod, node in plan:
                self._bind(pod, node, free, report)
            phases[name] = "Running"
            conditions[name] = SCHEDULED
        # The pods beyond minMember: one by one while they fit (no gang for them).
        for group in groups:
            name = group["metadata"]["name"]
            if phases[name] != "Running":
                continue
            placed = {p for p, _ in report.bound}
            for pod in by_group[name]:
                if pod.node or pod.terminating or pod.name in placed:
                    continue
                plan = place([pod], free, order=self.node_order)
                if plan is not None:
                    self._bind(pod, plan[0][1], free, report)
        bound_now = dict(report.bound)
        for group in groups:
            name = group["metadata"]["name"]
            self._write_group_status(group, phases[name], conditions.get(name), by_group[name])
        self._write_queue_status(groups, by_group, bound_now)

    def _bind(self, pod: Pod, node: str, free: dict[str, Fraction], report: _Report) -> None:
        """Bind through the ``pods/binding`` subresource, as a scheduler does."""
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.name),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            self._core.create_namespaced_pod_binding(
                pod.name, self.namespace, body, _preload_content=False
            )
        except ApiException as e:
            # Already bound, or deleted since it was read: the next session sees why.
            if e.status in (404, 409):
                logger.info("stand-in Volcano: binding %s refused: %s", pod.name, e.reason)
                return
            raise
        free[node] -= pod.gpus
        report.bound.append((pod.name, node))

    def _write_group_status(
        self,
        group: Mapping[str, Any],
        phase: str,
        condition: Mapping[str, str] | None,
        pods: Sequence[Pod],
    ) -> None:
        """Write the PodGroup's status when ``podgroup_status`` says it changed. The PodGroup
        CRD has no status subresource, so the scheduler writes the object itself
        (podgroups-with-pending-gang.json: vc-scheduler's Update has no "subresource")."""
        status = dict(group.get("status") or {})
        wanted = podgroup_status(status, phase=phase, condition=condition, pods=pods)
        if all(status.get(k) == v for k, v in wanted.items()):
            return
        self._custom.patch_namespaced_custom_object(
            *SCHEDULING,
            self.namespace,
            "podgroups",
            group["metadata"]["name"],
            {"status": wanted},
        )

    def _write_queue_status(
        self,
        groups: Sequence[Mapping[str, Any]],
        by_group: Mapping[str, Sequence[Pod]],
        bound_now: Mapping[str, str],
    ) -> None:
        """Each queue's ``status.allocated`` (what its bound pods request, terminating ones
        left out, counts as strings:
        README "`Queue.status.allocated["nvidia.com/gpu"]` is "28"", queues.json) and
        ``state: Open`` (queues.json; the README: a Job sent to a queue not Open is refused)."""
        totals: dict[str, dict[str, Fraction]] = {q: defaultdict(Fraction) for q in self.queues}
        for group in groups:
            queue = group["spec"].get("queue", "default")
            total = totals.setdefault(queue, defaultdict(Fraction))
            for pod in by_group.get(group["metadata"]["name"], ()):
                held = (pod.node or pod.name in bound_now) and not pod.terminating
                if held and pod.phase not in TERMINAL_POD_PHASES:
                    total["pods"] += 1
                    for k, v in pod.requests.items():
                        total[k] += v
        for queue, total in sorted(totals.items()):
            try:
                current = self._custom.get_cluster_custom_object(*SCHEDULING, "queues", queue)
            except ApiException as e:
                if e.status == 404:
                    continue
                raise
            status = current.get("status") or {}
            old = status.get("allocated") or {}
            # cpu and memory are always there (queues.json, even for an empty queue); the
            # others once the queue has held some.
            allocated = {"cpu": "0", "memory": "0"}
            allocated.update({k: "0" for k in old})
            allocated.update({k: format_quantity(v) for k, v in total.items()})
            if old == allocated and status.get("state") == "Open":
                continue
            self._custom.patch_cluster_custom_object_status(
                *SCHEDULING,
                "queues",
                queue,
                {"status": {"allocated": allocated, "state": "Open"}},
            )
