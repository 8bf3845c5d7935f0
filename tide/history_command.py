"""``tide history export``: a cluster's Prometheus history as a trace ``tide simulate`` replays."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from metrics_collector.history import (
    ClusterHistory,
    HistoryError,
    HistoryJob,
    HistoryLabels,
    export_history,
    parse_time,
)
from metrics_collector.prometheus import PrometheusConnection, PrometheusQuerier
from simulations.errors import TraceError
from simulations.profiles import MAX_PROFILE_REPLICAS, ThroughputMeasurement, measured_profile
from simulations.trace_rows import TraceRow, write_tide_trace

_DEFAULT = HistoryLabels()


def trace_row(job: HistoryJob, *, origin_s: float) -> TraceRow:
    """One exported job as a row of tide's trace format.

    With measured throughput and counted samples, ``duration_s`` is the time those samples take
    at ``replicas`` on the job's measured curve (the same curve the replay runs), so the replay
    has the job's real work whatever sizes it ran at; otherwise it is the observed run time.

    Args:
        job: the job as Prometheus saw it.
        origin_s: the trace's time zero, seconds since the epoch.

    Returns:
        The row.
    """
    throughput = tuple(
        ThroughputMeasurement(replicas=m.replicas, samples_per_s=m.samples_per_s)
        for m in job.throughput
        if m.replicas <= MAX_PROFILE_REPLICAS
    )
    duration_s = job.run_s
    if throughput and job.work_samples:
        rate = measured_profile(job.key, throughput).rate(job.replicas)
        duration_s = job.work_samples / rate
    return TraceRow(
        job_id=job.key,
        submit_s=round(job.submit_s - origin_s, 3),
        replicas=job.replicas,
        duration_s=duration_s,
        queue=job.queue,
        elastic=job.elastic,
        min_replicas=job.min_replicas,
        max_replicas=job.max_replicas,
        gpus_per_replica=job.gpus_per_replica,
        throughput=throughput,
        replicas_over_time=tuple(
            (round(t - job.submit_s, 3), n) for t, n in job.replicas_over_time
        ),
    )


def trace_rows(history: ClusterHistory) -> list[TraceRow]:
    """Every job of ``history`` as trace rows, time zero at the first submission."""
    origin = min((j.submit_s for j in history.jobs), default=history.start_s)
    return [trace_row(j, origin_s=origin) for j in history.jobs]


def export_trace(
    *,
    prometheus: str,
    start: str,
    end: str,
    out: Path,
    step_s: float,
    labels: HistoryLabels,
    console: Console | None = None,
) -> ClusterHistory:
    """Export the history between ``start`` and ``end`` into ``out`` (CSV, or ``.jsonl``).

    Args:
        prometheus: Prometheus's base URL.
        start: RFC 3339 or epoch seconds.
        end: RFC 3339 or epoch seconds.
        out: the trace file to write.
        step_s: the grid's step, seconds.
        labels: the label names to read.
        console: where the progress bar goes; none when None.

    Returns:
        What was exported.

    Raises:
        HistoryError: bad arguments, or Prometheus unreachable or refusing.
        TraceError: the file cannot be written.
    """
    start_s = parse_time(start, option="--start")
    end_s = parse_time(end, option="--end")
    try:
        connection = PrometheusConnection(url=prometheus, timeout_s=60.0)
    except ValueError as e:
        raise HistoryError("--prometheus", str(e)) from e
    querier = PrometheusQuerier(connection)
    read = functools.partial(
        export_history,
        querier=querier,
        start_s=start_s,
        end_s=end_s,
        step_s=step_s,
        labels=labels,
        where=prometheus,
    )
    try:
        if console is None:
            history = read()
        else:
            columns = (
                TextColumn("reading history"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=console, transient=True) as bar:
                task = bar.add_task("history", total=None)

                def advance(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                history = read(progress=advance)
    finally:
        querier.close()
    write_tide_trace(out, trace_rows(history))
    return history


def register(app: typer.Typer) -> None:
    """Add ``history export`` to the ``tide`` app."""
    history = typer.Typer(help="Read a cluster's history from Prometheus.", no_args_is_help=True)
    app.add_typer(history, name="history")

    @history.command("export")
    def export(
        prometheus: Annotated[
            str, typer.Option("--prometheus", help="Prometheus base URL, e.g. http://prom:9090.")
        ],
        start: Annotated[
            str, typer.Option("--start", help="Range start: RFC 3339 (with zone) or epoch seconds.")
        ],
        end: Annotated[
            str, typer.Option("--end", help="Range end: RFC 3339 (with zone) or epoch seconds.")
        ],
        out: Annotated[
            Path, typer.Option("--out", help="Trace file to write: CSV, or JSON Lines (.jsonl).")
        ],
        step: Annotated[
            float,
            typer.Option(
                "--step", help="Seconds between points read; at least the scrape interval."
            ),
        ] = 30.0,
        job_label: Annotated[
            str, typer.Option(help="kube_pod_labels label naming the pod's Volcano Job.")
        ] = _DEFAULT.job,
        queue_label: Annotated[
            str, typer.Option(help="kube_pod_labels label naming the pod's Volcano Queue.")
        ] = _DEFAULT.queue,
        elastic_label: Annotated[
            str, typer.Option(help='kube_pod_labels label that is "true" on elastic pods.')
        ] = _DEFAULT.elastic,
        gpu_resource: Annotated[
            str, typer.Option(help="kube-state-metrics resource name of GPUs.")
        ] = _DEFAULT.gpu_resource,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    ) -> None:
        """Export Prometheus history (job arrivals, run times, GPUs, queues, replicas over time,
        throughput by replicas) as a trace for `tide simulate --trace`."""
        console = Console(stderr=True)
        labels = HistoryLabels(
            job=job_label, queue=queue_label, elastic=elastic_label, gpu_resource=gpu_resource
        )
        try:
            result = export_trace(
                prometheus=prometheus,
                start=start,
                end=end,
                out=out,
                step_s=step,
                labels=labels,
                console=None if quiet else console,
            )
        except HistoryError as e:
            console.print(f"{e.where}: [red]error:[/red] {e.problem}", highlight=False)
            raise typer.Exit(1) from e
        except TraceError as e:
            console.print(f"{e.path}: [red]error:[/red] {e.problem}", highlight=False)
            raise typer.Exit(1) from e
        for sentence in result.skipped:
            console.print(f"[yellow]skipped:[/yellow] {sentence}", highlight=False)
        measured = sum(1 for j in result.jobs if j.throughput)
        typer.echo(
            f"{out}: {len(result.jobs)} jobs ({measured} with measured throughput), "
            f"{len(result.skipped)} skipped"
        )
