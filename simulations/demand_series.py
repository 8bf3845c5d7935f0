"""Demand series a headroom forecast is evaluated on, read from files.

Two formats:

- ``helios``: a Helios per-queue sequence (``cluster_sequence_vc.csv``: one row a minute,
  ``time`` as ``YYYY-MM-DD HH:MM:SS`` UTC); demand = ``running_gpu_num + pending_gpu_num``, the
  pending part and ``running_job_num`` are the job-level signals. The series is named after the
  file's folder (the queue).
- ``tide``: tide's trace format (TRACE_FORMAT.md): the demand of each queue's non-elastic jobs,
  each holding ``replicas × gpus_per_replica`` GPUs from its submission for its duration, on a
  one-minute grid. One series per queue, named ``<file stem>/<queue>``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import defaultdict
from pathlib import Path

import numpy as np

from scheduler_policy.models.demand_grid import DemandGrid, resample
from simulations.errors import TraceError
from simulations.traces import bad_rows_error, read_trace_rows

HELIOS_COLUMNS = ("time", "running_gpu_num", "pending_gpu_num", "running_job_num")
TRACE_STEP_S = 60.0


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(str(path), 0, f"cannot read: {e}") from e


def _number(row: dict[str, str], column: str) -> float:
    value = float(row[column])
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{column} must be a finite number >= 0, got {row[column]!r}")
    return value


def read_helios(path: Path, *, step_s: float = 60.0) -> tuple[str, DemandGrid]:
    """A Helios queue's demand series.

    Args:
        path: a ``cluster_sequence_vc.csv``.
        step_s: the grid's step, seconds.

    Returns:
        (the queue's name, its demand on the grid).

    Raises:
        TraceError: the file cannot be read, lacks a column, or has bad rows (file and line).
    """
    reader = csv.DictReader(io.StringIO(_text(path)))
    missing = [c for c in HELIOS_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(str(path), 1, f"missing columns {', '.join(missing)} in the header")
    times, gpus, pending, running = [], [], [], []
    bad: list[tuple[int, str]] = []
    for line, row in enumerate(reader, start=2):
        try:
            stamp = dt.datetime.strptime(row["time"], "%Y-%m-%d %H:%M:%S")
            run = _number(row, "running_gpu_num")
            wait = _number(row, "pending_gpu_num")
            jobs = _number(row, "running_job_num")
        except (ValueError, TypeError) as e:
            bad.append((line, str(e)))
            continue
        times.append(stamp.replace(tzinfo=dt.UTC).timestamp())
        gpus.append(run + wait)
        pending.append(wait)
        running.append(jobs)
    if bad:
        raise bad_rows_error(str(path), bad)
    if not times:
        raise TraceError(str(path), 1, "no data rows")
    order = np.argsort(np.array(times), kind="stable")
    try:
        grid = resample(
            times_s=np.array(times)[order],
            gpus=np.array(gpus)[order],
            step_s=step_s,
            pending_gpus=np.array(pending)[order],
            running_jobs=np.array(running)[order],
            what=str(path),
        )
    except ValueError as e:
        raise TraceError(str(path), 0, str(e)) from e
    return path.parent.name or path.stem, grid


def read_trace_demand(path: Path) -> list[tuple[str, DemandGrid]]:
    """Each queue's non-elastic demand in a tide-format trace.

    Args:
        path: a tide trace (CSV or JSON Lines).

    Returns:
        (``<stem>/<queue>``, demand on a one-minute grid) per queue with non-elastic jobs; the
        queue is ``default`` for jobs that name none.

    Raises:
        TraceError: a bad row (file and line), or no non-elastic job in the trace.
    """
    jobs: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for row in read_trace_rows(path):
        if not row.elastic:
            gpus = float(row.replicas * row.gpus_per_replica)
            jobs[row.queue or "default"].append((row.submit_s, row.submit_s + row.duration_s, gpus))
    if not jobs:
        raise TraceError(str(path), 0, "no non-elastic job: no demand to forecast")
    out = []
    for queue, spans in sorted(jobs.items()):
        end_s = max(e for _, e, _ in spans)
        size = int(end_s // TRACE_STEP_S) + 2
        change = np.zeros(size + 1)
        running = np.zeros(size + 1)
        for start_s, stop_s, gpus in spans:
            first = int(start_s // TRACE_STEP_S)
            last = int(np.ceil(stop_s / TRACE_STEP_S))
            change[first] += gpus
            change[last] -= gpus
            running[first] += 1
            running[last] -= 1
        demand = np.maximum(np.cumsum(change)[:size], 0.0)
        grid = DemandGrid(
            start_s=0.0,
            step_s=TRACE_STEP_S,
            gpus=demand,
            running_jobs=np.cumsum(running)[:size],
        )
        out.append((f"{path.stem}/{queue}", grid))
    return out
