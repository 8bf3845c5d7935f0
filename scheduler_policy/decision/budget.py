"""The budgets phase: what each queue's elastic jobs may hold, and what idle GPUs growth may use.

``plan_budgets`` is one call that returns a frozen ``Budgets`` (DESIGN.md, "Allocation, in one
paragraph"); ``Budgets.after_release`` is the same budgets once what the queues give back this
round is known (the fixed-point rule of ``decision.pipeline``). Pure functions of the
observation, the policy and the job table.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from scheduler_policy.decision.job_table import (
    PHASE_CODES,
    BoolArray,
    FloatArray,
    IntArray,
    JobColumns,
    JobTable,
)
from scheduler_policy.decision.pending import (
    idle_gpus,
    pending_gpus,
    pending_needs,
    short_of_idle,
    sorted_needs,
    yields,
)
from scheduler_policy.decision.shares import shares_if_asking
from scheduler_policy.policy.spec import ElasticPolicy, QueuePolicy
from scheduler_policy.vocabulary.state import (
    GPU_EPSILON,
    JobPhase,
    JobState,
    Observation,
    QueueName,
    QueueState,
    Reason,
)

INFINITE_GPUS = math.inf
_GONE = frozenset(phase for phase in JobPhase if phase.finished)


@dataclass(frozen=True, slots=True)
class QueueBudget:
    """The GPUs one queue's elastic jobs may hold together this round.

    Attributes:
        queue: the queue.
        elastic_gpus: GPUs the queue's elastic replicas may hold in total (mins included).
        limit_gpus: what Volcano would let the queue use (capability, or the deserved share
            when the queue may not borrow).
        held_nonelastic_gpus: GPUs held by the queue's non-elastic work.
        pending_gpus: GPUs the queue's pending work needs to start, plus what other queues'
            pending work needs back from this queue's borrowed GPUs.
        headroom_gpus: GPUs kept free for forecast demand and the fixed headroom.
        forecast_reason: which forecast the headroom follows and why, a sentence; "" without
            a forecast.
    """

    queue: QueueName
    elastic_gpus: float
    limit_gpus: float
    held_nonelastic_gpus: float
    pending_gpus: float
    headroom_gpus: float
    forecast_reason: str = ""

    def shrink_reason(self) -> Reason:
        """The reason to give a job of this queue that must shrink to fit the budget."""
        if self.pending_gpus > 0:
            return Reason.SHRINK_FOR_PENDING_WORK
        if self.headroom_gpus > 0:
            return Reason.SHRINK_FOR_HEADROOM
        return Reason.SHRINK_OVER_BUDGET


def _share_gpus(queue: QueueState, shares: Mapping[QueueName, float]) -> float:
    """The queue's deserved share (``shares`` first: what it would deserve asking for its
    capability, see ``_Tally.shares``); its capability when no share is set; unlimited when
    neither."""
    if queue.name in shares:
        return max(shares[queue.name], queue.deserved_gpus or 0.0)
    if queue.deserved_gpus is not None:
        return queue.deserved_gpus
    if queue.capability_gpus is not None:
        return queue.capability_gpus
    return INFINITE_GPUS


def _capability_gpus(queue: QueueState) -> float:
    return INFINITE_GPUS if queue.capability_gpus is None else queue.capability_gpus


@dataclass(frozen=True, slots=True)
class _Tally:
    """The per-queue sums every budget of one decision is made from, computed once.

    Attributes:
        managed: each queue of the observation that the policy manages, with its policy.
        pending: GPUs each queue's pending work needs (``pending_gpus``).
        forecast_gpus: forecast peak non-elastic demand per queue.
        forecast_reasons: per queue, which forecast it follows and why.
        held_nonelastic: GPUs each queue's non-elastic work holds (held elastic jobs included).
        held_elastic: GPUs each queue's planned elastic jobs hold (replicas waiting hold none).
        used: per borrowing queue, GPUs it holds in all.
        spares: per borrowing queue, what it holds above its floor (guarantee, or what its
            non-elastic work and elastic minimums hold).
        idle_gpus: idle and terminating GPUs.
        free_gpus: idle GPUs (terminating ones excluded).
        short: whether pending work needs more than ``idle_gpus``.
        needs: every pending need, smallest first, and the queue of each (empty unless a
            borrowing queue may give back).
        shares: per queue that may not borrow and is given all it requests (its deserved
            share as the scheduler reports it is what it requests: the proportion plugin caps
            it there), the share it would deserve asking for its capability
            (``shares_if_asking``): its budget's limit, so that it can grow within its share.
    """

    managed: tuple[tuple[QueueState, QueuePolicy], ...]
    pending: Mapping[QueueName, float]
    forecast_gpus: Mapping[QueueName, float]
    held_nonelastic: Mapping[QueueName, float]
    held_elastic: Mapping[QueueName, float]
    used: Mapping[QueueName, float]
    spares: Mapping[QueueName, float]
    idle_gpus: float
    free_gpus: float
    short: bool
    needs: tuple[npt.NDArray[np.float64], npt.NDArray[np.object_]]
    forecast_reasons: Mapping[QueueName, str]
    shares: Mapping[QueueName, float]


def _tally(
    observation: Observation,
    policy: ElasticPolicy,
    *,
    table: JobTable,
    forecast_gpus: Mapping[QueueName, float],
    forecast_reasons: Mapping[QueueName, str],
    columns: JobColumns | None = None,
) -> _Tally:
    """Sum the observation's jobs per queue, once per decision (see ``_Tally``)."""
    candidates: Sequence[JobState] = observation.jobs  # the jobs that are not planned for
    waiting = None  # the pending elastic jobs
    if columns is not None and table.rows is not None:
        # Found for every job at once: the loops below then visit only the few that count.
        others = np.ones(len(columns.jobs), dtype=bool)
        others[table.rows] = False
        phase = columns.phase
        pending_phase = phase == PHASE_CODES.index(JobPhase.PENDING)
        gone = np.isin(phase, [PHASE_CODES.index(p) for p in _GONE])
        pick = columns.jobs.__getitem__
        candidates = list(map(pick, np.flatnonzero(others & ~gone & ~pending_phase).tolist()))
        waiting = list(map(pick, np.flatnonzero(columns.elastic & pending_phase).tolist()))
    pending = pending_gpus(observation, jobs=waiting)
    # The planned elastic jobs, from the table's columns (a job with no replicas and no other
    # GPUs holds nothing): their non-elastic pods, the GPUs their replicas hold (replicas still
    # waiting for GPUs hold none: counting them would shrink a running job to make room that is
    # not needed; the allocator withdraws them instead), and their minimums.
    holds = (table.current > 0) | (table.nonelastic_gpus > 0)

    def per_queue(gpus: FloatArray) -> dict[QueueName, float]:
        sums = np.bincount(
            table.queue_index, weights=np.where(holds, gpus, 0.0), minlength=len(table.queue_names)
        )
        return dict(zip(table.queue_names, sums.tolist(), strict=True))

    held = defaultdict(float, per_queue(table.nonelastic_gpus))
    elastic_used = per_queue(table.held * table.gpus_per_replica)
    elastic_min = per_queue(table.min_replicas * table.gpus_per_replica)
    # Everything else that runs is non-elastic work (held elastic jobs included).
    planned = set(table.keys) if candidates else set()
    for job in candidates:
        # The planned jobs, most of them, are skipped first, by key: hashing a JobPhase for
        # ``_GONE`` is a Python-level call.
        if job.key in planned or job.phase in _GONE or job.phase is JobPhase.PENDING:
            continue
        if job.current_replicas <= 0 and job.nonelastic_gpus <= 0:
            continue
        held[job.queue] += job.current_replicas * job.gpus_per_replica + job.nonelastic_gpus
    policies: dict[QueueName, QueuePolicy] = {}
    for queue_policy in policy.queues:
        policies.setdefault(queue_policy.name, queue_policy)  # the first of a name wins
    managed = tuple((q, policies[q.name]) for q in observation.queues if q.name in policies)
    used: dict[QueueName, float] = {}
    spares: dict[QueueName, float] = {}
    for queue, queue_policy in managed:
        if queue_policy.borrow:
            held_q = held.get(queue.name, 0.0)
            used[queue.name] = held_q + elastic_used.get(queue.name, 0.0)
            floor = max(queue.guarantee_gpus, held_q + elastic_min.get(queue.name, 0.0))
            spares[queue.name] = used[queue.name] - floor
    short = short_of_idle(observation, pending)
    capped = [
        queue.name
        for queue, queue_policy in managed
        if not queue_policy.borrow
        and queue.deserved_gpus is not None
        and queue.request_gpus is not None
        and queue.deserved_gpus >= queue.request_gpus - GPU_EPSILON
    ]
    needs = sorted_needs(pending_needs(observation, pending) if spares and short else {})
    return _Tally(
        managed=managed,
        pending=pending,
        forecast_gpus=forecast_gpus,
        held_nonelastic=dict(held),
        held_elastic=dict(elastic_used),
        used=used,
        spares=spares,
        # GPUs of terminating pods are already on their way to the pending work: counting them
        # keeps one shortfall from shrinking a job each round until the pods are gone.
        idle_gpus=idle_gpus(observation),
        free_gpus=max(0.0, observation.cluster_free_gpus),
        short=short,
        needs=needs,
        forecast_reasons=forecast_reasons,
        shares=shares_if_asking(observation, capped),
    )


def _queue_budgets(
    tally: _Tally, *, released: Mapping[QueueName, float] | None
) -> dict[QueueName, QueueBudget]:
    """The elastic budget of every queue the policy manages.

    budget = limit − held by non-elastic work − pending work − headroom, capped by
    the queue's ``maxElasticGpus``. The limit is the queue's capability if it may borrow idle
    GPUs, else the smaller of capability and deserved share.

    A borrowing queue's growth yields to other queues' pending work that the idle GPUs cannot
    start: its limit drops by that shortfall, down to its guarantee or to what its non-elastic
    work and elastic minimums hold. Volcano's proportion plugin sizes deserved shares by what
    each queue requests, so elastic growth raises the growing queue's share at the expense of
    the others'; giving the growth back gracefully is better than the abrupt kill of a reclaim,
    and better than leaving a whole job queued for one more replica's speedup. It gives back
    what starts the most pending jobs, smallest first (Volcano starts whatever fits), and
    nothing when not even the smallest would start: GPUs freed for work they still cannot start
    would sit idle while the queue's jobs run slower. With ``released``, each borrowing queue
    counts what the others' jobs give back this round as idle (``yields``), so that the next
    round, which sees those GPUs terminating, gives nothing more.

    Args:
        tally: the per-queue sums of this decision.
        released: GPUs each queue's elastic jobs give back under earlier budgets of this
            decision (see ``yields``); None before any.

    Returns:
        One budget per managed queue present in the observation.
    """
    gives: Mapping[QueueName, float] = {}
    if tally.spares and tally.short:
        gives = yields(
            tally.spares,
            free=tally.idle_gpus,
            pending=tally.pending,
            needs=tally.needs,
            released=released,
        )
    budgets: dict[QueueName, QueueBudget] = {}
    for queue, queue_policy in tally.managed:
        held_q = tally.held_nonelastic.get(queue.name, 0.0)
        pending_q = tally.pending.get(queue.name, 0.0)
        claimed = pending_q
        if queue_policy.borrow:
            limit = _capability_gpus(queue)
            give = gives.get(queue.name, 0.0)
            if give > 0:
                limit = min(limit, tally.used[queue.name] - give)
                claimed += give
        else:
            limit = min(_capability_gpus(queue), _share_gpus(queue, tally.shares))
        # The forecast is the peak the queue's non-elastic work will request in all; what it
        # holds and what is pending are already set aside.
        forecast = tally.forecast_gpus.get(queue.name, 0.0)
        headroom = queue_policy.headroom.gpus + max(
            0.0, forecast - held_q - queue.pending_nonelastic_gpus
        )
        budget = limit - held_q - pending_q - headroom
        if queue_policy.max_elastic_gpus is not None:
            budget = min(budget, queue_policy.max_elastic_gpus)
        budgets[queue.name] = QueueBudget(
            queue=queue.name,
            elastic_gpus=max(0.0, budget),
            limit_gpus=limit,
            held_nonelastic_gpus=held_q,
            pending_gpus=claimed,
            headroom_gpus=headroom,
            forecast_reason=tally.forecast_reasons.get(queue.name, ""),
        )
    return budgets


@dataclass(frozen=True, slots=True, eq=False)
class Budgets:
    """Everything budget-related one decision needs: the value of the budgets phase.

    Attributes:
        queues: each managed queue's budget.
        growth_pool_gpus: idle GPUs that growth may take, all queues together, after pending
            work and every queue's headroom (``growth_pool_gpus``).
        waiting_pool_gpus: GPUs that replicas already asked for may keep, idle and terminating,
            after the same (``waiting_pool_gpus``).
        trade_queues: the queues where a running replica may move to another job's growth.
        leave_waiting: per job of the table, whether its replicas waiting for GPUs are left as
            asked rather than withdrawn.
        floor: per job of the table, the fewest replicas the allocator may leave it with (the
            rate limit of a job still on the prior's curve).
        gives_back: whether pending work needs more than the idle and terminating GPUs: only
            then does a borrowing queue give GPUs back, and does what others release count.
        tally: the per-queue sums the budgets are made from.
    """

    queues: Mapping[QueueName, QueueBudget]
    growth_pool_gpus: float
    waiting_pool_gpus: float
    trade_queues: frozenset[QueueName]
    leave_waiting: BoolArray
    floor: IntArray
    gives_back: bool
    tally: _Tally

    def after_release(self, released: Mapping[QueueName, float]) -> Budgets:
        """The same budgets, each borrowing queue counting as idle what the other queues' jobs
        give back this round (``released``, GPUs per queue).

        Args:
            released: GPUs each queue's elastic jobs give back under these budgets.

        Returns:
            The budgets recomputed; equal ``queues`` when ``released`` changes nothing.
        """
        queues = _queue_budgets(self.tally, released=released)
        return replace(self, queues=queues, trade_queues=_trade_queues(self.tally, queues))


def plan_budgets(
    observation: Observation,
    policy: ElasticPolicy,
    *,
    table: JobTable,
    forecast_gpus: Mapping[QueueName, float],
    forecast_reasons: Mapping[QueueName, str] | None = None,
    columns: JobColumns | None = None,
) -> Budgets:
    """The budgets phase: every budget of one decision, in one value.

    Args:
        observation: the cluster now.
        policy: the policy in force.
        table: the jobs the allocator plans for (their GPUs are not counted as non-elastic).
        forecast_gpus: forecast peak non-elastic demand per queue (the fit phase's).
        forecast_reasons: per queue, which forecast it follows and why (the fit phase's).
        columns: ``observation.jobs`` as columns, the ones ``table`` was built from
            (``JobTable.from_columns``); None to look at every job one by one.

    Returns:
        The budgets, before anything is known of what the queues give back this round.
    """
    tally = _tally(
        observation,
        policy,
        table=table,
        forecast_gpus=forecast_gpus,
        forecast_reasons=forecast_reasons or {},
        columns=columns,
    )
    queues = _queue_budgets(tally, released=None)
    # Headroom is kept free of every queue's growth, not only its own queue's: a borrowing
    # queue would otherwise take the GPUs a non-elastic queue keeps for its coming work.
    reserved = sum(budget.headroom_gpus for budget in queues.values())
    total_pending = sum(tally.pending.values())
    # The allocator plans within the rate limit of jobs still on the prior's curve: a shrink the
    # damping would hold back must not fund another job's growth or a budget's share.
    floor = np.where(
        table.shaped,
        table.min_replicas,
        np.clip(table.held - policy.defaults.max_step_down, table.min_replicas, table.max_replicas),
    )
    if tally.short:
        floor = _without_infeasible_floors(floor, table, queues)
    return Budgets(
        queues=queues,
        growth_pool_gpus=max(0.0, tally.free_gpus - total_pending - reserved),
        waiting_pool_gpus=max(0.0, tally.idle_gpus - total_pending - reserved),
        trade_queues=_trade_queues(tally, queues),
        leave_waiting=_leave_waiting(table, tally),
        floor=floor,
        gives_back=tally.short,
        tally=tally,
    )


def _without_infeasible_floors(
    floor: IntArray, table: JobTable, queues: Mapping[QueueName, QueueBudget]
) -> IntArray:
    """``floor``, with each job's minimum instead in every queue whose floors alone hold more GPUs
    than its elastic budget, while pending work needs more than the idle and terminating GPUs.

    There, Volcano's reclaim takes what the budget cannot hold: a rate limit that keeps the
    replicas this round only turns a graceful shrink into pods killed a few seconds later (the
    extender's grace window ends before the next round may shrink the job again). A job still
    on the prior's curve then gives back like any other, by the value of its replicas. Both
    abrupt kills tide suffered on the built-in workload (seed 9) and ITP cluster04 (seed 0)
    with the square-root ranking came from here: long-running jobs, whose 24 throughput points
    all lay at the size they held, each gave back 2 replicas of the 8 and 32 GPUs their queue
    owed.
    """
    floor_gpus = np.bincount(
        table.queue_index, weights=floor * table.gpus_per_replica, minlength=len(table.queue_names)
    )
    budget = np.asarray([queues[q].elastic_gpus for q in table.queue_names], dtype=np.float64)
    infeasible = floor_gpus > budget + GPU_EPSILON
    result: IntArray = np.where(infeasible[table.queue_index], table.min_replicas, floor)
    return result


def _leave_waiting(table: JobTable, tally: _Tally) -> BoolArray:
    """Per job, whether replicas waiting for GPUs are left as asked rather than withdrawn.

    They are while pending work claims more than the idle GPUs, all of it in the job's own
    queue: Volcano starts pending gangs before it adds elastic pods, so the waiting replicas take
    nothing from them. Pending work in another queue gets them withdrawn, since they would raise
    their queue's request, and with it the deserved share Volcano's proportion plugin gives it.
    """
    total = sum(tally.pending.values())
    covered = total <= tally.free_gpus  # only then does a GPU one job gives up reach another
    own = np.asarray([tally.pending.get(q, 0.0) for q in table.queue_names], dtype=np.float64)
    per_queue = (total - own <= GPU_EPSILON) & (not covered)
    return per_queue[table.queue_index] if len(table.jobs) else np.zeros(0, dtype=bool)


def _trade_queues(tally: _Tally, budgets: Mapping[QueueName, QueueBudget]) -> frozenset[QueueName]:
    """The queues where a replica one job gives up reaches another job's growth.

    Pending work takes a freed GPU first, and headroom is kept free before growth. Other queues'
    pending work and every queue's headroom must fit the idle GPUs. The queue's own pending work
    must too, unless its budget binds (its elastic jobs hold all of it): then its pending work is
    set aside in the budget and gets its GPUs from the shrinks the budget forces. (Terminating
    GPUs do not count: a second round on the same cluster must not trade where the first did
    not.)
    """
    total = sum(tally.pending.values()) + sum(b.headroom_gpus for b in budgets.values())
    out = set()
    for name, budget in budgets.items():
        binds = tally.held_elastic.get(name, 0.0) >= budget.elastic_gpus - GPU_EPSILON
        if total - (tally.pending.get(name, 0.0) if binds else 0.0) <= tally.free_gpus:
            out.add(name)
    return frozenset(out)
