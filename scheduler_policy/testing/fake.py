"""An in-memory cluster implementing both ``MetricsSource`` and ``ClusterClient``, for tests.

It holds an observation, serves it back, records every write, and refuses a write whose
``from_replicas`` no longer matches (as the Volcano client's JSON-patch ``test`` would). As on a
real cluster, new replicas take idle GPUs at once while removed ones hold theirs until their
pods have terminated: ``settle()`` lets them go. Replicas a job's spec asks for beyond its
``scheduled_replicas`` hold nothing, so removing them frees nothing.

Each job's memory is kept as the Volcano client keeps it, as the ``tide.io/memory`` annotation
string (``memory_codec``), and decoded when the jobs are listed. A job whose metrics the source
cannot give (``stale_jobs``) has no throughput in the sample and is named in its ``stale_jobs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scheduler_policy.adapters.memory_codec import (
    MEMORY_ANNOTATION,
    encode_memory,
    memory_from_annotations,
)
from scheduler_policy.vocabulary.errors import ConflictError, PermanentError
from scheduler_policy.vocabulary.protocols import MetricsSample, ReplicaChange
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobMemory,
    JobState,
    NodeState,
    Observation,
    PendingGang,
    QueueState,
)


class FakeCluster:
    """A cluster that lives in a dict.

    Args:
        observation: the queues, jobs and free GPUs to start from.
        refuse: job keys whose writes fail permanently (a webhook that says no).

    Attributes:
        writes: every successful write, in order.
        fresh: what the metrics report as freshness; set False to simulate an outage.
        stale_jobs: jobs whose own metrics the source cannot give, each with why; starts with
            the observation's jobs that have a ``stale_reason``.
        annotations: each job's annotations as stored (the memory among them).
    """

    def __init__(self, observation: Observation, *, refuse: Sequence[JobKey] = ()) -> None:
        self._queues = list(observation.queues)
        self.stale_jobs = {
            job.key: job.stale_reason for job in observation.jobs if job.stale_reason is not None
        }
        self._jobs = {job.key: dataclasses.replace(job, stale_reason=None)
                      for job in observation.jobs}  # fmt: skip
        self.annotations: dict[JobKey, dict[str, str]] = {
            job.key: {MEMORY_ANNOTATION: encode_memory(
                JobMemory(job.last_rescale_s, job.recommendations), job=job.key
            )}
            for job in observation.jobs
        }  # fmt: skip
        self.nodes = list(observation.nodes)
        self.pending_gangs = list(observation.pending_gangs)
        self.free_gpus = observation.cluster_free_gpus
        self.fresh = observation.metrics_fresh
        self.writes: list[ReplicaChange] = []
        self.terminating_gpus = 0.0
        self._refuse = set(refuse)

    def sample(self, *, now_s: float) -> MetricsSample:
        """See base class."""
        return MetricsSample(
            fresh=self.fresh,
            cluster_free_gpus=self.free_gpus,
            releasing_gpus=self.terminating_gpus,
            stale_jobs=dict(self.stale_jobs),
            job_throughput={
                k: j.throughput_history for k, j in self._jobs.items() if k not in self.stale_jobs
            },
        )

    def list_queues(self) -> Sequence[QueueState]:
        """See base class."""
        return tuple(self._queues)

    def list_jobs(self) -> Sequence[JobState]:
        """See base class. Each job's memory is decoded from its annotation."""
        return tuple(self.job(key) for key in self._jobs)

    def list_nodes(self) -> Sequence[NodeState]:
        """See base class."""
        return tuple(self.nodes)

    def list_pending_gangs(self) -> Sequence[PendingGang]:
        """See base class."""
        return tuple(self.pending_gangs)

    def releasing_gpus(self) -> float:
        """See base class: ``terminating_gpus`` (also what the metrics report)."""
        return self.terminating_gpus

    def job(self, key: JobKey) -> JobState:
        """The job as the cluster holds it now, its memory read from its annotation."""
        job = self._jobs[key]
        memory = memory_from_annotations(self.annotations.get(key, {}), job=key)
        return dataclasses.replace(
            job, last_rescale_s=memory.last_rescale_s, recommendations=memory.recommendations
        )

    def apply(self, change: ReplicaChange) -> None:
        """See base class."""
        job = self._jobs.get(change.job)
        if job is None:
            raise PermanentError(f"job {change.job}: not found")
        if change.job in self._refuse:
            raise PermanentError(f"job {change.job}: refused by admission webhook")
        if job.current_replicas != change.from_replicas:
            raise ConflictError(
                f"job {change.job}: replicas are {job.current_replicas}, not {change.from_replicas}"
            )
        try:
            stored = encode_memory(change.memory, job=change.job)
        except ValueError as e:
            raise PermanentError(f"job {change.job}: memory cannot be stored: {e}") from e
        held, to = job.held_replicas, change.to_replicas
        if to > change.from_replicas:
            self.free_gpus -= (to - change.from_replicas) * job.gpus_per_replica
        self.terminating_gpus += max(0, held - to) * job.gpus_per_replica
        scheduled = job.scheduled_replicas
        if scheduled is not None:  # new replicas are scheduled at once, removed ones go first
            scheduled = min(scheduled, to) + max(0, to - change.from_replicas)
        self._jobs[change.job] = dataclasses.replace(
            job, current_replicas=to, scheduled_replicas=scheduled
        )
        self.annotations.setdefault(change.job, {})[MEMORY_ANNOTATION] = stored
        self.writes.append(change)

    def settle(self) -> None:
        """Let the pods of removed replicas finish terminating: their GPUs become idle."""
        self.free_gpus += self.terminating_gpus
        self.terminating_gpus = 0.0
