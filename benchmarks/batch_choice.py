"""How close the worker's batch choice comes to the best batch, on Pollux's measured applications.

    python benchmarks/batch_choice.py [--json PATH]

For every adaptive application of Pollux's traces (ncf is pinned to one replica and adapts
nothing), at the start of several epochs and at several sizes, a job restarts at that size as the
simulator's ``BatchRun`` does it (the worker's own rule, ``scheduler_policy.models.batch_choice``:
the batch closest to the initial one, then re-chosen from what it measured until the choice
stays) and the script compares the progress rate of the batch it settles on with the best rate
at that size, ``gain(B, e) / iteration_s(n, B)`` over every even split the job's bounds allow
(not only the worker's geometric candidates): what a perfectly informed job would make in
Pollux's own model.

Two workers side by side: ``timed sync`` (the step-time model takes the all-reduce the worker
times where its steps cannot tell it from the compute) and ``blind`` (the same worker given no
timed sync: k micro batches priced as k whole steps, as before the worker kept its syncs).

Prints, per application, the median and the worst ratio to the best over its (epoch, size)
points, and the yolov3 rows; ``--json`` writes one record per point. Deterministic; a few
seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scheduler_policy.models.batch_choice import MAX_ACCUMULATION, BatchChoice
from simulations.adaptive_batch import AdaptiveApplication, BatchRun, adaptive_application
from simulations.api import SHARED_TRACES
from simulations.pollux import EPOCHS
from simulations.pollux_model import PINNED_APPLICATIONS

POLLUX_TRACES = SHARED_TRACES / "pollux-osdi21" / "traces"
SIZES = (1, 2, 4, 8, 12, 16, 32)


class _Blind(BatchRun):
    """A worker that timed no all-reduce."""

    def _sync_s(self, local_batch_size: int) -> float | None:
        return None


def _rates(
    app: AdaptiveApplication, run_type: type[BatchRun], *, replicas: int, epoch: int
) -> tuple[float, int, int]:
    run = run_type(app)
    run.follow(replicas=replicas, progress=app.epoch_ends[epoch - 1] if epoch else 0.0)
    return run.progress_rate(), run.choice.global_batch_size, run.choice.accumulation_steps


def _best(app: AdaptiveApplication, *, replicas: int, epoch: int) -> tuple[float, int]:
    """The best rate at ``replicas`` over every even split the bounds allow (every micro batch
    in the local bounds, 1 to ``MAX_ACCUMULATION`` of them), not only the worker's geometric
    candidates, and its global batch."""
    b = app.bounds
    best = (0.0, b.initial_batch_size)
    for local in range(b.local_batch_min, b.local_batch_max + 1):
        for k in range(1, MAX_ACCUMULATION + 1):
            batch = replicas * local * k
            if not b.initial_batch_size <= batch <= b.max_batch_size:
                continue
            seconds = app.iteration_s(replicas, BatchChoice(batch, local, k))
            if math.isfinite(seconds) and seconds > 0:
                best = max(best, (app.gain(batch, epoch) / seconds, batch))
    return best


def points(app: AdaptiveApplication) -> list[dict[str, object]]:
    """One record per (epoch, size) of ``app``: the best rate and each worker's."""
    out: list[dict[str, object]] = []
    epochs = sorted({0, app.epochs // 4, app.epochs // 2, 3 * app.epochs // 4, app.epochs - 1})
    for epoch in epochs:
        for replicas in SIZES:
            if replicas > app.max_replicas or app.timed_size(replicas) != replicas:
                continue
            best, best_batch = _best(app, replicas=replicas, epoch=epoch)
            record: dict[str, object] = {
                "application": app.name,
                "epoch": epoch,
                "replicas": replicas,
                "best_rate": best,
                "best_batch": best_batch,
            }
            for name, run_type in (("timed_sync", BatchRun), ("blind", _Blind)):
                rate, batch, accumulation = _rates(app, run_type, replicas=replicas, epoch=epoch)
                record[f"{name}_rate"] = rate
                record[f"{name}_batch"] = batch
                record[f"{name}_accumulation"] = accumulation
                record[f"{name}_vs_best"] = rate / best if best > 0 else float("nan")
            out.append(record)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write the records here")
    args = parser.parse_args()
    if not POLLUX_TRACES.exists():
        raise SystemExit(f"Pollux's traces are not at {POLLUX_TRACES}")
    records: list[dict[str, object]] = []
    table = Table(title="worker's settled batch: progress rate / the best split's")
    for column in (
        "application",
        "points",
        "timed sync: median",
        "worst",
        "blind: median",
        "worst",
    ):
        table.add_column(column, justify="right")
    for name in sorted(EPOCHS):
        if name in PINNED_APPLICATIONS:
            continue
        found = points(adaptive_application(POLLUX_TRACES, name, EPOCHS[name]))
        records.extend(found)
        timed = [float(r["timed_sync_vs_best"]) for r in found]  # type: ignore[arg-type]
        blind = [float(r["blind_vs_best"]) for r in found]  # type: ignore[arg-type]
        table.add_row(
            name,
            str(len(found)),
            f"{statistics.median(timed):.3f}",
            f"{min(timed):.3f}",
            f"{statistics.median(blind):.3f}",
            f"{min(blind):.3f}",
        )
    console = Console()
    console.print(table)
    rows = Table(title="yolov3: progress per second (batch, micro batches per worker)")
    for column in ("epoch", "replicas", "best", "timed sync", "blind"):
        rows.add_column(column, justify="right")
    for r in records:
        if r["application"] == "yolov3":
            rows.add_row(
                str(r["epoch"]),
                str(r["replicas"]),
                f"{r['best_rate']:.2f} (B {r['best_batch']})",
                *(
                    f"{r[f'{w}_rate']:.2f} ({r[f'{w}_batch']}, {r[f'{w}_accumulation']})"
                    for w in ("timed_sync", "blind")
                ),
            )
    console.print(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
