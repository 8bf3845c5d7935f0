"""How tide's headroom forecast compares with the naive ones on every Helios queue in ../shared.

    python benchmarks/forecast_accuracy.py [--json PATH] [--horizons 1800] [--targets peak]
                                           [--quantile 0.9] [--test-days 10] [--workers 2]

Rolling origin over each queue's last ``--test-days`` (refit daily, origins every 10 minutes, no
look-ahead), as ``tide forecast evaluate`` does (by default only what the targets name, the
peak at 30 minutes: ``--horizons 600,1800,3600 --targets peak,point`` scores all). Prints
the 30-minute q-quantile peak-target table (pinball loss of tide and of the best naive quantile
baseline, recent peak or persistence + residual quantile, and tide's coverage) and whether
issue 18's targets are met: pinball at least 15% below the best naive baseline on average over
the queues and no more than 2% worse on any, coverage within [0.87, 0.94] on every queue.
Also times one engine fit per queue (a
``PeakForecaster`` on the whole minute series, 30-minute horizon). ``--json`` writes every
score record, then the summary records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scheduler_policy.models.demand_grid import Target
from scheduler_policy.models.forecast_eval import NAIVE_QUANTILE_MODELS, evaluate_series
from scheduler_policy.models.peak_forecast import PeakForecaster
from simulations.demand_series import read_helios

HELIOS = Path(__file__).resolve().parents[1].parent / "shared/traces/helios-artifact/earth_vcs"
TARGET_HORIZON_S = 1800.0
PINBALL_GAIN = 0.15  # at least 15% below the best naive baseline on average
PINBALL_WORST = 0.02  # no more than 2% above it on any queue
COVERAGE_BAND = (0.87, 0.94)


Unit = tuple[Path, list[float], list[Target], float, float]


def _one(unit: Unit) -> tuple[str, list[dict[str, object]], float]:
    path, horizons, targets, quantile, test_days = unit
    name, grid = read_helios(path)
    evaluation = evaluate_series(
        grid,
        name=name,
        horizons_s=horizons,
        quantile=quantile,
        test_s=test_days * 86400.0,
        targets=targets,
    )
    started = time.perf_counter()
    PeakForecaster(quantile=quantile, horizon_s=TARGET_HORIZON_S).fit_grid(grid, end=grid.size)
    fit_s = time.perf_counter() - started
    return name, [s.record() for s in evaluation.scores], fit_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--horizons", default="1800", help="seconds, comma-separated")
    parser.add_argument("--targets", default="peak", help="peak and/or point, comma-separated")
    parser.add_argument("--quantile", type=float, default=0.9)
    parser.add_argument("--test-days", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    paths = sorted(HELIOS.glob("*/cluster_sequence_vc.csv"))
    if not paths:
        sys.exit(f"no Helios queue under {HELIOS}")
    horizons = [float(h) for h in args.horizons.split(",")]
    if TARGET_HORIZON_S not in horizons:
        horizons.append(TARGET_HORIZON_S)
    targets = [Target(t) for t in args.targets.split(",")]
    if Target.PEAK not in targets:
        targets.append(Target.PEAK)
    units = [(p, horizons, targets, args.quantile, args.test_days) for p in paths]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_one, units))
    records = [r for _, rs, _ in results for r in rs]
    fit_s = {name: f for name, _, f in results}

    def value(series: str, model: str, metric: str) -> float:
        for r in records:
            if (r["series"], r["model"], r["metric"], r["target"], r["horizon_s"]) == (
                series, model, metric, "peak", int(TARGET_HORIZON_S)):  # fmt: skip
                return float(r["value"])  # type: ignore[arg-type]
        raise KeyError(series)

    table = Table(title=f"peak target, {TARGET_HORIZON_S / 60:.0f} min, q = {args.quantile}")
    for col in ("queue", "tide pinball", "best naive", "(model)", "ratio", "tide coverage",
                "naive coverage", "fit s"):  # fmt: skip
        table.add_column(col, justify="right")
    ratios, coverages, summary = [], [], []
    for name, _, _ in results:
        naive = {m: value(name, m, "pinball") for m in NAIVE_QUANTILE_MODELS}
        best = min(naive, key=lambda m: naive[m])
        tide = value(name, "tide", "pinball")
        ratio = tide / naive[best] if naive[best] > 0 else (1.0 if tide == 0 else float("inf"))
        cov = value(name, "tide", "coverage")
        ratios.append(ratio)
        coverages.append(cov)
        table.add_row(
            name, f"{tide:.4f}", f"{naive[best]:.4f}", best, f"{ratio:.3f}", f"{cov:.3f}",
            f"{value(name, best, 'coverage'):.3f}", f"{fit_s[name]:.2f}",
        )  # fmt: skip
        summary += [
            {"metric": "pinball_vs_best_naive", "value": round(ratio, 4), "unit": "ratio",
             "series": name, "best_naive": best},
            {"metric": "fit_time", "value": round(fit_s[name], 3), "unit": "s", "series": name},
        ]  # fmt: skip
    mean_ratio = statistics.fmean(ratios)
    checks = {
        "mean pinball >= 15% below best naive": mean_ratio <= 1 - PINBALL_GAIN,
        "no queue > 2% worse": max(ratios) <= 1 + PINBALL_WORST,
        "coverage in [0.87, 0.94] on every queue": all(
            COVERAGE_BAND[0] <= c <= COVERAGE_BAND[1] for c in coverages
        ),
    }
    console = Console(width=140)
    console.print(table)
    console.print(f"mean pinball ratio {mean_ratio:.3f}; worst {max(ratios):.3f}")
    for check, met in checks.items():
        console.print(f"  {'met' if met else 'NOT met'}: {check}")
    summary.append({"metric": "pinball_vs_best_naive_mean", "value": round(mean_ratio, 4),
                    "unit": "ratio", "series": "all"})  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(records + summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
