"""Trace loaders: Philly job lists, Microsoft ITP / ElasticFlow raw traces, tide's own format.

Duration-only traces (Philly, ITP) say how long a job ran on how many GPUs, not how it scales, so
each job gets a built-in job type's curve (seeded choice) scaled so that it takes exactly its
recorded duration at its recorded size. A seeded ``elastic_fraction`` of jobs is elastic, between
half and twice their size. tide's own format (TRACE_FORMAT.md) says all of this per job.
"""

from __future__ import annotations

import csv
import io
import json
import math
import tarfile
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from scheduler_policy.vocabulary.state import JobKey
from simulations.errors import TraceError
from simulations.profiles import BUILTIN_JOB_TYPES
from simulations.trace_rows import Row, TraceRow, read_trace_row
from simulations.trace_rows import column_float as column_float  # re-exported for the loaders
from simulations.trace_rows import column_int as column_int
from simulations.workload import Workload, WorkloadJob


def _pick(key: str, salt: str, n: int) -> int:
    """A stable pseudo-random index in [0, n) from a job's key (seeded by ``salt``)."""
    return zlib.crc32(f"{salt}/{key}".encode()) % n


def duration_job(
    *,
    key: str,
    submit_s: float,
    duration_s: float,
    gpus: int,
    seed: int,
    elastic_fraction: float,
    source: str,
) -> WorkloadJob:
    """A job from a duration-only record (see the module docstring).

    Args:
        key: the job's id.
        submit_s: submission time, seconds from the trace start.
        duration_s: run time at ``gpus`` GPUs.
        gpus: GPUs it ran with (one per replica).
        seed: seeds the job-type and elasticity choices.
        elastic_fraction: share of jobs made elastic.
        source: ``file:line``.

    Returns:
        The job.

    Raises:
        ValueError: a non-positive duration or GPU count.
    """
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration must be > 0, got {duration_s}")
    if gpus < 1:
        raise ValueError(f"GPU count must be >= 1, got {gpus}")
    elastic = _pick(key, f"elastic{seed}", 10_000) < elastic_fraction * 10_000
    job_type = BUILTIN_JOB_TYPES[_pick(key, f"type{seed}", len(BUILTIN_JOB_TYPES))]
    return WorkloadJob(
        key=JobKey(f"trace/{key}"),
        submit_s=submit_s,
        queue=None,
        elastic=elastic,
        gpus_per_replica=1,
        min_replicas=max(1, gpus // 2) if elastic else gpus,
        max_replicas=gpus * 2 if elastic else gpus,
        requested_replicas=gpus,
        work_units=duration_s * job_type.profile.rate(gpus),
        profile=job_type.profile,
        source=source,
    )


def _csv_rows(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    yield from enumerate(csv.DictReader(io.StringIO(text)), start=2)


def _collect(
    rows: Iterator[tuple[int, Row]],
    *,
    where: str,
    name: str,
    skip_bad_rows: bool,
    build: Callable[[int, Row], WorkloadJob],
) -> Workload:
    jobs: list[WorkloadJob] = []
    bad: list[tuple[int, str]] = []
    for line, row in rows:
        try:
            job = build(line, row)
            problems = job.problems()
            if problems:
                raise ValueError("; ".join(problems))
        except (KeyError, ValueError, TypeError) as e:
            bad.append((line, f"missing column {e}" if isinstance(e, KeyError) else str(e)))
            continue
        jobs.append(job)
    if bad and not skip_bad_rows:
        raise bad_rows_error(where, bad)
    jobs.sort(key=lambda j: j.submit_s)
    return Workload(name=name, jobs=tuple(jobs), skipped_rows=len(bad), skipped=tuple(bad))


MAX_BAD_ROWS_SHOWN = 20
"""Bad rows an error lists one by one; the rest are counted ("and N more")."""


def bad_rows_error(where: str, bad: list[tuple[int, str]]) -> TraceError:
    """One error for every bad row of a trace: the first ``MAX_BAD_ROWS_SHOWN``, each as
    ``file:line: problem``, then how many more, so that a file is fixed in one pass.

    Args:
        where: the trace, as messages name it.
        bad: ``(line, problem)`` of each bad row, in file order (at least one).

    Returns:
        The error, naming the first bad row as its line.
    """
    (line, problem), rest = bad[0], bad[1:MAX_BAD_ROWS_SHOWN]
    text = problem + "".join(f"\n{where}:{n}: {p}" for n, p in rest)
    if len(bad) > MAX_BAD_ROWS_SHOWN:
        text += f"\nand {len(bad) - MAX_BAD_ROWS_SHOWN} more bad rows"
    if len(bad) > 1:
        text += f"\n{len(bad)} bad rows in all; --skip-bad-rows replays the others"
    return TraceError(where, line, text)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(path, 0, f"cannot read: {e}") from e


def load_philly(
    path: Path,
    *,
    seed: int = 0,
    elastic_fraction: float = 0.5,
    skip_bad_rows: bool = False,
    max_jobs: int | None = None,
) -> Workload:
    """Read a Philly-derived job list (``timestamp,duration,num_gpus,gpu_time,cluster``).

    ``timestamp`` is ``YYYY-MM-DD HH:MM:SS``; submissions are measured from the earliest one.

    Raises:
        TraceError: a bad row (file and line), unless ``skip_bad_rows``.
    """
    rows = list(_csv_rows(_read(path)))[: max_jobs or None]
    stamps: list[float] = []
    for _, row in rows:
        try:
            stamps.append(datetime.fromisoformat(row["timestamp"]).timestamp())
        except (KeyError, ValueError, TypeError):
            continue
    origin = min(stamps, default=0.0)

    def build(line: int, row: Row) -> WorkloadJob:
        try:
            stamp = datetime.fromisoformat(row["timestamp"]).timestamp()
        except ValueError:
            raise ValueError(
                f"timestamp must be YYYY-MM-DD HH:MM:SS, got {row['timestamp']!r}"
            ) from None
        submit = stamp - origin
        return duration_job(
            key=f"philly-{line}",
            submit_s=submit,
            duration_s=column_float(row, "duration"),
            gpus=column_int(row, "num_gpus"),
            seed=seed,
            elastic_fraction=elastic_fraction,
            source=f"{path}:{line}",
        )

    return _collect(
        iter(rows), where=str(path), name=path.stem, skip_bad_rows=skip_bad_rows, build=build
    )


def load_itp(
    path: Path,
    *,
    member: str,
    seed: int = 0,
    elastic_fraction: float = 0.5,
    skip_bad_rows: bool = False,
) -> Workload:
    """Read one cluster of the Microsoft ITP raw traces (``job_id,submission_time,duration,
    num_gpu``) from inside the ElasticFlow tarball, without extracting it.

    Args:
        path: ``raw-traces.tar.gz``.
        member: the member's file name, e.g. ``cluster04.csv``.
        seed: seeds job types and elasticity.
        elastic_fraction: share of jobs made elastic.
        skip_bad_rows: skip (and count) bad rows.

    Raises:
        TraceError: the archive or member cannot be read, or a bad row.
    """
    where = f"{path}:{member}"
    try:
        with tarfile.open(path) as archive:
            members = archive.getmembers()
            found = [m for m in members if Path(m.name).name == member]
            if not found:
                tables = sorted(Path(m.name).name for m in members if m.name.endswith(".csv"))
                raise TraceError(
                    where,
                    0,
                    f"no such member in the archive (--member): it has {', '.join(tables)}",
                )
            handle = archive.extractfile(found[0])
            if handle is None:
                raise TraceError(where, 0, "member is not a file")
            text = handle.read().decode("utf-8")
    except (OSError, tarfile.TarError, UnicodeDecodeError) as e:
        raise TraceError(where, 0, f"cannot read: {e}") from e

    def build(line: int, row: Row) -> WorkloadJob:
        return duration_job(
            key=str(row["job_id"]),
            submit_s=column_float(row, "submission_time"),
            duration_s=column_float(row, "duration"),
            gpus=column_int(row, "num_gpu"),
            seed=seed,
            elastic_fraction=elastic_fraction,
            source=f"{where}:{line}",
        )

    return _collect(
        _csv_rows(text),
        where=where,
        name=f"itp-{Path(member).stem}",
        skip_bad_rows=skip_bad_rows,
        build=build,
    )


def tide_job(row: Row, *, source: str) -> WorkloadJob:
    """One job of tide's trace format (TRACE_FORMAT.md)."""
    return read_trace_row(row).workload_job(source=source)


def _rows_of(path: Path, text: str) -> Iterator[tuple[int, Row]]:
    if path.suffix != ".jsonl":
        return _csv_rows(text)

    def json_rows() -> Iterator[tuple[int, Row]]:
        for line, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as e:
                value = {"_error": f"invalid JSON: {e.msg}"}
            yield line, value if isinstance(value, dict) else {"_error": "not an object"}

    return json_rows()


def load_tide_trace(path: Path, *, skip_bad_rows: bool = False) -> Workload:
    """Read a trace in tide's format: CSV, or JSON Lines when the name ends in ``.jsonl``.

    Raises:
        TraceError: a bad row or line (file and line), unless ``skip_bad_rows``.
    """

    def build(line: int, row: Row) -> WorkloadJob:
        if "_error" in row:
            raise ValueError(row["_error"])
        return tide_job(row, source=f"{path}:{line}")

    rows = _rows_of(path, _read(path))
    return _collect(rows, where=str(path), name=path.stem, skip_bad_rows=skip_bad_rows, build=build)


def read_trace_rows(path: Path) -> list[TraceRow]:
    """Every row of a tide-format trace, as written (no defaults filled in).

    Raises:
        TraceError: a bad row or line (file and line).
    """
    out: list[TraceRow] = []
    for line, row in _rows_of(path, _read(path)):
        try:
            if "_error" in row:
                raise ValueError(row["_error"])
            out.append(read_trace_row(row))
        except (KeyError, ValueError, TypeError) as e:
            detail = f"missing column {e}" if isinstance(e, KeyError) else str(e)
            raise TraceError(path, line, detail) from e
    return out
