"""How the fluid average-JCT lower bound moves with its grid, and what each grid costs.

``simulations.bounds.jct_lower_bound_h`` solves a linear program whose time grid is as fine as
its ``max_variables`` allows: a coarser grid gives a lower (still valid) bound, sooner. This
solves it at several sizes on the built-in workload's seeds 1 and 8 (where jobs contend most)
and on Pollux workload 3, and prints each bound, its share of the finest one and the median
solve time over ``--repeats`` runs (the finest: one run), next to the "alone" bound.

    python benchmarks/bound_resolution.py --json benchmarks/out/bound_resolution.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulations.api import SHARED_TRACES, load_workload
from simulations.bounds import DEFAULT_MAX_VARIABLES, alone_jct_bound_h, jct_lower_bound_h
from simulations.cluster_config import BUILTIN_CLUSTER, ClusterSpec, load_cluster
from simulations.workload import Workload

REPO = Path(__file__).resolve().parents[1]
SOLVE_LIMIT_S = 600.0
"""Time for the dual simplex on the finest grid (about 90 s on Pollux 3 here)."""
SIZES = (DEFAULT_MAX_VARIABLES, 300_000, 1_000_000)


def cases() -> list[tuple[str, Workload, ClusterSpec]]:
    out = [(f"builtin seed {s}", load_workload(seed=s), BUILTIN_CLUSTER) for s in (1, 8)]
    pollux = SHARED_TRACES / "pollux-osdi21" / "workloads" / "workload-3.csv"
    if pollux.exists():
        cluster = load_cluster(REPO / "manifests" / "clusters" / "pollux-64.yaml")
        out.append(("pollux-3", load_workload(trace=pollux), cluster))
    else:
        print(f"skip pollux-3: {pollux} absent")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = Table(title="fluid JCT bound against its grid")
    for col in ("case", "alone h", "variables", "bound h", "of finest", "solve s (median)"):
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    for name, workload, cluster in cases():
        alone = alone_jct_bound_h(workload)
        found = []
        for size in SIZES:
            times, bound = [], 0.0
            # The finest grid is the reference, solved once (about a minute on Pollux 3).
            for _ in range(1 if size == SIZES[-1] else args.repeats):
                start = time.perf_counter()
                bound = jct_lower_bound_h(
                    workload, cluster, max_variables=size, solve_limit_s=SOLVE_LIMIT_S
                )
                times.append(time.perf_counter() - start)
            found.append((size, bound, statistics.median(times)))
        finest = found[-1][1]
        for size, bound, seconds in found:
            table.add_row(
                name, f"{alone:.3f}", f"{size:,}", f"{bound:.4f}", f"{bound / finest:.3f}",
                f"{seconds:.2f}",
            )  # fmt: skip
            records.append(
                {"case": name, "max_variables": size, "alone_h": round(alone, 4),
                 "bound_h": round(bound, 4), "of_finest": round(bound / finest, 4),
                 "solve_s": round(seconds, 3)}
            )  # fmt: skip
    Console().print(table)
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
