"""Pending work and what borrowing queues give back to it, for the budgets phase.

Pending work has the first claim on idle GPUs; a borrowing queue gives back, gracefully, what
starts other queues' pending jobs that the idle GPUs cannot (``yields``). Pure functions of the
observation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from scheduler_policy.vocabulary.state import (
    GPU_EPSILON,
    JobPhase,
    JobState,
    Observation,
    QueueName,
)


def pending_gpus(
    observation: Observation, *, jobs: Iterable[JobState] | None = None
) -> dict[QueueName, float]:
    """GPUs each queue's pending work needs to start.

    That is the queue's pending non-elastic requests plus the gang minimum of each of its
    pending elastic jobs: an elastic job that waits while others in its queue run above their
    minimums is time lost for nothing, so their growth must make room for it.

    Args:
        observation: the cluster now.
        jobs: the jobs of ``observation`` that may be pending elastic jobs, in its order (the
            others add nothing); None for all of them.

    Returns:
        GPUs per queue.
    """
    pending = {q.name: q.pending_nonelastic_gpus for q in observation.queues}
    for job in observation.jobs if jobs is None else jobs:
        waiting = job.elastic and job.phase is JobPhase.PENDING and job.queue in pending
        if waiting and not job.spec_problems():
            pending[job.queue] += start_gpus(job)
    return pending


def start_gpus(job: JobState) -> float:
    """GPUs a pending job needs to start: its gang minimum if elastic, else all it asks for."""
    replicas = max(job.min_replicas, 1) if job.elastic else job.current_replicas
    return replicas * job.gpus_per_replica + job.nonelastic_gpus


def idle_gpus(observation: Observation) -> float:
    """Idle GPUs, and those of terminating pods (already on their way to pending work)."""
    return max(0.0, observation.cluster_free_gpus) + max(0.0, observation.releasing_gpus)


def short_of_idle(observation: Observation, pending: Mapping[QueueName, float]) -> bool:
    """Whether pending work needs more than the idle and terminating GPUs: only then does a
    borrowing queue give anything back."""
    return sum(pending.values()) > idle_gpus(observation) + GPU_EPSILON


def pending_needs(
    observation: Observation, pending: Mapping[QueueName, float]
) -> dict[QueueName, list[float]]:
    """What each pending job of each queue needs to start, GPUs; pending work the jobs do not
    account for (pods outside Volcano Jobs) is one more need of the queue."""
    needs: dict[QueueName, list[float]] = defaultdict(list)
    for job in observation.jobs:
        if job.phase is not JobPhase.PENDING or job.queue not in pending or job.spec_problems():
            continue
        needs[job.queue].append(start_gpus(job))
    for name, total in pending.items():
        rest = total - sum(needs[name])
        if rest > GPU_EPSILON:
            needs[name].append(rest)
    return needs


def sorted_needs(
    needs: Mapping[QueueName, list[float]],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.object_]]:
    """Every pending need, smallest first, and the queue of each."""
    pairs = sorted((need, name) for name, items in needs.items() for need in items)
    owners = np.empty(len(pairs), dtype=object)
    owners[:] = [p[1] for p in pairs]
    return np.asarray([p[0] for p in pairs], dtype=np.float64), owners


def _yield_gpus(needs: npt.NDArray[np.float64], *, free: float, spare: float) -> float:
    """GPUs a borrowing queue gives back so that other queues' pending jobs (``needs``, sorted
    smallest first) can start.

    Volcano starts whatever pending jobs fit, so the smallest start first: the queue gives back
    what, with the idle GPUs, starts as many of them as its ``spare`` GPUs (what it holds above
    its floor) allow. Nothing when not even the smallest would start: GPUs given back for work
    they cannot start would sit idle, reserved, while the queue's jobs run slower.
    """
    if not len(needs) or spare <= 0:
        return 0.0
    total = np.cumsum(needs)  # smallest first
    startable = total[total <= free + spare + GPU_EPSILON]
    if not len(startable):
        return 0.0
    return max(0.0, float(startable[-1]) - free)


def yields(
    spares: Mapping[QueueName, float],
    *,
    free: float,
    pending: Mapping[QueueName, float],
    needs: tuple[npt.NDArray[np.float64], npt.NDArray[np.object_]],
    released: Mapping[QueueName, float] | None,
) -> dict[QueueName, float]:
    """GPUs each borrowing queue gives back to other queues' pending work (``_yield_gpus``).

    On a first pass (``released`` None) each queue counts only the idle GPUs, so several borrowing
    queues may each give up to the whole shortfall. On the next, a queue counts as idle what the
    other queues' jobs give back this round under the first pass (``released``, whatever the
    reason): the next round sees those GPUs terminating, and must find nothing more to give. A
    job gives back whole replicas, and a job above its maximum shrinks anyway, so that can differ
    from what the first pass asked for.

    Args:
        spares: per borrowing queue, what it holds above its floor.
        free: idle and terminating GPUs.
        pending: GPUs each queue's pending work needs.
        needs: every pending need, smallest first, and its queue (``sorted_needs``).
        released: GPUs each queue's jobs give back this round, from a first pass; None for none.
    """
    total_pending = sum(pending.values())
    total_released = sum(released.values()) if released is not None else 0.0
    sizes, owners = needs
    gives = {}
    for name, spare in spares.items():
        idle = free + total_released - (released.get(name, 0.0) if released is not None else 0.0)
        give = 0.0
        if spare > 0 and total_pending - pending.get(name, 0.0) > idle:
            give = _yield_gpus(sizes[owners != name], free=idle, spare=spare)
        gives[name] = give
    return gives
