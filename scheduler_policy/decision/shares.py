"""Volcano's deserved shares, as its proportion plugin computes them, for the budgets phase.

The proportion plugin gives each queue its guarantee first (up to what it requests), then
water-fills the rest of the cluster's GPUs by weight, each queue capped by what it requests and
by its capability. A share is therefore never above what the queue requests: a queue that may
not borrow, budgeted its share as the scheduler reports it, could never grow past what its jobs
already ask. Its budget is the share it would get if it asked for its capability instead, the
other queues asking what they ask now (``shares_if_asking``). The simulator computes the
scheduler's own shares with the same water-filling (``water_fill``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler_policy.vocabulary.state import GPU_EPSILON, Observation, QueueName, QueueState


def water_fill(
    *,
    total_gpus: float,
    ceilings: Mapping[QueueName, float],
    guarantees: Mapping[QueueName, float],
    weights: Mapping[QueueName, float],
) -> dict[QueueName, float]:
    """Each queue's deserved share: its guarantee first, then the rest of ``total_gpus`` by
    weight, a queue taking no more than its ceiling (what it requests, and its capability).

    Args:
        total_gpus: the cluster's healthy GPUs.
        ceilings: per queue, the most it may deserve.
        guarantees: per queue, GPUs reserved for it.
        weights: per queue, its weight (a queue of weight 0 gets only its guarantee).

    Returns:
        The share of every queue of ``ceilings``, in its order.
    """
    deserved = {name: min(guarantees[name], ceiling) for name, ceiling in ceilings.items()}
    remaining = total_gpus - sum(deserved.values())
    while remaining > GPU_EPSILON:
        hungry = [n for n in deserved if deserved[n] < ceilings[n] - GPU_EPSILON]
        total_weight = sum(weights[n] for n in hungry)
        if not hungry or total_weight <= 0:
            break
        given = 0.0
        for name in hungry:
            step = min(remaining * weights[name] / total_weight, ceilings[name] - deserved[name])
            deserved[name] += step
            given += step
        remaining -= given
        if given <= GPU_EPSILON:
            break
    return deserved


def cluster_gpus(observation: Observation) -> float:
    """The cluster's GPUs: its nodes' allocatable GPUs where the source reads nodes, else what
    the queues hold plus the idle and terminating GPUs."""
    if observation.nodes:
        return sum(node.allocatable_gpus for node in observation.nodes)
    held = sum(queue.allocated_gpus for queue in observation.queues)
    return held + max(0.0, observation.cluster_free_gpus) + max(0.0, observation.releasing_gpus)


def shares_if_asking(
    observation: Observation, names: Sequence[QueueName]
) -> dict[QueueName, float]:
    """The share each queue of ``names`` would deserve had it asked for its capability (the
    whole cluster when it has none), the other queues asking what they ask now.

    Args:
        observation: the cluster now; its queues' requests, weights and guarantees.
        names: the queues to size (those that may not borrow), each one of the observation's.

    Returns:
        One share per queue of ``names``; none at all when a queue's request is not known (the
        scheduler's own shares then stand).
    """
    queues: Sequence[QueueState] = observation.queues
    if not names or any(q.request_gpus is None for q in queues):
        return {}
    total = cluster_gpus(observation)
    guarantees = {q.name: q.guarantee_gpus for q in queues}
    weights = {q.name: q.weight for q in queues}
    capability = {q.name: total if q.capability_gpus is None else q.capability_gpus for q in queues}
    asking = {q.name: min(capability[q.name], q.request_gpus or 0.0) for q in queues}
    return {
        name: water_fill(
            total_gpus=total,
            ceilings={**asking, name: min(capability[name], total)},
            guarantees=guarantees,
            weights=weights,
        )[name]
        for name in names
    }
