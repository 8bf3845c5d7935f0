"""A comparison run for the CLI: every policy on one workload (or one per seed), a rich table,
JSON, a CSV of every job, and plots."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from scheduler_policy.policy.file import policy_document
from simulations.api import Case, PolicyRun, Seeded, run_cases, write_json_report
from simulations.bounds import jct_lower_bounds_h
from simulations.cluster_config import ClusterSpec, cluster_document
from simulations.report import (
    Summary,
    policy_label,
    remaining_work_known_share,
    summarize,
    write_jobs_csv,
)
from simulations.run import SimResult
from tide.comparison_lines import (
    batch_line,
    fmt,
    group_by_policy,
    idle_line,
    kills_line,
    known_line,
    median_finite,
    ratio_lines,
    resize_lines,
    skipped_line,
)

BOUND_TERMS = (
    "a relaxation: every job from its submission at its best sizes, sharing the cluster's GPUs "
    "within each queue's capability, with no gangs, deserved shares or restarts"
)
"""What the printed lower bound assumes (``simulations.bounds.jct_lower_bound_h``)."""


NO_BOUND = "lower bound on the average JCT: skipped (--no-bound)"


def _json_number(value: float) -> float | None:
    """A figure as JSON holds it: null for NaN (JSON has no NaN)."""
    return None if math.isnan(value) else value


def _table(title: str, caption: str, columns: Sequence[str]) -> Table:
    """A comparison table: a policy column, then right-aligned figures.

    Short header words that wrap cleanly; numbers never wrap, so an 80-column terminal shows
    every figure whole. A long policy name folds onto more lines rather than pushing the last
    columns (and part of the caption) off the terminal.
    """
    table = Table(
        title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, caption=caption
    )
    table.add_column("policy", justify="left", overflow="fold", min_width=9)
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True, min_width=5)
    return table


def fit_to_width(console: Console, table: Table) -> list[Table]:
    """``table`` as one or more tables, each as narrow as ``console``'s width allows.

    Below the width a table needs, rich drops whole columns, the first one (the policy's name)
    among them. Instead, the figures are split over several tables that each repeat the first
    column; the title goes on the first, and the caption on none (``print_fitted`` prints it
    under them, as wide as the console). A table that fits is returned as it is.
    """
    width = console.width

    label, *figures = table.columns

    def needs(columns: list[Column]) -> int:
        # Each column at the least width rich can give it without cropping: what its cells
        # and header need if it may not wrap, else its min_width (it folds). Measured as a
        # table of that many x's (the same padding), against a wide page: a measurement is
        # clamped to the width it is given.
        stubs = Table(
            box=table.box, pad_edge=table.pad_edge, collapse_padding=table.collapse_padding
        )
        widths = [_least_width(c) for c in (label, *columns)]
        for w in widths:
            stubs.add_column("x" * w, no_wrap=True)
        stubs.add_row(*("x" * w for w in widths))
        return Measurement.get(console, console.options.update_width(10_000), stubs).minimum

    if len(table.columns) < 3 or needs(figures) <= width:
        return [table]
    chunks: list[list[Column]] = [[]]
    for column in figures:
        if chunks[-1] and needs([*chunks[-1], column]) > width:
            chunks.append([])
        chunks[-1].append(column)
    parts = [_part(table, [label, *chunk]) for chunk in chunks]
    parts[0].title = table.title
    return parts


def _least_width(column: Column) -> int:
    """The narrowest ``column`` can be without losing a character."""
    if not column.no_wrap:
        return column.min_width or 1
    texts = [str(column.header), *map(str, column.cells)]
    return max((len(line) for text in texts for line in text.splitlines()), default=1)


def _part(table: Table, columns: list[Column]) -> Table:
    """A table of ``table``'s style with some of its columns and their cells."""
    part = Table(
        box=table.box,
        pad_edge=table.pad_edge,
        collapse_padding=table.collapse_padding,
    )
    for column in columns:
        part.add_column(
            column.header,
            justify=column.justify,
            no_wrap=column.no_wrap,
            overflow=column.overflow,
            min_width=column.min_width,
        )
    for row in zip(*(list(column.cells) for column in columns), strict=True):
        part.add_row(*row)
    return part


def print_fitted(console: Console, table: Table) -> None:
    """Print ``table`` whole on ``console``, split over several tables if it is too narrow."""
    parts = fit_to_width(console, table)
    for part in parts:
        console.print(part)
    if len(parts) > 1 and table.caption:
        console.print(table.caption, style="table.caption", justify="center")


def summary_table(summaries: Sequence[Summary], *, title: str) -> Table:
    """The comparison as a rich table."""
    table = _table(
        title,
        "JCT: job completion time. rigid queue: queueing delay of non-elastic jobs. "
        "useful util: GPU time that made progress. lost: GPU-hours lost to restarts and "
        "kills. guar. wait: minutes guaranteed work waited while its GPUs were lent out.",
        (
            "JCT\navg h",
            "JCT\np50 h",
            "JCT\np95 h",
            "JCT\np99 h",
            "rigid\nqueue\np95 h",
            "useful\nutil",
            "re-\nscales",
            "lost\nGPU-h",
            "guar.\nwait\nmin",
        ),
    )
    for s in summaries:
        table.add_row(
            policy_label(s.policy),
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


def seeds_table(summaries: Sequence[Summary], *, title: str) -> Table:
    """Each policy's figures over several seeds: medians, and the range of the average JCT.

    Args:
        summaries: one per policy per seed, in any order.
        title: the table's title.
    """
    table = _table(
        title,
        "Medians over the seeds; range: lowest and highest average JCT of one seed. "
        "Per seed in the JSON report and jobs.csv.",
        (
            "JCT\navg h",
            "JCT avg\nrange h",
            "JCT\np95 h",
            "rigid\nqueue\np95 h",
            "useful\nutil",
            "re-\nscales",
            "lost\nGPU-h",
        ),
    )
    for policy, rows in group_by_policy(summaries).items():
        avg = [r.avg_jct_h for r in rows if not math.isnan(r.avg_jct_h)]
        table.add_row(
            policy_label(policy),
            fmt(median_finite(avg)),
            f"{fmt(min(avg))}–{fmt(max(avg))}" if avg else "-",
            fmt(median_finite([r.p95_jct_h for r in rows])),
            fmt(median_finite([r.p95_queue_nonelastic_h for r in rows])),
            fmt(median_finite([r.useful_utilization for r in rows])),
            f"{median_finite([float(r.rescales) for r in rows]):.0f}",
            fmt(median_finite([r.restart_gpu_hours + r.killed_gpu_hours for r in rows])),
        )
    return table


def run_comparison(
    *,
    console: Console,
    runs: Sequence[PolicyRun],
    seeded: Sequence[Seeded],
    cluster: ClusterSpec,
    out_dir: Path,
    json_path: Path | None,
    workers: int = 1,
    with_bound: bool = True,
) -> list[Summary]:
    """Run every policy on every seed's workload, print the table, write the reports and plots.

    With one seed the table shows that run's figures; with several, each policy's medians over
    the seeds, and how the first policy compares with each other one seed by seed.

    Args:
        console: where the table goes.
        runs: the policies.
        seeded: the workload and run options of each seed (at least one).
        cluster: the cluster.
        out_dir: folder for ``report.json``, ``jobs.csv`` and the plots (``plot_all``: the JCT
            CDF of every seed, the others of the first).
        json_path: where else to write the JSON report; None for nowhere else.
        workers: processes the runs go in at once (``run_cases``).
        with_bound: whether to solve and print the lower bound on the average JCT
            (``--no-bound`` skips it, and the output says so).

    Returns:
        One summary per policy per seed, seed by seed.
    """
    cases = [Case(run, one.workload, one.options) for one in seeded for run in runs]
    seeds = [one.seed for one in seeded for _ in runs]
    first = seeded[0]
    parallel = workers > 1 and len(cases) > 1
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        # Piped or redirected, a bar has nothing to show and would leave a blank first line.
        disable=not console.is_terminal,
        # No refresh thread while worker processes are forked: a fork copies the locks another
        # thread holds, and the bar moves at each finished run anyway.
        auto_refresh=not parallel,
    ) as progress:
        processes = f" in {min(workers, len(cases))} processes" if parallel else ""
        what = f"{len(runs)} policies" + (f" x {len(seeded)} seeds" if len(seeded) > 1 else "")
        task = progress.add_task(
            f"simulating {what} on {_name(seeded)}{processes}", total=len(cases)
        )
        # One bar per policy, over all seeds (a long trace takes minutes per run): in jobs
        # finished, or in simulated hours when runs stop at a horizon (most jobs would never
        # finish).
        horizon_s = first.options.horizon_s
        horizon_h = None if horizon_s is None else horizon_s / 3600.0
        if horizon_h is None:
            unit, total = "jobs done", float(sum(len(one.workload.jobs) for one in seeded))
        else:
            unit, total = "simulated h", horizon_h * len(seeded)
        bars = [progress.add_task(f"  {run.label}: {unit}", total=total) for run in runs]
        shown = [0.0] * len(cases)
        progress.refresh()

        def advance(_: SimResult) -> None:
            progress.advance(task)
            progress.refresh()

        def show(index: int, finished: int, _total: int, now_s: float) -> None:
            value = finished if horizon_h is None else min(horizon_h, now_s / 3600.0)
            # A worker's report may arrive after its run's final one: never move back.
            shown[index] = max(shown[index], value)
            policy = index % len(runs)  # cases go seed by seed, policies in order
            progress.update(bars[policy], completed=sum(shown[policy :: len(runs)]))
            if parallel:
                progress.refresh()

        results = run_cases(
            cases, cluster=cluster, on_done=advance, workers=workers, on_progress=show
        )
    summaries = [summarize(r) for r in results]
    known = [remaining_work_known_share(one.workload, one.options) for one in seeded]
    bounds = (
        jct_lower_bounds_h([one.workload for one in seeded], cluster)
        if with_bound
        else [math.nan] * len(seeded)
    )
    if len(seeded) == 1:
        resizing = {run.label: run.kind != "static" for run in runs}
        _print_one(console, summaries, first, cluster, bounds[0], resizing)
    else:
        _print_seeds(console, summaries, seeds, seeded, cluster, bounds, reference=runs[0].label)
    console.print(known_line(known))
    batch = batch_line(summaries)
    if batch:
        console.print(batch)
    for summary, seed in zip(summaries, seeds, strict=True):
        if summary.finished < summary.jobs:
            where = f" (seed {seed})" if len(seeded) > 1 else ""
            console.print(
                f"[yellow]{summary.policy}{where}: {summary.jobs - summary.finished} job(s) did "
                "not finish (their gangs never fit, or the horizon cut them); JCT figures cover "
                "finished jobs only[/yellow]"
            )
    meta: dict[str, object] = {
        "workload": first.workload.name,
        "cluster": cluster.name,
        "gpus": cluster.total_gpus,
        # The figures depend on where the scheduler put the pods (spread: Volcano's default).
        "node_order": cluster.node_order.value,
        "jobs": len(first.workload.jobs),
        "skipped_rows": first.workload.skipped_rows,
        # Each skipped row's line and reason (a trace skips the same rows at every seed).
        "skipped": [{"line": line, "problem": problem} for line, problem in first.workload.skipped],
        "avg_jct_lower_bound_h": _json_number(bounds[0]),
        # Of the elastic jobs, those whose remaining work tide's engine is told (planned samples
        # declared, and not hidden by --no-declared-work); optimus (oracle) knows all of it.
        "remaining_work_known_share": _json_number(known[0]),
        "remaining_work_known_share_by_seed": [_json_number(k) for k in known],
        # How each policy's jobs counted their work: "adaptive" (progress at the batch the
        # workers chose, Pollux's jobs under tide) or "submitted" (each job's own batch).
        "batch_model": {s.policy: s.batch_model for s in summaries},
        "seeds": [one.seed for one in seeded],
        "jobs_by_seed": [len(one.workload.jobs) for one in seeded],
        "avg_jct_lower_bound_h_by_seed": [_json_number(b) for b in bounds],
        # What ran, so that a report can be reproduced: the whole cluster, each tide policy as
        # its file would say it, and the run options (the seeds' differ only in their seed).
        "cluster_spec": cluster_document(cluster),
        "policies": {
            run.label: policy_document(run.policy) if run.policy else run.kind for run in runs
        },
        "run_options": dataclasses.asdict(first.options),
    }
    write_json_report(out_dir / "report.json", summaries, meta=meta, seeds=seeds)
    if json_path is not None:
        write_json_report(json_path, summaries, meta=meta, seeds=seeds)
    write_jobs_csv(out_dir / "jobs.csv", results, seeds=seeds)
    try:
        # Plotting is an extra (``tide[plots]``): an engine image carries no plotting stack.
        from simulations.plots import plot_all
    except ImportError as e:
        console.print(
            f"report and jobs.csv (every job under every policy) in {out_dir}; no plots: "
            f"{e.name} is not installed (pip install 'tide\\[plots]')"
        )
        return summaries
    plots = plot_all(
        results,
        out_dir,
        seeds=[one.seed for one in seeded],
        subject=f"{_name(seeded)} on {cluster.name}, {cluster.total_gpus} GPUs, "
        f"{cluster.node_order.value} placement",
    )
    of_seed = (
        f" (the JCT CDF of every seed's jobs, the others of seed {first.seed})"
        if len(seeded) > 1
        else ""
    )
    console.print(
        f"report, jobs.csv (every job under every policy) and {len(plots)} plots{of_seed} "
        f"in {out_dir}"
    )
    return summaries


def _name(seeded: Sequence[Seeded]) -> str:
    """The workloads' name: one name, or the first and last seed's when they differ."""
    names = [one.workload.name for one in seeded]
    return names[0] if len(set(names)) == 1 else f"{names[0]} … {names[-1]}"


def _print_one(
    console: Console,
    summaries: Sequence[Summary],
    one: Seeded,
    cluster: ClusterSpec,
    bound_h: float,
    resizing: dict[str, bool],
) -> None:
    workload = one.workload
    print_fitted(
        console,
        summary_table(
            summaries,
            title=f"{workload.name} on {cluster.name} ({cluster.total_gpus} GPUs, "
            f"{cluster.node_order.value} placement, {len(workload.jobs)} jobs)",
        ),
    )
    console.print(idle_line(summaries))
    console.print(kills_line(summaries))
    for line in resize_lines(summaries, resizing=resizing):
        console.print(line)
    if workload.skipped_rows:
        console.print(skipped_line(workload))
    if math.isnan(bound_h):
        console.print(NO_BOUND)
    else:
        console.print(
            f"no policy can bring the average JCT of all jobs below {bound_h:.2f} h "
            f"({BOUND_TERMS})" + _to_bound([summaries[0]], [bound_h])
        )
    faults = one.options.faults
    if faults.node_mtbf_s is not None or faults.outage_every_s is not None:
        # The same seeded faults for every policy; a run that lasts longer sees more of them.
        longest = max(summaries, key=lambda s: s.makespan_h)
        console.print(
            f"faults injected (seed {faults.seed}) during the longest run ({longest.policy}): "
            f"{longest.node_failures} node failure(s) ({longest.node_down_hours:.1f} node-hours "
            f"down), {longest.metrics_outages} metrics outage(s) "
            f"({longest.metrics_outage_minutes:.0f} min); per policy in the JSON report"
        )


def _to_bound(runs: Sequence[Summary], bounds: Sequence[float]) -> str:
    """How far one policy's average JCT is from the bound, given its run on each seed (the
    median over seeds), for the runs that finished every job: an average over fewer jobs is
    not comparable."""
    ratios = [
        s.avg_jct_h / b for s, b in zip(runs, bounds, strict=True) if s.finished == s.jobs and b > 0
    ]
    if not ratios:
        return ""
    median = " (median over the seeds)" if len(runs) > 1 else ""
    return f"; {runs[0].policy}'s average is {median_finite(ratios):.2f} times it{median}"


def _print_seeds(
    console: Console,
    summaries: Sequence[Summary],
    seeds: Sequence[int],
    seeded: Sequence[Seeded],
    cluster: ClusterSpec,
    bounds: Sequence[float],
    *,
    reference: str,
) -> None:
    counts = sorted({len(one.workload.jobs) for one in seeded})
    jobs = f"{counts[0]} jobs" if len(counts) == 1 else f"{counts[0]}–{counts[-1]} jobs"
    seed_list = ",".join(str(one.seed) for one in seeded)
    print_fitted(
        console,
        seeds_table(
            summaries,
            title=f"{_name(seeded)} on {cluster.name} ({cluster.total_gpus} GPUs, "
            f"{cluster.node_order.value} placement, {jobs}), seeds {seed_list}",
        ),
    )
    for line in ratio_lines(summaries, seeds, reference=reference):
        console.print(line)
    console.print(idle_line(summaries))
    console.print(kills_line(summaries))
    most = max((one.workload for one in seeded), key=lambda w: w.skipped_rows)
    if most.skipped_rows:
        console.print(skipped_line(most))
    if all(math.isnan(b) for b in bounds):
        console.print(NO_BOUND)
    else:
        console.print(
            f"no policy can bring the average JCT of all jobs below {median_finite(bounds):.2f} h, "
            f"median over the seeds ({min(bounds):.2f}–{max(bounds):.2f}; {BOUND_TERMS})"
            + _to_bound([s for s in summaries if s.policy == reference], bounds)
        )
    faults = seeded[0].options.faults
    if faults.node_mtbf_s is not None or faults.outage_every_s is not None:
        console.print("faults injected, drawn per seed; what each run saw is in the JSON report")
