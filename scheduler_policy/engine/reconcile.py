"""The reconcile loop in named phases: observe → fit → decide → apply.

Fitting (``ModelCache.fit``) is the one stateful step; ``decide``
(``scheduler_policy.decision.pipeline``) is pure; only ``apply_changes`` writes, and it writes
only what differs from what it observed, so reconciling twice on the same cluster writes nothing
the second time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from scheduler_policy.decision.pipeline import Plan, decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.errors import ConflictError, PermanentError, TemporaryError
from scheduler_policy.vocabulary.protocols import ClusterClient, MetricsSource, ReplicaChange
from scheduler_policy.vocabulary.state import Observation, ScalingDecision, ThroughputPoint

__all__ = ["Plan", "ReconcileResult", "apply_changes", "decide", "observe", "reconcile"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """One reconcile's outcome.

    Attributes:
        observation: what was observed.
        decisions: one per elastic job.
        applied: the writes that succeeded.
        failed: the writes that failed, with why.
        plan: what ``decide`` returned (its queue budgets and forecasts included).
    """

    observation: Observation
    decisions: tuple[ScalingDecision, ...]
    applied: tuple[ReplicaChange, ...]
    failed: tuple[tuple[ReplicaChange, str], ...] = ()
    plan: Plan | None = None


def observe(*, metrics: MetricsSource, cluster: ClusterClient, now_s: float) -> Observation:
    """Join the cluster's queues and jobs with the metrics into one observation.

    Freshness is judged at two levels, as the HPA judges missing metrics per pod: the cluster-
    and queue-level figures (``MetricsSample.fresh``, the free GPUs, each queue's allocated
    GPUs) decide ``Observation.metrics_fresh``, and every job holds when they are stale; a job
    whose own throughput is stale, missing or non-finite gets a ``stale_reason`` naming what
    was wrong, and only that job holds. Its non-finite points are dropped from its history, so
    its scaling model is fitted on what was measured.

    Args:
        metrics: throughput, queue use and demand history.
        cluster: queues and jobs.
        now_s: the reconcile time.

    Returns:
        The observation; ``metrics_fresh`` is False if the sample was stale or had NaN in its
        cluster- or queue-level figures.
    """
    sample = metrics.sample(now_s=now_s)
    nodes = tuple(cluster.list_nodes())
    # The Kubernetes API's nodes and pods, where the cluster gives them, are the exact free
    # GPUs now; the metrics' figure (kube-state-metrics through Prometheus) is the fallback.
    free_gpus = math.fsum(n.free_gpus for n in nodes) if nodes else sample.cluster_free_gpus
    # So are the GPUs of its terminating pods (``tide engine`` reads no cluster figure from
    # Prometheus at all).
    releasing_gpus = cluster.releasing_gpus() if nodes else sample.releasing_gpus
    fresh = sample.fresh and math.isfinite(free_gpus)
    queues = []
    for queue in cluster.list_queues():
        allocated = sample.queue_allocated_gpus.get(queue.name, queue.allocated_gpus)
        # Volcano's proportion plugin computes each queue's deserved share every session from
        # the weights and what each queue requests; a Queue's spec has no such field (only
        # the capacity plugin's ``spec.deserved``), so the scheduler's figure comes first.
        deserved = sample.queue_deserved_gpus.get(queue.name, queue.deserved_gpus)
        request = sample.queue_request_gpus.get(queue.name, queue.request_gpus)
        fresh = fresh and math.isfinite(allocated)
        fresh = fresh and all(x is None or math.isfinite(x) for x in (deserved, request))
        queues.append(
            dataclasses.replace(
                queue,
                allocated_gpus=allocated,
                deserved_gpus=deserved,
                request_gpus=request,
                demand_history=sample.queue_demand_history.get(queue.name, queue.demand_history),
            )
        )
    stale_jobs = sample.stale_jobs
    batch_statistics = sample.job_batch_statistics
    jobs = []
    for job in cluster.list_jobs():
        history = sample.job_throughput.get(job.key, job.throughput_history)
        remaining = sample.job_remaining_samples.get(job.key, job.remaining_samples)
        statistics = batch_statistics.get(job.key) if batch_statistics else None
        stale = stale_jobs.get(job.key) if stale_jobs else None
        for point in history:  # a loop, not any(): a generator per job cost more than the check
            if not math.isfinite(point.samples_per_s):
                history, found = _finite_points(history)
                stale = found if stale is None else f"{stale}; {found}"
                break
        if (
            history is not job.throughput_history
            or remaining != job.remaining_samples
            or statistics is not None
        ):
            job = job.with_metrics(history, remaining, statistics)
        if stale != job.stale_reason:
            job = dataclasses.replace(job, stale_reason=stale)
            if stale is not None:
                logger.info("job %s: metrics stale: %s", job.key, stale)
        jobs.append(job)
    return Observation(
        time_s=now_s,
        queues=tuple(queues),
        jobs=tuple(jobs),
        cluster_free_gpus=free_gpus,
        metrics_fresh=fresh,
        releasing_gpus=releasing_gpus,
        nodes=nodes,
        pending_gangs=tuple(cluster.list_pending_gangs()),
    )


def _finite_points(
    history: tuple[ThroughputPoint, ...],
) -> tuple[tuple[ThroughputPoint, ...], str]:
    """The finite points of ``history``, and a sentence naming the first that was not."""
    bad = [p for p in history if not math.isfinite(p.samples_per_s)]
    first = bad[0]
    found = (
        f"{len(bad)} of {len(history)} throughput points are not finite "
        f"(first: {first.samples_per_s} samples/s at {first.replicas} replicas, "
        f"time {first.time_s:.0f} s)"
    )
    return tuple(p for p in history if math.isfinite(p.samples_per_s)), found


def apply_changes(
    cluster: ClusterClient,
    changes: Sequence[ReplicaChange],
    *,
    max_concurrent_writes: int | None = None,
) -> tuple[tuple[ReplicaChange, ...], tuple[tuple[ReplicaChange, str], ...]]:
    """Write each change; one failed write never stops the others.

    A cluster whose ``apply`` may be called from several threads at once says so with an
    attribute ``max_concurrent_writes`` (an int > 1: ``VolcanoClient`` has one); its changes
    are written by that many threads at a time, each change once, and the result lists them in
    the order of ``changes`` whatever order the writes finished in. Any other cluster is
    written one change after another.

    Args:
        cluster: where the writes go.
        changes: the writes, in the plan's order.
        max_concurrent_writes: writes in flight at once; None for the cluster's own figure
            (1 when it declares none).

    Returns:
        ``(applied, failed)``, each in the order of ``changes``, each failure with its reason.

    Raises:
        ValueError: ``max_concurrent_writes`` (given or the cluster's) is not an integer >= 1.
        Exception: what a write raised that is none of the engine's errors (a bug), after
            every other write has finished; the first such, in the order of ``changes``.
    """
    workers = _concurrency(cluster) if max_concurrent_writes is None else max_concurrent_writes
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"max_concurrent_writes: must be an integer >= 1, got {workers!r}")
    if workers == 1 or len(changes) <= 1:
        outcomes = [_write(cluster, change) for change in changes]
    else:
        with ThreadPoolExecutor(
            max_workers=min(workers, len(changes)), thread_name_prefix="tide-apply"
        ) as pool:
            outcomes = list(pool.map(lambda change: _write(cluster, change), changes))
    applied: list[ReplicaChange] = []
    failed: list[tuple[ReplicaChange, str]] = []
    for change, outcome in zip(changes, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is None:
            applied.append(change)
        else:
            failed.append((change, outcome))
    return tuple(applied), tuple(failed)


def _concurrency(cluster: ClusterClient) -> object:
    """The writes ``cluster`` takes at once: its ``max_concurrent_writes``, else 1."""
    return getattr(cluster, "max_concurrent_writes", 1)


def _write(cluster: ClusterClient, change: ReplicaChange) -> str | BaseException | None:
    """Write one change: None when written, why not when the cluster refused it, or the
    unexpected exception it raised (handed back, so that the other writes still run)."""
    try:
        cluster.apply(change)
    except ConflictError as e:
        reason = f"conflict, will retry next round: {e}"
        logger.info("job %s: %s", change.job, reason)
        return reason
    except (TemporaryError, PermanentError) as e:
        logger.warning("job %s: write failed: %s", change.job, e)
        return str(e)
    except Exception as e:  # a bug: raised by apply_changes once every write has run
        return e
    return None


def reconcile(
    *,
    metrics: MetricsSource,
    cluster: ClusterClient,
    policy: ElasticPolicy,
    now_s: float,
    models: ModelCache,
) -> ReconcileResult:
    """Observe, fit, decide and apply once.

    Args:
        metrics: where throughput and queue use come from.
        cluster: where jobs and queues come from and writes go.
        policy: the policy in force.
        now_s: the reconcile time, seconds since the epoch.
        models: fitted models kept across reconciles.

    Returns:
        What was observed, decided, written and refused.
    """
    observation = observe(metrics=metrics, cluster=cluster, now_s=now_s)
    plan = decide(observation, policy, fits=models.fit(observation, policy))
    models.forget({job.key for job in observation.jobs})
    applied, failed = apply_changes(cluster, plan.changes)
    return ReconcileResult(observation, plan.decisions, applied, failed, plan)
