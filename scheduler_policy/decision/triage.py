"""Which elastic jobs the allocator plans for, and a held decision for each of the others.

Missing data biases toward no change, at the level it is missing: when the cluster- or
queue-level figures are stale (``Observation.metrics_fresh`` False) every job holds, since no
budget can be trusted; a job whose own throughput is stale (``JobState.stale_reason``) is still
planned for, so that its held GPUs count in its queue's budget and a shrink that budget forces
(a pending gang) still reaches it, but the allocator gives it no growth and takes nothing from
it for other jobs or for its own low efficiency (``stale`` below), and it otherwise holds with
``HoldMetricsStale``. A job with no throughput point at all (never measured: its curve would
be the prior's alone) is planned for the same way, and holds with ``HoldNotMeasured`` until its
first measurement: growth on a guess would spend a restart on GPUs the job may not use.
"""

from __future__ import annotations

import logging
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from scheduler_policy.decision.job_table import PHASE_CODES, IntArray, JobColumns
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.state import (
    JobKey,
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


class Triage(NamedTuple):
    """The jobs the allocator plans for, and why the others hold.

    Attributes:
        ready: running elastic jobs in managed queues, valid, to allocate for.
        held: a decision for each elastic job that is not planned for.
        stale: the jobs of ``ready`` whose own metrics are stale, or that were never measured
            (``NOT_MEASURED``), each with why.
        rows: where each job of ``ready`` is in ``observation.jobs``.
    """

    ready: list[JobState]
    held: list[ScalingDecision]
    stale: dict[JobKey, str]
    rows: IntArray


NOT_MEASURED = "no throughput measured yet"
"""The ``stale`` entry of a job with no throughput point at all."""


def stale_hold_message(job: JobState, reason: str) -> str:
    """The sentence of a job that holds because its own metrics are stale."""
    return (
        f"job {job.key}: metrics are stale ({reason}); holding {job.current_replicas} "
        "replicas until they recover"
    )


def triage(
    observation: Observation, policy: ElasticPolicy, *, columns: JobColumns | None = None
) -> Triage:
    """Split the jobs into those to allocate for and decisions for the rest.

    Args:
        observation: the cluster now.
        policy: the policy in force.
        columns: ``observation.jobs`` as columns (``read_columns``); None to read them here.

    Returns:
        The jobs to plan for (and their rows in ``observation.jobs``), the held decisions and
        the stale jobs.
    """
    if columns is None:
        columns = read_columns(observation, policy)
    queue_names = {q.name for q in observation.queues}
    queue_policies = {q.name: q for q in policy.queues}
    # The common case, found for every job at once: a valid running elastic job in a queue the
    # policy manages elastically, on fresh metrics. Every other elastic job is asked one by one.
    elastic_queue = np.array(
        [queue_policies[name].elastic for name in columns.queue_names], dtype=bool
    )
    known = columns.queue_index >= 0
    plain = (
        columns.elastic
        & columns.valid
        & known
        & elastic_queue[np.where(known, columns.queue_index, 0)]
        & (columns.phase == _RUNNING)
    )
    if not observation.metrics_fresh:
        plain[:] = False
    rows: list[int] = []
    held: list[ScalingDecision] = []
    jobs = columns.jobs
    for i in np.flatnonzero(columns.elastic & ~plain).tolist():
        job = jobs[i]
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
        rows.append(i)  # valid after all (``JobColumns.valid`` is conservative)
    ready_rows = np.flatnonzero(plain)
    if rows:
        ready_rows = np.sort(np.concatenate([ready_rows, np.asarray(rows, dtype=np.int64)]))
    if len(ready_rows) == len(jobs):  # every job (rows 0, 1, ..., n - 1): no lookups
        ready = list(jobs)
    else:
        ready = list(map(jobs.__getitem__, ready_rows.tolist()))
    stale: dict[JobKey, str] = {}
    reasons = list(map(attrgetter("stale_reason"), ready))
    measured = np.fromiter(
        map(bool, map(attrgetter("throughput_history"), ready)), dtype=bool, count=len(ready)
    )
    if reasons.count(None) != len(reasons) or not measured.all():
        for job, reason, seen in zip(ready, reasons, measured.tolist(), strict=True):
            if reason is not None:
                stale[job.key] = reason
            elif not seen:
                stale[job.key] = NOT_MEASURED
    return Triage(ready, held, stale, ready_rows)


_RUNNING = PHASE_CODES.index(JobPhase.RUNNING)


def read_columns(observation: Observation, policy: ElasticPolicy) -> JobColumns:
    """``observation.jobs`` as columns, their queues indexed among those the policy manages.

    Args:
        observation: the cluster now.
        policy: the policy in force.

    Returns:
        The columns (``JobColumns.read``).
    """
    present = {q.name for q in observation.queues}
    managed = present & {q.name for q in policy.queues}
    return JobColumns.read(observation.jobs, queue_names=sorted(managed), other_queues=present)
