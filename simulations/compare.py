"""A comparison run for the CLI: every policy on one workload, a rich table, JSON and plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from simulations.api import PolicyRun, run_policies, write_json_report
from simulations.cluster_config import ClusterSpec
from simulations.plots import plot_all
from simulations.report import Summary, jct_lower_bound_h, summarize, write_jobs_csv
from simulations.run import RunOptions, SimResult
from simulations.workload import Workload


def fmt(value: float, digits: int = 2) -> str:
    return "-" if isinstance(value, float) and math.isnan(value) else f"{value:.{digits}f}"


def summary_table(summaries: Sequence[Summary], *, title: str) -> Table:
    """The comparison as a rich table."""
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        caption=(
            "JCT: job completion time. rigid queue: queueing delay of non-elastic jobs. "
            "useful util: GPU time that made progress. lost: GPU-hours lost to restarts and "
            "kills. guar. wait: minutes guaranteed work waited while its GPUs were lent out."
        ),
    )
    # Short header words that wrap cleanly; numbers never wrap, so an 80-column terminal
    # shows every figure whole. A long policy name folds onto more lines rather than pushing
    # the last columns (and part of the caption) off the terminal.
    table.add_column("policy", justify="left", overflow="fold", min_width=9)
    for col in (
        "JCT\navg h",
        "JCT\np50 h",
        "JCT\np95 h",
        "JCT\np99 h",
        "rigid\nqueue\np95 h",
        "useful\nutil",
        "re-\nscales",
        "lost\nGPU-h",
        "guar.\nwait\nmin",
    ):
        table.add_column(col, justify="right", no_wrap=True, min_width=5)
    for s in summaries:
        table.add_row(
            s.policy,
            fmt(s.avg_jct_h),
            fmt(s.median_jct_h),
            fmt(s.p95_jct_h),
            fmt(s.p99_jct_h),
            fmt(s.p95_queue_nonelastic_h),
            fmt(s.useful_utilization),
            str(s.rescales),
            fmt(s.restart_gpu_hours + s.killed_gpu_hours),
            fmt(s.guaranteed_wait_minutes, 0),
        )
    return table


def run_comparison(
    *,
    console: Console,
    runs: Sequence[PolicyRun],
    workload: Workload,
    cluster: ClusterSpec,
    options: RunOptions,
    out_dir: Path,
    json_path: Path | None,
    workers: int = 1,
) -> list[Summary]:
    """Run every policy, print the table, write the JSON report and plots.

    Args:
        workers: processes the policies run in at once (``run_policies``).

    Returns:
        One summary per policy.
    """
    parallel = workers > 1 and len(runs) > 1
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        # No refresh thread while worker processes are forked: a fork copies the locks another
        # thread holds, and the bar moves at each finished run anyway.
        auto_refresh=not parallel,
    ) as progress:
        processes = f" in {min(workers, len(runs))} processes" if parallel else ""
        task = progress.add_task(
            f"simulating {len(runs)} policies on {workload.name}{processes}", total=len(runs)
        )
        # One bar per run (a long trace takes minutes per policy): in jobs finished, or in
        # simulated hours when the run stops at a horizon (most jobs would never finish).
        horizon_h = None if options.horizon_s is None else options.horizon_s / 3600.0
        unit, total = (
            ("jobs done", len(workload.jobs)) if horizon_h is None else ("simulated h", horizon_h)
        )
        bars = [progress.add_task(f"  {run.label}: {unit}", total=total) for run in runs]
        shown = [0.0] * len(runs)
        progress.refresh()

        def advance(_: SimResult) -> None:
            progress.advance(task)
            progress.refresh()

        def show(index: int, finished: int, _total: int, now_s: float) -> None:
            value = finished if horizon_h is None else min(horizon_h, now_s / 3600.0)
            # A worker's report may arrive after its run's final one: never move back.
            shown[index] = max(shown[index], value)
            progress.update(bars[index], completed=shown[index])
            if parallel:
                progress.refresh()

        results = run_policies(
            runs,
            workload=workload,
            cluster=cluster,
            options=options,
            on_done=advance,
            workers=workers,
            on_progress=show,
        )
    summaries = [summarize(r) for r in results]
    console.print(
        summary_table(
            summaries,
            title=f"{workload.name} on {cluster.name} "
            f"({cluster.total_gpus} GPUs, {len(workload.jobs)} jobs)",
        )
    )
    if workload.skipped_rows:
        console.print(f"skipped {workload.skipped_rows} bad trace row(s)")
    bound_h = jct_lower_bound_h(workload)
    console.print(
        f"no policy can bring the average JCT of all jobs below {bound_h:.2f} h (each job alone on "
        "the cluster at its fastest size, never queued)"
    )
    faults = options.faults
    if faults.node_mtbf_s is not None or faults.outage_every_s is not None:
        # The same seeded faults for every policy; a run that lasts longer sees more of them.
        longest = max(summaries, key=lambda s: s.makespan_h)
        console.print(
            f"faults injected (seed {faults.seed}) during the longest run ({longest.policy}): "
            f"{longest.node_failures} node failure(s) ({longest.node_down_hours:.1f} node-hours "
            f"down), {longest.metrics_outages} metrics outage(s) "
            f"({longest.metrics_outage_minutes:.0f} min); per policy in the JSON report"
        )
    for summary in summaries:
        if summary.finished < summary.jobs:
            console.print(
                f"[yellow]{summary.policy}: {summary.jobs - summary.finished} job(s) did not "
                "finish (their gangs never fit, or the horizon cut them); JCT figures cover "
                "finished jobs only[/yellow]"
            )
    meta: dict[str, object] = {
        "workload": workload.name,
        "cluster": cluster.name,
        "gpus": cluster.total_gpus,
        "jobs": len(workload.jobs),
        "skipped_rows": workload.skipped_rows,
        "avg_jct_lower_bound_h": bound_h,
    }
    write_json_report(out_dir / "report.json", summaries, meta=meta)
    if json_path is not None:
        write_json_report(json_path, summaries, meta=meta)
    write_jobs_csv(out_dir / "jobs.csv", results)
    plots = plot_all(results, out_dir)
    console.print(
        f"report, jobs.csv (every job under every policy) and {len(plots)} plots in {out_dir}"
    )
    return summaries
