"""Targets for elastic jobs within queue budgets: a greedy on marginal speedup per GPU.

Pure and vectorised over all jobs at once (numpy), so 10,000 jobs decide in milliseconds.

Each job starts at its minimum. A job's k-th replica is an *increment* worth
``value = (X(k) / X(k−1) − 1) / gpus_per_replica``, its relative speedup per GPU under the job's
fitted scaling curve X. Within a job, values are made non-increasing in k (a running minimum), so
taking increments in order of value never takes a job's (k+1)-th replica before its k-th.

Increments a job already runs (k ≤ current) come first: a running replica is only given up when
its queue's budget cannot hold it, never to make room for another job's growth (that would cost
two restarts for one). Growth increments (k > current) are taken only while the time they save
over the job's expected remaining run exceeds its restart cost, and only from the idle GPUs
left after pending non-elastic work.

Per queue, increments are taken in order while their GPUs fit the budget; the first that does not
fit ends the queue's turn (a prefix, which keeps the greedy vectorisable and never overfills).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_policy.budget import QueueBudget
from scheduler_policy.model import JobState, QueueName, Reason
from scheduler_policy.policy import Defaults
from scheduler_policy.scaling_model import usl_throughput

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# The value of a replica that takes a job from zero to one, or costs no GPUs: always first.
_FIRST_VALUE = 1e12
# Slack for float sums of fractional GPUs.
_GPU_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class JobCurve:
    """A job's fitted scaling curve, X(n) = λn / (1 + σ(n−1) + κn(n−1)).

    Attributes:
        lambda_samples_per_s: λ, throughput of one replica (1.0 when ``measured`` is False).
        sigma: σ, contention.
        kappa: κ, coherency delay.
        measured: whether λ comes from the job's own measurements.
    """

    lambda_samples_per_s: float
    sigma: float
    kappa: float
    measured: bool


@dataclass(frozen=True, slots=True)
class Allocation:
    """The allocator's answer, one entry per job, aligned with its input.

    Attributes:
        targets: replicas per job.
        reasons: why each target is what it is.
        forced: True where a shrink is needed to fit a budget (damping must not delay it).
        gains: predicted relative throughput change of moving from current to target.
        next_gains: relative speedup the next replica above the target would bring.
    """

    targets: IntArray
    reasons: tuple[Reason, ...]
    forced: BoolArray
    gains: FloatArray
    next_gains: FloatArray


def _job_arrays(
    jobs: Sequence[JobState], curves: Sequence[JobCurve], defaults: Defaults
) -> dict[str, FloatArray]:
    def floats(values: list[float]) -> FloatArray:
        return np.asarray(values, dtype=np.float64)

    return {
        "lo": floats([max(j.min_replicas, 0) for j in jobs]),
        "hi": floats([max(j.max_replicas, j.min_replicas, 0) for j in jobs]),
        "cur": floats([j.current_replicas for j in jobs]),
        "gpr": floats([j.gpus_per_replica for j in jobs]),
        "lam": floats([c.lambda_samples_per_s for c in curves]),
        "sig": floats([c.sigma for c in curves]),
        "kap": floats([c.kappa for c in curves]),
        "restart_s": floats(
            [
                defaults.restart_cost_s if j.restart_cost_s is None else j.restart_cost_s
                for j in jobs
            ]
        ),
        "remaining_samples": floats(
            [
                j.remaining_samples if (j.remaining_samples is not None and c.measured) else np.nan
                for j, c in zip(jobs, curves, strict=True)
            ]
        ),
    }


def _curve(a: dict[str, FloatArray], n: FloatArray) -> FloatArray:
    return usl_throughput(a["lam"][:, None], a["sig"][:, None], a["kap"][:, None], n)


def allocate(
    jobs: Sequence[JobState],
    curves: Sequence[JobCurve],
    *,
    budgets: Mapping[QueueName, QueueBudget],
    growth_pool_gpus: float,
    defaults: Defaults,
) -> Allocation:
    """Decide a target for every running elastic job.

    Args:
        jobs: running elastic jobs, each in a queue that ``budgets`` has.
        curves: each job's scaling curve, aligned with ``jobs``.
        budgets: the elastic budget of each queue.
        growth_pool_gpus: idle GPUs that growth beyond current replicas may take, all queues
            together.
        defaults: the policy's defaults (restart cost, assumed remaining time).

    Returns:
        Targets within [min, max] that fit every budget, with reasons.
    """
    count = len(jobs)
    if count == 0:
        empty = np.zeros(0)
        return Allocation(
            np.zeros(0, dtype=np.int64), (), np.zeros(0, dtype=bool), empty, empty.copy()
        )
    a = _job_arrays(jobs, curves, defaults)
    lo, hi, cur, gpr = a["lo"], a["hi"], a["cur"], a["gpr"]
    width = int((hi - lo).max())
    steps = np.arange(1, width + 1, dtype=np.float64)
    k = lo[:, None] + steps[None, :]  # the replica count each increment reaches
    valid = steps[None, :] <= (hi - lo)[:, None]
    x_prev = _curve(a, k - 1)
    x_new = _curve(a, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(x_prev > 0, x_new / x_prev - 1.0, _FIRST_VALUE)
        per_gpu = np.where(gpr[:, None] > 0, gain / gpr[:, None], _FIRST_VALUE)
    value = np.minimum.accumulate(np.where(valid, per_gpu, -np.inf), axis=1)
    existing = k <= cur[:, None]

    # Time saved by the k-th replica over the remaining run, against the restart it costs:
    # remaining work W = T·X(cur) in curve units, saved = W·(1/X(k−1) − 1/X(k)).
    x_cur = _curve(a, np.maximum(cur, 1.0)[:, None])[:, 0]
    remaining_s = np.where(
        np.isfinite(a["remaining_samples"]),
        a["remaining_samples"] / np.where(x_cur > 0, x_cur, np.inf),
        defaults.assumed_remaining_s,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        saved_s = (remaining_s * x_cur)[:, None] * (1.0 / x_prev - 1.0 / x_new)
    saved_s = np.where(x_prev > 0, saved_s, np.inf)
    worth = saved_s > a["restart_s"][:, None]
    useful = valid & (value > 0)
    eligible = np.logical_and.accumulate(useful & (existing | worth), axis=1)

    queue_names = sorted(budgets)
    queue_index = {name: i for i, name in enumerate(queue_names)}
    qidx = np.asarray([queue_index[j.queue] for j in jobs], dtype=np.int64)
    base_gpus = np.bincount(qidx, weights=lo * gpr, minlength=len(queue_names))
    increment_budget = np.asarray([budgets[q].elastic_gpus for q in queue_names]) - base_gpus

    rows, cols = np.nonzero(eligible)
    item_gpus = gpr[rows]
    growth = ~existing[rows, cols]
    order = np.lexsort((cols, rows, -value[rows, cols], growth, qidx[rows]))
    rows, cols, item_gpus, growth = rows[order], cols[order], item_gpus[order], growth[order]
    item_queue = qidx[rows]
    spent = np.cumsum(item_gpus)
    first = np.searchsorted(item_queue, np.arange(len(queue_names)))
    before = np.concatenate(([0.0], spent))  # GPUs spent before each queue's first increment
    spent_in_queue = spent - before[first][item_queue]
    accepted = spent_in_queue <= increment_budget[item_queue] + _GPU_EPSILON

    # Growth across all queues must fit in the idle GPUs, best value first.
    grow = np.nonzero(accepted & growth)[0]
    if len(grow):
        g_order = grow[np.lexsort((cols[grow], rows[grow], -value[rows[grow], cols[grow]]))]
        fits = np.cumsum(item_gpus[g_order]) <= growth_pool_gpus + _GPU_EPSILON
        accepted[g_order[~fits]] = False

    targets = lo + np.bincount(rows[accepted], minlength=count)
    t_int = targets.astype(np.int64)
    reasons, forced = _reasons(jobs, budgets, a, t_int, useful, eligible, existing)
    x_target = _curve(a, np.maximum(targets, 1.0)[:, None])[:, 0]
    x_next = _curve(a, (targets + 1.0)[:, None])[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        gains = np.where(x_cur > 0, x_target / x_cur - 1.0, 0.0)
        next_gains = np.where(x_target > 0, x_next / x_target - 1.0, 0.0)
    next_gains = np.where(targets < hi, next_gains, 0.0)
    return Allocation(t_int, reasons, forced, gains, next_gains)


def _reasons(
    jobs: Sequence[JobState],
    budgets: Mapping[QueueName, QueueBudget],
    a: dict[str, FloatArray],
    targets: IntArray,
    useful: BoolArray,
    eligible: BoolArray,
    existing: BoolArray,
) -> tuple[tuple[Reason, ...], BoolArray]:
    """Why each target is what it is, and which shrinks are forced by a budget."""
    lo, hi, cur = a["lo"], a["hi"], a["cur"]
    width = useful.shape[1]
    if width == 0:  # every job is fixed at one size: nothing to take or give
        useful = eligible = existing = np.zeros((len(jobs), 1), dtype=bool)
        width = 1
    step = (targets - lo).astype(np.int64)  # index of the first increment not taken
    in_range = step < width
    col = np.minimum(step, width - 1)
    row = np.arange(len(jobs))
    next_useful = in_range & useful[row, col]
    next_eligible = in_range & eligible[row, col]
    next_existing = in_range & existing[row, col]
    reasons: list[Reason] = []
    forced = np.zeros(len(jobs), dtype=bool)
    for i, job in enumerate(jobs):
        target, current = int(targets[i]), int(cur[i])
        if target > current:
            below_min = current < lo[i] and target == lo[i]
            reasons.append(Reason.LIMITED_BY_BOUNDS if below_min else Reason.SCALE_UP_FOR_IDLE_GPUS)
        elif target < current:
            if current > hi[i] and target == hi[i]:
                reasons.append(Reason.LIMITED_BY_BOUNDS)
                forced[i] = True
            elif next_existing[i] and not next_useful[i]:
                reasons.append(Reason.SHRINK_LOW_EFFICIENCY)
            else:
                reasons.append(budgets[job.queue].shrink_reason())
                forced[i] = True
        elif next_useful[i] and not next_eligible[i] and not next_existing[i]:
            reasons.append(Reason.RESTART_COST_EXCEEDS_GAIN)
        else:
            reasons.append(Reason.AT_TARGET)
    return tuple(reasons), forced
