"""One Volcano scheduling session over the simulated cluster: enqueue, allocate, backfill, reclaim.

What is modelled (volcano-sh/volcano v1.16, DESIGN.md "Volcano facts"):

- proportion plugin: each queue's *deserved* share water-fills the healthy GPUs by weight, each
  queue capped by what it requests and by its real capability (``capability``, and never into
  other queues' ``guarantee``); a queue first gets its guarantee (up to what it requests).
- enqueue: a pending job is admitted (Inqueue) when its gang minimum fits in its queue's real
  capability next to what the queue holds and has admitted, and in the overcommit plugin's
  ``overcommit_factor x healthy GPUs``. A job that does not fit does not block the ones behind it.
- allocate: queues by ascending share (allocated / deserved); in each, jobs in order (submit time,
  or a baseline's priority). A job starts only when its whole gang minimum fits (gang plugin),
  within the queue's deserved share. Elastic pods (above ``minAvailable``) are placed after every
  gang, in the same order, one at a time, also within the deserved share.
- placement: each pod goes to a node by the cluster's node order (``NodeOrder``: spread, Volcano's
  default ``nodeorder``, to the node with the most free GPUs; binpack to the fullest that fits),
  a gang all or none; free GPUs spread over nodes too small for a pod do not start it.
- backfill: a job that does not fit does not block smaller jobs behind it.
- reclaim (when enabled): a queue whose first waiting job fits in its deserved share but not in
  the free GPUs kills elastic pods (never below a job's ``minAvailable``) of jobs in other,
  reclaimable queues that hold more than their deserved share, latest-submitted job first,
  only when that frees enough. The kill is abrupt: work since the last checkpoint is lost.
- the ``extender`` plugin (a tide policy): before it evicts, reclaim asks tide's extender
  (``Extender.answer``, the production code, with an ``EvictionRequest`` built from the victims,
  each pod's grace period its job's save-and-exit time, the evictor the waiting job's first
  pod); the pods tide withholds are not
  evicted, and when the rest no longer free enough nothing is. The session records what was
  withheld and when the first window ends (``ClusterCore.withheld_pods``, ``withheld_until_s``):
  the event loop reconciles at once and asks again when the window ends. Baselines run without.
- releasing GPUs (pods saving and exiting after a graceful stop) are not free: nothing is
  placed on them until they free (``ClusterCore.free_released``).
- not modelled: ``preempt`` within a queue, priority classes, node affinity, CPU/memory, and
  reclaim choosing victims by node (it kills the highest task indices wherever they are).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from scheduler_policy.decision.shares import water_fill
from scheduler_policy.extender import EvictionRequest, Extender, Task
from scheduler_policy.vocabulary.state import QueueName
from simulations.core import ClusterCore
from simulations.state import SimJob, Status

JobOrder = Callable[[SimJob], tuple[float, float]]
"""Sort key of a queue's jobs (smaller first)."""

_EPS = 1e-9


def fifo_order(job: SimJob) -> tuple[float, float]:
    """Volcano's default job order: by submission time."""
    return (0.0, job.spec.submit_s)


def real_capability(core: ClusterCore) -> dict[QueueName, float]:
    """Each queue's real capability: its capability, minus other queues' guarantees."""
    return core.spec.real_capability(float(core.nodes.healthy_gpus))


def queue_usage(core: ClusterCore) -> tuple[dict[QueueName, float], dict[QueueName, float]]:
    """GPUs each queue's pods hold, and GPUs its jobs request in all (held plus wanted)."""
    allocated = {q.name: 0.0 for q in core.spec.queues}
    request = dict(allocated)
    for job in core.running.values():
        allocated[job.queue] += job.gpus
        request[job.queue] += job.spec_replicas * job.spec.gpus_per_replica
    for name, waiting in core.waiting_by_queue.items():
        request[name] += sum(j.spec_replicas * j.spec.gpus_per_replica for j in waiting)
    return allocated, request


def deserved_shares(
    core: ClusterCore, request: dict[QueueName, float], capability: dict[QueueName, float]
) -> dict[QueueName, float]:
    """The proportion plugin's deserved share of every queue (water-filling by weight, as the
    engine computes it: ``scheduler_policy.decision.shares.water_fill``)."""
    return water_fill(
        total_gpus=float(core.nodes.healthy_gpus),
        ceilings={q.name: min(capability[q.name], request[q.name]) for q in core.spec.queues},
        guarantees={q.name: q.guarantee_gpus for q in core.spec.queues},
        weights={q.name: float(q.weight) for q in core.spec.queues},
    )


def _enqueue(core: ClusterCore, capability: dict[QueueName, float], order: JobOrder) -> None:
    total_limit = core.spec.overcommit_factor * core.nodes.healthy_gpus
    used = sum(j.gpus for j in core.running.values())
    inqueue_total = 0.0
    inqueue: dict[QueueName, float] = {}
    for name, waiting in core.waiting_by_queue.items():
        inqueue[name] = sum(j.spec.min_gpus for j in waiting if j.status is Status.INQUEUE)
        inqueue_total += inqueue[name]
    allocated = {q.name: 0.0 for q in core.spec.queues}
    for job in core.running.values():
        allocated[job.queue] += job.gpus
    for name, waiting in core.waiting_by_queue.items():
        waiting.sort(key=order)
        for job in waiting:
            if job.status is not Status.PENDING:
                continue
            need = job.spec.min_gpus
            if total_limit - used - inqueue_total < 1 - _EPS:
                break  # the overcommit gate is full for every job
            if allocated[name] + inqueue[name] + need > capability[name] + _EPS:
                continue
            if used + inqueue_total + need > total_limit + _EPS:
                continue
            job.status = Status.INQUEUE
            inqueue[name] += need
            inqueue_total += need


def _try_gang(core: ClusterCore, job: SimJob, room: float) -> bool:
    need = job.spec.min_gpus
    if need > room + _EPS or need > core.nodes.total_free:
        return False
    nodes = core.nodes.place(job.spec.gpus_per_replica, job.spec.min_replicas)
    if nodes is None:
        return False
    core.waiting_by_queue[job.queue].remove(job)
    core.add_pods(job, nodes)
    return True


def _allocate(
    core: ClusterCore,
    deserved: dict[QueueName, float],
    allocated: dict[QueueName, float],
) -> list[SimJob]:
    """Place gangs, then elastic pods; return each queue's first waiting job that did not start."""
    queues = sorted(
        core.waiting_by_queue, key=lambda n: allocated[n] / deserved[n] if deserved[n] else math.inf
    )
    blocked: list[SimJob] = []
    for name in queues:
        first_blocked: SimJob | None = None
        for job in list(core.waiting_by_queue[name]):
            if job.status is not Status.INQUEUE:
                continue
            if core.nodes.total_free <= 0:
                first_blocked = first_blocked or job
                break
            if _try_gang(core, job, deserved[name] - allocated[name]):
                allocated[name] += job.gpus
            elif first_blocked is None:
                first_blocked = job
        if first_blocked is not None:
            blocked.append(first_blocked)
    # Elastic pods last: one at a time per job, in queue order, within the deserved share.
    by_queue: dict[QueueName, list[SimJob]] = {}
    for job in core.running.values():
        if job.wanted_pods:
            by_queue.setdefault(job.queue, []).append(job)
    for name, jobs in by_queue.items():
        jobs.sort(key=lambda j: j.spec.submit_s)
        for job in jobs:
            gpr = job.spec.gpus_per_replica
            count = min(job.wanted_pods, int((deserved[name] - allocated[name] + _EPS) // gpr))
            placed: list[int] = []
            for _ in range(count):
                nodes = core.nodes.place(gpr, 1)
                if nodes is None:
                    break
                placed += nodes
            if placed:
                core.add_pods(job, placed)
                allocated[name] += len(placed) * gpr
    return blocked


def _reclaim(
    core: ClusterCore,
    job: SimJob,
    deserved: dict[QueueName, float],
    allocated: dict[QueueName, float],
    extender: Extender | None = None,
) -> bool:
    """Kill elastic pods of over-share reclaimable queues so that ``job`` can start; with an
    extender, only the victims it agrees to."""
    need = job.spec.min_gpus - core.nodes.total_free
    if need <= 0:
        return False
    victims: list[tuple[SimJob, int]] = []
    freed = 0.0
    over = {n: allocated[n] - deserved[n] for n in allocated}
    for other in sorted(core.running.values(), key=lambda j: -j.spec.submit_s):
        spec_q = core.spec.queue(other.queue)
        if other.queue == job.queue or spec_q is None or not spec_q.reclaimable:
            continue
        gpr = other.spec.gpus_per_replica
        elastic = len(other.pods) - other.spec.min_replicas
        take = min(elastic, int((over[other.queue] + _EPS) // gpr))
        take = min(take, math.ceil((need - freed) / gpr))
        if take <= 0:
            continue
        victims.append((other, take))
        over[other.queue] -= take * gpr
        freed += take * gpr
        if freed >= need:
            break
    if freed < need:
        return False
    if extender is not None:
        return _reclaim_asking(
            core, job, victims, need=need, extender=extender, allocated=allocated
        )
    for other, take in victims:
        core.remove_pods(other, take, graceful=False)
        allocated[other.queue] -= take * other.spec.gpus_per_replica
    return True


SCALING_TASK = "worker"
"""The scaling task's name in the simulated Jobs (as ``JobState.task``'s default)."""


def victim_task(job: SimJob, position: int) -> Task:
    """The TaskInfo Volcano would send for the job's pod at ``position`` (in ``job.pods``).

    Its UID is ``<job>#<task index>``, its grace period the job's save-and-exit time (its pods'
    ``terminationGracePeriodSeconds`` covers the save).
    """
    index = job.pod_indices[position]
    namespace, _, name = job.key.partition("/")
    return Task(
        uid=f"{job.key}#{index}",
        podgroup=job.key,
        name=f"{name}-{SCALING_TASK}-{index}",
        namespace=namespace,
        role=SCALING_TASK,
        node=f"node-{job.pods[position]}",
        gpus=float(job.spec.gpus_per_replica),
        preemptable=True,
        job=job.key,
        task_index=index,
        grace_period_s=job.save_exit_s,
        text=json.dumps({"UID": f"{job.key}#{index}"}).encode(),
        # An elastic Job's pods carry the label, as the example Jobs' pod templates set it.
        elastic=job.spec.elastic,
    )


def evictor_task(job: SimJob) -> Task:
    """The TaskInfo Volcano would send as the evictor: the waiting job's first pod (index 0),
    not bound to a node. The extender keys its grace windows by its PodGroup (``Job``)."""
    namespace, _, name = job.key.partition("/")
    return Task(
        uid=f"{job.key}#0",
        podgroup=job.key,
        name=f"{name}-{SCALING_TASK}-0",
        namespace=namespace,
        role=SCALING_TASK,
        node=None,
        gpus=float(job.spec.gpus_per_replica),
        preemptable=True,
        job=job.key,
        task_index=0,
        grace_period_s=job.save_exit_s,
        text=json.dumps({"UID": f"{job.key}#0"}).encode(),
    )


def _reclaim_asking(
    core: ClusterCore,
    job: SimJob,
    victims: list[tuple[SimJob, int]],
    *,
    need: float,
    extender: Extender,
    allocated: dict[QueueName, float],
) -> bool:
    """Ask the extender about the victims; evict the ones it agrees to, when they free enough."""
    tasks: list[Task] = []
    where: dict[str, tuple[SimJob, int]] = {}
    for other, take in victims:
        for position in range(len(other.pods) - take, len(other.pods)):
            task = victim_task(other, position)
            tasks.append(task)
            where[task.uid] = (other, position)
    request = EvictionRequest(evictor=evictor_task(job), evictees=tuple(tasks))
    answer = extender.answer(request, verb="reclaimable", now_s=core.now_s)
    if answer.status == 0:
        agreed = tasks
    else:
        agreed = list(answer.victims)
        core.withheld_pods += len(answer.withheld)
        if answer.until_s is not None:
            first = core.withheld_until_s
            core.withheld_until_s = answer.until_s if first is None else min(first, answer.until_s)
    if sum(task.gpus for task in agreed) < need:
        return False
    by_job: dict[str, tuple[SimJob, list[int]]] = {}
    for task in agreed:
        other, position = where[task.uid]
        by_job.setdefault(other.key, (other, []))[1].append(position)
    for other, positions in by_job.values():
        core.kill_pods(other, sorted(positions))
        allocated[other.queue] -= len(positions) * other.spec.gpus_per_replica
    return True


def run_session(
    core: ClusterCore, *, order: JobOrder = fifo_order, extender: Extender | None = None
) -> None:
    """Run one scheduling session at the core's current time.

    Args:
        core: the cluster; placements and kills are applied to it.
        order: the job order within a queue.
        extender: tide's extender, asked before reclaim evicts (None: Volcano's plain reclaim).
            What it withheld is added to ``core.withheld_pods`` and ``core.withheld_until_s``.
    """
    capability = real_capability(core)
    allocated, request = queue_usage(core)
    deserved = deserved_shares(core, request, capability)
    _enqueue(core, capability, order)
    blocked = _allocate(core, deserved, allocated)
    if core.spec.reclaim and blocked:
        retry = False
        for job in blocked:
            if allocated[job.queue] + job.spec.min_gpus <= deserved[job.queue] + _EPS:
                retry = _reclaim(core, job, deserved, allocated, extender) or retry
        if retry:
            blocked = _allocate(core, deserved, allocated)
    core.blocked_queues = frozenset(
        job.queue
        for job in blocked
        if job.status is Status.INQUEUE
        and allocated[job.queue] + job.spec.min_gpus
        <= max(deserved[job.queue], _guarantee(core, job.queue)) + _EPS
    )
    core.last_deserved = deserved


def _guarantee(core: ClusterCore, name: QueueName) -> float:
    spec = core.spec.queue(name)
    return 0.0 if spec is None else spec.guarantee_gpus
