"""Pollux's measured application profiles and workloads (Qiao et al., OSDI'21, osdi21-artifact).

``traces/<app>/placements.csv`` has ``placement,local_bsz,step_time,sync_time``: ``placement`` is
the GPUs used on each node as digits (``"22"`` = 2 nodes x 2 GPUs), ``step_time`` the seconds of one
iteration at that per-GPU batch. ``scalability.csv`` has ``num_nodes,num_replicas,local_bsz,
step_time,sync_time`` for larger sizes. ``validation-<batch>.csv`` has one row per epoch with the
cumulative ``iteration`` count at that global batch.

A job of application A with global batch B on n replicas runs iterations of B samples at local
batch B/n. Its step time is interpolated from placements.csv when its packed placement (4 GPUs per
node, filled in order) was measured, else linearly over (num_nodes, num_replicas, local_bsz) from
both files, as Pollux's simulator does. When B/n exceeds the largest measured local batch, the
job accumulates gradients: k = ceil(B / (n x max_local)) micro-steps, each at B/(n k). Its work is
the cumulative iterations after its application's epochs (bert 2, cifar10 100, ncf 10, imagenet 90,
deepspeech2 80, yolov3 50) at batch B.
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import numpy as np
from scipy.interpolate import LinearNDInterpolator, interp1d

from scheduler_policy.vocabulary.state import JobKey
from simulations.errors import TraceError
from simulations.profiles import ScalingProfile
from simulations.traces import bad_rows_error, column_float, column_int
from simulations.workload import Workload, WorkloadJob

EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
"""Epochs each application trains for in Pollux's workloads."""

MAX_REPLICAS = 64
"""Largest size tabulated (Pollux's simulated cluster: 16 nodes x 4 GPUs)."""


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise TraceError(path, 0, f"cannot read: {e}") from e


@functools.lru_cache(maxsize=64)
def application_profile(
    traces_dir: Path, app: str, batch_size: int, gpus_per_node: int = 4
) -> ScalingProfile:
    """The measured scaling profile of ``app`` at global batch ``batch_size``.

    Args:
        traces_dir: Pollux's ``traces/`` folder.
        app: the application (a folder under it).
        batch_size: the global batch size.
        gpus_per_node: GPUs per node when packing replicas onto nodes.

    Returns:
        Iterations per second at 1..MAX_REPLICAS replicas; ``samples_per_unit`` is the batch.

    Raises:
        TraceError: a file is missing or a row cannot be read.
    """
    base = traces_dir / app
    placements = _rows(base / "placements.csv")
    scalability = _rows(base / "scalability.csv")
    by_placement: dict[str, list[tuple[float, float]]] = {}
    points: list[tuple[float, float, float, float]] = []
    for i, row in enumerate(placements, start=2):
        try:
            place, bsz, step = row["placement"], float(row["local_bsz"]), float(row["step_time"])
        except (KeyError, ValueError) as e:
            raise TraceError(base / "placements.csv", i, f"bad row: {e}") from e
        by_placement.setdefault(place, []).append((bsz, step))
        points.append((len(place), sum(int(c) for c in place), bsz, step))
    for i, row in enumerate(scalability, start=2):
        try:
            points.append(
                (
                    float(row["num_nodes"]),
                    float(row["num_replicas"]),
                    float(row["local_bsz"]),
                    float(row["step_time"]),
                )
            )
        except (KeyError, ValueError) as e:
            raise TraceError(base / "scalability.csv", i, f"bad row: {e}") from e
    xyz = np.array([p[:3] for p in points])
    interp = LinearNDInterpolator(xyz, np.array([p[3] for p in points]))
    max_local = float(xyz[:, 2].max())
    min_local = float(xyz[:, 2].min())
    rates: list[float] = []
    for n in range(1, MAX_REPLICAS + 1):
        accum = max(1, math.ceil(batch_size / (n * max_local)))
        local = max(min_local, batch_size / (n * accum))
        full, rest = divmod(n, gpus_per_node)
        place = str(gpus_per_node) * full + (str(rest) if rest else "")
        step = math.nan
        measured = by_placement.get(place)
        if measured and len(measured) > 1:
            bs, st = zip(*sorted(measured), strict=True)
            if bs[0] <= local <= bs[-1]:
                step = float(interp1d(bs, st)(local))
        if not math.isfinite(step):
            step = float(interp([len(place), n, local])[0])
        if not math.isfinite(step):
            step = rates_fallback(rates, n)
            rates.append(step)
            continue
        rates.append(1.0 / (step * accum))
    return ScalingProfile(f"pollux/{app}@{batch_size}", tuple(rates), float(batch_size))


def rates_fallback(rates: list[float], n: int) -> float:
    """Rate for a size outside the measured hull: the previous size's (no speedup assumed)."""
    if rates:
        return rates[-1]
    raise ValueError(f"no measurement covers {n} replica(s)")


@functools.lru_cache(maxsize=64)
def total_iterations(traces_dir: Path, app: str, batch_size: int) -> float:
    """Iterations to train ``app`` for its epochs at ``batch_size`` (from validation-<batch>.csv).

    Raises:
        TraceError: the file is missing or short of rows.
    """
    path = traces_dir / app / f"validation-{batch_size}.csv"
    rows = _rows(path)
    epochs = EPOCHS[app]
    if not rows:
        raise TraceError(path, 1, "no rows")
    row = rows[min(epochs, len(rows)) - 1]
    try:
        return float(row["iteration"])
    except (KeyError, ValueError) as e:
        raise TraceError(path, min(epochs, len(rows)) + 1, f"bad iteration: {e}") from e


def load_pollux_workload(
    path: Path, *, traces_dir: Path, gpus_per_node: int = 4, skip_bad_rows: bool = False
) -> Workload:
    """Read a Pollux workload CSV (``name,time,application,num_replicas,batch_size``).

    Every job is elastic between 1 replica and the largest size whose local batch stays at or
    above the smallest measured one (at most MAX_REPLICAS), and asks for ``num_replicas``.

    Args:
        path: the workload file.
        traces_dir: Pollux's ``traces/`` folder with the application profiles.
        gpus_per_node: GPUs per node, for placement.
        skip_bad_rows: skip (and count) bad rows instead of raising.

    Returns:
        The workload.

    Raises:
        TraceError: every bad row (file and line, the first 20 listed), unless skipped.
    """
    jobs: list[WorkloadJob] = []
    bad: list[tuple[int, str]] = []
    for line, row in enumerate(_rows(path), start=2):
        try:
            app = row["application"]
            if app not in EPOCHS:
                raise ValueError(f"unknown application {app!r}")
            batch, replicas = column_int(row, "batch_size"), column_int(row, "num_replicas")
            submit = column_float(row, "time")
            if replicas < 1 or batch < 1 or submit < 0:
                raise ValueError(f"bad num_replicas/batch_size/time {replicas}/{batch}/{submit}")
            profile = application_profile(traces_dir, app, batch, gpus_per_node)
            work = total_iterations(traces_dir, app, batch)
        except (KeyError, ValueError, TypeError, TraceError) as e:
            bad.append((line, f"missing column {e}" if isinstance(e, KeyError) else str(e)))
            continue
        max_replicas = min(MAX_REPLICAS, max(replicas, max_useful_replicas(profile)))
        jobs.append(
            WorkloadJob(
                key=JobKey(f"pollux/{row['name']}"),
                submit_s=submit,
                queue=None,
                elastic=True,
                gpus_per_replica=1,
                min_replicas=1,
                max_replicas=max_replicas,
                requested_replicas=min(replicas, max_replicas),
                work_units=work,
                profile=profile,
                declares_planned_samples=True,  # a fixed number of epochs: planned samples known
                source=f"{path}:{line}",
            )
        )
    if bad and not skip_bad_rows:
        raise bad_rows_error(str(path), bad)
    jobs.sort(key=lambda j: j.submit_s)
    return Workload(name=path.stem, jobs=tuple(jobs), skipped_rows=len(bad), skipped=tuple(bad))


def max_useful_replicas(profile: ScalingProfile) -> int:
    """The size past which one more replica adds under 1% throughput."""
    best = 1
    for n in range(2, len(profile.units_per_s) + 1):
        if profile.rate(n) > profile.rate(best) * 1.01:
            best = n
    return best
