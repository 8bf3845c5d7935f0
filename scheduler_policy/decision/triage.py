"""Which elastic jobs the allocator plans for, and a held decision for each of the others."""

from __future__ import annotations

import logging

from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.state import (
    JobPhase,
    JobState,
    Observation,
    Reason,
    ScalingDecision,
    Sentence,
)

logger = logging.getLogger(__name__)


def _hold(job: JobState, reason: Reason, message: str) -> ScalingDecision:
    return ScalingDecision(
        job.key, job.current_replicas, job.current_replicas, reason, Sentence(message)
    )


def triage(
    observation: Observation, policy: ElasticPolicy
) -> tuple[list[JobState], list[ScalingDecision]]:
    """Split the jobs into those to allocate for and decisions for the rest."""
    queue_names = {q.name for q in observation.queues}
    queue_policies = {q.name: q for q in policy.queues}
    ready: list[JobState] = []
    held: list[ScalingDecision] = []
    for job in observation.jobs:
        if not job.elastic:
            continue
        problems = job.spec_problems()
        if job.queue not in queue_names:
            problems.append(f"queue {job.queue!r} does not exist")
        if problems:
            held.append(_hold(job, Reason.INVALID_JOB_SPEC, "; ".join(problems)))
            logger.warning("job %s skipped: %s", job.key, "; ".join(problems))
            continue
        queue_policy = queue_policies.get(job.queue)
        if queue_policy is None or not queue_policy.elastic:
            if job.phase is JobPhase.RUNNING:
                held.append(
                    _hold(job, Reason.QUEUE_NOT_MANAGED,
                          f"queue {job.queue} is not elastic in policy {policy.name}")
                )  # fmt: skip
            continue
        if job.phase is not JobPhase.RUNNING:
            if not job.phase.finished:
                held.append(_hold(job, Reason.NOT_RUNNING, f"job is {job.phase.value}"))
            continue
        if not observation.metrics_fresh:
            held.append(
                _hold(job, Reason.HOLD_METRICS_STALE,
                      "metrics are stale or missing; holding replicas until they recover")
            )  # fmt: skip
            continue
        ready.append(job)
    return ready, held
