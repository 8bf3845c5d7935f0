"""The policies admins use today, as the simulator runs them in tide's place.

Each baseline reads the same ``Observation`` the engine reads (built by ``engine.observe`` from the
same ``SimulatedCluster``) and returns a ``BaselinePlan``: target replicas per job, and for
preemptive schedulers a job priority and jobs to suspend. The simulator applies the targets as the
engine's writes are applied (a shrink checkpoints first), so only the decisions differ.
``static`` (Volcano as-is) decides nothing, so it reads nothing either: it is
``controllers.StaticController``.

What each baseline follows, and with which parameters:

- ``static``: Volcano v1.15.1 as deployed (gang, proportion and FIFO job order, as
  ``simulations.volcano`` models them); every job keeps the replicas it asked for.
- ``threshold``: the idle-GPU rule cluster admins script today (no published reference; tide's
  statement of it): +1 replica when a queue's idle GPUs exceed 2, -1 when they fall below 0.
- ``hpa``: the Kubernetes HPA replica formula (``pkg/controller/podautoscaler``) on a queue's
  GPU supply/demand ratio with target 1: tolerance 0.1, 300 s scale-down stabilization window,
  scale-up at most max(2x, +4) per decision (the HPA defaults).
- ``optimus``: the Optimus+Oracle of Pollux's evaluation (petuum/adaptdl, branch
  ``osdi21-artifact``, ``simulator/optimus.py``): one replica per job first (line 22), then one
  GPU at a time to the job whose next replica cuts (step time x remaining iterations) the most
  (lines 36-48), with the true scaling curves and the true remaining work (lines 13-19, 78).
- ``tiresias``: Pollux's Tiresias (``simulator/tiresias.py``): two queues, 16 GPU-hour
  demotion threshold, arrival order in the high queue, demotion order in the low, no
  starvation promotion, rigid jobs; see ``TiresiasBaseline``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from scheduler_policy.vocabulary.state import JobKey, JobPhase, JobState, Observation, QueueName
from simulations.profiles import ScalingProfile


@dataclass(frozen=True, slots=True)
class BaselinePlan:
    """What a baseline decides at one reconcile.

    Attributes:
        targets: new replicas for the jobs whose size should change.
        priority: job order key for the scheduler (smaller first); empty keeps FIFO.
        suspend: running jobs to preempt whole (gracefully, back to the queue).
    """

    targets: Mapping[JobKey, int] = field(default_factory=dict)
    priority: Mapping[JobKey, float] = field(default_factory=dict)
    suspend: frozenset[JobKey] = frozenset()


class Baseline(Protocol):
    """A policy the simulator can run in tide's place."""

    name: str

    def decide(self, observation: Observation, *, now_s: float) -> BaselinePlan:
        """Decide from one observation.

        Args:
            observation: the cluster now, as the engine sees it.
            now_s: the decision time.

        Returns:
            The plan.
        """
        ...


def _running_elastic(observation: Observation) -> list[JobState]:
    return [j for j in observation.jobs if j.elastic and j.phase is JobPhase.RUNNING]


def _running_elastic_by_queue(observation: Observation) -> dict[QueueName, list[JobState]]:
    by_queue: dict[QueueName, list[JobState]] = {}
    for job in _running_elastic(observation):
        by_queue.setdefault(job.queue, []).append(job)
    return by_queue


def _pending_nonelastic(observation: Observation) -> float:
    return sum(q.pending_nonelastic_gpus for q in observation.queues)


@dataclass(slots=True)
class ThresholdBaseline:
    """The rule admins write today: one worker more when the queue's idle GPUs exceed
    ``up_idle_gpus``, one fewer when they fall below ``down_idle_gpus``.

    A queue's idle GPUs are the cluster's free GPUs it could use (its capability permitting),
    less the GPUs pending non-elastic work asks for. Workers are added to the oldest jobs first
    and removed from the newest first, one per job per reconcile.
    """

    up_idle_gpus: float = 2.0
    down_idle_gpus: float = 0.0
    name: str = "threshold"

    def decide(self, observation: Observation, *, now_s: float) -> BaselinePlan:
        """See base class."""
        if not observation.metrics_fresh:
            return BaselinePlan()
        free = observation.cluster_free_gpus - _pending_nonelastic(observation)
        targets: dict[JobKey, int] = {}
        running = _running_elastic_by_queue(observation)
        for queue in observation.queues:
            jobs = running.get(queue.name)
            if not jobs:
                continue
            room = math.inf if queue.capability_gpus is None else queue.capability_gpus
            idle = min(free, room - queue.allocated_gpus)
            if idle > self.up_idle_gpus:
                for job in jobs:
                    if job.current_replicas < job.max_replicas and idle - job.gpus_per_replica >= 0:
                        targets[job.key] = job.current_replicas + 1
                        idle -= job.gpus_per_replica
                        free -= job.gpus_per_replica
                        if idle <= self.up_idle_gpus:
                            break
            elif idle < self.down_idle_gpus:
                for job in reversed(jobs):
                    if job.current_replicas > job.min_replicas:
                        targets[job.key] = job.current_replicas - 1
                        idle += job.gpus_per_replica
                        if idle >= self.down_idle_gpus:
                            break
        return BaselinePlan(targets=targets)


@dataclass(slots=True)
class HpaBaseline:
    """The Kubernetes HPA formula per job, on a queue metric as KEDA's Prometheus scaler feeds it.

    The metric is the queue's GPU supply over demand: (allocated + free GPUs it could take) /
    (allocated + GPUs its jobs and the cluster's pending non-elastic work still ask for), with
    target 1. desired = ceil(current x metric / target) unless |metric/target - 1| <= tolerance;
    scale-down takes the highest recommendation of the last ``down_window_s``; scale-up is
    limited to max(2 x current, current + 4) per decision (the HPA default policies).
    """

    tolerance: float = 0.1
    down_window_s: float = 300.0
    name: str = "hpa"
    _history: dict[JobKey, list[tuple[float, int]]] = field(default_factory=dict)

    def decide(self, observation: Observation, *, now_s: float) -> BaselinePlan:
        """See base class."""
        if not observation.metrics_fresh:
            return BaselinePlan()
        pending_all = _pending_nonelastic(observation)
        wanted: dict[QueueName, float] = {}
        for job in observation.jobs:
            if job.phase is JobPhase.PENDING:
                wanted[job.queue] = wanted.get(job.queue, 0.0) + job.gpus
        targets: dict[JobKey, int] = {}
        running = _running_elastic_by_queue(observation)
        for queue in observation.queues:
            jobs = running.get(queue.name)
            if not jobs:
                continue
            room = math.inf if queue.capability_gpus is None else queue.capability_gpus
            supply = queue.allocated_gpus + max(
                0.0, min(observation.cluster_free_gpus, room - queue.allocated_gpus)
            )
            others_pending = pending_all - queue.pending_nonelastic_gpus
            demand = queue.allocated_gpus + wanted.get(queue.name, 0.0) + others_pending
            ratio = supply / demand if demand > 0 else 1.0
            for job in jobs:
                current = job.current_replicas
                desired = current
                if abs(ratio - 1.0) > self.tolerance:
                    desired = math.ceil(current * ratio)
                desired = min(desired, max(2 * current, current + 4))
                desired = max(job.min_replicas, min(job.max_replicas, desired))
                history = self._history.setdefault(job.key, [])
                history.append((now_s, desired))
                while history and history[0][0] < now_s - self.down_window_s:
                    history.pop(0)
                if desired < current:
                    desired = min(current, max(r for _, r in history))
                if desired != current:
                    targets[job.key] = desired
        return BaselinePlan(targets=targets)


@dataclass(slots=True)
class OptimusBaseline:
    """Greedy marginal gain with perfect knowledge of every job's scaling curve (an oracle), as
    Pollux's Optimus+Oracle (``simulator/optimus.py`` lines 20-48 of petuum/adaptdl's
    ``osdi21-artifact`` branch: gain = (t(n) - t(n+1)) x remaining iterations).

    GPUs not held or wanted by non-elastic work go, one replica at a time, to the elastic job
    whose next replica cuts its remaining time the most per GPU. No forecast, and restart costs
    are ignored when deciding (the simulator still charges them).
    """

    profiles: Mapping[JobKey, ScalingProfile]
    samples_per_unit: Mapping[JobKey, float]
    name: str = "optimus"

    def decide(self, observation: Observation, *, now_s: float) -> BaselinePlan:
        """See base class."""
        if not observation.metrics_fresh:
            return BaselinePlan()
        total = observation.cluster_free_gpus + sum(q.allocated_gpus for q in observation.queues)
        fixed = _pending_nonelastic(observation)
        jobs = _running_elastic(observation)
        for job in observation.jobs:
            if not job.elastic and job.phase is JobPhase.RUNNING:
                fixed += job.gpus
            elif job.elastic and job.phase is JobPhase.PENDING:
                fixed += job.min_replicas * job.gpus_per_replica
        budget = total - fixed - sum(j.min_replicas * j.gpus_per_replica for j in jobs)
        size = {j.key: j.min_replicas for j in jobs}
        remaining = {
            j.key: (j.remaining_samples or 0.0) / self.samples_per_unit.get(j.key, 1.0)
            for j in jobs
        }

        def gain(job: JobState, n: int) -> float:
            profile = self.profiles[job.key]
            left = remaining[job.key]
            cut = left / profile.rate(n) - left / profile.rate(n + 1)
            return cut / job.gpus_per_replica

        heap = [(-gain(j, size[j.key]), j.key, j) for j in jobs if j.max_replicas > size[j.key]]
        heapq.heapify(heap)
        while heap and budget > 0:
            neg, key, job = heapq.heappop(heap)
            if -neg <= 0 or job.gpus_per_replica > budget:
                continue
            size[key] += 1
            budget -= job.gpus_per_replica
            if size[key] < job.max_replicas:
                heapq.heappush(heap, (-gain(job, size[key]), key, job))
        targets = {j.key: size[j.key] for j in jobs if size[j.key] != j.current_replicas}
        return BaselinePlan(targets=targets)


TIRESIAS_THRESHOLD_GPU_S = 3600.0 * 16
"""Attained service (GPU-seconds) past which Tiresias demotes a job to its low queue: Pollux's
Tiresias, ``simulator/tiresias.py`` line 8 (``3600 * 16``)."""


@dataclass(slots=True)
class TiresiasBaseline:
    """Tiresias' discretized two-queue least-attained-service scheduler (Gu et al., NSDI'19), with
    the parameters of the Tiresias Pollux compares against (petuum/adaptdl, branch
    ``osdi21-artifact``, ``simulator/tiresias.py``).

    - Two queues; a job starts in the high queue (line 30) and is demoted once its attained
      service, the seconds it ran times the GPUs it holds, reaches ``threshold_gpu_s``
      (16 GPU-hours, lines 35-44).
    - The high queue is ordered by arrival, the low queue by demotion (both append, lines 30 and
      43): ``priority`` is the arrival time in the high queue, 1e12 + the demotion time in the low.
    - No promotion back: Pollux runs it with starvation handling off (``_solve_starvation = 0``,
      line 9, so lines 52-58 never fire).
    - Jobs run rigid at the replicas they asked for (the simulator sets every gang minimum to
      its requested replicas; Pollux: ``max_replicas=job.target_num_replicas``,
      ``simulator.py`` line 364). Every reconcile walks the high queue then the low one and keeps
      each job whose gang still fits, skipping those that do not (lines 62-69); running jobs left
      out are preempted (checkpointed and requeued).

    Preemption is within a Volcano queue (capacity: its deserved share, at most what it holds
    plus the free GPUs); across queues Volcano's proportion plugin decides, as it would with
    Tiresias' order as the job-order plugin. Pollux's cluster has one queue, so there the walk is
    Pollux's.
    """

    threshold_gpu_s: float = TIRESIAS_THRESHOLD_GPU_S
    name: str = "tiresias"
    _attained: dict[JobKey, float] = field(default_factory=dict)
    _submitted: dict[JobKey, float] = field(default_factory=dict)
    _demoted: dict[JobKey, float] = field(default_factory=dict)
    _last_s: float | None = None

    def decide(self, observation: Observation, *, now_s: float) -> BaselinePlan:
        """See base class."""
        dt = 0.0 if self._last_s is None else now_s - self._last_s
        self._last_s = now_s
        for job in observation.jobs:
            self._submitted.setdefault(job.key, now_s)
            if job.phase is JobPhase.RUNNING:
                self._attained[job.key] = self._attained.get(job.key, 0.0) + job.gpus * dt
            if self._attained.get(job.key, 0.0) >= self.threshold_gpu_s:
                self._demoted.setdefault(job.key, now_s)
        priority = {
            job.key: (
                LOW_QUEUE_OFFSET_S + self._demoted[job.key]
                if job.key in self._demoted
                else self._submitted[job.key]
            )
            for job in observation.jobs
        }
        # Preempt within a queue only: across queues, Volcano's deserved shares decide (the
        # session would otherwise hand a suspended job's GPUs straight back to it).
        capacity = {
            q.name: min(
                q.deserved_gpus if q.deserved_gpus is not None else math.inf,
                q.allocated_gpus + observation.cluster_free_gpus,
            )
            for q in observation.queues
        }
        keep: set[JobKey] = set()
        for job in sorted(observation.jobs, key=lambda j: priority[j.key]):  # stable: arrival
            if job.phase.finished:
                continue
            gang = job.min_replicas * job.gpus_per_replica  # rigid: min == requested replicas
            if gang <= capacity.get(job.queue, math.inf) + 1e-9:
                capacity[job.queue] = capacity.get(job.queue, math.inf) - gang
                keep.add(job.key)
        suspend = frozenset(
            j.key for j in observation.jobs if j.phase is JobPhase.RUNNING and j.key not in keep
        )
        return BaselinePlan(priority=priority, suspend=suspend)


LOW_QUEUE_OFFSET_S = 1.0e12
"""Added to a demoted job's priority so the low queue sorts after every high-queue job."""
