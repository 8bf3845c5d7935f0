"""Trades: a running replica moves to another job's waiting replica worth far more.

Helpers of ``allocate`` over its items sorted by (queue, growth, −value); each updates the
allocator's ``accepted`` mask in place.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_policy.vocabulary.state import GPU_EPSILON

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def trade(
    *,
    accepted: BoolArray,
    givers: BoolArray,
    takers: BoolArray,
    item_queue: IntArray,
    item_gpus: FloatArray,
    item_value: FloatArray,
    queues: int,
    factor: float,
    allowed: BoolArray | None = None,
) -> bool:
    """Move running replicas to waiting ones worth ``factor`` times more, within each queue.

    ``accepted`` is updated in place. Items come sorted by (queue, growth, −value); only those
    of ``allowed`` queues (all when None) trade. ``takers`` (replicas up to what a job's spec
    or its owner asks for, which the idle pool could not give) are paired, best first, with
    ``givers`` (the queue's running replicas), least valuable first, GPU for GPU; a taker is
    taken while its value exceeds ``factor`` times the most valuable replica it displaces. Both
    sequences are monotone, so what is taken is a prefix of each. Growth beyond the asked size
    never takes: it would move on before its giver's damped shrink does, and a second round on
    the same cluster would then trade again; a taken replica up to the asked size is one the
    spec asks for next round, and waits for the same giver.

    Returns:
        Whether any replica was given up.
    """
    if not np.isfinite(factor):
        return False
    candidates = np.ones(len(accepted), dtype=bool) if allowed is None else allowed[item_queue]
    give = np.flatnonzero(givers & candidates)
    take = np.flatnonzero(takers & candidates)
    if not len(give) or not len(take):
        return False
    # Givers least valuable first within each queue: reversed, they are by queue descending and
    # value ascending, and a stable sort on the queue (a radix sort) puts the queues back in
    # order. Takers are already best first.
    give = give[::-1]
    give = give[np.argsort(item_queue[give], kind="stable")]
    # Only takers worth more than the factor times their queue's least valuable giver can trade
    # at all (a prefix of each queue's takers): most growth is ruled out here, cheaply.
    give_queue = item_queue[give]
    first_give = np.minimum(np.searchsorted(give_queue, np.arange(queues)), len(give) - 1)
    least = np.where(
        give_queue[first_give] == np.arange(queues), item_value[give[first_give]], np.inf
    )
    take = take[item_value[take] > factor * least[item_queue[take]]]
    if not len(take):
        return False
    span = float(item_gpus.sum()) + 1.0  # separates the queues on one cumulative axis

    def cumulative(idx: IntArray) -> FloatArray:
        return _cumsum_within_queues(item_queue[idx], item_gpus[idx]) + item_queue[idx] * span

    give_end = cumulative(give)
    take_end = cumulative(take)
    # The giver whose GPUs complete each taker's: the first with give_end >= take_end.
    pos = np.searchsorted(give_end, take_end - GPU_EPSILON)
    same_queue = pos < len(give)
    pos = np.minimum(pos, len(give) - 1)
    same_queue &= item_queue[give[pos]] == item_queue[take]
    ok = same_queue & (item_value[take] > factor * item_value[give[pos]])
    if not ok.any():
        return False
    accepted[take[ok]] = True
    # Per queue, the GPUs the taken growth needs; givers up to them are given up.
    needed = np.zeros(queues)
    np.maximum.at(needed, item_queue[take[ok]], take_end[ok] - item_queue[take[ok]] * span)
    give_start = give_end - item_gpus[give] - item_queue[give] * span
    accepted[give[give_start < needed[item_queue[give]] - GPU_EPSILON]] = False
    return True


def ranked_prefix(
    idx: IntArray,
    item_queue: IntArray,
    item_value: FloatArray,
    item_gpus: FloatArray,
    room: FloatArray,
) -> tuple[IntArray, BoolArray]:
    """Items ``idx`` ranked by (queue, best value first), and which fit their queue's ``room``
    (per item) taken in that order: a prefix of each queue, since the sums only grow."""
    idx = idx[np.argsort(-item_value[idx], kind="stable")]
    idx = idx[np.argsort(item_queue[idx], kind="stable")]
    return idx, _cumsum_within_queues(item_queue[idx], item_gpus[idx]) <= room[idx]


def _cumsum_within_queues(queue: IntArray, gpus: FloatArray) -> FloatArray:
    """Running total of ``gpus`` within each queue, for items sorted by ``queue``."""
    total = np.cumsum(gpus)
    return total - np.concatenate(([0.0], total))[np.searchsorted(queue, queue)]


def grow_after_trade(
    accepted: BoolArray,
    *,
    growth: BoolArray,
    item_queue: IntArray,
    item_gpus: FloatArray,
    item_value: FloatArray,
    increment_budget: FloatArray,
    pool: float,
) -> IntArray:
    """New growth in the budget room a trade leaves, as the next round would take it.

    ``accepted`` is updated in place. In each queue that gave up running replicas, the growth
    and the running replicas not kept rank by value as they will next round (when those are
    gone, and growth like any other); growth in the prefix that fits the room the kept replicas
    leave is taken, best value first, from the idle GPUs still free (``pool``). A queue whose
    growth already taken would not fit that prefix takes nothing more.

    Returns:
        Those queues ("crowded"): the next round would not keep what this one took there.
    """
    let_go = ~growth & ~accepted
    queues = np.unique(item_queue[let_go])
    idx = np.flatnonzero(np.isin(item_queue, queues) & (growth | let_go))
    if not len(idx):
        return np.zeros(0, dtype=np.int64)
    kept = accepted & ~growth
    held = np.bincount(item_queue[kept], weights=item_gpus[kept], minlength=len(increment_budget))
    room = (increment_budget - held)[item_queue] + GPU_EPSILON
    idx, fits = ranked_prefix(idx, item_queue, item_value, item_gpus, room)
    # Growth already taken (by the trade) must be in the prefix, or the next round differs.
    crowded = np.unique(item_queue[idx[~fits & accepted[idx] & growth[idx]]])
    new = idx[fits & growth[idx] & ~accepted[idx] & ~np.isin(item_queue[idx], crowded)]
    new = new[np.argsort(-item_value[new], kind="stable")]
    accepted[new[np.cumsum(item_gpus[new]) <= pool + GPU_EPSILON]] = True
    return crowded
