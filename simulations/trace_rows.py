"""tide's trace format, column by column: a row read and checked, and rows written back.

``simulations.traces`` reads whole files with these; ``TRACE_FORMAT.md`` documents the columns.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations.errors import TraceError
from simulations.profiles import (
    MAX_PROFILE_REPLICAS,
    ScalingProfile,
    ThroughputMeasurement,
    builtin_job_type,
    measured_profile,
)
from simulations.workload import DEFAULT_CHECKPOINT_INTERVAL_S, WorkloadJob

Row = Mapping[str, Any]


def _bool(value: Any, column: str = "elastic") -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{column} must be true or false, got {value!r}")


def column_float(row: Row, key: str) -> float:
    """Column ``key`` as a number; a ValueError that names the column otherwise."""
    value = row[key]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {value!r} is not a number") from None


def column_int(row: Row, key: str) -> int:
    """Column ``key`` as a whole number; a ValueError that names the column otherwise."""
    value = row[key]
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {value!r} is not a whole number") from None


def _optional(row: Row, key: str) -> Any:
    value = row.get(key)
    return None if value is None or value == "" else value


def _whole(value: Any, what: str) -> int:
    """``value`` as an int: an int (not a bool) or a string of digits; nothing rounded."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise ValueError(f"{what} {value!r} is not a whole number")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return number


def _measurement(replicas: Any, nodes: Any, rate: Any) -> ThroughputMeasurement:
    n = _whole(replicas, "replicas")
    if not 1 <= n <= MAX_PROFILE_REPLICAS:
        raise ValueError(f"replicas must be in [1, {MAX_PROFILE_REPLICAS}], got {n}")
    k = None if nodes is None else _whole(nodes, "nodes")
    if k is not None and not 1 <= k <= n:
        raise ValueError(f"nodes must be in [1, replicas={n}], got {k}")
    x = _number(rate, "samples_per_s")
    if x <= 0:
        raise ValueError(f"samples_per_s must be > 0, got {x:g}")
    return ThroughputMeasurement(replicas=n, samples_per_s=x, nodes=k)


def _size_key(text: str) -> tuple[str, str | None]:
    replicas, at, nodes = text.strip().partition("@")
    return replicas, (nodes if at else None)


def parse_throughput(value: Any) -> tuple[ThroughputMeasurement, ...]:
    """The ``throughput`` column: measured samples/s by replicas (and nodes).

    Accepts the CSV form ``"1:120.5;2:230;8@2:410"`` (``replicas[@nodes]:samples_per_s``,
    entries separated by ``;``) and, in JSON Lines, also a list of objects
    ``{"replicas": 8, "nodes": 2, "samples_per_s": 410}`` or an object ``{"8@2": 410}``.

    Args:
        value: the column's value.

    Returns:
        The measurements, sorted by (replicas, nodes).

    Raises:
        ValueError: ``throughput: entry I (...): what is wrong``, or a size given twice.
    """
    # (the entry as written, replicas, nodes, samples/s, what is wrong with its shape)
    entries: list[tuple[str, Any, Any, Any, str]] = []
    if isinstance(value, str):
        for part in (p.strip() for p in value.split(";") if p.strip()):
            size, colon, rate = part.partition(":")
            replicas, nodes = _size_key(size)
            entries.append((part, replicas, nodes, rate, "" if colon else "expected R:X or R@N:X"))
    elif isinstance(value, Mapping):
        for size, rate in value.items():
            replicas, nodes = _size_key(str(size))
            entries.append((f"{size}: {rate}", replicas, nodes, rate, ""))
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, Mapping):
                entries.append((repr(item), None, None, None, "expected an object"))
                continue
            unknown = sorted(set(item) - {"replicas", "nodes", "samples_per_s"})
            entries.append(
                (
                    json.dumps(item),
                    item.get("replicas"),
                    item.get("nodes"),
                    item.get("samples_per_s"),
                    f"unknown keys {unknown}" if unknown else "",
                )
            )
    else:
        raise ValueError(f"throughput: expected text, a list or an object, got {value!r}")
    out: list[ThroughputMeasurement] = []
    seen: set[tuple[int, int | None]] = set()
    for index, (text, replicas, nodes, rate, shape) in enumerate(entries, start=1):
        try:
            if shape:
                raise ValueError(shape)
            m = _measurement(replicas, nodes, rate)
            if (m.replicas, m.nodes) in seen:
                raise ValueError("this size is given twice")
        except ValueError as e:
            raise ValueError(f"throughput: entry {index} ({text!r}): {e}") from None
        seen.add((m.replicas, m.nodes))
        out.append(m)
    if not out:
        raise ValueError("throughput: no measurements")
    return tuple(sorted(out, key=lambda m: (m.replicas, m.nodes or 0)))


def format_throughput(measurements: Iterable[ThroughputMeasurement]) -> str:
    """The CSV form of ``throughput`` (``parse_throughput`` reads it back exactly)."""
    return ";".join(
        f"{m.replicas}{'' if m.nodes is None else f'@{m.nodes}'}:{m.samples_per_s!r}"
        for m in measurements
    )


def parse_replicas_over_time(value: Any) -> tuple[tuple[float, int], ...]:
    """The ``replicas_over_time`` column: ``"0:2;3600:4"``, or a JSON list of ``[t_s, n]``.

    Args:
        value: the column's value; times are seconds after ``submit_s``.

    Returns:
        (seconds after submission, replicas running from then) pairs, times increasing.

    Raises:
        ValueError: ``replicas_over_time: entry I (...): what is wrong``.
    """
    raw: list[tuple[Any, Any]]
    if isinstance(value, str):
        raw = [(p.partition(":")[0], p.partition(":")[2]) for p in value.split(";") if p.strip()]
    elif isinstance(value, list):
        raw = [(p[0], p[1]) if isinstance(p, list) and len(p) == 2 else (p, None) for p in value]
    else:
        raise ValueError(f"replicas_over_time: expected text or a list, got {value!r}")
    out: list[tuple[float, int]] = []
    for index, (t, n) in enumerate(raw, start=1):
        where = f"replicas_over_time: entry {index} ({t}:{n})"
        try:
            t_s = _number(t, "time")
            replicas = _whole(n, "replicas")
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if t_s < 0 or replicas < 0:
            raise ValueError(f"{where}: time and replicas must be >= 0")
        if out and t_s <= out[-1][0]:
            raise ValueError(f"{where}: times must increase, {t_s:g} follows {out[-1][0]:g}")
        out.append((t_s, replicas))
    return tuple(out)


TRACE_COLUMNS = (
    "job_id",
    "submit_s",
    "replicas",
    "duration_s",
    "queue",
    "elastic",
    "min_replicas",
    "max_replicas",
    "gpus_per_replica",
    "job_type",
    "restart_cost_s",
    "checkpoint_interval_s",
    "save_exit_s",
    "throughput",
    "replicas_over_time",
    "declares_planned_samples",
)
"""The columns of tide's trace format, in the order ``write_tide_trace`` writes them."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One job of tide's trace format, as written (TRACE_FORMAT.md has the meaning of each).

    Attributes:
        job_id: ``namespace/name``.
        submit_s: submission, seconds from the trace start.
        replicas: replicas it asks for.
        duration_s: run time at ``replicas``, seconds.
        queue: the Volcano Queue, or None.
        elastic: whether tide may resize it.
        min_replicas: the gang minimum; None for ``replicas``.
        max_replicas: the most replicas; None for ``replicas``.
        gpus_per_replica: GPUs per worker.
        job_type: a built-in curve, used when ``throughput`` is empty; None for the default.
        restart_cost_s: seconds without progress after a membership change; None for the
            cluster's.
        checkpoint_interval_s: progress seconds between checkpoints; None for the default.
        save_exit_s: seconds its departing workers take to save and exit after a graceful
            shrink; None for the cluster's.
        throughput: the job's measured samples/s by size; empty when not measured.
        replicas_over_time: (seconds after submission, replicas) as the cluster ran it; the
            replay does not follow it (it decides anew), it is there for people and tools.
        declares_planned_samples: whether the job declares its planned samples (the engine
            then knows its remaining work); False (the default) leaves it unknown.
    """

    job_id: str
    submit_s: float
    replicas: int
    duration_s: float
    queue: str | None = None
    elastic: bool = False
    min_replicas: int | None = None
    max_replicas: int | None = None
    gpus_per_replica: int = 1
    job_type: str | None = None
    restart_cost_s: float | None = None
    checkpoint_interval_s: float | None = None
    save_exit_s: float | None = None
    throughput: tuple[ThroughputMeasurement, ...] = ()
    replicas_over_time: tuple[tuple[float, int], ...] = ()
    declares_planned_samples: bool = False

    def profile(self) -> ScalingProfile:
        """The job's scaling curve: its measured one, else its job type's (or the default's).

        Raises:
            KeyError: an unknown job type.
        """
        job_type = builtin_job_type(self.job_type or DEFAULT_JOB_TYPE)
        if not self.throughput:
            return job_type.profile
        return measured_profile(f"measured/{self.job_id}", self.throughput)

    def workload_job(self, *, source: str) -> WorkloadJob:
        """The job the simulator replays.

        Args:
            source: ``file:line``, for messages.

        Returns:
            The job; its work is ``duration_s`` at its curve's rate at ``replicas``.

        Raises:
            KeyError: an unknown job type.
        """
        profile = self.profile()
        return WorkloadJob(
            key=JobKey(self.job_id),
            submit_s=self.submit_s,
            queue=QueueName(self.queue) if self.queue is not None else None,
            elastic=self.elastic,
            gpus_per_replica=self.gpus_per_replica,
            min_replicas=self.replicas if self.min_replicas is None else self.min_replicas,
            max_replicas=self.replicas if self.max_replicas is None else self.max_replicas,
            requested_replicas=self.replicas,
            work_units=self.duration_s * profile.rate(self.replicas),
            profile=profile,
            checkpoint_interval_s=(
                DEFAULT_CHECKPOINT_INTERVAL_S
                if self.checkpoint_interval_s is None
                else self.checkpoint_interval_s
            ),
            restart_cost_s=self.restart_cost_s,
            declares_planned_samples=self.declares_planned_samples,
            source=source,
            save_exit_s=self.save_exit_s,
        )


DEFAULT_JOB_TYPE = "transformer"


def read_trace_row(row: Row) -> TraceRow:
    """One row (CSV) or object (JSON Lines) of tide's trace format, checked.

    Raises:
        KeyError: a required column is missing.
        ValueError: a value is malformed; the message names the column.
    """
    duration = column_float(row, "duration_s")
    if not duration > 0 or not math.isfinite(duration):
        raise ValueError(f"duration_s must be > 0, got {duration}")
    job_type = _optional(row, "job_type")
    if job_type is not None:
        try:  # an unknown type is an error even next to a measured curve
            builtin_job_type(str(job_type))
        except KeyError as e:
            raise ValueError(f"job_type: {e.args[0]}") from None
    throughput = _optional(row, "throughput")
    history = _optional(row, "replicas_over_time")

    def maybe_int(key: str) -> int | None:
        return column_int(row, key) if _optional(row, key) is not None else None

    def maybe_float(key: str) -> float | None:
        return column_float(row, key) if _optional(row, key) is not None else None

    queue = _optional(row, "queue")
    save_exit_s = maybe_float("save_exit_s")
    if save_exit_s is not None and not (math.isfinite(save_exit_s) and save_exit_s >= 0):
        raise ValueError(f"save_exit_s must be a finite number >= 0 (seconds), got {save_exit_s}")
    return TraceRow(
        job_id=str(row["job_id"]),
        submit_s=column_float(row, "submit_s"),
        replicas=column_int(row, "replicas"),
        duration_s=duration,
        queue=None if queue is None else str(queue),
        elastic=_bool(row.get("elastic", False)),
        min_replicas=maybe_int("min_replicas"),
        max_replicas=maybe_int("max_replicas"),
        gpus_per_replica=maybe_int("gpus_per_replica") or 1,
        job_type=None if job_type is None else str(job_type),
        restart_cost_s=maybe_float("restart_cost_s"),
        checkpoint_interval_s=maybe_float("checkpoint_interval_s"),
        save_exit_s=save_exit_s,
        throughput=() if throughput is None else parse_throughput(throughput),
        replicas_over_time=() if history is None else parse_replicas_over_time(history),
        declares_planned_samples=_bool(
            row.get("declares_planned_samples", False), "declares_planned_samples"
        ),
    )


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_tide_trace(path: Path, rows: Iterable[TraceRow]) -> int:
    """Write ``rows`` in tide's format: JSON Lines when ``path`` ends in ``.jsonl``, else CSV.

    ``read_trace_rows`` reads back exactly what was written (floats included).

    Args:
        path: the file to write (replaced).
        rows: the jobs.

    Returns:
        How many rows were written.

    Raises:
        TraceError: the file cannot be written.
    """
    count = 0
    try:
        with path.open("w", encoding="utf-8", newline="") as f:
            if path.suffix == ".jsonl":
                for row in rows:
                    record: dict[str, Any] = {
                        "job_id": row.job_id,
                        "submit_s": row.submit_s,
                        "replicas": row.replicas,
                        "duration_s": row.duration_s,
                        "queue": row.queue,
                        "elastic": row.elastic,
                        "min_replicas": row.min_replicas,
                        "max_replicas": row.max_replicas,
                        "gpus_per_replica": row.gpus_per_replica,
                        "job_type": row.job_type,
                        "restart_cost_s": row.restart_cost_s,
                        "checkpoint_interval_s": row.checkpoint_interval_s,
                        "save_exit_s": row.save_exit_s,
                        "throughput": [
                            {"replicas": m.replicas, "samples_per_s": m.samples_per_s}
                            | ({} if m.nodes is None else {"nodes": m.nodes})
                            for m in row.throughput
                        ]
                        or None,
                        "replicas_over_time": [list(p) for p in row.replicas_over_time] or None,
                        "declares_planned_samples": row.declares_planned_samples or None,
                    }
                    f.write(json.dumps({k: v for k, v in record.items() if v is not None}) + "\n")
                    count += 1
                return count
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(TRACE_COLUMNS)
            for row in rows:
                writer.writerow(
                    [
                        _csv_cell(v)
                        for v in (
                            row.job_id,
                            row.submit_s,
                            row.replicas,
                            row.duration_s,
                            row.queue,
                            row.elastic,
                            row.min_replicas,
                            row.max_replicas,
                            row.gpus_per_replica,
                            row.job_type,
                            row.restart_cost_s,
                            row.checkpoint_interval_s,
                            row.save_exit_s,
                        )
                    ]
                    + [
                        format_throughput(row.throughput),
                        ";".join(f"{t!r}:{n}" for t, n in row.replicas_over_time),
                        "true" if row.declares_planned_samples else "",
                    ]
                )
                count += 1
    except OSError as e:
        raise TraceError(path, 0, f"cannot write: {e}") from e
    return count
