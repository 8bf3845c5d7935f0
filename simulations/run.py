"""The event loop: jump from event to event and to the next reconcile, never tick every second.

Events are job arrivals, completions (computed from each job's rate), node failures and repairs,
held GPUs freeing (a graceful stop's save-and-exit time is over), the end of an extender grace
window (Volcano asks again), and reconciles every ``interval_s``. After any event the Volcano
session runs once. A tide policy also reconciles at once (no sooner than ``MIN_GAP_S`` after the
last) when a session leaves a new non-elastic gang pending or its extender withheld pods from
reclaim (``scheduler_policy.engine.trigger``), as ``tide engine`` does. While nothing
has happened since a reconcile that changed nothing, the next reconciles may be spaced up to
``quiet_interval_s`` apart (off by default: equal to the interval).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from scheduler_policy.engine.trigger import MIN_GAP_S
from simulations.cluster import MetricsOptions, SimulatedCluster
from simulations.cluster_config import ClusterSpec, NodeOrder
from simulations.controllers import Controller
from simulations.core import TimelinePoint
from simulations.faults import FaultOptions, plan_faults
from simulations.state import SimJob, Status
from simulations.volcano import run_session
from simulations.workload import Workload

logger = logging.getLogger(__name__)

_ARRIVAL, _NODE_DOWN, _NODE_UP = 0, 1, 2

PROGRESS_EVERY_S = 0.25
"""Least wall-clock time between two progress reports of one run."""

Progress = Callable[[int, int, float], None]
"""Told ``(jobs finished, jobs in all, simulated seconds)`` while a run goes on."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How one simulation runs.

    Attributes:
        interval_s: seconds between reconciles (tide uses its policy's interval).
        quiet_interval_s: longest gap between reconciles while nothing happens; None = interval.
        horizon_s: stop at this simulated time even if jobs remain; None to run them all.
        faults: faults to inject.
        metrics: how the simulated metrics behave.
        adaptive_batch: whether the jobs that let tide choose their batch
            (``WorkloadJob.adaptive``: every Pollux job but ncf) adapt it under a policy that
            adapts (``Controller.adapts_batch``: tide); False keeps every job at its submitted
            batch (``--no-adaptive-batch``).
    """

    interval_s: float = 60.0
    quiet_interval_s: float | None = None
    horizon_s: float | None = None
    faults: FaultOptions = field(default_factory=FaultOptions)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    adaptive_batch: bool = True

    def __post_init__(self) -> None:
        for name in ("interval_s", "quiet_interval_s", "horizon_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                # Zero, negative or NaN would stop simulated time from moving on.
                raise ValueError(f"RunOptions.{name} must be a finite number > 0, got {value}")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job's outcome.

    Attributes:
        key: the job.
        queue: its queue.
        elastic: whether it was elastic.
        submit_s: submission time.
        start_s: first start; None if it never started.
        end_s: completion; None if it did not finish.
        requested_gpus: GPUs at its requested size.
        work_units: work asked for.
        done_units: work done.
        rescales: membership changes after its first start.
        kills: abrupt pod kills (reclaim, node failure).
        restart_gpu_s: GPU-seconds held while restarting (after the first start).
        killed_gpu_s: GPU-seconds of work lost to abrupt kills.
        replica_log: ``(time_s, placed pods)`` at each membership change.
        late_pods: membership changes that only placed the job's own pods, up to its requested
            size, after its gang started: Volcano allocating (or backfilling) pods above
            ``minAvailable`` as GPUs free up; each restarts the workers, and no policy asked.
    """

    key: str
    queue: str
    elastic: bool
    submit_s: float
    start_s: float | None
    end_s: float | None
    requested_gpus: int
    work_units: float
    done_units: float
    rescales: int
    kills: int
    restart_gpu_s: float
    killed_gpu_s: float
    replica_log: tuple[tuple[float, int], ...]
    late_pods: int = 0


@dataclass(frozen=True, slots=True)
class SimResult:
    """Everything a run produced, for the report.

    Attributes:
        policy: the controller's name.
        workload: the workload's name.
        cluster: the cluster's name.
        total_gpus: GPUs in the cluster.
        node_order: where the scheduler put each pod (``NodeOrder``'s name: spread, binpack).
        jobs: one record per job.
        timeline: allocated/effective GPUs at each reconcile.
        alloc_gpu_s: GPU-seconds held by pods.
        effective_gpu_s: GPU-seconds of useful progress (speedup-weighted, restarts excluded).
        blocked_queue_s: per queue, seconds its waiting work fit its share but not the free GPUs.
        idle_waiting_gpu_s: GPU-seconds of healthy GPUs left idle while a job waited to start.
        end_s: simulated time when the run stopped.
        reconciles: reconciles run.
        writes: replica changes written.
        skipped_rows: bad trace rows skipped while loading.
        wall_s: wall-clock seconds the run took.
        node_failures: injected node failures that began before the run stopped.
        node_down_s: node-seconds those nodes were down before the run stopped.
        metrics_outages: injected metrics outages that began before the run stopped.
        metrics_outage_s: seconds of those outages before the run stopped.
        batch_model: how the jobs' work was counted (``batch_model``): ``adaptive`` when some
            job chose its batch, ``submitted`` when every job kept its submitted batch.
    """

    policy: str
    workload: str
    cluster: str
    total_gpus: int
    jobs: tuple[JobRecord, ...]
    timeline: tuple[TimelinePoint, ...]
    alloc_gpu_s: float
    effective_gpu_s: float
    blocked_queue_s: dict[str, float]
    idle_waiting_gpu_s: float
    end_s: float
    reconciles: int
    writes: int
    skipped_rows: int
    wall_s: float
    node_failures: int = 0
    node_down_s: float = 0.0
    metrics_outages: int = 0
    metrics_outage_s: float = 0.0
    node_order: str = NodeOrder.SPREAD.value
    batch_model: str = "submitted"


def _record(job: SimJob) -> JobRecord:
    return JobRecord(
        key=job.key,
        queue=job.queue,
        elastic=job.spec.elastic,
        submit_s=job.spec.submit_s,
        start_s=job.first_start_s,
        end_s=job.end_s,
        requested_gpus=job.spec.requested_replicas * job.spec.gpus_per_replica,
        work_units=job.work_units,
        done_units=job.done_units,
        rescales=job.rescales,
        kills=job.kills,
        restart_gpu_s=job.restart_gpu_s,
        killed_gpu_s=job.killed_gpu_s,
        replica_log=tuple(job.replica_log),
        late_pods=_late_pods(job),
    )


def _late_pods(job: SimJob) -> int:
    """How many of the job's membership changes grew it to at most its requested size from a
    smaller running size (``JobRecord.late_pods``)."""
    sizes = [n for _, n in job.replica_log]
    asked = job.spec.requested_replicas
    return sum(1 for a, b in itertools.pairwise(sizes) if 0 < a < b <= asked)


def simulate(
    *,
    workload: Workload,
    cluster: ClusterSpec,
    controller: Controller,
    options: RunOptions | None = None,
    progress: Progress | None = None,
) -> SimResult:
    """Replay ``workload`` on ``cluster`` with ``controller`` deciding replicas.

    Args:
        workload: the jobs.
        cluster: the cluster.
        controller: tide or a baseline (fresh: controllers keep state).
        options: run options.
        progress: told how far the run is (``Progress``), at most every ``PROGRESS_EVERY_S``
            of wall time while it goes on, and once at its end.

    Returns:
        The run's result.

    Raises:
        ValueError: a job names a queue the cluster lacks, or two jobs share a key.
    """
    options = options or RunOptions()
    started = time.perf_counter()
    if controller.rigid:
        workload = rigid_workload(workload)
    # A controller written before adaptive batch (no ``adapts_batch``) keeps the submitted one.
    adapts = options.adaptive_batch and bool(getattr(controller, "adapts_batch", False))
    if not adapts:
        workload = submitted_batch_workload(workload)
    last_submit = workload.jobs[-1].submit_s if workload.jobs else 0.0
    failures, outages = plan_faults(
        options.faults, nodes=cluster.nodes, span_s=last_submit + 30 * 86400.0
    )
    metrics = dataclasses.replace(options.metrics, outages=options.metrics.outages + outages)
    sim = SimulatedCluster(spec=cluster, workload=workload, metrics=metrics)
    events: list[tuple[float, int, int, object]] = []
    for seq, job in enumerate(sim.order):
        events.append((job.spec.submit_s, _ARRIVAL, seq, job))
    for i, failure in enumerate(failures):
        events.append((failure.start_s, _NODE_DOWN, i, failure.node))
        events.append((failure.end_s, _NODE_UP, i, failure.node))
    heapq.heapify(events)
    interval = options.interval_s
    quiet = options.quiet_interval_s or interval
    next_reconcile = 0.0
    last_reconcile = -math.inf
    retries: list[float] = []  # when an extender grace window ends: Volcano asks again
    extender = controller.extender
    reconciles = 0
    busy_since_reconcile = True
    total_jobs = len(sim.order)
    reported_at = started
    while sim.done_count < total_jobs:
        if progress is not None and time.perf_counter() - reported_at >= PROGRESS_EVERY_S:
            progress(sim.done_count, total_jobs, sim.now_s)
            reported_at = time.perf_counter()
        if not sim.running and not events:
            # The cluster is empty and nothing more will arrive or recover, yet jobs wait: their
            # gangs do not fit the empty cluster (e.g. larger than a queue's real capability),
            # and no reconcile can change that. Without this, the loop would never end.
            logger.warning(
                "%d job(s) can never run on cluster %s (their gangs do not fit it empty)",
                total_jobs - sim.done_count,
                cluster.name,
            )
            break
        t_event = events[0][0] if events else math.inf
        t_done, _ = sim.next_completion()
        if not sim.running and not any(sim.waiting_by_queue.values()):
            # Nothing submitted is alive: jump to the next arrival, reconcile on the grid after.
            next_reconcile = max(next_reconcile, math.ceil(t_event / interval) * interval)
        t_held = sim.next_release_s()
        t_retry = retries[0] if retries else math.inf
        t = min(t_event, t_done, next_reconcile, t_held, t_retry)
        if t == math.inf:
            logger.warning(
                "%d job(s) can never run on cluster %s", total_jobs - sim.done_count, cluster.name
            )
            break
        if options.horizon_s is not None and t > options.horizon_s:
            sim.advance(options.horizon_s)
            break
        sim.advance(t)
        changed = bool(sim.finish_due())
        changed = sim.free_released() or changed
        while retries and retries[0] <= t:
            heapq.heappop(retries)
            changed = True
        gang_arrived = False
        while events and events[0][0] <= t:
            _, kind, _, payload = heapq.heappop(events)
            changed = True
            if kind == _ARRIVAL:
                assert isinstance(payload, SimJob)
                sim.submit(payload)
                gang_arrived = gang_arrived or not payload.spec.elastic
            elif kind == _NODE_DOWN:
                assert isinstance(payload, int)
                sim.fail_node(payload)
            else:
                assert isinstance(payload, int)
                sim.repair_node(payload)
        busy_since_reconcile = busy_since_reconcile or changed
        if t >= next_reconcile:
            reconciles += 1
            last_reconcile = t
            writes = controller.control(sim, now_s=t)
            sim.sample_timeline()
            changed = changed or writes > 0
            step = interval if (busy_since_reconcile or writes) else quiet
            busy_since_reconcile = False
            next_reconcile = t + step
        elif changed and next_reconcile - t > interval:
            next_reconcile = math.ceil(t / interval) * interval
        if changed:
            sim.withheld_pods, sim.withheld_until_s = 0, None
            run_session(sim, order=controller.order(), extender=extender)
            if sim.withheld_until_s is not None:
                heapq.heappush(retries, sim.withheld_until_s)
            if extender is not None and (gang_arrived or sim.withheld_pods):
                why = controller.trigger(sim, withheld_pods=sim.withheld_pods)
                if why is not None:
                    logger.debug("t=%.1f reconcile now: %s", t, why)
                    next_reconcile = min(next_reconcile, max(t, last_reconcile + MIN_GAP_S))
                    busy_since_reconcile = True
    if progress is not None:
        progress(sim.done_count, total_jobs, sim.now_s)
    return SimResult(
        policy=controller.name,
        workload=workload.name,
        cluster=cluster.name,
        total_gpus=cluster.total_gpus,
        jobs=tuple(_record(job) for job in sim.order),
        timeline=tuple(sim.timeline),
        alloc_gpu_s=sim.alloc_gpu_s,
        effective_gpu_s=sim.effective_gpu_s,
        blocked_queue_s={str(k): v for k, v in sim.blocked_queue_s.items()},
        idle_waiting_gpu_s=sim.idle_waiting_gpu_s,
        end_s=sim.now_s,
        reconciles=reconciles,
        writes=sim.writes,
        skipped_rows=workload.skipped_rows,
        wall_s=time.perf_counter() - started,
        node_failures=sum(1 for f in failures if f.start_s < sim.now_s),
        node_down_s=_seen(((f.start_s, f.end_s) for f in failures), sim.now_s),
        metrics_outages=sum(1 for start, _ in metrics.outages if start < sim.now_s),
        metrics_outage_s=_seen(metrics.outages, sim.now_s),
        node_order=cluster.node_order.value,
        batch_model=batch_model(workload, adapts=adapts),
    )


def _seen(intervals: Iterable[tuple[float, float]], end_s: float) -> float:
    """Seconds of ``intervals`` before ``end_s``."""
    return sum(max(0.0, min(stop, end_s) - start) for start, stop in intervals)


def rigid_workload(workload: Workload) -> Workload:
    """Every job at its requested size as a full gang (how a non-elastic scheduler runs it).

    Jobs keep their ``elastic`` flag (and so their queue and report group); with min = max = the
    requested replicas nothing can resize them.
    """
    jobs = tuple(
        dataclasses.replace(j, min_replicas=j.requested_replicas, max_replicas=j.requested_replicas)
        for j in workload.jobs
    )
    return dataclasses.replace(workload, jobs=jobs)


def submitted_batch_workload(workload: Workload) -> Workload:
    """Every job at its submitted batch (``WorkloadJob.adaptive`` dropped); ``workload`` itself
    when no job adapts."""
    if not any(j.adaptive is not None for j in workload.jobs):
        return workload
    jobs = tuple(dataclasses.replace(j, adaptive=None) for j in workload.jobs)
    return dataclasses.replace(workload, jobs=jobs)


def batch_model(workload: Workload, *, adapts: bool) -> str:
    """Which model counted the work of ``workload``'s jobs in a run: ``"adaptive"`` (progress
    at the batch the workers choose, ``simulations.adaptive_batch``) when some job adapted,
    else ``"submitted"`` (iterations at each job's submitted batch).

    Args:
        workload: the jobs as given to ``simulate``.
        adapts: whether the run let them adapt (``RunOptions.adaptive_batch`` and
            ``Controller.adapts_batch``).
    """
    if adapts and any(j.adaptive is not None for j in workload.jobs):
        return "adaptive"
    return "submitted"


__all__ = ["JobRecord", "Progress", "RunOptions", "SimResult", "Status", "simulate"]
