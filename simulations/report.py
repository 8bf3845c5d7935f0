"""What a run is worth: JCT, queueing delay, utilization, restarts and lost work, as one summary."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from simulations.run import RunOptions, SimResult
from simulations.workload import Workload

ORACLE_POLICIES = frozenset({"optimus"})
"""Policies handed what production cannot know: ``optimus`` reads every job's true scaling curve
and true remaining work."""


def policy_label(policy: str) -> str:
    """A policy's name as tables print it: an oracle says so (``optimus (oracle)``)."""
    return f"{policy} (oracle)" if policy in ORACLE_POLICIES else policy


def remaining_work_known_share(workload: Workload, options: RunOptions) -> float:
    """The share of a workload's elastic jobs whose remaining work reaches tide's engine: those
    that declare their planned samples (``WorkloadJob.declares_planned_samples``), none when
    the run hides declared work (``MetricsOptions.declared_work``). NaN without elastic jobs.

    Args:
        workload: the jobs.
        options: the run's options.

    Returns:
        A share in [0, 1], or NaN.
    """
    elastic = [job for job in workload.jobs if job.elastic]
    if not elastic:
        return math.nan
    if not options.metrics.declared_work:
        return 0.0
    return sum(job.declares_planned_samples for job in elastic) / len(elastic)


@dataclass(frozen=True, slots=True)
class Summary:
    """A run's figures. Times in hours unless the name says otherwise; NaN when undefined.

    Attributes:
        policy: the policy's name.
        workload: the workload's name.
        jobs: jobs in the workload.
        finished: jobs that finished.
        avg_jct_h / median_jct_h / p95_jct_h / p99_jct_h: job completion time (submit to end).
        max_jct_h: the longest job's completion time. With fewer than a few hundred jobs the
            p99 is interpolated between the two or three longest, so a policy that evens out
            its longest jobs can show a higher p99 than one that leaves one far behind.
        avg_queue_h / p95_queue_h: queueing delay (submit to first start), all jobs.
        p95_queue_nonelastic_h / avg_queue_nonelastic_h: the same for non-elastic jobs only.
        queue_delay_by_queue_h: average queueing delay per queue.
        makespan_h: first submission to last completion.
        gpu_allocation: GPU-seconds held by pods / (GPUs x makespan).
        useful_utilization: speedup-weighted progress GPU-seconds / (GPUs x makespan).
        rescales: membership changes after first start, all jobs.
        kills: abrupt pod kills.
        late_pods: of the rescales, those that grew a job to at most its requested size
            (``JobRecord.late_pods``): under a policy that never resizes (``static``), all of
            its rescales are these, Volcano placing pods above ``minAvailable`` as GPUs free.
        restart_gpu_hours: GPU-hours held while restarting.
        killed_gpu_hours: GPU-hours of work lost to abrupt kills.
        guaranteed_wait_minutes: queue-minutes when a queue's waiting work fit in its share but
            the GPUs were held by other queues.
        idle_while_waiting_gpu_hours: GPU-hours of healthy GPUs left idle while some job waited
            to start: what the scheduler's rules (queue shares, gangs, placement, the enqueue
            gate) and the policy left unused although there was work.
        work_done_ratio: work done / work asked (1 when every job finished).
        skipped_rows: bad trace rows skipped.
        wall_s: wall-clock seconds of the run.
        node_failures / node_down_hours: injected node failures during the run, and the
            node-hours they took down.
        metrics_outages / metrics_outage_minutes: injected metrics outages during the run.
        node_order: where the scheduler put each pod (spread: Volcano's default; binpack):
            the figures depend on it.
        batch_model: how the jobs' work was counted (``SimResult.batch_model``):
            ``adaptive`` (progress at the batch the workers chose) or ``submitted``.
    """

    policy: str
    workload: str
    jobs: int
    finished: int
    avg_jct_h: float
    median_jct_h: float
    p95_jct_h: float
    p99_jct_h: float
    max_jct_h: float
    avg_queue_h: float
    p95_queue_h: float
    avg_queue_nonelastic_h: float
    p95_queue_nonelastic_h: float
    queue_delay_by_queue_h: dict[str, float]
    makespan_h: float
    gpu_allocation: float
    useful_utilization: float
    rescales: int
    kills: int
    restart_gpu_hours: float
    killed_gpu_hours: float
    guaranteed_wait_minutes: float
    idle_while_waiting_gpu_hours: float
    work_done_ratio: float
    skipped_rows: int
    wall_s: float
    node_failures: int = 0
    node_down_hours: float = 0.0
    metrics_outages: int = 0
    metrics_outage_minutes: float = 0.0
    late_pods: int = 0
    node_order: str = "spread"
    batch_model: str = "submitted"

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready dict (NaN becomes None)."""
        out = asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def _stat(values: Sequence[float], kind: str) -> float:
    if not values:
        return math.nan
    arr = np.asarray(values, dtype=float)
    if kind == "mean":
        return float(arr.mean())
    return float(np.percentile(arr, {"median": 50, "p95": 95, "p99": 99}[kind]))


def summarize(result: SimResult) -> Summary:
    """Compute the figures of one run.

    Args:
        result: the run.

    Returns:
        Its summary.
    """
    h = 3600.0
    done = [j for j in result.jobs if j.end_s is not None]
    jct = [(j.end_s - j.submit_s) / h for j in done if j.end_s is not None]
    # A job still waiting when the run stopped has waited until then (at least); one submitted
    # after a --horizon cut the run short never entered it, and has no queueing delay.
    entered = [j for j in result.jobs if j.submit_s <= result.end_s]
    queued = [
        ((j.start_s if j.start_s is not None else result.end_s) - j.submit_s) / h for j in entered
    ]
    nonelastic = [q for q, j in zip(queued, entered, strict=True) if not j.elastic]
    by_queue: dict[str, list[float]] = {}
    for q, j in zip(queued, entered, strict=True):
        by_queue.setdefault(j.queue, []).append(q)
    first = min((j.submit_s for j in result.jobs), default=0.0)
    last = max((j.end_s for j in done if j.end_s is not None), default=result.end_s)
    span = max(last - first, 1e-9)
    capacity = result.total_gpus * span
    asked = sum(j.work_units for j in result.jobs)
    return Summary(
        policy=result.policy,
        workload=result.workload,
        jobs=len(result.jobs),
        finished=len(done),
        avg_jct_h=_stat(jct, "mean"),
        median_jct_h=_stat(jct, "median"),
        p95_jct_h=_stat(jct, "p95"),
        p99_jct_h=_stat(jct, "p99"),
        max_jct_h=max(jct, default=math.nan),
        avg_queue_h=_stat(queued, "mean"),
        p95_queue_h=_stat(queued, "p95"),
        avg_queue_nonelastic_h=_stat(nonelastic, "mean"),
        p95_queue_nonelastic_h=_stat(nonelastic, "p95"),
        queue_delay_by_queue_h={k: _stat(v, "mean") for k, v in sorted(by_queue.items())},
        makespan_h=span / h,
        gpu_allocation=result.alloc_gpu_s / capacity,
        useful_utilization=result.effective_gpu_s / capacity,
        rescales=sum(j.rescales for j in result.jobs),
        kills=sum(j.kills for j in result.jobs),
        late_pods=sum(j.late_pods for j in result.jobs),
        restart_gpu_hours=sum(j.restart_gpu_s for j in result.jobs) / h,
        killed_gpu_hours=sum(j.killed_gpu_s for j in result.jobs) / h,
        guaranteed_wait_minutes=sum(result.blocked_queue_s.values()) / 60.0,
        idle_while_waiting_gpu_hours=result.idle_waiting_gpu_s / h,
        work_done_ratio=sum(j.done_units for j in result.jobs) / asked if asked else 1.0,
        skipped_rows=result.skipped_rows,
        wall_s=result.wall_s,
        node_failures=result.node_failures,
        node_down_hours=result.node_down_s / h,
        metrics_outages=result.metrics_outages,
        metrics_outage_minutes=result.metrics_outage_s / 60.0,
        node_order=result.node_order,
        batch_model=result.batch_model,
    )


JOB_COLUMNS = (
    "policy",
    "seed",
    "job",
    "queue",
    "elastic",
    "requested_gpus",
    "submit_h",
    "start_h",
    "end_h",
    "queueing_h",
    "jct_h",
    "peak_replicas",
    "rescales",
    "kills",
    "restart_gpu_h",
    "killed_gpu_h",
    "work_done",
)
"""The columns of ``write_jobs_csv``, in order."""


def write_jobs_csv(path: Path, results: Sequence[SimResult], *, seeds: Sequence[int]) -> int:
    """Write one row per job per run: where each job's time went under each policy and seed.

    Times are hours from the trace's start (``submit_h`` is the trace's submission time);
    ``start_h``, ``end_h``, ``queueing_h`` and ``jct_h`` are empty for a job that never started
    or did not finish. ``peak_replicas`` is the most pods the job held at once; ``work_done`` the
    share of its work done.

    Args:
        path: the CSV file to write.
        results: the runs.
        seeds: the seed of each run.

    Returns:
        The rows written.
    """
    h = 3600.0

    def hours(value: float | None) -> str:
        return "" if value is None else f"{value / h:.4f}"

    rows = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(JOB_COLUMNS)
        for result, seed in zip(results, seeds, strict=True):
            for job in result.jobs:
                writer.writerow(
                    (
                        result.policy,
                        seed,
                        job.key,
                        job.queue,
                        "true" if job.elastic else "false",
                        job.requested_gpus,
                        hours(job.submit_s),
                        hours(job.start_s),
                        hours(job.end_s),
                        hours(None if job.start_s is None else job.start_s - job.submit_s),
                        hours(None if job.end_s is None else job.end_s - job.submit_s),
                        max((n for _, n in job.replica_log), default=0),
                        job.rescales,
                        job.kills,
                        f"{job.restart_gpu_s / h:.4f}",
                        f"{job.killed_gpu_s / h:.4f}",
                        f"{job.done_units / job.work_units:.4f}" if job.work_units else "1.0000",
                    )
                )
                rows += 1
    return rows
