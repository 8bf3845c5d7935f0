"""Pollux's measured application profiles and workloads (Qiao et al., OSDI'21, osdi21-artifact).

``traces/<app>/placements.csv`` has ``placement,local_bsz,step_time,sync_time``: ``placement`` is
the GPUs used on each node as digits (``"22"`` = 2 nodes x 2 GPUs), ``step_time`` the seconds of one
iteration at that per-GPU batch. ``scalability.csv`` has ``num_nodes,num_replicas,local_bsz,
step_time,sync_time`` for larger sizes. ``validation-<batch>.csv`` has one row per epoch with the
cumulative ``progress`` and ``iteration`` at that global batch and its ``grad_sqr``, ``grad_var``.

A job of application A with global batch B on n replicas runs at the rate Pollux's own simulator
gives it (``simulations.pollux_model``: its packed placement named as placements.csv names it,
gradient accumulation past the largest local batch with the synchronisation paid once per
optimizer step, yolov3's local batch capped at 8). Its work is the optimizer steps of its
application's epochs (bert 2, cifar10 100, ncf 10, imagenet 90, deepspeech2 80, yolov3 50; Pollux's
``applications.py`` lines 232-237) at batch B, counted as Pollux counts them: the statistical
progress every validated batch reached by then, divided by batch B's gain per step. ncf runs on
one replica at batch 32768, as Pollux runs it (``simulator.py`` lines 191-192, 332-333, 350-351).
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

from scheduler_policy.vocabulary.state import JobKey
from simulations.adaptive_batch import adaptive_application
from simulations.errors import TraceError
from simulations.pollux_model import (
    PINNED_APPLICATIONS,
    application_table,
    iteration_rate_per_s,
    training_iterations,
)
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

    Each size's rate is Pollux's (``simulations.pollux_model.iteration_rate_per_s``); a size
    where Pollux's model gives none (micro-batch below the smallest measured local batch, or
    outside every measurement) runs at the previous size's rate.

    Args:
        traces_dir: Pollux's ``traces/`` folder.
        app: the application (a folder under it).
        batch_size: the global batch size.
        gpus_per_node: GPUs per node when packing replicas onto nodes.

    Returns:
        Iterations per second at 1..MAX_REPLICAS replicas; ``samples_per_unit`` is the batch.

    Raises:
        TraceError: a file is missing or a row cannot be read.
        ValueError: no measurement covers one replica at this batch.
    """
    table = application_table(traces_dir, app)
    rates: list[float] = []
    for n in range(1, MAX_REPLICAS + 1):
        rate = iteration_rate_per_s(
            table, batch_size=batch_size, replicas=n, gpus_per_node=gpus_per_node
        )
        rates.append(rate if math.isfinite(rate) else rates_fallback(rates, n))
    return ScalingProfile(f"pollux/{app}@{batch_size}", tuple(rates), float(batch_size))


def rates_fallback(rates: list[float], n: int) -> float:
    """Rate for a size outside the measured hull: the previous size's (no speedup assumed)."""
    if rates:
        return rates[-1]
    raise ValueError(f"no measurement covers {n} replica(s)")


def total_iterations(traces_dir: Path, app: str, batch_size: int) -> float:
    """Optimizer steps to train ``app`` for its epochs at ``batch_size``, as Pollux counts them
    (``simulations.pollux_model.training_iterations``).

    Raises:
        TraceError: a validation file is missing, short of rows or lacks a column.
    """
    return training_iterations(traces_dir, app, batch_size, EPOCHS[app])


def load_pollux_workload(
    path: Path, *, traces_dir: Path, gpus_per_node: int = 4, skip_bad_rows: bool = False
) -> Workload:
    """Read a Pollux workload CSV (``name,time,application,num_replicas,batch_size``).

    Every job is elastic between 1 replica and the largest size that still adds throughput (at
    most MAX_REPLICAS), and asks for ``num_replicas``; ncf is pinned to one replica at batch 32768.
    Every job but ncf may adapt its batch (``WorkloadJob.adaptive``, within Pollux's bounds for
    its application), as every Pollux job is an AdaptDL job; a replay that keeps the submitted
    batch (``RunOptions.adaptive_batch``, and every baseline) drops that.

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
            batch = PINNED_APPLICATIONS.get(app, batch)
            submit = column_float(row, "time")
            if replicas < 1 or batch < 1 or submit < 0:
                raise ValueError(f"bad num_replicas/batch_size/time {replicas}/{batch}/{submit}")
            profile = application_profile(traces_dir, app, batch, gpus_per_node)
            work = total_iterations(traces_dir, app, batch)
            adaptive = (
                None
                if app in PINNED_APPLICATIONS
                else adaptive_application(traces_dir, app, EPOCHS[app], gpus_per_node)
            )
        except (KeyError, ValueError, TypeError, TraceError) as e:
            bad.append((line, f"missing column {e}" if isinstance(e, KeyError) else str(e)))
            continue
        max_replicas = min(MAX_REPLICAS, max(replicas, max_useful_replicas(profile)))
        if app in PINNED_APPLICATIONS:
            max_replicas = 1
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
                adaptive=adaptive,
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
