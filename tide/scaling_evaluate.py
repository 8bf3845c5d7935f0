"""How well scaling models extrapolate: fit on small sizes, predict the measured larger ones.

Profiles are in Pollux's format: a folder of ``<app>/placements.csv`` (``placement,local_bsz,
step_time,sync_time``; a placement spells the GPUs used on each node as digits, ``"14"`` = one
node with 1 GPU and one with 4) and ``<app>/scalability.csv`` (``num_nodes,num_replicas,
local_bsz,step_time,sync_time``). Every row is one measurement at a fixed per-GPU batch b, so
its throughput is k·b / step_time samples/s.

For each n, at each local batch: every measurement with at most n replicas (any placement) is
the training set, and every size k in (n, 2n] whose packed placement (filled node by node, spelt
as the file spells it: ``"14"``, ``"244"``) was measured is a test point, at that placement's
node count. The error is the mean absolute percentage error over the test points of all local
batches. Beside tide's model (``NodeScalingModel``) two placement-blind baselines, fitted on
the packed measurements of sizes ≤ n: linear (X = λk, λ the median of X/k) and a power law
(X = λk^α, least squares in log-log; α = 1 with one size).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler_policy.models.node_scaling import NodeScalingModel
from simulations.errors import TraceError

MODELS = ("tide", "linear", "power_law")
"""The models evaluated, in the order tables show them."""

SIZES = (1, 2, 4, 8)
"""The training sizes n evaluated by default."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured step of an application.

    Attributes:
        replicas: GPUs (one replica each).
        nodes: nodes they spanned.
        local_batch: per-GPU batch, samples.
        samples_per_s: k·b / step time.
        placement: the placement as the file spells it ("" for a scalability.csv row).
    """

    replicas: int
    nodes: int
    local_batch: float
    samples_per_s: float
    placement: str


@dataclass(frozen=True, slots=True)
class Score:
    """One model's error on one application at one training size.

    Attributes:
        app: the application.
        n: the largest training size; test sizes are (n, 2n].
        model: one of ``MODELS``.
        mape_percent: mean absolute percentage error over the test points.
        points: test points scored.
    """

    app: str
    n: int
    model: str
    mape_percent: float
    points: int

    def record(self) -> dict[str, object]:
        """The benchmark record of this score."""
        return {
            "metric": "mape", "value": self.mape_percent, "unit": "percent",
            "model": self.model, "app": self.app, "n": self.n,
        }  # fmt: skip


def packed_placement(replicas: int, gpus_per_node: int) -> str:
    """The packed placement of ``replicas`` GPUs as Pollux's files spell it: the partly filled
    node first, then the full ones (5 on 4-GPU nodes is ``"14"``, 10 is ``"244"``)."""
    full, rest = divmod(replicas, gpus_per_node)
    return (str(rest) if rest else "") + str(gpus_per_node) * full


def _number(row: dict[str, str], column: str) -> float:
    try:
        value = float(row[column])
    except KeyError:
        raise ValueError(f"missing column {column!r}") from None
    except (TypeError, ValueError):
        raise ValueError(f"{column}: not a number, got {row[column]!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{column}: must be a finite number > 0, got {row[column]!r}")
    return value


def _read(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise TraceError(path, 0, f"cannot read: {e.strerror or e}") from e


def read_application(folder: Path) -> list[Measurement]:
    """Every measurement of one application folder.

    Raises:
        TraceError: a file is missing or unreadable, or a row is bad (file and line named).
    """
    out: list[Measurement] = []
    path = folder / "placements.csv"
    for line, row in enumerate(_read(path), start=2):
        try:
            place = (row.get("placement") or "").strip()
            if not place.isdigit() or "0" in place:
                raise ValueError(f"placement: must be digits 1-9 (GPUs per node), got {place!r}")
            k = sum(int(c) for c in place)
            b, step = _number(row, "local_bsz"), _number(row, "step_time")
        except ValueError as e:
            raise TraceError(path, line, str(e)) from e
        out.append(Measurement(k, len(place), b, k * b / step, place))
    path = folder / "scalability.csv"
    for line, row in enumerate(_read(path), start=2):
        try:
            nodes, replicas = _number(row, "num_nodes"), _number(row, "num_replicas")
            b, step = _number(row, "local_bsz"), _number(row, "step_time")
            if replicas != int(replicas) or nodes != int(nodes) or nodes > replicas:
                raise ValueError(
                    "num_nodes/num_replicas: must be whole, nodes <= replicas, "
                    f"got {nodes:g}/{replicas:g}"
                )
        except ValueError as e:
            raise TraceError(path, line, str(e)) from e
        out.append(Measurement(int(replicas), int(nodes), b, replicas * b / step, ""))
    return out


def applications(profiles: Path, names: Sequence[str] = ()) -> dict[str, list[Measurement]]:
    """The applications of a profiles folder (every sub-folder with a placements.csv), by name.

    Raises:
        TraceError: the folder or a named application is missing, or a file is bad.
    """
    if not profiles.is_dir():
        raise TraceError(profiles, 0, "not a folder of <app>/placements.csv and scalability.csv")
    found = sorted(p.name for p in profiles.iterdir() if (p / "placements.csv").is_file())
    for name in names:
        if name not in found:
            raise TraceError(
                profiles / name, 0, f"no such application (found: {', '.join(found) or 'none'})"
            )
    return {name: read_application(profiles / name) for name in (names or found)}


def _baselines(train: list[tuple[int, float]], test_k: np.ndarray) -> dict[str, np.ndarray]:
    k = np.array([p[0] for p in train], dtype=np.float64)
    x = np.array([p[1] for p in train], dtype=np.float64)
    lam = float(np.median(x / k))
    if np.unique(k).size >= 2:
        # log X = log λ + α·log k, least squares.
        alpha, log_lam = np.polyfit(np.log(k), np.log(x), 1)
    else:
        alpha, log_lam = 1.0, math.log(lam)
    return {"linear": lam * test_k, "power_law": math.exp(log_lam) * test_k**alpha}


def evaluate(
    measurements: Sequence[Measurement], *, app: str, n: int, gpus_per_node: int = 4
) -> list[Score]:
    """Each model's MAPE on sizes (n, 2n] after fitting on sizes ≤ n (see the module docstring).

    Returns:
        One score per model; none when no size in (n, 2n] has a measured packed placement.
    """
    errors: dict[str, list[float]] = {name: [] for name in MODELS}
    for b in sorted({m.local_batch for m in measurements}):
        at_b = [m for m in measurements if m.local_batch == b]
        train = [m for m in at_b if m.replicas <= n]
        tests: list[tuple[int, int, float]] = []
        for k in range(n + 1, 2 * n + 1):
            place = packed_placement(k, gpus_per_node)
            seen = [m.samples_per_s for m in at_b if m.placement == place]
            if seen:
                tests.append((k, len(place), statistics.median(seen)))
        packed_train = [
            (m.replicas, m.samples_per_s) for m in train
            if m.placement == packed_placement(m.replicas, gpus_per_node)
        ]  # fmt: skip
        if not tests or not packed_train:
            continue
        model = NodeScalingModel().fit(
            [[m.replicas, m.nodes] for m in train], [m.samples_per_s for m in train]
        )
        test_k = np.array([t[0] for t in tests], dtype=np.float64)
        truth = np.array([t[2] for t in tests])
        predictions = {"tide": model.predict(np.column_stack([test_k, [t[1] for t in tests]]))}
        predictions |= _baselines(packed_train, test_k)
        for name, pred in predictions.items():
            errors[name].extend((100.0 * np.abs(pred - truth) / truth).tolist())
    return [
        Score(app, n, name, float(np.mean(errs)), len(errs))
        for name, errs in errors.items()
        if errs
    ]


def evaluate_all(
    profiles: Path,
    *,
    apps: Sequence[str] = (),
    sizes: Sequence[int] = SIZES,
    gpus_per_node: int = 4,
) -> list[Score]:
    """``evaluate`` for every application of ``profiles`` (or those named) and every n.

    Raises:
        TraceError: as ``applications``.
        ValueError: a size below 1 or a node size below 1.
    """
    if gpus_per_node < 1 or any(n < 1 for n in sizes):
        raise ValueError(
            f"sizes and gpus_per_node must be >= 1, got {list(sizes)} and {gpus_per_node}"
        )
    scores: list[Score] = []
    for name, measurements in applications(profiles, apps).items():
        for n in sizes:
            scores += evaluate(measurements, app=name, n=n, gpus_per_node=gpus_per_node)
    return scores


def medians(scores: Sequence[Score]) -> dict[tuple[str, int], tuple[float, float]]:
    """Per (model, n): the median and the largest MAPE over the applications, percent."""
    groups: dict[tuple[str, int], list[float]] = {}
    for s in scores:
        groups.setdefault((s.model, s.n), []).append(s.mape_percent)
    return {key: (statistics.median(v), max(v)) for key, v in groups.items()}
