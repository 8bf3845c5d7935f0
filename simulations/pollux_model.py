"""Pollux's application model: how fast one of its measured applications trains at a given size.

This follows Pollux's own simulator (petuum/adaptdl, branch ``osdi21-artifact``,
``simulator/applications.py`` and ``simulator/simulator.py``); each rule below cites the line it
follows. A job of global batch B on n replicas:

- splits B into a per-replica batch ``ceil(B / n)``; when that exceeds the application's largest
  local batch it accumulates gradients over ``accum_steps`` extra micro-steps of ``atomic_bsz``
  samples each (:func:`step_plan`);
- runs on its packed placement (4 GPUs per node, filled in order), named as Pollux names it: the
  lexicographically smallest rotation of the per-node GPU counts, so 5 GPUs are ``"14"``, not
  ``"41"`` (:func:`placement_id`);
- takes the measured ``step_time`` and ``sync_time`` of that placement at ``atomic_bsz``
  (interpolated over local batch) when placements.csv has it, else interpolated linearly over
  (num_nodes, num_replicas, local_bsz) from both files (:meth:`ApplicationTable.step_and_sync_s`);
- pays the synchronisation once per optimizer step: an iteration takes
  ``step + accum_steps x (step - sync)`` seconds (:func:`iteration_time_s`).
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.interpolate import LinearNDInterpolator, interp1d
from scipy.spatial import QhullError

from simulations.errors import TraceError

LOCAL_BATCH_CAPS: Mapping[str, int] = {"yolov3": 8}
"""Largest local batch per application where Pollux overrides the measured one
(``applications.py`` line 237: yolov3 ``max_local_bsz=8``; the file measures up to 16)."""

PINNED_APPLICATIONS: Mapping[str, int] = {"ncf": 32768}
"""Applications Pollux runs on one replica at a fixed global batch: ``simulator.py`` lines
191-192 set ncf's batch to 32768, lines 332-333 and 350-351 cap it at one replica."""

MAX_NODES = 16
"""Pollux's simulated cluster has 16 nodes; interpolation clamps num_nodes to it
(``applications.py`` line 223)."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """How one optimizer step of a job is split.

    Attributes:
        accum_steps: extra micro-steps accumulated before the synchronising one (0 = none).
        atomic_bsz: samples per replica in each micro-step.
    """

    accum_steps: int
    atomic_bsz: int


def step_plan(
    *,
    batch_size: int,
    replicas: int,
    init_batch_size: int,
    max_batch_size: int,
    max_local_bsz: int,
) -> StepPlan:
    """Pollux's split of a global batch into micro-steps (``simulator.py`` lines 77-83).

    Args:
        batch_size: the job's global batch.
        replicas: its replicas, >= 1.
        init_batch_size: the application's smallest validated batch.
        max_batch_size: its largest validated batch.
        max_local_bsz: its largest local batch (measured, or Pollux's cap).

    Returns:
        ``local = ceil(B / n)``; ``accum = ceil(local / max_local) - 1``, at least 1 on one replica
        whenever B exceeds the initial batch (line 79-80); ``atomic = ceil(local / (accum + 1))``,
        at most ``max_batch_size / (n (accum + 1))`` (line 83).

    Raises:
        ValueError: ``replicas`` or a batch size is below 1.
    """
    if replicas < 1 or batch_size < 1 or max_local_bsz < 1 or max_batch_size < 1:
        raise ValueError(
            f"replicas, batch_size, max_local_bsz and max_batch_size must be >= 1, got "
            f"{replicas}, {batch_size}, {max_local_bsz}, {max_batch_size}"
        )
    # The 1e-8 guards against float error in an exact division, as Pollux's code does.
    local = math.ceil(batch_size / replicas - 1e-8)
    accum = math.ceil(local / max_local_bsz - 1e-8) - 1
    if replicas == 1 and batch_size > init_batch_size:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    atomic = min(atomic, int(max_batch_size / (replicas * (accum + 1))))
    return StepPlan(accum_steps=accum, atomic_bsz=atomic)


def iteration_time_s(*, step_s: float, sync_s: float, accum_steps: int) -> float:
    """Seconds of one optimizer step: the synchronising micro-step plus ``accum_steps`` that only
    compute (``simulator.py`` lines 119-130, ``total_time = step_time + accum_time x accum_steps``
    with ``accum_time = step_time - sync_time``; the same in optimus.py line 79).

    Args:
        step_s: measured seconds of one micro-step including synchronisation.
        sync_s: its synchronisation seconds.
        accum_steps: extra micro-steps.

    Returns:
        The seconds.
    """
    return step_s + accum_steps * (step_s - sync_s)


def packed_placement(replicas: int, *, gpus_per_node: int) -> tuple[int, ...]:
    """GPUs per node when ``replicas`` fill nodes in order (``optimus.py`` lines 66-68).

    Raises:
        ValueError: ``replicas`` or ``gpus_per_node`` is below 1.
    """
    if replicas < 1 or gpus_per_node < 1:
        raise ValueError(
            f"replicas and gpus_per_node must be >= 1, got {replicas}, {gpus_per_node}"
        )
    full, rest = divmod(replicas, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def placement_id(placement: tuple[int, ...]) -> str:
    """The name placements.csv gives a placement: the lexicographically smallest rotation of its
    non-empty nodes' GPU counts, as digits (``applications.py`` lines 206-210).

    Args:
        placement: GPUs on each node.

    Returns:
        E.g. ``"14"`` for (4, 1), ``"244"`` for (4, 4, 2).

    Raises:
        ValueError: a node has 10 or more GPUs (the digits would be ambiguous) or none is used.
    """
    nodes = tuple(g for g in placement if g)
    if not nodes or any(g > 9 for g in nodes):
        raise ValueError(f"placement must use 1 to 9 GPUs on some node, got {placement}")
    smallest = min(nodes[i:] + nodes[:i] for i in range(len(nodes)))
    return "".join(str(g) for g in smallest)


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise TraceError(path, 0, f"cannot read: {e}") from e


@dataclass(frozen=True, eq=False)
class ApplicationTable:
    """One application's measurements, read once.

    Attributes:
        name: the application.
        by_placement: placement id -> sorted (local_bsz, step_s, sync_s) rows of placements.csv.
        points: (num_nodes, num_replicas, local_bsz) of every distinct configuration of both
            files (placements.csv averaged per configuration, as ``applications.py`` line 220).
        values: (step_s, sync_s) at each point.
        min_local_bsz: smallest local batch in placements.csv (``applications.py`` line 44).
        max_local_bsz: largest, or Pollux's cap (line 45, 237).
        init_batch_size: smallest validated global batch (line 42).
        max_batch_size: largest validated global batch (line 43).
    """

    name: str
    by_placement: Mapping[str, tuple[tuple[float, float, float], ...]]
    points: np.ndarray
    values: np.ndarray
    min_local_bsz: int
    max_local_bsz: int
    init_batch_size: int
    max_batch_size: int

    @functools.cached_property
    def _interpolator(self) -> LinearNDInterpolator:
        try:
            return LinearNDInterpolator(self.points, self.values)
        except (QhullError, ValueError) as e:  # all points on a plane: nothing to interpolate
            raise ValueError(
                f"application {self.name!r}: its measurements span no volume of "
                f"(num_nodes, num_replicas, local_bsz) to interpolate over: {e}"
            ) from e

    def step_and_sync_s(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """Seconds of one micro-step and of its synchronisation (``applications.py`` 205-227).

        Args:
            placement: GPUs on each node.
            local_bsz: samples per replica per micro-step.

        Returns:
            Interpolated over local batch on the placement's own rows when placements.csv
            measured it and ``local_bsz`` lies in their range, else over (num_nodes clamped to
            16, num_replicas, local_bsz) from both files; NaN outside every measurement.
        """
        rows = self.by_placement.get(placement_id(placement))
        if rows and rows[0][0] <= local_bsz <= rows[-1][0]:
            if len(rows) == 1:
                return rows[0][1], rows[0][2]
            bs = [r[0] for r in rows]
            step, sync = interp1d(bs, [[r[1], r[2]] for r in rows], axis=0)(local_bsz)
            return float(step), float(sync)
        nodes = min(sum(1 for g in placement if g), MAX_NODES)
        step, sync = self._interpolator([nodes, sum(placement), local_bsz])[0]
        return float(step), float(sync)


@functools.lru_cache(maxsize=16)
def application_table(traces_dir: Path, app: str) -> ApplicationTable:
    """Read ``traces_dir/app``'s placements.csv, scalability.csv and validation-*.csv names.

    Args:
        traces_dir: Pollux's ``traces/`` folder.
        app: the application (a folder under it).

    Returns:
        The table.

    Raises:
        TraceError: a file is missing, a row cannot be read or no validation-<batch>.csv exists.
    """
    base = traces_dir / app
    by_placement: dict[str, list[tuple[float, float, float]]] = {}
    grouped: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
    for i, row in enumerate(_rows(base / "placements.csv"), start=2):
        try:
            place = row["placement"].strip()
            bsz, step = float(row["local_bsz"]), float(row["step_time"])
            sync = float(row["sync_time"])
            if not place.isdigit():
                raise ValueError(f"placement {place!r} is not digits")
        except (KeyError, ValueError) as e:
            raise TraceError(base / "placements.csv", i, f"bad row: {e}") from e
        by_placement.setdefault(place, []).append((bsz, step, sync))
        key = (float(len(place)), float(sum(int(c) for c in place)), bsz)
        grouped.setdefault(key, []).append((step, sync))
    if not by_placement:
        raise TraceError(base / "placements.csv", 1, "no rows")
    for i, row in enumerate(_rows(base / "scalability.csv"), start=2):
        try:
            key = (float(row["num_nodes"]), float(row["num_replicas"]), float(row["local_bsz"]))
            value = (float(row["step_time"]), float(row["sync_time"]))
        except (KeyError, ValueError) as e:
            raise TraceError(base / "scalability.csv", i, f"bad row: {e}") from e
        grouped.setdefault(key, []).append(value)
    batches = sorted(
        int(p.stem.split("-", 1)[1])
        for p in base.glob("validation-*.csv")
        if p.stem.split("-", 1)[1].isdigit()
    )
    if not batches:
        raise TraceError(base, 0, "no validation-<batch>.csv file")
    local_sizes = [r[0] for rows in by_placement.values() for r in rows]
    return ApplicationTable(
        name=app,
        by_placement={k: tuple(sorted(v)) for k, v in by_placement.items()},
        points=np.array(list(grouped)),
        values=np.array([np.mean(v, axis=0) for v in grouped.values()]),
        min_local_bsz=int(min(local_sizes)),
        max_local_bsz=LOCAL_BATCH_CAPS.get(app, int(max(local_sizes))),
        init_batch_size=batches[0],
        max_batch_size=batches[-1],
    )


def iteration_rate_per_s(
    table: ApplicationTable, *, batch_size: int, replicas: int, gpus_per_node: int
) -> float:
    """Optimizer steps per second of a job at ``batch_size`` on ``replicas`` packed replicas.

    Args:
        table: the application's measurements.
        batch_size: the global batch.
        replicas: replicas, >= 1.
        gpus_per_node: GPUs per node, for packing.

    Returns:
        The rate; NaN where the micro-batch falls below the smallest measured local batch (Pollux
        never runs a job there: ``simulator.py`` line 347 caps replicas at B / min_local_bsz) or
        outside every measurement.
    """
    plan = step_plan(
        batch_size=batch_size,
        replicas=replicas,
        init_batch_size=table.init_batch_size,
        max_batch_size=table.max_batch_size,
        max_local_bsz=table.max_local_bsz,
    )
    if plan.atomic_bsz < table.min_local_bsz:
        return math.nan
    placement = packed_placement(replicas, gpus_per_node=gpus_per_node)
    step, sync = table.step_and_sync_s(placement, plan.atomic_bsz)
    if not (math.isfinite(step) and math.isfinite(sync)):
        return math.nan
    return 1.0 / iteration_time_s(step_s=step, sync_s=sync, accum_steps=plan.accum_steps)


def validation_curves(traces_dir: Path, app: str) -> dict[int, list[tuple[float, float, float]]]:
    """Each validated batch's ``(progress, grad_sqr, grad_var)`` per epoch.

    Args:
        traces_dir: Pollux's ``traces/`` folder.
        app: the application.

    Returns:
        Validated global batch -> one row per epoch, in file order.

    Raises:
        TraceError: a file cannot be read or a row lacks a column or a number.
    """
    curves: dict[int, list[tuple[float, float, float]]] = {}
    for path in sorted((traces_dir / app).glob("validation-*.csv")):
        suffix = path.stem.split("-", 1)[1]
        if not suffix.isdigit():
            continue
        rows: list[tuple[float, float, float]] = []
        for i, row in enumerate(_rows(path), start=2):
            try:
                rows.append(
                    (float(row["progress"]), float(row["grad_sqr"]), float(row["grad_var"]))
                )
            except (KeyError, ValueError) as e:
                raise TraceError(path, i, f"bad row: {e}") from e
        curves[int(suffix)] = rows
    return curves


@functools.lru_cache(maxsize=64)
def training_iterations(traces_dir: Path, app: str, batch_size: int, epochs: int) -> float:
    """Optimizer steps a job of ``app`` at ``batch_size`` needs for ``epochs``, as Pollux's
    simulator counts them.

    Pollux measures training in statistical progress, not iterations: epoch e ends when the
    progress reaches the least any validated batch had made by then (``applications.py`` lines
    132-136), and one step at batch B makes ``gain = (var + sqr) / (var / scale + sqr)`` of it,
    ``scale = B / init_batch_size``, from B's gradient statistics in that epoch
    (``simulator.py`` lines 117-126, 133-149). So the steps are
    sum over epochs of (progress_e - progress_(e-1)) / gain_e.

    Args:
        traces_dir: Pollux's ``traces/`` folder.
        app: the application.
        batch_size: a validated global batch (a validation-<batch>.csv exists).
        epochs: epochs to train, >= 1; at most the rows every validation file has.

    Returns:
        The steps.

    Raises:
        TraceError: the batch was not validated, a file lacks ``progress``, ``grad_sqr`` or
            ``grad_var``, has fewer rows than ``epochs``, or a gain is not positive.
    """
    base = traces_dir / app
    curves = validation_curves(traces_dir, app)
    own = curves.get(batch_size)
    if own is None:
        raise TraceError(base / f"validation-{batch_size}.csv", 0, "no such validated batch")
    for batch, rows in curves.items():
        if len(rows) < epochs:
            raise TraceError(
                base / f"validation-{batch}.csv", len(rows) + 1, f"fewer than {epochs} epochs"
            )
    scale = batch_size / min(curves)
    steps, done = 0.0, 0.0
    for e in range(epochs):
        target = min(rows[e][0] for rows in curves.values())
        _, sqr, var = own[e]
        gain = (var + sqr) / (var / scale + sqr)
        if not (math.isfinite(gain) and gain > 0):
            raise TraceError(base / f"validation-{batch_size}.csv", e + 2, f"gain {gain}")
        steps += (target - done) / gain
        done = target
    return steps
