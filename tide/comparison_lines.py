"""The lines printed under a comparison table: idle GPUs, abrupt kills, ratios, what tide knew
of the remaining work, the batch model, static's rescales and skipped trace rows; and the number
format and per-policy helpers the tables share."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from simulations.report import Summary
from simulations.workload import Workload

__all__ = [
    "batch_line",
    "fmt",
    "group_by_policy",
    "idle_line",
    "kills_line",
    "known_line",
    "median_finite",
    "ratio_lines",
    "resize_lines",
    "skipped_line",
]


def fmt(value: float, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals; "-" for NaN (no figure)."""
    return "-" if isinstance(value, float) and math.isnan(value) else f"{value:.{digits}f}"


def median_finite(values: Sequence[float]) -> float:
    """The median of the values that are not NaN; NaN when there are none."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def group_by_policy(summaries: Sequence[Summary]) -> dict[str, list[Summary]]:
    """The summaries per policy label, in their first appearance's order."""
    out: dict[str, list[Summary]] = {}
    for summary in summaries:
        out.setdefault(summary.policy, []).append(summary)
    return out


def idle_line(summaries: Sequence[Summary]) -> str:
    """GPU-hours each policy left idle while a job waited to start (medians over seeds)."""
    by_policy = group_by_policy(summaries)
    several = any(len(rows) > 1 for rows in by_policy.values())
    figures = ", ".join(
        f"{policy} {fmt(median_finite([r.idle_while_waiting_gpu_hours for r in rows]), 1)}"
        for policy, rows in by_policy.items()
    )
    median = ", median over the seeds" if several else ""
    return f"GPU-hours idle while a job waited to start{median}: {figures}"


def kills_line(summaries: Sequence[Summary]) -> str:
    """Pods Volcano's reclaim killed abruptly under each policy (summed over seeds)."""
    by_policy = group_by_policy(summaries)
    several = any(len(rows) > 1 for rows in by_policy.values())
    figures = ", ".join(
        f"{policy} {sum(r.kills for r in rows)}" for policy, rows in by_policy.items()
    )
    over = ", over all seeds" if several else ""
    return f"pods killed abruptly by Volcano's reclaim{over}: {figures}"


def ratio_lines(summaries: Sequence[Summary], seeds: Sequence[int], *, reference: str) -> list[str]:
    """``reference``'s average JCT over each other policy's, seed by seed, and their median."""
    mine = {
        seed: s.avg_jct_h for s, seed in zip(summaries, seeds, strict=True) if s.policy == reference
    }
    lines = []
    for policy in group_by_policy(summaries):
        if policy == reference:
            continue
        ratios = [
            mine[seed] / s.avg_jct_h
            for s, seed in zip(summaries, seeds, strict=True)
            # No finished job under either policy (NaN): no ratio for that seed.
            if s.policy == policy and seed in mine and s.avg_jct_h > 0 and mine[seed] >= 0
        ]
        if not ratios:
            continue
        per_seed = " ".join(f"{r:.2f}" for r in ratios)
        lines.append(
            f"{reference} ÷ {policy}, average JCT: median {median_finite(ratios):.2f} "
            f"(per seed: {per_seed})"
        )
    return lines


def known_line(known: Sequence[float]) -> str:
    """What tide's engine knew of the remaining work, on screen: the share of elastic jobs whose
    remaining work it was told (``remaining_work_known_share``; the median over seeds), and that
    optimus alone is handed all of it."""
    finite = [k for k in known if not math.isnan(k)]
    if not finite:
        return "remaining work: no elastic job"
    median = " (median over the seeds)" if len(finite) > 1 else ""
    return (
        f"remaining work known to tide for {median_finite(finite):.0%} of elastic jobs{median} "
        "(those that declare their planned samples); optimus (oracle) is handed every job's true "
        "remaining work and scaling curve"
    )


def batch_line(summaries: Sequence[Summary]) -> str:
    """Which batch model each policy ran, on screen, when some run adapted the jobs' batch
    (``Summary.batch_model``); empty when every job kept its submitted batch."""
    adaptive = sorted({s.policy for s in summaries if s.batch_model == "adaptive"})
    if not adaptive:
        return ""
    fixed = sorted({s.policy for s in summaries if s.batch_model != "adaptive"})
    rest = f"; {', '.join(fixed)} at each job's submitted batch" if fixed else ""
    return (
        f"batch: {', '.join(adaptive)} let the jobs that allow it choose their batch by goodput "
        f"(work counted in Pollux's progress){rest} (--no-adaptive-batch keeps it for all)"
    )


def resize_lines(summaries: Sequence[Summary], *, resizing: dict[str, bool]) -> list[str]:
    """Where a policy that never resizes a job shows rescales, what they were: Volcano placing
    a job's pods above its ``minAvailable`` as GPUs free up (each a restart of its workers), and
    reclaim's kills.

    Args:
        summaries: one per policy.
        resizing: per policy label, whether the policy resizes jobs itself.
    """
    lines = []
    for s in summaries:
        if resizing.get(s.policy, True) or not s.rescales:
            continue
        others = s.rescales - s.late_pods
        rest = f", {others} requeue(s) after a kill or a node failure" if others else ""
        lines.append(
            f"{s.policy} resizes no job: its {s.rescales} rescales are Volcano placing jobs' "
            f"pods above minAvailable as GPUs free up ({s.late_pods}, each a restart of the "
            f"job's workers: {s.restart_gpu_hours:.2f} GPU-h){rest}; pods were killed "
            f"{s.kills} time(s), by reclaim or node failures ({s.killed_gpu_hours:.2f} GPU-h "
            "of work lost)"
        )
    return lines


def skipped_line(workload: Workload) -> str:
    """What ``--skip-bad-rows`` skipped, on screen: how many rows, and their lines (the first
    20); each line's reason is in the report."""
    lines = [str(line) for line, _ in workload.skipped[:20]]
    more = f" and {len(workload.skipped) - 20} more" if len(workload.skipped) > 20 else ""
    where = f": line(s) {', '.join(lines)}{more}" if lines else ""
    return (
        f"skipped {workload.skipped_rows} bad trace row(s){where} (each with its reason in "
        "report.json, meta.skipped)"
    )
