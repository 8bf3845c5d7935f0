"""Lower bounds on the average job completion time any policy could reach on a workload.

Two bounds, the second never below the first:

- ``alone_jct_bound_h``: every job alone on the cluster from its submission, at its fastest size,
  never queued, never restarted. It ignores that jobs share the GPUs, so where they contend it
  says little.
- ``jct_lower_bound_h``: a fluid relaxation of the cluster, solved as a linear program. Jobs share
  the cluster's GPUs in every interval of a time grid, and a queue's jobs never hold more than
  its real capability (its capability, never into other queues' guarantees: Volcano's, which
  no policy changes). Each job may run at any mix of its sizes (or wait) from its submission
  on, preempted and resized for free. Its GPU cost for a rate is the least its profile allows
  (the concave envelope of rate against GPUs, from idle). Each job finishes no earlier than the
  work-weighted mean of the times its work is done plus half its fastest run time (work done at
  most at the fastest rate ends at least that long after its mean: the mean-busy-time
  relaxation of single-machine scheduling), and no earlier than its fastest run alone. Work
  done in an interval counts as done at the interval's start; work past the grid counts as done
  at its end, with no GPU limit. Each of these relaxes what a real cluster, and the simulator,
  allow (no gangs, no deserved shares, no placement, no restart cost), so no policy beats the
  bound.

The grid is as fine as ``max_variables`` allows, so the bound is a little looser on workloads
with many jobs; it is valid at any resolution.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix, vstack

from simulations.cluster_config import ClusterSpec
from simulations.workload import Workload, WorkloadJob

logger = logging.getLogger(__name__)

DEFAULT_MAX_VARIABLES = 50_000
"""The linear program's size for the CLI: about 0.2 s on a built-in or Pollux workload, 2-5% below
the bound on a grid of 1,000,000 variables (``benchmarks/bound_resolution.py``)."""

MAX_INTERVALS = 2_000
"""The finest grid: a workload of few jobs needs no more intervals than this."""

SOLVE_LIMIT_S = 5.0
"""Seconds each of the two solvers may take before the bound falls back (``jct_lower_bound_h``)."""

MAX_VARIABLES_PER_JOB = 1_500
"""The grid's cells per job at most: a workload of a few jobs on the whole ``max_variables``
grid took the dual simplex 6 s for 6 jobs (0.4 s at this many, and a bound 0.2% looser): each
job's cells share its completion row, which the simplex pivots on again and again."""

MIN_CELLS_PER_JOB = 4
"""Below this many grid cells per job the grid is too coarse to say much more than the alone bound
(on the whole Philly list, 82,247 jobs, it said nothing more, after seconds of solving), so the
alone bound is returned at once: every job alone at its fastest size within its queue's ceiling."""


def _sizes(job: WorkloadJob, gpus: int) -> range:
    """The replica counts ``job`` may run at when it may hold at most ``gpus`` GPUs."""
    fitting = min(job.max_replicas, gpus // job.gpus_per_replica)
    if fitting < job.min_replicas:  # never fits: the bound treats it as if it did
        return range(job.min_replicas, job.max_replicas + 1)
    return range(job.min_replicas, fitting + 1)


def _fastest_s(job: WorkloadJob, sizes: range) -> float:
    """Seconds ``job`` takes alone at its fastest size among ``sizes``."""
    return job.work_units / max(job.profile.rate(n) for n in sizes)


def alone_jct_bound_h(workload: Workload) -> float:
    """The average JCT, hours, if every job ran alone from its submission at its fastest size.

    Each job at its fastest size within [min, max], with no queueing and no restart: no scheduler
    beats it, whatever the cluster.

    Args:
        workload: the jobs.

    Returns:
        The bound; NaN for an empty workload.
    """
    if not workload.jobs:
        return math.nan
    bounds = [
        _fastest_s(job, range(job.min_replicas, job.max_replicas + 1)) for job in workload.jobs
    ]
    return float(np.mean(bounds)) / 3600.0


def _envelope(job: WorkloadJob, sizes: range) -> list[tuple[float, float]]:
    """The job's cheapest GPU cost for each rate, as steps from idle.

    Returns:
        ``(rate, gpus_per_rate)`` per step, in order: the step adds up to ``rate`` work units
        per second, each costing ``gpus_per_rate`` GPUs. The steps trace the upper concave
        envelope of the points (0 GPUs, rate 0) and (GPUs, rate) of each size, so their costs
        rise from one step to the next.
    """
    points = [(0.0, 0.0)] + [(float(n * job.gpus_per_replica), job.profile.rate(n)) for n in sizes]
    hull: list[tuple[float, float]] = [points[0]]
    for gpus, rate in sorted(points[1:]):
        if rate <= hull[-1][1]:
            continue  # more GPUs for no more speed: never the cheapest way to a rate
        while len(hull) >= 2:
            (g1, r1), (g2, r2) = hull[-2], hull[-1]
            if (r2 - r1) * (gpus - g1) <= (rate - r1) * (g2 - g1):
                hull.pop()  # the last point lies on or under the chord to the new one
            else:
                break
        hull.append((gpus, rate))
    return [(r2 - r1, (g2 - g1) / (r2 - r1)) for (g1, r1), (g2, r2) in itertools.pairwise(hull)]


def jct_lower_bound_h(
    workload: Workload,
    cluster: ClusterSpec,
    *,
    max_variables: int = DEFAULT_MAX_VARIABLES,
    solve_limit_s: float = SOLVE_LIMIT_S,
) -> float:
    """The least average JCT, hours, any policy could reach on ``workload`` (module docstring).

    Args:
        workload: the jobs.
        cluster: its GPUs, and each queue's real capability: the most GPUs the queue's pods
            can hold, whatever the policy.
        max_variables: the linear program's size, which sets the time grid's resolution.
        solve_limit_s: how long the dual simplex may take, then the interior-point method (each
            faster on some programs: the simplex on most workloads, the interior point where
            many jobs are alike); the alone bound when neither finishes in time.

    Returns:
        The bound, never below ``alone_jct_bound_h``; NaN for an empty workload.
    """
    jobs = workload.jobs
    if not jobs:
        return math.nan
    total_gpus = cluster.total_gpus
    ceilings = cluster.real_capability(float(total_gpus))
    queues = [job.queue or cluster.default_queue(elastic=job.elastic) for job in jobs]
    # A job never holds more than its queue may (never more than the cluster's GPUs).
    sizes = [_sizes(job, int(ceilings[q])) for job, q in zip(jobs, queues, strict=True)]
    fastest = np.array([_fastest_s(job, s) for job, s in zip(jobs, sizes, strict=True)])
    # Every job alone, at its fastest size within its queue's ceiling: the bound when the
    # program cannot be solved, and a floor under the program's answer.
    alone = float(np.mean(fastest)) / 3600.0
    if len(jobs) * MIN_CELLS_PER_JOB > max_variables:
        logger.info("%d jobs are too many for a %d-variable grid: the alone bound",
                    len(jobs), max_variables)  # fmt: skip
        return alone
    max_variables = min(max_variables, MAX_VARIABLES_PER_JOB * len(jobs))
    steps = [_envelope(job, s) for job, s in zip(jobs, sizes, strict=True)]
    submit = np.array([job.submit_s for job in jobs])
    # The grid runs from the first submission to the last one plus the time the cluster needs
    # for all the work at its cheapest. Work past it still counts, as done at its end, so where
    # the grid ends sets only how tight the bound is, not whether it holds.
    least_gpu_s = sum(
        min(job.work_units / job.profile.rate(n) * n * job.gpus_per_replica for n in s)
        for job, s in zip(jobs, sizes, strict=True)
    )
    start, end = float(submit.min()), float(submit.max()) + least_gpu_s / total_gpus
    cells = sum((end - t) * len(st) for t, st in zip(submit, steps, strict=True))
    step_s = max(cells / max_variables, (end - start) / MAX_INTERVALS, 1e-9)
    edges = np.append(np.arange(start, end, step_s), end)
    # The whole cluster's GPUs bound every job's; a queue's ceiling its own jobs', where lower.
    pools = [(np.ones(len(jobs), dtype=bool), float(total_gpus))] + [
        (np.array([q == name for q in queues]), cap)
        for name, cap in ceilings.items()
        if cap < total_gpus
    ]
    solved = _solve(jobs, steps, submit, fastest, edges, pools, solve_limit_s)
    if solved is None:
        return alone
    return max(solved, alone)


def jct_lower_bounds_h(workloads: Sequence[Workload], cluster: ClusterSpec) -> list[float]:
    """``jct_lower_bound_h`` of each workload, solving a workload given more than once (the
    same object, as a trace at several seeds is) once."""
    solved: dict[int, float] = {}
    for workload in workloads:
        if id(workload) not in solved:
            solved[id(workload)] = jct_lower_bound_h(workload, cluster)
    return [solved[id(workload)] for workload in workloads]


def _solve(
    jobs: Sequence[WorkloadJob],
    steps: Sequence[list[tuple[float, float]]],
    submit: np.ndarray,
    fastest: np.ndarray,
    edges: np.ndarray,
    pools: Sequence[tuple[np.ndarray, float]],
    limit_s: float,
) -> float | None:
    """The linear program of ``jct_lower_bound_h``; None if no solver finds its optimum in time
    (only the optimum is a bound: any other point's value may lie above it).

    Variables, each a share of one job's work: one per (job, interval from its submission on,
    envelope step), bounded by what that step's rate does in the interval; one per job for work
    past the grid; then each job's completion time after its submission, hours. ``pools`` are
    (jobs, GPUs): the GPU-hours those jobs use in an interval fit in that many GPUs.
    """
    intervals = len(edges) - 1
    n_jobs = len(jobs)
    # Per grid variable: its interval, column and GPU-hours per share.
    at, columns, gpu_h = [], [], []
    # Per variable, tails included: delay after submission (h), upper bound, job.
    delay_h, upper, owner = [], [], []
    column = 0
    for j, (job, job_steps) in enumerate(zip(jobs, steps, strict=True)):
        first = max(0, int(np.searchsorted(edges, submit[j], side="right")) - 1)
        begins = np.maximum(edges[first:intervals], submit[j])
        lengths = edges[first + 1 :] - begins
        keep = lengths > 0
        index, begins, lengths = np.arange(first, intervals)[keep], begins[keep], lengths[keep]
        for rate, gpus_per_rate in job_steps:
            n = len(index)
            at.append(index)
            columns.append(np.arange(column, column + n))
            gpu_h.append(np.full(n, job.work_units * gpus_per_rate / 3600.0))
            delay_h.append((begins - submit[j]) / 3600.0)
            upper.append(rate * lengths / job.work_units)
            owner.append(np.full(n, j))
            column += n
        # Work past the grid: done at its end at the earliest, on GPUs the grid does not count.
        delay_h.append(np.array([max(edges[-1] - submit[j], 0.0) / 3600.0]))
        upper.append(np.array([1.0]))
        owner.append(np.array([j]))
        column += 1
    shares = column
    width = shares + n_jobs
    at_, columns_, gpu_h_ = map(np.concatenate, (at, columns, gpu_h))
    job_of = np.concatenate(owner)
    rows, limits = [], []
    for members, gpus in pools:
        mine = members[job_of[columns_]]
        rows.append(
            coo_matrix((gpu_h_[mine], (at_[mine], columns_[mine])), shape=(intervals, width))
        )
        limits.append(np.diff(edges) * gpus / 3600.0)
    # Completion ≥ mean time of the job's work + half its fastest run:
    # Σ share·delay − completion ≤ −fastest/2.
    rows.append(
        coo_matrix(
            (
                np.concatenate([*delay_h, -np.ones(n_jobs)]),
                (np.concatenate([job_of, np.arange(n_jobs)]), np.arange(width)),
            ),
            shape=(n_jobs, width),
        )
    )
    limits.append(-fastest / 2 / 3600.0)
    # Every job's shares add up to all of its work.
    a_eq = csr_matrix((np.ones(shares), (job_of, np.arange(shares))), shape=(n_jobs, width))
    bounds = np.column_stack(
        [
            np.concatenate([np.zeros(shares), fastest / 3600.0]),
            np.concatenate([*upper, np.full(n_jobs, np.inf)]),
        ]
    )
    cost = np.concatenate([np.zeros(shares), np.full(n_jobs, 1.0 / n_jobs)])
    a_ub, b_ub = vstack(rows).tocsr(), np.concatenate(limits)
    for method in ("highs-ds", "highs-ipm"):
        result = linprog(
            cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(n_jobs), bounds=bounds,
            method=method, options={"time_limit": limit_s},
        )  # fmt: skip
        if result.status == 0:
            return float(result.fun)
        logger.info("the JCT bound's %s solver stopped: %s", method, result.message)
    logger.warning("no solver found the JCT bound in %g s each; using the alone bound", limit_s)
    return None
