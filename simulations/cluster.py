"""``SimulatedCluster``: the simulated Volcano cluster as the engine's metrics source and client.

It implements ``MetricsSource`` and ``ClusterClient`` exactly as the production adapters do, so
``scheduler_policy.engine.reconcile`` runs against it unchanged. Writes go through ``apply``,
which checks the replicas the engine saw (a conflict otherwise), stores the stabilizer's memory on
the job as the Volcano client stores it, as the ``tide.io/memory`` annotation string
(``memory_codec``; decoded again when the jobs are listed), and shrinks gracefully.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler_policy.adapters.memory_codec import MEMORY_ANNOTATION, decode_memory, encode_memory
from scheduler_policy.vocabulary.errors import ConflictError, PermanentError
from scheduler_policy.vocabulary.protocols import MetricsSample, ReplicaChange
from scheduler_policy.vocabulary.state import (
    BatchStatistics,
    DemandPoint,
    JobKey,
    JobPhase,
    JobState,
    NodeState,
    PendingGang,
    PodPlacement,
    QueueName,
    QueueState,
    ThroughputPoint,
)
from simulations.cluster_config import ClusterSpec
from simulations.core import ClusterCore
from simulations.state import SimJob, Status
from simulations.volcano import deserved_shares, queue_usage, real_capability
from simulations.workload import Workload

_PHASES = {
    Status.PENDING: JobPhase.PENDING,
    Status.INQUEUE: JobPhase.PENDING,
    Status.RUNNING: JobPhase.RUNNING,
    Status.DONE: JobPhase.COMPLETED,
}


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """How the simulated metrics behave.

    Attributes:
        throughput_noise: relative standard deviation of each throughput measurement.
        max_points: throughput points kept per job (oldest dropped).
        point_every_s: least time between two throughput points of one job at one size.
        demand_every_s: spacing of each queue's demand-history points.
        demand_points: demand-history points kept per queue.
        outages: ``(start_s, end_s)`` intervals when the metrics source is stale.
        seed: seed of the measurement noise.
        declared_work: whether the jobs that declare their planned samples
            (``WorkloadJob.declares_planned_samples``) report their remaining samples; False
            hides remaining work from the engine for every job (``--no-declared-work``).
        batch_statistics: whether the engine is told what adaptive jobs' workers report (their
            ``BatchStatistics``) and their ``BatchBounds``; False leaves it their throughput
            only, as an engine without a goodput model sees them (the workers still adapt).
    """

    throughput_noise: float = 0.02
    max_points: int = 24
    point_every_s: float = 300.0
    demand_every_s: float = 300.0
    demand_points: int = 2016
    outages: tuple[tuple[float, float], ...] = ()
    seed: int = 0
    declared_work: bool = True
    batch_statistics: bool = True


class SimulatedCluster(ClusterCore):
    """A simulated Volcano cluster the engine reads and writes like a real one."""

    def __init__(
        self, *, spec: ClusterSpec, workload: Workload, metrics: MetricsOptions | None = None
    ) -> None:
        super().__init__(spec=spec, workload=workload)
        self.metrics = metrics or MetricsOptions()
        self._rng = np.random.default_rng(self.metrics.seed)
        self._step_rng = np.random.default_rng([self.metrics.seed, 20])
        self._step_noise: dict[JobKey, dict[tuple[int, int], float]] = {}
        self._demand: dict[QueueName, list[DemandPoint]] = {q.name: [] for q in spec.queues}
        self._last_demand_s = -math.inf
        # job -> (its last view, the memory annotation and the (replicas, pods' version, status,
        # restart cost) seen)
        self._views: dict[JobKey, tuple[JobState, str | None, tuple[object, ...]]] = {}
        # The nodes' last view and the nodes' change count it was built at; each node's last
        # state, reused while its free GPUs stay the same.
        self._node_view: tuple[tuple[NodeState, ...], int] = ((), -1)
        self._node_states: list[NodeState | None] = [None] * spec.nodes
        # job -> (its status, its pending gang) while it waits
        self._gangs: dict[JobKey, tuple[Status, PendingGang]] = {}
        self.writes = 0
        self.conflicts = 0

    # --- MetricsSource ------------------------------------------------------------------------

    def in_outage(self, now_s: float) -> bool:
        """Whether the metrics source is down at ``now_s``."""
        return any(start <= now_s < end for start, end in self.metrics.outages)

    def _measure(self, job: SimJob, now_s: float) -> None:
        if job.status is not Status.RUNNING or job.restart_until_s > now_s:
            return
        n = len(job.pods)
        last = job.points[-1] if job.points else None
        if (
            last is not None
            and last.replicas == n
            and now_s - last.time_s < self.metrics.point_every_s
        ):
            return
        noise = 1.0 + self.metrics.throughput_noise * float(self._rng.standard_normal())
        rate = job.samples_per_s * max(0.1, noise)
        job.points.append(ThroughputPoint(now_s, n, rate, nodes=len(set(job.pods)) or None))
        if len(job.points) > self.metrics.max_points:
            del job.points[0]

    def record_demand(self, now_s: float) -> None:
        """Append a demand-history point per queue when one is due."""
        if now_s - self._last_demand_s < self.metrics.demand_every_s:
            return
        self._last_demand_s = now_s
        demand = {q.name: 0.0 for q in self.spec.queues}
        for job in self.running.values():
            if not job.spec.elastic:
                demand[job.queue] += job.gpus
        for name, waiting in self.waiting_by_queue.items():
            demand[name] += sum(j.spec.min_gpus for j in waiting if not j.spec.elastic)
        for name, gpus in demand.items():
            points = self._demand[name]
            points.append(DemandPoint(time_s=now_s, gpus=gpus))
            if len(points) > self.metrics.demand_points:
                del points[0]

    def sample(self, *, now_s: float) -> MetricsSample:
        """See base class. ``releasing_gpus`` are the GPUs of pods still saving and exiting
        after a graceful stop (not free yet). Stale (``fresh=False``, no measurements) during
        an outage, which names every running elastic job in ``stale_jobs``.

        Remaining samples come only for the jobs that declare their planned samples (and only
        while ``MetricsOptions.declared_work``), as the Prometheus source computes them: the
        planned samples minus the consumed ones (the checkpointed data position, so the work a
        kill lost is to be done again), never below zero.

        An adaptive job (``SimJob.batch``) also reports its ``BatchStatistics`` as its workers
        export them: its batch, the current epoch's gradient statistics, its progress and
        planned progress (Pollux's jobs declare their epochs), and its step times at each shape
        it ran at lately (each with a measurement error of ``throughput_noise``); its
        throughput points stay samples/s."""
        if self.in_outage(now_s):
            return MetricsSample(
                fresh=False,
                cluster_free_gpus=float(self.nodes.total_free),
                releasing_gpus=float(self.held_gpus),
                stale_jobs={
                    job.key: "the metrics source is down (simulated outage)"
                    for job in self.running.values()
                    if job.spec.elastic
                },
            )
        self.record_demand(now_s)
        throughput: dict[JobKey, tuple[ThroughputPoint, ...]] = {}
        remaining: dict[JobKey, float] = {}
        statistics: dict[JobKey, BatchStatistics] = {}
        declared = self.metrics.declared_work
        for job in self.running.values():
            if job.spec.elastic:
                self._measure(job, now_s)
                throughput[job.key] = tuple(job.points)
                batch = job.batch
                if batch is not None and self.metrics.batch_statistics:
                    statistics[job.key] = batch.statistics(
                        progress=job.done_units, noise=self._shape_noise(job)
                    )
                if declared and job.spec.declares_planned_samples:
                    # An adaptive job's progress is in steps at its initial batch: its planned
                    # samples are its planned progress times that batch, as the worker says
                    # (``AdaptiveBatch.planned_progress``).
                    per_unit = (
                        job.spec.profile.samples_per_unit
                        if batch is None
                        else float(batch.app.bounds.initial_batch_size)
                    )
                    planned = job.work_units * per_unit
                    remaining[job.key] = max(0.0, planned - job.done_units * per_unit)
        return MetricsSample(
            fresh=True,
            cluster_free_gpus=float(self.nodes.total_free),
            job_throughput=throughput,
            job_remaining_samples=remaining,
            queue_demand_history={n: tuple(p) for n, p in self._demand.items()},
            releasing_gpus=float(self.held_gpus),
            job_batch_statistics=statistics,
        )

    def _shape_noise(self, job: SimJob) -> dict[tuple[int, int], float]:
        """The measurement error of each shape an adaptive job reports step times for: drawn
        once per shape (its mean over many steps), from a stream of its own so that the
        throughput noise of every job is the same as without adaptive jobs."""
        assert job.batch is not None
        noise = self._step_noise.setdefault(job.key, {})
        for shape in job.batch.recent:
            if shape not in noise:
                draw = float(self._step_rng.standard_normal())
                noise[shape] = max(0.1, 1.0 + self.metrics.throughput_noise * draw)
        return noise

    # --- ClusterClient ------------------------------------------------------------------------

    def list_queues(self) -> Sequence[QueueState]:
        """See base class. Capability is Volcano's real capability (guarantees of others out)."""
        capability = real_capability(self)
        allocated, request = queue_usage(self)
        deserved = deserved_shares(self, request, capability)
        pending = {q.name: 0.0 for q in self.spec.queues}
        for name, waiting in self.waiting_by_queue.items():
            pending[name] = float(sum(j.spec.min_gpus for j in waiting if not j.spec.elastic))
        return [
            QueueState(
                name=q.name,
                capability_gpus=capability[q.name],
                deserved_gpus=deserved[q.name],
                guarantee_gpus=q.guarantee_gpus,
                allocated_gpus=allocated[q.name],
                pending_nonelastic_gpus=pending[q.name],
                weight=float(q.weight),
                request_gpus=request[q.name],
            )
            for q in self.spec.queues
        ]

    def job_state(self, job: SimJob) -> JobState:
        """The engine's view of one job.

        The view is immutable and depends only on the memory annotation and what the key below
        holds (``version`` moves at every change of the job's pods), so an unchanged job (most
        of a long queue, every reconcile) gives back the same object, and a memory is decoded
        once per write. A running job's ``pods`` are its scaling task's ``spec_replicas`` pods,
        each with its task index and node (None while it waits for GPUs).
        """
        key = (job.spec_replicas, job.version, job.status, job.restart_cost_s)
        stored = job.annotations.get(MEMORY_ANNOTATION)
        cached = self._views.get(job.key)
        if cached is not None and cached[1] == stored and cached[2] == key:
            return cached[0]
        memory = decode_memory(stored, job=job.key)
        view = JobState(
            key=job.key,
            queue=job.queue,
            gpus_per_replica=float(job.spec.gpus_per_replica),
            min_replicas=job.spec.min_replicas,
            max_replicas=job.spec.max_replicas,
            current_replicas=job.spec_replicas,
            scheduled_replicas=len(job.pods),
            phase=_PHASES[job.status],
            elastic=job.spec.elastic,
            last_rescale_s=memory.last_rescale_s,
            restart_cost_s=job.restart_cost_s,
            recommendations=memory.recommendations,
            pods=self._pods(job) if job.status is Status.RUNNING else (),
            running_since_s=job.first_start_s,
            requested_replicas=job.spec.requested_replicas,
            batch_bounds=(
                job.spec.adaptive.bounds
                if job.spec.adaptive is not None and self.metrics.batch_statistics
                else None
            ),
        )
        self._views[job.key] = (view, stored, key)
        return view

    def _pods(self, job: SimJob) -> tuple[PodPlacement, ...]:
        """The job's scaling-task pods, lowest index first: placed ones on their node, the
        rest of its ``spec_replicas`` waiting (node None)."""
        names = self.nodes.names
        gpus = float(job.spec.gpus_per_replica)
        where = dict(zip(job.pod_indices, job.pods, strict=True))
        return tuple(
            PodPlacement(index=i, node=names[where[i]] if i in where else None, gpus=gpus)
            for i in range(max(job.spec_replicas, len(job.pods)))
        )

    def active_jobs(self) -> list[SimJob]:
        """Submitted jobs that are not done: running first, then waiting, each in submit order."""
        waiting = [j for jobs in self.waiting_by_queue.values() for j in jobs]
        return list(self.running.values()) + waiting

    def list_jobs(self) -> Sequence[JobState]:
        """See base class."""
        return [self.job_state(job) for job in self.active_jobs()]

    def list_nodes(self) -> Sequence[NodeState]:
        """See base class. Every node that is up, with its free GPUs; a failed node is gone."""
        nodes = self.nodes
        view, seen = self._node_view
        if seen == nodes.changes:
            return view
        states = self._node_states
        allocatable = float(nodes.gpus_per_node)
        out = []
        for i, free in enumerate(nodes.free):
            if not nodes.up[i]:
                continue
            state = states[i]
            if state is None or state.free_gpus != free:
                state = NodeState(
                    name=nodes.names[i], allocatable_gpus=allocatable, free_gpus=float(free)
                )
                states[i] = state
            out.append(state)
        view = tuple(out)
        self._node_view = (view, nodes.changes)
        return view

    def list_pending_gangs(self) -> Sequence[PendingGang]:
        """See base class. Each waiting non-elastic job, in its queue's order: its gang is all
        its pods (``min_member``), ``since_s`` its submit time. (Their GPUs are in each queue's
        ``pending_nonelastic_gpus`` too.)"""
        gangs = []
        known = self._gangs
        for waiting in self.waiting_by_queue.values():
            for job in waiting:
                if job.spec.elastic:
                    continue
                cached = known.get(job.key)
                if cached is None or cached[0] is not job.status:
                    gang = PendingGang(
                        key=job.key,
                        queue=job.queue,
                        min_member=job.spec.min_replicas,
                        gpus=float(job.spec.min_gpus),
                        phase="Inqueue" if job.status is Status.INQUEUE else "Pending",
                        since_s=job.spec.submit_s,
                    )
                    cached = (job.status, gang)
                    known[job.key] = cached
                gangs.append(cached[1])
        return gangs

    def releasing_gpus(self) -> float:
        """See base class: the GPUs of pods still saving and exiting after a graceful shrink."""
        return float(self.held_gpus)

    def apply(self, change: ReplicaChange) -> None:
        """See base class. A shrink is graceful: the workers checkpoint before they stop."""
        job = self.jobs.get(change.job)
        if job is None or job.status in (Status.WAITING, Status.DONE):
            raise PermanentError(f"job {change.job} does not exist (or has finished)")
        if job.spec_replicas != change.from_replicas:
            self.conflicts += 1
            raise ConflictError(
                f"job {change.job} has {job.spec_replicas} replicas, not {change.from_replicas}"
            )
        if not job.spec.min_replicas <= change.to_replicas <= job.spec.max_replicas:
            raise PermanentError(
                f"job {change.job}: replicas {change.to_replicas} outside "
                f"[{job.spec.min_replicas}, {job.spec.max_replicas}]"
            )
        try:
            job.annotations[MEMORY_ANNOTATION] = encode_memory(change.memory, job=change.job)
        except ValueError as e:
            raise PermanentError(f"job {change.job}: memory cannot be stored: {e}") from e
        if change.to_replicas != job.spec_replicas:
            self.writes += 1
            self.resize(job, change.to_replicas)
