"""Wall time of `tide simulate` with the tide policy on Pollux workloads 1-4 and ITP cluster04.

    python benchmarks/simulate_speed.py [--json PATH] [--skip-itp]

Reads the shared traces from ../shared next to the checkout; cases whose files are absent are
skipped with a message. Targets: <= 5 s per Pollux workload (64 GPUs), <= 60 s for cluster04.
One more case runs the built-in workload (seed 0) with the example policy
``manifests/policies/research-and-production.yaml``, whose demand forecast refits a gradient-
boosted model every 10 simulated minutes: the cost a forecasting policy adds to a simulation.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scheduler_policy.policy_file import load_policy
from simulations.api import SHARED_TRACES, PolicyRun, default_policy_for, load_workload, run_one
from simulations.cluster_config import BUILTIN_CLUSTER, load_cluster
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
    # (name, trace or None for the built-in workload, format, cluster or None for the built-in
    # one, quiet interval, policy file or None for the default policy)
    cases: list[tuple[str, Path | None, str, Path | None, float | None, Path | None]] = []
    pollux = SHARED_TRACES / "pollux-osdi21" / "workloads"
    for i in range(1, 5):
        cases.append(
            (
                f"pollux-workload-{i}",
                pollux / f"workload-{i}.csv",
                "auto",
                REPO / "manifests" / "clusters" / "pollux-64.yaml",
                None,
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
                None,
            )
        )
    forecasting = REPO / "manifests" / "policies" / "research-and-production.yaml"
    cases.append(("builtin-forecast-policy", None, "auto", None, None, forecasting))
    for name, path, fmt, cluster_path, quiet, policy_path in cases:
        if path is not None and not path.exists():
            console.print(f"[yellow]skip {name}: {path} absent[/yellow]")
            continue
        cluster = load_cluster(cluster_path) if cluster_path else BUILTIN_CLUSTER
        t0 = time.perf_counter()
        workload = (
            load_workload(trace=path, trace_format=fmt, gpus_per_node=cluster.gpus_per_node)
            if path is not None
            else load_workload(cluster_gpus=cluster.total_gpus)
        )
        load_s = time.perf_counter() - t0
        policy = load_policy(policy_path) if policy_path else default_policy_for(cluster)
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
