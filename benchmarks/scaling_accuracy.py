"""How well tide's scaling model extrapolates, on every Pollux-format profile folder in ../shared.

    python benchmarks/scaling_accuracy.py [--json PATH] [--sizes 1,2,4,8]

For n = 1, 2, 4 and 8: fit on every measurement with at most n replicas (any placement), predict
every size in (n, 2n] at its measured packed placement (4 GPUs per node), at each measured
per-GPU batch; MAPE per application beside the linear and power-law baselines
(``tide.scaling_evaluate``). Target: median MAPE over the applications <= 10% at every n, no
application above 30%. Prints the table and a verdict per n; ``--json`` writes one record per
(model, application, n) plus the median and worst per (model, n) (``"app": "median"`` /
``"worst"``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulations.api import SHARED_TRACES
from tide.scaling_command import scores_table
from tide.scaling_evaluate import SIZES, evaluate_all, medians

TARGET_MEDIAN_PERCENT = 10.0
TARGET_WORST_PERCENT = 30.0


def profile_folders() -> list[Path]:
    """Every folder under ../shared/traces holding ``<app>/placements.csv`` profiles."""
    return sorted(
        {p.parent.parent for p in SHARED_TRACES.glob("*/traces/*/placements.csv")}
        | {p.parent.parent for p in SHARED_TRACES.glob("*/*/placements.csv")}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = parser.parse_args()
    sizes = [int(v) for v in args.sizes.split(",")]
    console = Console()
    records: list[dict[str, object]] = []
    folders = profile_folders()
    if not folders:
        raise SystemExit(f"no profiles (<app>/placements.csv) under {SHARED_TRACES}")
    for folder in folders:
        scores = evaluate_all(folder, sizes=sizes)
        console.print(f"profiles: {folder}")
        console.print(scores_table(scores))
        records += [s.record() | {"profiles": folder.parent.name} for s in scores]
        verdict = Table(title="Target: median <= 10%, no application above 30% (tide)")
        for column in ("n", "median %", "worst %", "met"):
            verdict.add_column(column, justify="right")
        for (model, n), (median, worst) in sorted(medians(scores).items()):
            for label, value in (("median", median), ("worst", worst)):
                records.append(
                    {"metric": "mape", "value": value, "unit": "percent", "model": model,
                     "app": label, "n": n, "profiles": folder.parent.name}
                )  # fmt: skip
            if model == "tide":
                met = median <= TARGET_MEDIAN_PERCENT and worst <= TARGET_WORST_PERCENT
                verdict.add_row(str(n), f"{median:.1f}", f"{worst:.1f}", "yes" if met else "NO")
        console.print(verdict)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
