"""The engine's boundary: what it reads from and writes to, as small protocols.

Production implements these with the Volcano client and the Prometheus source, the simulator with
``SimulatedCluster``, tests with ``FakeCluster``. Nothing in the core knows which one it talks to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler_policy.vocabulary.state import (
    BatchStatistics,
    DemandPoint,
    Explanation,
    JobKey,
    JobMemory,
    JobState,
    NodeState,
    PendingGang,
    QueueName,
    QueueState,
    Reason,
    ThroughputPoint,
)


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """What the metrics source knows at one time.

    Attributes:
        fresh: False when the cluster- or queue-level figures are stale, unreachable or NaN;
            every job then holds.
        stale_jobs: jobs whose own figures (throughput, progress) are stale, missing or
            non-finite, each with a sentence naming what was stale; only those jobs hold.
        cluster_free_gpus: allocatable GPUs that no pod requests.
        job_throughput: measured throughput per job, oldest first.
        job_remaining_samples: samples left to train, for the jobs that report it.
        queue_allocated_gpus: GPUs each queue's pods hold (overrides the cluster's figure).
        queue_deserved_gpus: each queue's deserved share as Volcano's scheduler computes it
            (its proportion or capacity plugin; overrides the Queue's ``spec.deserved``).
        queue_request_gpus: GPUs each queue's jobs request in all, as Volcano's scheduler
            counts them.
        queue_demand_history: past GPU demand of each queue's non-elastic work, oldest first.
        releasing_gpus: GPUs held by terminating pods, which come free shortly.
        job_batch_statistics: what each adaptive-batch job's workers report.
    """

    fresh: bool
    cluster_free_gpus: float
    stale_jobs: Mapping[JobKey, str] = field(default_factory=dict)
    job_throughput: Mapping[JobKey, tuple[ThroughputPoint, ...]] = field(default_factory=dict)
    job_remaining_samples: Mapping[JobKey, float] = field(default_factory=dict)
    queue_allocated_gpus: Mapping[QueueName, float] = field(default_factory=dict)
    queue_deserved_gpus: Mapping[QueueName, float] = field(default_factory=dict)
    queue_request_gpus: Mapping[QueueName, float] = field(default_factory=dict)
    queue_demand_history: Mapping[QueueName, tuple[DemandPoint, ...]] = field(default_factory=dict)
    releasing_gpus: float = 0.0
    job_batch_statistics: Mapping[JobKey, BatchStatistics] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReplicaChange:
    """One write the engine asks the cluster for.

    Attributes:
        job: the job's key.
        task: the task whose replicas change.
        from_replicas: the replicas the engine saw; the write must fail if the job has moved on.
        to_replicas: the replicas to set (equal to ``from_replicas`` for a memory-only write).
        memory: the stabilizer's memory to store on the job.
        reason: why, CamelCase.
        why: what writes the sentence for people (``message``), rendered when read: most
            writes of a large round are never logged, so they are never formatted.
    """

    job: JobKey
    task: str
    from_replicas: int
    to_replicas: int
    memory: JobMemory
    reason: Reason
    why: Explanation

    @property
    def message(self) -> str:
        """Why, for people."""
        return self.why.render(self.job)


class MetricsSource(Protocol):
    """Reads throughput, queue use and demand history (Prometheus in production)."""

    def sample(self, *, now_s: float) -> MetricsSample:
        """Return what the source knows at ``now_s``.

        Args:
            now_s: the reconcile time, seconds since the epoch.

        Returns:
            The sample; ``fresh`` is False when it cannot be trusted.
        """
        ...


class ClusterClient(Protocol):
    """Reads queues and jobs and writes replicas (the Kubernetes API in production)."""

    def list_queues(self) -> Sequence[QueueState]:
        """Return every queue; demand history and use may be left empty for the metrics to fill."""
        ...

    def list_jobs(self) -> Sequence[JobState]:
        """Return every job, with its stored memory; throughput may be left empty."""
        ...

    def list_nodes(self) -> Sequence[NodeState]:
        """Return the GPU nodes with their free GPUs; empty when placement is not known."""
        ...

    def list_pending_gangs(self) -> Sequence[PendingGang]:
        """Return the PodGroups of non-elastic work that wait for GPUs, oldest first."""
        ...

    def releasing_gpus(self) -> float:
        """Return the GPUs held by terminating pods bound to a node (they come free shortly);
        0.0 when not known. Read where ``list_nodes`` gives nodes, as the free GPUs are."""
        ...

    def apply(self, change: ReplicaChange) -> None:
        """Write one change.

        Raises:
            ConflictError: the job changed since it was read.
            TemporaryError: the write may succeed later.
            PermanentError: the write will never succeed as asked.
        """
        ...


class Clock(Protocol):
    """Where the engine's loop reads the time (the wall clock, or the simulator's)."""

    def now_s(self) -> float:
        """Seconds since the epoch."""
        ...
