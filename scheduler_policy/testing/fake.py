"""An in-memory cluster implementing both ``MetricsSource`` and ``ClusterClient``, for tests.

It holds an observation, serves it back, records every write, and refuses a write whose
``from_replicas`` no longer matches (as the Volcano client's JSON-patch ``test`` would). As on a
real cluster, new replicas take idle GPUs at once while removed ones hold theirs until their
pods have terminated: ``settle()`` lets them go. Replicas a job's spec asks for beyond its
``scheduled_replicas`` hold nothing, so removing them frees nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scheduler_policy.vocabulary.errors import ConflictError, PermanentError
from scheduler_policy.vocabulary.protocols import MetricsSample, ReplicaChange
from scheduler_policy.vocabulary.state import JobKey, JobState, Observation, QueueState


class FakeCluster:
    """A cluster that lives in a dict.

    Args:
        observation: the queues, jobs and free GPUs to start from.
        refuse: job keys whose writes fail permanently (a webhook that says no).

    Attributes:
        writes: every successful write, in order.
        fresh: what the metrics report as freshness; set False to simulate an outage.
    """

    def __init__(self, observation: Observation, *, refuse: Sequence[JobKey] = ()) -> None:
        self._queues = list(observation.queues)
        self._jobs = {job.key: job for job in observation.jobs}
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
            job_throughput={k: j.throughput_history for k, j in self._jobs.items()},
        )

    def list_queues(self) -> Sequence[QueueState]:
        """See base class."""
        return tuple(self._queues)

    def list_jobs(self) -> Sequence[JobState]:
        """See base class."""
        return tuple(self._jobs.values())

    def job(self, key: JobKey) -> JobState:
        """The job as the cluster holds it now."""
        return self._jobs[key]

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
        held, to = job.held_replicas, change.to_replicas
        if to > change.from_replicas:
            self.free_gpus -= (to - change.from_replicas) * job.gpus_per_replica
        self.terminating_gpus += max(0, held - to) * job.gpus_per_replica
        scheduled = job.scheduled_replicas
        if scheduled is not None:  # new replicas are scheduled at once, removed ones go first
            scheduled = min(scheduled, to) + max(0, to - change.from_replicas)
        self._jobs[change.job] = dataclasses.replace(
            job,
            current_replicas=to,
            scheduled_replicas=scheduled,
            last_rescale_s=change.memory.last_rescale_s,
            recommendations=change.memory.recommendations,
        )
        self.writes.append(change)

    def settle(self) -> None:
        """Let the pods of removed replicas finish terminating: their GPUs become idle."""
        self.free_gpus += self.terminating_gpus
        self.terminating_gpus = 0.0
