"""Where Volcano's allocate would put a pending gang's pods, given the free GPUs per node.

Its default node order spreads pods (``nodeorder``, no ``binpack``): each pod goes to the node
with the most room. A gang starts whole or not at all. Pure.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from scheduler_policy.vocabulary.state import GPU_EPSILON, PendingGang


def place_gang(
    free_gpus: dict[str, float], gang: PendingGang, *, order: Mapping[str, int]
) -> list[str] | None:
    """Place one gang's pods as Volcano's allocate would with its default (spread) node order.

    Each pod goes to the node with the most free GPUs (ties to the node listed first); a gang
    starts whole or not at all. With pods of one size, whether the gang fits does not depend on
    the order (each node takes ⌊free / size⌋ of them); which nodes it takes does, and that
    matters to the gangs placed after it.

    Args:
        free_gpus: free GPUs per node; the gang's pods are taken from it when it fits.
        gang: the gang.
        order: each node's position, for ties.

    Returns:
        The node of each pod, or None when the gang does not fit (``free_gpus`` unchanged).
    """
    size = gang.gpus_per_pod
    if gang.min_member <= 0 or size <= GPU_EPSILON:
        return []
    heap = [(-free, order[name], name) for name, free in free_gpus.items()]
    heapq.heapify(heap)
    chosen: list[str] = []
    for _ in range(gang.min_member):
        if not heap or -heap[0][0] < size - GPU_EPSILON:
            return None
        free, position, name = heapq.heappop(heap)
        chosen.append(name)
        heapq.heappush(heap, (free + size, position, name))
    for name in chosen:
        free_gpus[name] -= size
    return chosen


def place_gangs(
    free_gpus: Mapping[str, float], gangs: Sequence[PendingGang]
) -> list[list[str] | None]:
    """Place gangs oldest first on ``free_gpus`` (``place_gang``); one that does not fit takes
    nothing and the next is tried.

    Args:
        free_gpus: free GPUs per node (not changed).
        gangs: the gangs, oldest first.

    Returns:
        Per gang, the node of each pod, or None when it does not fit.
    """
    left = dict(free_gpus)
    order = {name: i for i, name in enumerate(free_gpus)}
    return [place_gang(left, gang, order=order) for gang in gangs]
