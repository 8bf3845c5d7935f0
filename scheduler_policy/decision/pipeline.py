"""``decide``: the decision core, in named phases, from an observation to decisions and writes.

The phases, each one call returning a small value:

1. fit (``ModelCache.fit``, run by the caller before ``decide``: the only stateful step) → ``Fits``
2. triage (``triage``) → the jobs to plan for, and a held decision for each of the others
3. budgets (``plan_budgets``) → ``Budgets``
4. allocate (``allocate``) → ``Allocation``
5. stabilize (``_damp``, the damping chain of ``stabilize``) → ``Stabilized``
6. placement (``reshape``, only while a gang waits and placement is known) → ``Reshaped``
7. changes (``_decisions_and_changes``) → the decisions and the writes

Allocate and stabilize repeat under one fixed-point rule (``settle``). Pure: ``now`` is the
observation's time.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import cast

import numpy as np

from scheduler_policy.decision.allocate import Allocation, allocate
from scheduler_policy.decision.budget import Budgets, QueueBudget, plan_budgets
from scheduler_policy.decision.job_table import BoolArray, IntArray, JobTable
from scheduler_policy.decision.messages import (
    DecisionBatch,
    gang_fit_message,
    not_measured_message,
)
from scheduler_policy.decision.placement import GangFit
from scheduler_policy.decision.reshape import Reshaped, reshape
from scheduler_policy.decision.stabilize import DAMPING_STEPS, Stabilized, stabilize
from scheduler_policy.decision.triage import (
    NOT_MEASURED,
    read_columns,
    stale_hold_message,
    triage,
)
from scheduler_policy.models.cache import Fits
from scheduler_policy.models.curve import CurveColumns, JobCurve
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.protocols import ReplicaChange
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobState,
    Observation,
    QueueName,
    Reason,
    ScalingDecision,
    Sentence,
)

logger = logging.getLogger(__name__)

# The most rounds of allocate → stabilize one decision runs (see ``settle``): the second sees
# what the first gave back in whole replicas; a third is rare.
MAX_PASSES = 3


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``decide`` returns: a decision per elastic job and the writes it implies.

    Attributes:
        decisions: one per elastic job (and per invalid job), sorted by job key.
        changes: the writes: replicas that move, or memory that changed.
        passes: rounds of allocate → stabilize it took to settle (``settle``), 0 when no job
            was planned for.
        budgets: each managed queue's budget as the decisions used it (the last pass's).
        forecast_gpus: each managed queue's forecast peak non-elastic demand, GPUs.
        forecast_reasons: per queue with a forecast, which forecast it follows and why.
        gangs: per pending gang, oldest first, whether its pods fit the nodes after the
            targets and what that took (``gang_fit_message`` says it); empty when placement
            is unknown or no gang waits.
    """

    decisions: tuple[ScalingDecision, ...]
    changes: tuple[ReplicaChange, ...]
    passes: int = 0
    budgets: Mapping[QueueName, QueueBudget] = field(default_factory=dict)
    forecast_gpus: Mapping[QueueName, float] = field(default_factory=dict)
    forecast_reasons: Mapping[QueueName, str] = field(default_factory=dict)
    gangs: tuple[GangFit, ...] = ()


@dataclass(frozen=True, slots=True)
class Settled:
    """The allocation and its damped targets, under the budgets they settled on.

    Attributes:
        budgets: the budgets of the last pass.
        allocation: the allocator's answer under them.
        stabilized: the allocation through the damping chain.
        passes: how many rounds of allocate → stabilize it took.
    """

    budgets: Budgets
    allocation: Allocation
    stabilized: Stabilized
    passes: int


def decide(observation: Observation, policy: ElasticPolicy, *, fits: Fits) -> Plan:
    """Decide and stabilize a target for every elastic job.

    Args:
        observation: the cluster now (its ``time_s`` is the decision time).
        policy: the policy in force.
        fits: the fit phase's curves and forecasts for this observation (``ModelCache.fit``).

    Returns:
        The decisions and the writes they imply.
    """
    columns = read_columns(observation, policy)
    ready, held, stale, rows = triage(observation, policy, columns=columns)
    rows, curves, unfitted = _with_curves(ready, rows, fits, keys=columns.keys)
    table = JobTable.from_columns(
        columns, rows, curves, default_restart_cost_s=policy.defaults.restart_cost_s
    )
    budgets = plan_budgets(
        observation,
        policy,
        table=table,
        forecast_gpus=fits.forecast_gpus,
        forecast_reasons=fits.forecast_reasons,
        columns=columns,
    )
    stale_rows = (
        np.fromiter((job.key in stale for job in table.jobs), dtype=bool, count=len(table.jobs))
        if stale
        else None
    )
    settled = settle(table, budgets, policy=policy, now_s=observation.time_s, stale=stale_rows)
    reshaped = None
    if observation.pending_gangs:  # the one check a round without pending gangs pays
        reshaped = reshape(
            observation,
            table,
            settled.stabilized,
            floor=budgets.floor,
            stale=_stale_measured(table, stale),
            policy=policy,
        )
        if reshaped is not None:
            _log_gangs(reshaped.gangs)
    decisions, changes = _decisions_and_changes(table, settled, policy=policy, reshaped=reshaped)
    if stale:
        _hold_stale(table, stale, decisions, changes)
    decisions = sorted([*decisions, *held, *unfitted], key=itemgetter(0))  # by job key
    passes = settled.passes if table.jobs else 0
    return Plan(
        decisions=tuple(decisions),
        changes=tuple(changes),
        passes=passes,
        budgets=dict(settled.budgets.queues),
        forecast_gpus=dict(fits.forecast_gpus),
        forecast_reasons=dict(fits.forecast_reasons),
        gangs=reshaped.gangs if reshaped is not None else (),
    )


def _log_gangs(gangs: Sequence[GangFit]) -> None:
    """One line per pending gang that needed a further shrink or cannot be placed."""
    if logger.isEnabledFor(logging.INFO):
        for fit in gangs:
            if fit.shrunk or not fit.fits:
                logger.info("gang %s: %s", fit.gang.key, gang_fit_message(fit))


def _with_curves(
    ready: Sequence[JobState], rows: IntArray, fits: Fits, *, keys: Sequence[JobKey]
) -> tuple[IntArray, CurveColumns, list[ScalingDecision]]:
    """The rows of the jobs that have a curve, their curves as columns, and a held decision for
    each of the others (``keys``: every job's key, ``rows`` index it)."""
    if len(rows) < len(keys):
        keys = list(map(keys.__getitem__, rows.tolist()))
    found = list(map(fits.curves.get, keys))
    if all(found):  # the steady state (a curve is always true): one lookup per job, no more
        return rows, CurveColumns.of(cast(list[JobCurve], found)), []
    curves, kept, held = [], [], []
    for job, row, curve in zip(ready, rows.tolist(), found, strict=True):
        if curve is not None:
            kept.append(row)
            curves.append(curve)
            continue
        why = fits.failures.get(job.key, f"job {job.key}: no scaling curve was fitted for it")
        held.append(
            ScalingDecision(
                job.key,
                job.current_replicas,
                job.current_replicas,
                Reason.MODEL_FIT_FAILED,
                Sentence(f"{why}; holding replicas until a fit succeeds"),
            )
        )
    return np.asarray(kept, dtype=np.int64), CurveColumns.of(curves), held


def settle(
    table: JobTable,
    budgets: Budgets,
    *,
    policy: ElasticPolicy,
    now_s: float,
    stale: BoolArray | None = None,
) -> Settled:
    """Allocate and stabilize under budgets that count what the queues give back this round.

    The fixed-point rule: a borrowing queue gives GPUs back to other queues' pending work, and
    counts as idle what the other queues' jobs give back this round (the next round sees those
    GPUs terminating, and must find nothing more to give). The budgets are therefore a function
    of the stabilized targets, which are a function of the budgets. Starting from budgets that
    count nothing given back, each pass allocates, stabilizes, and recomputes the budgets with
    the GPUs each queue's targets give back; it stops when the budgets come out the same (a
    fixed point), when no queue gives anything back (pending work fits the idle GPUs: released
    GPUs change no budget), or after ``MAX_PASSES`` passes (replicas come in whole GPUs, so the
    budgets need not settle; the last pass's answer stands, and the next round starts from what
    it did).

    Args:
        table: the jobs planned for.
        budgets: the budgets phase's value, before anything is given back.
        policy: the policy in force.
        now_s: the decision time.
        stale: per job, whether its own metrics are stale (``allocate``'s ``stale``); None
            for none.

    Returns:
        The last pass's budgets, allocation and damped targets, and the passes taken.
    """
    # Jobs the damping holds in place this round unless a budget forces them: no trade takes
    # a replica from them (it would not be given up, and the taker would overfill the budget).
    since_s = now_s - table.last_rescale_s  # NaN (never rescaled) compares False
    cooling = since_s < max(policy.defaults.cooldown_s, policy.interval_s)
    passes = 0
    while True:
        passes += 1
        allocation = allocate(
            table,
            budgets=budgets.queues,
            growth_pool_gpus=budgets.growth_pool_gpus,
            waiting_pool_gpus=budgets.waiting_pool_gpus,
            defaults=policy.defaults,
            objective=policy.objective,
            trade_queues=budgets.trade_queues,
            floor=budgets.floor,
            cooling=cooling,
            stale=stale,
            now_s=now_s,
        )
        stabilized = _damp(table, allocation, budgets, policy=policy, now_s=now_s)
        if passes == MAX_PASSES or not budgets.gives_back:
            break
        again = budgets.after_release(_released_gpus(table, stabilized))
        if again.queues == budgets.queues:
            break
        budgets = again
    return Settled(budgets, allocation, stabilized, passes)


def _released_gpus(table: JobTable, stabilized: Stabilized) -> dict[QueueName, float]:
    """GPUs each queue's jobs give back under the damped targets (whole replicas)."""
    gone = np.maximum(table.held - stabilized.targets, 0) * table.gpus_per_replica
    per_queue = np.bincount(table.queue_index, weights=gone, minlength=len(table.queue_names))
    return dict(zip(table.queue_names, per_queue.tolist(), strict=True))


def _damp(
    table: JobTable,
    allocation: Allocation,
    budgets: Budgets,
    *,
    policy: ElasticPolicy,
    now_s: float,
) -> Stabilized:
    """The allocator's targets through the damping chain."""
    # Withdrawing replicas that still wait for GPUs restarts nothing, so it is not damped: the
    # damping chain starts from what the allocator keeps of them. Not within an interval of the
    # job's last rescale, though: pods tide itself just added may not be bound yet.
    spec, held, wanted = table.current, table.held, allocation.targets
    recent = (now_s - table.last_rescale_s) < policy.interval_s  # NaN (never) compares False
    kept = (wanted >= held) & budgets.leave_waiting
    wanted = np.where(kept, np.maximum(wanted, spec), wanted)
    start = np.where(recent | kept, spec, np.clip(wanted, held, spec))
    return stabilize(
        current=start,
        recommended=wanted,
        gains=allocation.gains,
        forced=allocation.forced,
        min_replicas=table.min_replicas,
        max_replicas=table.max_replicas,
        last_rescale_s=table.last_rescale_s,
        recommendations=list(map(attrgetter("recommendations"), table.jobs)),
        defaults=policy.defaults,
        interval_s=policy.interval_s,
        now_s=now_s,
        # The rate limit guards predictions from the prior; a job measured at two sizes or more
        # moves to its target at once (each change restarts it whatever the step).
        rate_limited=~table.shaped,
        # A second forced shrink within the interval only while pending work is short of the
        # idle and releasing GPUs; a job on the prior's curve shrinks by its rate limit a round.
        unmet=(table.shaped & budgets.gives_back) if budgets.gives_back else None,
    )


def _decisions_and_changes(
    table: JobTable,
    settled: Settled,
    *,
    policy: ElasticPolicy,
    reshaped: Reshaped | None = None,
) -> tuple[list[ScalingDecision], list[ReplicaChange]]:
    """The changes phase: a decision per planned job, and a write where anything changed."""
    allocation = settled.allocation
    result = settled.stabilized if reshaped is None else reshaped.stabilized
    spec, held = table.current, table.held
    targets = result.targets.tolist()
    reasons = list(allocation.reasons)
    for i in np.flatnonzero(result.held_step >= 0).tolist():  # held back by a damping step
        reasons[i] = DAMPING_STEPS[int(result.held_step[i])]
    for i in np.flatnonzero((result.targets < spec) & (result.targets >= held)).tolist():
        reasons[i] = Reason.WITHDRAW_UNPLACED
    shaped = reshaped.explanations if reshaped is not None else {}
    for i in shaped:
        reasons[i] = Reason.SHRINK_FOR_GANG_SHAPE
    batch = DecisionBatch(
        reasons=reasons,
        jobs=table.jobs,
        targets=targets,
        recommended=allocation.targets.tolist(),
        gains=allocation.gains.tolist(),
        next_gains=allocation.next_gains.tolist(),
        budgets=settled.budgets.queues,
        measured=table.measured.tolist(),
        defaults=policy.defaults,
        goodput=table.goodput,
    )
    # ``_make``, the NamedTuple's constructor from a row: 10,000 in 3/4 of the time of its call
    rows = zip(table.keys, table.current.tolist(), targets, reasons, repeat(batch))
    decisions = list(map(ScalingDecision._make, rows))
    for i, why in shaped.items():
        decisions[i] = decisions[i]._replace(why=why)
    written = np.flatnonzero(result.memory_changed | (result.targets != spec)).tolist()
    changes = [
        ReplicaChange(
            job=decisions[i].job,
            task=table.jobs[i].task,
            from_replicas=decisions[i].current_replicas,
            to_replicas=decisions[i].target_replicas,
            memory=memory,
            reason=decisions[i].reason,
            why=decisions[i].why,
        )
        for i, memory in zip(written, result.memories(written), strict=True)
    ]
    if logger.isEnabledFor(logging.INFO):
        for change in changes:
            if change.to_replicas != change.from_replicas:
                logger.info(
                    "job %s: %d -> %d %s: %s",
                    change.job,
                    change.from_replicas,
                    change.to_replicas,
                    change.reason.value,
                    change.message,
                )
    return decisions, changes


def _stale_measured(table: JobTable, stale: Mapping[JobKey, str]) -> BoolArray | None:
    """Per job, whether its measured throughput is stale: the jobs a gang's shape may not shrink
    beyond their budget. A job never measured is not among them: it has no stale figure to
    doubt, only none yet, and freeing whole nodes for a gang asks nothing of its curve (on
    Volcano's spread order such a job held the gang out until reclaim killed its pods)."""
    rows = [stale.get(job.key) not in (None, NOT_MEASURED) for job in table.jobs]
    return np.array(rows, dtype=bool) if any(rows) else None


def _hold_stale(
    table: JobTable,
    stale: Mapping[JobKey, str],
    decisions: list[ScalingDecision],
    changes: list[ReplicaChange],
) -> None:
    """Say ``HoldMetricsStale`` (``HoldNotMeasured`` for a job never measured) for each job
    with stale metrics that keeps its replicas.

    ``decisions`` (aligned with ``table.jobs``) and ``changes`` are updated in place. A stale
    job's other decisions stand: the shrinks its budget forces, a move into its bounds, and
    the withdrawal of replicas still waiting for GPUs (which stops no worker).
    """
    where = {change.job: i for i, change in enumerate(changes)}
    for i, job in enumerate(table.jobs):
        reason = stale.get(job.key)
        if reason is None or decisions[i].changes:
            continue
        code = Reason.HOLD_METRICS_STALE
        why = Sentence(stale_hold_message(job, reason))
        if job.stale_reason is None:  # in ``stale`` for no throughput point at all (triage)
            code, why = Reason.HOLD_NOT_MEASURED, Sentence(not_measured_message(job))
        decisions[i] = ScalingDecision(
            job.key, job.current_replicas, job.current_replicas, code, why
        )
        at = where.get(job.key)
        if at is not None:  # a memory-only write
            changes[at] = dataclasses.replace(changes[at], reason=code, why=why)
