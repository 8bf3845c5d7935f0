"""Wall time of `tide simulate` with the tide policy on Pollux workloads 1-4 and ITP cluster04.

    python benchmarks/simulate_speed.py [--json PATH] [--skip-itp]

Reads the shared traces from ../shared next to the checkout; cases whose files are absent are
skipped with a message. Targets: <= 5 s per Pollux workload (64 GPUs), <= 60 s for cluster04.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulations.api import SHARED_TRACES, PolicyRun, default_policy_for, load_workload, run_one
from simulations.cluster_config import load_cluster
from simulations.report import summarize
from simulations.run import RunOptions

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip-itp", action="store_true")
    parser.add_argument(
        "--quiet-interval",
        type=float,
        default=600.0,
        help="longest reconcile gap while nothing happens, s (ITP only)",
    )
    args = parser.parse_args()
    console = Console()
    records: list[dict[str, object]] = []
    table = Table(title="tide simulate: wall time (tide policy)")
    for col in ("case", "jobs", "GPUs", "load s", "simulate s", "reconciles", "avg JCT h"):
        table.add_column(col, justify="right")
    cases: list[tuple[str, Path, str, Path, float | None]] = []
    pollux = SHARED_TRACES / "pollux-osdi21" / "workloads"
    for i in range(1, 5):
        cases.append(
            (
                f"pollux-workload-{i}",
                pollux / f"workload-{i}.csv",
                "auto",
                REPO / "manifests" / "clusters" / "pollux-64.yaml",
                None,
            )
        )
    if not args.skip_itp:
        cases.append(
            (
                "itp-cluster04",
                SHARED_TRACES / "elasticflow-itp" / "raw-traces.tar.gz",
                "itp",
                REPO / "manifests" / "clusters" / "itp-640.yaml",
                args.quiet_interval,
            )
        )
    for name, path, fmt, cluster_path, quiet in cases:
        if not path.exists():
            console.print(f"[yellow]skip {name}: {path} absent[/yellow]")
            continue
        cluster = load_cluster(cluster_path)
        t0 = time.perf_counter()
        workload = load_workload(trace=path, trace_format=fmt, gpus_per_node=cluster.gpus_per_node)
        load_s = time.perf_counter() - t0
        policy = default_policy_for(cluster)
        result = run_one(
            PolicyRun("tide", "tide", policy),
            workload=workload,
            cluster=cluster,
            options=RunOptions(quiet_interval_s=quiet),
        )
        summary = summarize(result)
        table.add_row(
            name,
            str(len(workload.jobs)),
            str(cluster.total_gpus),
            f"{load_s:.2f}",
            f"{result.wall_s:.2f}",
            str(result.reconciles),
            f"{summary.avg_jct_h:.2f}",
        )
        params = {
            "case": name,
            "jobs": len(workload.jobs),
            "gpus": cluster.total_gpus,
            "policy": "tide",
        }
        records.append(
            {
                "metric": "simulate_wall_time",
                "value": round(result.wall_s, 3),
                "unit": "s",
                **params,
            }
        )
        records.append(
            {"metric": "load_wall_time", "value": round(load_s, 3), "unit": "s", **params}
        )
        records.append(
            {"metric": "reconciles", "value": result.reconciles, "unit": "count", **params}
        )
    console.print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
