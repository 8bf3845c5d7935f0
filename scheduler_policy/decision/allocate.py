"""Targets for elastic jobs within queue budgets: a greedy on marginal speedup per GPU.

Pure and vectorised over all jobs at once (numpy), so 10,000 jobs decide in milliseconds.

Each job starts at its minimum. A job's k-th replica is an *increment* worth
``value = (X(k) / X(k−1) − 1) / gpus_per_replica``, its relative speedup per GPU under the job's
fitted scaling curve X, divided by the square root of the job's expected remaining time under
the default ``completionTime`` objective (shorter remaining time first). Where a job's relative
gains rise somewhere in k (a dip followed by a rise: a node added, whose sync the next replicas
amortise), X is first replaced by its least concave majorant over [min, max] (``bridge_dips``),
so values are non-increasing in k and taking increments in order of value never takes a job's
(k+1)-th replica before its k-th; a running minimum of the values would stop growth at the dip.
Growth that would end inside a bridged dip (the budget funds only part of the bridge) stops at
the fastest size on the way (``stop_outside_dips``): a part of a bridge may be slower than its
start.

Increments a job holds (k ≤ its scheduled replicas) come first: a running replica is given up
when its queue's budget cannot hold it, or for a replica another job of its queue asks for and
waits for that is worth at least twice as much (a trade costs two restarts). Growth increments
(k > held) are taken only while the time they save over the job's expected remaining run exceeds
its restart cost, and only from the idle GPUs left after pending work, or from such trades.
Replicas a job's spec asks for that Volcano has not scheduled (waiting for GPUs) are growth like
any other: they hold nothing, so withdrawing them costs nothing.

Per queue, increments are taken in order while their GPUs fit the budget; the first that does not
fit ends the queue's turn (a prefix, which keeps the greedy vectorisable and never overfills). A
running replica the budget cannot hold ranks among its queue's growth at its value, as it will
next round when it is gone: growth this round takes nothing that it would then keep out. The
running replicas a job's rate limit keeps this round (``floor``) are kept first, whatever the
budget: the budget then takes from other jobs, and no GPU that the damping will not free funds
anything.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_policy.decision.budget import QueueBudget
from scheduler_policy.decision.envelope import bridge_dips, stop_outside_dips
from scheduler_policy.decision.job_table import JobTable
from scheduler_policy.decision.ranking import best_first, by_group_best_first
from scheduler_policy.decision.trade import grow_after_trade, ranked_prefix, trade
from scheduler_policy.policy.spec import Defaults, Objective
from scheduler_policy.vocabulary.state import GPU_EPSILON, QueueName, Reason

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# The value of a replica that takes a job from zero to one, or costs no GPUs: always first.
_FIRST_VALUE = 1e12
# A running replica moves to another job's growth only if that growth is worth this many times
# more: the move costs two restarts for one replica, and the margin keeps two jobs whose values
# cross from handing a replica back and forth.
_TRADE_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class Allocation:
    """The allocator's answer, one entry per job, aligned with its input.

    Attributes:
        targets: replicas per job.
        reasons: why each target is what it is.
        forced: True where a shrink is needed to fit a budget (damping must not delay it).
        gains: predicted relative throughput change of moving from the held replicas to target.
        next_gains: relative speedup the next replica above the target would bring.
    """

    targets: IntArray
    reasons: tuple[Reason, ...]
    forced: BoolArray
    gains: FloatArray
    next_gains: FloatArray


def _expected_remaining_s(age_s: FloatArray, assumed_s: float) -> FloatArray:
    """Expected remaining run time of jobs that do not report their progress, from their age.

    Job durations are heavy-tailed (Philly, Helios: a lognormal whose tail spans hours), so a
    job that has run long is likely to run long yet, as least-attained-service schedulers
    (Tiresias) reason. Under a Lomax (Pareto II) law with shape 2 and mean ``assumed_s``, the
    expected remaining time at age a is ``assumed_s + a``: the policy's assumed remaining time
    when the job starts, growing by a second per second it has run. NaN ages (unknown) give
    ``assumed_s``.
    """
    return assumed_s + np.nan_to_num(age_s, nan=0.0)


def _curve(t: JobTable, n: FloatArray) -> FloatArray:
    """Each job's throughput at replica counts ``n`` (one row per job), packed on its nodes."""
    return t.throughput(n)


def _curve_at(table: JobTable, x_all: FloatArray, n: FloatArray, lo: FloatArray) -> FloatArray:
    """Each job's throughput at ``n`` replicas (one count per job): read from ``x_all``, the
    curves at lo, lo + 1, ... (one row per job), where it has that count, else computed (the same
    arithmetic on the same figures, so the same values)."""
    col = (n - lo).astype(np.int64)
    inside = (col >= 0) & (col < x_all.shape[1])
    x = x_all[np.arange(len(n)), np.where(inside, col, 0)]
    if not inside.all():
        x = np.where(inside, x, _curve(table, n[:, None])[:, 0])
    return x


def allocate(
    table: JobTable,
    *,
    budgets: Mapping[QueueName, QueueBudget],
    growth_pool_gpus: float,
    defaults: Defaults,
    waiting_pool_gpus: float | None = None,
    objective: Objective = Objective.COMPLETION_TIME,
    trade_queues: Collection[QueueName] | None = None,
    floor: IntArray | None = None,
    stale: BoolArray | None = None,
    cooling: BoolArray | None = None,
    now_s: float | None = None,
) -> Allocation:
    """Decide a target for every running elastic job.

    Args:
        table: running elastic jobs and their scaling curves, each in a queue ``budgets`` has.
        budgets: the elastic budget of each queue.
        growth_pool_gpus: idle GPUs that growth beyond current replicas may take, all queues
            together.
        waiting_pool_gpus: GPUs that replicas a job's spec already asks for, waiting to be
            scheduled, may keep (idle and terminating); None for ``growth_pool_gpus``.
        defaults: the policy's defaults (assumed remaining time).
        objective: what increments are ranked by (see ``Objective``).
        trade_queues: the queues where running replicas may move to other jobs' growth (where
            a replica given up would reach the grower: ``budget.trade_queues``); None for all.
        floor: the fewest replicas each job can be left with this round (the rate limit of a
            job whose curve is still the prior's); the running replicas up to it are kept
            whatever the budgets, and the budgets take from the other replicas instead. None
            for each job's minimum.
        stale: True for each job whose own metrics are stale (``JobState.stale_reason``):
            its running replicas are all taken as useful (a stale curve cannot say otherwise),
            it grows to nothing its spec does not ask for, and it neither gives a replica to
            nor takes one from another job; only its queue's budget can shrink it. None for
            none.
        cooling: the jobs the damping holds in place this round unless a budget forces them
            (rescaled within the cooldown or the decision interval): they give no replica to
            another job's growth, since the trade's shrink would not happen. None for none.
        now_s: the engine's clock, for each job's age (``JobTable.running_since_s``); None
            where ages are not known (no age-based estimate, no starvation bound).

    Returns:
        Targets within [min, max] that fit every budget, with reasons.
    """
    count = len(table.jobs)
    if count == 0:
        empty = np.zeros(0)
        return Allocation(
            np.zeros(0, dtype=np.int64), (), np.zeros(0, dtype=bool), empty, empty.copy()
        )
    lo = table.min_replicas.astype(np.float64)
    hi = table.max_replicas.astype(np.float64)
    cur = table.held.astype(np.float64)
    gpr = table.gpus_per_replica
    width = int((hi - lo).max())
    steps = np.arange(1, width + 1, dtype=np.float64)
    k = lo[:, None] + steps[None, :]  # the replica count each increment reaches
    valid = steps[None, :] <= (hi - lo)[:, None]
    x_raw = _curve(table, lo[:, None] + np.arange(width + 1, dtype=np.float64)[None, :])
    x_all = bridge_dips(x_raw, (hi - lo).astype(np.int64))
    x_prev, x_new = x_all[:, :-1], x_all[:, 1:]  # before and after each increment
    existing = k <= cur[:, None]

    # Time saved by the k-th replica over the remaining run, against the restart it costs:
    # remaining work W = T·X(cur) in curve units, saved = W·(1/X(k−1) − 1/X(k)).
    x_cur = _curve_at(table, x_all, np.maximum(cur, 1.0), lo)
    age_s = (
        np.full(count, np.nan)
        if now_s is None
        else np.maximum(now_s - table.running_since_s, 0.0)  # NaN stays NaN
    )
    remaining_s = np.where(
        np.isfinite(table.remaining_samples),
        table.remaining_samples / np.where(x_cur > 0, x_cur, np.inf),
        _expected_remaining_s(age_s, defaults.assumed_remaining_s),
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(x_prev > 0, x_new / x_prev - 1.0, _FIRST_VALUE)
        per_gpu = np.where(gpr[:, None] > 0, gain / gpr[:, None], _FIRST_VALUE)
        saved_s = (remaining_s * x_cur)[:, None] * (1.0 / x_prev - 1.0 / x_new)
    if objective is Objective.COMPLETION_TIME:
        # Shorter remaining time first: the same speedup is worth more to a job that finishes
        # sooner (a floor of one minute keeps a job about to finish from taking everything).
        # Divided by the square root of that time, not the time itself (pure shortest-
        # remaining-first): speedups are sublinear, so the replicas a short job adds past a few
        # buy less than a long job's first ones, and mean completion time is lowest when long
        # jobs keep a share (as heSRPT has it: Berg, Vesilo and Harchol-Balter, 2020). With the
        # time itself, a 3 h yolov3 job on Pollux workload 3 sat at 1 of its 4 replicas for 45
        # minutes while short cifar10 jobs took their 7th and 8th. Pollux workloads 1-4 at seed 0,
        # mean average JCT, by the exponent of the time: 1: 0.734 h, 0.75: 0.733, 0.5: 0.725,
        # 0.25: 0.730, 0 (``speedup``): 0.754; 0.5 on all 20 runs (seeds 0-4): 0.733 -> 0.725,
        # faster on 16 (benchmarks/policy_quality.py, BENCHMARKS.md).
        rank_s = np.broadcast_to(np.maximum(remaining_s, 60.0)[:, None], per_gpu.shape)
        aging_s = defaults.starvation_bound_s
        if aging_s is not None:
            # The replicas up to a job's asked size rank as if the job ran at its asked size (its
            # known remaining work at that size's throughput; an estimate from its age does not
            # depend on the size), and past the bound (aging) that time is divided by
            # 1 + (age - bound) / bound, so a long job below its asked size rises with its age
            # above the short ones that keep it there. Ranked at the size it holds, a job kept
            # at 1 of 4 replicas looks about 4 times longer than it is, and the shortfall
            # keeps itself going: on Pollux workloads 1-4 the jobs that set the p99 (yolov3
            # at 1 of 4 replicas, imagenet at 1-8 of 24) sat there for hours, and a cifar10
            # job started at 1 replica in a busy cluster stayed there for 10 minutes of a run
            # that takes 10 at its asked size. Ranked at the asked size from the start rather
            # than only past the bound, Pollux 1-4 ran 2.1% faster on average (18 of 20 runs
            # faster), the built-in cases within 0.7% per run. (Ranked first outright after 2 h
            # or 5 h, or aged by the square or cube of that factor, the long jobs took so much
            # that Pollux workloads 1, 2 and 4 at seed 0 lost 4-100% in average JCT.) The bound
            # is 30 min since a job below its asked size takes replicas by trade (below): the
            # long jobs then give more. On 8 Pollux runs (workload 1 at seeds 0, 1, 2, 4,
            # workload 2 at 0 and 1, workloads 3 and 4 at 0) a 30 min bound left the p99 lower
            # than 2 h on all 8 and than 1 h on 7; 20 min was slower on average on 7 of them.
            beyond = np.maximum(np.nan_to_num(age_s, nan=0.0) - aging_s, 0.0) / aging_s
            owed = k <= table.requested[:, None]
            x_asked = _curve_at(table, x_all, table.requested.astype(np.float64), lo)
            with np.errstate(divide="ignore", invalid="ignore"):
                at_asked_s = np.where(
                    np.isfinite(table.remaining_samples) & (x_asked > 0),
                    table.remaining_samples / np.where(x_asked > 0, x_asked, np.inf),
                    remaining_s,
                )
            # Never longer than at the held size (the asked size may be the slower one).
            owed_s = np.maximum(np.minimum(at_asked_s, remaining_s), 60.0) / (1.0 + beyond)
            rank_s = np.where(owed, owed_s[:, None], rank_s)
        per_gpu = per_gpu / np.sqrt(np.maximum(rank_s, 60.0))
    # Non-increasing already (the envelope's relative gains fall with k, and the asked-size
    # ranking shortens a prefix); the running minimum only irons out rounding.
    value = np.minimum.accumulate(np.where(valid, per_gpu, -np.inf), axis=1)
    saved_s = np.where(x_prev > 0, saved_s, np.inf)
    worth = saved_s > table.restart_cost_s[:, None]
    useful = valid & (value > 0)
    eligible = np.logical_and.accumulate(useful & (existing | worth), axis=1)
    if stale is not None:
        # Every prefix of a row stays a prefix: what it runs, and no more than its spec asks.
        keep = valid & existing & stale[:, None]
        useful |= keep
        eligible = (eligible | keep) & (~stale[:, None] | (k <= table.current[:, None]))
    must = None  # running replicas the rate limit keeps this round, where there are any
    if floor is not None and bool((floor > lo).any()):
        must = existing & (k <= floor[:, None])
        eligible |= must  # both are prefixes of each row, and so is their union

    qidx = table.queue_index
    base_gpus = np.bincount(qidx, weights=lo * gpr, minlength=len(table.queue_names))
    increment_budget: FloatArray = (
        np.asarray([budgets[q].elastic_gpus for q in table.queue_names], dtype=np.float64)
        - base_gpus
    )

    # Increments in row-major (job, k) order, as flat indices into the (job, k) arrays (one
    # index array to gather with, not two); the sorts below are stable, so ties keep it.
    items = np.flatnonzero(eligible)
    item_value = value.ravel()[items]
    growth = ~existing.ravel()[items]
    item_queue = qidx[items // width]
    # Sort by (queue, growth, -value), ties in (job, k) order. Replicas a job must keep come
    # first among the running ones.
    rank_value = item_value if must is None else np.where(must.ravel()[items], np.inf, item_value)
    order = by_group_best_first(item_queue * 2 + growth, rank_value)
    items = items[order]
    item_value, growth, item_queue = item_value[order], growth[order], item_queue[order]
    rows = items // width  # each increment's job
    item_gpus = gpr[rows]
    reaches = k.ravel()[items]  # the replica count each increment reaches
    asked = reaches <= table.current[rows]  # the job's spec already asks for it
    item_must = must.ravel()[items] if must is not None else np.zeros(len(items), dtype=bool)
    first = np.searchsorted(item_queue, np.arange(len(table.queue_names)))

    def spent_in_queue(gpus: FloatArray) -> FloatArray:
        """Running total of ``gpus`` within each queue, at each item."""
        spent = np.cumsum(gpus)
        before = np.concatenate(([0.0], spent))  # spent before each queue's first item
        return spent - before[first][item_queue]

    # Running replicas first; growth then takes what they leave (not what a running replica
    # that did not fit would have taken, or the next round would find room this one missed).
    fit = ~growth & (
        spent_in_queue(np.where(growth, 0.0, item_gpus))
        <= increment_budget[item_queue] + GPU_EPSILON
    )
    kept = fit | item_must
    kept_gpus = np.bincount(item_queue[kept], weights=item_gpus[kept], minlength=len(first))
    room: FloatArray = (increment_budget - kept_gpus)[item_queue] + GPU_EPSILON
    grown = growth & (spent_in_queue(np.where(growth, item_gpus, 0.0)) <= room)
    dropped = ~growth & ~kept
    if dropped.any():
        # A running replica the budget cannot hold still ranks among its queue's growth at its
        # value, and ends the queue's turn there if it does not fit: next round it is growth
        # like any other, and this round must take no growth that it would then keep out.
        bound = np.isin(item_queue, np.unique(item_queue[dropped]))
        grown &= ~bound
        idx, fits = ranked_prefix(
            np.flatnonzero(bound & (growth | dropped)),
            item_queue,
            item_value,
            item_gpus,
            room,
        )
        grown[idx[fits & growth[idx]]] = True
    accepted = kept | grown

    # Growth across all queues must fit in the idle GPUs, best value first: replicas already
    # asked for first (they may also keep GPUs now terminating), then new ones from what idle
    # GPUs the first left (terminating GPUs never fund new growth, so a second round on the
    # same cluster asks for nothing the first did not).
    waiting_pool = growth_pool_gpus if waiting_pool_gpus is None else waiting_pool_gpus
    pool = waiting_pool
    for tier in (asked, ~asked):
        grow = np.flatnonzero(accepted & growth & tier)
        if len(grow):
            g_order = grow[best_first(item_value[grow])]
            spent = np.cumsum(item_gpus[g_order])
            fits = spent <= pool + GPU_EPSILON
            accepted[g_order[~fits]] = False
            growth_pool_gpus -= float(spent[fits][-1]) if fits.any() else 0.0
        pool = max(0.0, growth_pool_gpus)

    # Givers move in one step only once measured at two sizes (before, the rate limit holds
    # them back, and the replica they owe would be owed again next round), and only when the
    # damping lets them move at all (a job in its cooldown would keep the replica it gave).
    # A job with stale metrics trades nothing: its curve cannot say what a replica is worth.
    # Takers are the replicas up to what the job asks for, by its spec or its owner: a job
    # started small in a full cluster, whose unplaced replicas were withdrawn, still takes
    # replicas worth more than theirs from other jobs (growing only into idle GPUs, a bert job
    # that asked for 16 ran at 1 for an hour on Pollux workload 1).
    givers = accepted & ~growth & table.shaped[rows]
    takers = ~accepted & growth & (asked | (reaches <= table.requested[rows]))
    if cooling is not None:
        givers &= ~cooling[rows]
    if stale is not None:
        givers &= ~stale[rows]
        takers &= ~stale[rows]
    allowed = None
    if trade_queues is not None:
        allowed = np.asarray([q in trade_queues for q in table.queue_names], dtype=bool)
    before_trade = accepted.copy()
    traded = trade(
        accepted=accepted,
        givers=givers,
        takers=takers,
        item_queue=item_queue,
        item_gpus=item_gpus,
        item_value=item_value,
        queues=len(first),
        factor=_TRADE_FACTOR,
        allowed=allowed,
    )
    if traded:
        crowded = grow_after_trade(
            accepted,
            growth=growth,
            item_queue=item_queue,
            item_gpus=item_gpus,
            item_value=item_value,
            increment_budget=increment_budget,
            pool=max(0.0, growth_pool_gpus),
        )
        # A trade whose taker the next round would rank out of its queue's budget is undone:
        # its giver cannot give again then (it is in its cooldown), so the taker would lose the
        # place and another job take it, a second write on the same cluster.
        undone = np.isin(item_queue, crowded)
        accepted[undone] = before_trade[undone]
    given = kept & ~accepted
    targets = lo + np.bincount(rows[accepted], minlength=count)
    if x_all is not x_raw:
        targets = stop_outside_dips(targets, lo=lo, held=cur, curve=x_raw, envelope=x_all)
    t_int = targets.astype(np.int64)
    traded_jobs = None
    if traded:
        # A job that also gives up replicas its budget cannot hold shrinks for the budget.
        over = np.bincount(rows[~growth & ~kept], minlength=count) > 0
        traded_jobs = (np.bincount(rows[given], minlength=count) > 0) & ~over
    reasons, forced = _reasons(table, budgets, t_int, useful, eligible, existing, traded_jobs)
    if must is not None:
        # Kept only because the rate limit holds them: the budget wanted them back.
        held_back = np.bincount(rows[item_must & ~fit], minlength=count) > 0
        if held_back.any():
            reasons = tuple(
                Reason.LIMITED_BY_RATE if h else r
                for r, h in zip(reasons, held_back.tolist(), strict=True)
            )
    x_target = _curve_at(table, x_all, np.maximum(targets, 1.0), lo)
    # A job at its maximum has no next replica (its next gain is 0 below): the curve is read
    # there at the maximum, from the table, rather than computed past it for every job.
    x_next = _curve_at(table, x_all, np.minimum(targets + 1.0, hi), lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        gains = np.where(x_cur > 0, x_target / x_cur - 1.0, 0.0)
        next_gains = np.where(x_target > 0, x_next / x_target - 1.0, 0.0)
    next_gains = np.where(targets < hi, next_gains, 0.0)
    return Allocation(t_int, reasons, forced, gains, next_gains)


# Reason codes of the vectorised classification below, in the order ``_REASONS`` lists them.
_REASONS = (
    Reason.AT_TARGET,
    Reason.SCALE_UP_FOR_IDLE_GPUS,
    Reason.LIMITED_BY_BOUNDS,
    Reason.SHRINK_LOW_EFFICIENCY,
    Reason.RESTART_COST_EXCEEDS_GAIN,
    Reason.SHRINK_FOR_PENDING_WORK,
    Reason.SHRINK_FOR_HEADROOM,
    Reason.SHRINK_OVER_BUDGET,
    Reason.SHRINK_FOR_BETTER_USE,
)
_BUDGET_SHRINK = {reason: code for code, reason in enumerate(_REASONS) if 5 <= code <= 7}


def _reasons(
    table: JobTable,
    budgets: Mapping[QueueName, QueueBudget],
    targets: IntArray,
    useful: BoolArray,
    eligible: BoolArray,
    existing: BoolArray,
    traded: BoolArray | None = None,
) -> tuple[tuple[Reason, ...], BoolArray]:
    """Why each target is what it is, and which shrinks are forced by a budget."""
    lo, hi, cur = table.min_replicas, table.max_replicas, table.held
    count = len(table.jobs)
    width = useful.shape[1]
    if width == 0:  # every job is fixed at one size: nothing to take or give
        useful = eligible = existing = np.zeros((count, 1), dtype=bool)
        width = 1
    step = (targets - lo).astype(np.int64)  # index of the first increment not taken
    in_range = step < width
    col = np.minimum(step, width - 1)
    row = np.arange(count)
    next_useful = in_range & useful[row, col]
    next_eligible = in_range & eligible[row, col]
    next_existing = in_range & existing[row, col]
    per_queue = np.asarray(
        [_BUDGET_SHRINK[budgets[q].shrink_reason()] for q in table.queue_names], dtype=np.int64
    )
    budget_code = per_queue[table.queue_index]
    up, down = targets > cur, targets < cur
    to_bounds_up = up & (cur < lo) & (targets == lo)
    to_bounds_down = down & (cur > hi) & (targets == hi)
    inefficient = down & ~to_bounds_down & next_existing & ~next_useful
    budget_shrink = down & ~to_bounds_down & ~inefficient
    restart = ~up & ~down & next_useful & ~next_eligible & ~next_existing
    codes = np.zeros(count, dtype=np.int64)
    codes[up] = 1
    codes[to_bounds_up | to_bounds_down] = 2
    codes[inefficient] = 3
    codes[restart] = 4
    codes[budget_shrink] = budget_code[budget_shrink]
    if traded is not None:
        # Given up for other jobs' growth, not for a budget: damped like any other move.
        budget_shrink &= ~traded
        codes[down & traded & ~to_bounds_down] = 8
    reasons = tuple(map(_REASONS.__getitem__, codes.tolist()))
    return reasons, to_bounds_down | budget_shrink
