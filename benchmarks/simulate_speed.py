"""Wall time of `tide simulate` with the tide policy on Pollux workloads 1-4 and ITP cluster04.

    python benchmarks/simulate_speed.py [--json PATH] [--skip-itp] [--philly]

Reads the shared traces from ../shared next to the checkout; cases whose files are absent are
skipped with a message. Targets: <= 5 s per Pollux workload (64 GPUs), <= 60 s for cluster04.
One more case runs the built-in workload (seed 0) with the example policy
``manifests/policies/research-and-production.yaml``, whose demand forecast refits a gradient-
boosted model every 10 simulated minutes: the cost a forecasting policy adds to a simulation.
ITP cluster04 runs once more with the ``static`` baseline, the time a comparison's reference
costs. Last, all six policies on ITP cluster04's first 7 days, as `tide simulate` runs them, in
one process and in two, alternated three times; the two must give the same results.

With ``--philly``, also the largest trace at hand: the whole Philly-derived job list (82,247 jobs
over 109 days) on the 640-GPU ITP cluster, tide and static in two processes, as
``tide simulate --policies tide,static`` runs them (a few minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scheduler_policy.policy.file import load_policy
from simulations.api import (
    SHARED_TRACES,
    PolicyRun,
    default_policy_for,
    load_workload,
    run_one,
    run_policies,
)
from simulations.cluster_config import BUILTIN_CLUSTER, load_cluster
from simulations.controllers import BASELINE_NAMES
from simulations.report import summarize
from simulations.run import RunOptions

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip-itp", action="store_true")
    parser.add_argument("--philly", action="store_true", help="also the whole Philly trace")
    parser.add_argument(
        "--quiet-interval",
        type=float,
        default=600.0,
        help="longest reconcile gap while nothing happens, s (ITP only)",
    )
    args = parser.parse_args()
    console = Console(width=120)
    records: list[dict[str, object]] = []
    table = Table(title="tide simulate: wall time (tide policy unless said)")
    for col in ("case", "jobs", "GPUs", "load s", "simulate s", "reconciles", "avg JCT h"):
        table.add_column(col, justify="right")
    # (name, trace or None for the built-in workload, format, cluster or None for the built-in
    # one, quiet interval, policy file or None for the default policy, or "static")
    cases: list[tuple[str, Path | None, str, Path | None, float | None, Path | str | None]] = []
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
        for policy in (None, "static"):
            cases.append(
                (
                    "itp-cluster04" + (" (static)" if policy else ""),
                    SHARED_TRACES / "elasticflow-itp" / "raw-traces.tar.gz",
                    "itp",
                    REPO / "manifests" / "clusters" / "itp-640.yaml",
                    args.quiet_interval,
                    policy,
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
        if policy_path == "static":
            run = PolicyRun("static", "static")
        else:
            policy = load_policy(policy_path) if policy_path else default_policy_for(cluster)
            run = PolicyRun("tide", "tide", policy)
        result = run_one(
            run,
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
            "policy": run.kind,
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
    if not args.skip_itp:
        records += _parallel_comparison(console, args.quiet_interval)
    if args.philly:
        records += _philly(console, args.quiet_interval)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


def _parallel_comparison(console: Console, quiet_s: float) -> list[dict[str, object]]:
    """All six policies on ITP cluster04's first 7 days, in 1 process and in 2, alternated."""
    path = SHARED_TRACES / "elasticflow-itp" / "raw-traces.tar.gz"
    if not path.exists():
        console.print(f"[yellow]skip the parallel comparison: {path} absent[/yellow]")
        return []
    cluster = load_cluster(REPO / "manifests" / "clusters" / "itp-640.yaml")
    full = load_workload(trace=path, trace_format="itp", gpus_per_node=cluster.gpus_per_node)
    workload = dataclasses.replace(full, jobs=tuple(j for j in full.jobs if j.submit_s < 7 * 86400))
    runs = [PolicyRun("tide", "tide", default_policy_for(cluster))]
    runs += [PolicyRun(name, name) for name in BASELINE_NAMES]
    options = RunOptions(quiet_interval_s=quiet_s)
    walls: dict[int, list[float]] = {1: [], 2: []}
    figures: dict[int, list[dict[str, object]]] = {}
    for _ in range(3):
        for workers in (1, 2):
            t0 = time.perf_counter()
            results = run_policies(
                runs, workload=workload, cluster=cluster, options=options, workers=workers
            )
            walls[workers].append(time.perf_counter() - t0)
            figures[workers] = [
                {k: v for k, v in summarize(r).as_dict().items() if k != "wall_s"} for r in results
            ]
    if figures[1] != figures[2]:
        raise SystemExit("the parallel comparison gave other results than the sequential one")
    table = Table(title=f"tide simulate, {len(runs)} policies on {workload.name} (7 days)")
    for col in ("processes", "wall s (3 runs)", "median s"):
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    for workers, times in walls.items():
        median = statistics.median(times)
        table.add_row(str(workers), " / ".join(f"{t:.1f}" for t in times), f"{median:.1f}")
        records.append(
            {"metric": "comparison_wall_time", "value": round(median, 2), "unit": "s",
             "case": "itp-cluster04-7d", "policies": len(runs), "workers": workers}
        )  # fmt: skip
    console.print(table)
    ratio = statistics.median(walls[1]) / statistics.median(walls[2])
    console.print(f"median speed-up with 2 processes: {ratio:.2f}x, same results")
    return records


def _philly(console: Console, quiet_s: float) -> list[dict[str, object]]:
    """tide and static on the whole Philly trace, in two processes."""
    path = SHARED_TRACES / "pollux-osdi21" / "traces" / "philly.csv"
    if not path.exists():
        console.print(f"[yellow]skip philly: {path} absent[/yellow]")
        return []
    cluster = load_cluster(REPO / "manifests" / "clusters" / "itp-640.yaml")
    workload = load_workload(trace=path, trace_format="philly")
    runs = [PolicyRun("tide", "tide", default_policy_for(cluster)), PolicyRun("static", "static")]
    t0 = time.perf_counter()
    results = run_policies(
        runs,
        workload=workload,
        cluster=cluster,
        options=RunOptions(quiet_interval_s=quiet_s),
        workers=2,
    )
    wall_s = time.perf_counter() - t0
    table = Table(title=f"tide simulate --policies tide,static on {workload.name}, 2 processes")
    for col in ("policy", "jobs", "reconciles", "simulate s", "avg JCT h"):
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    for result in results:
        table.add_row(
            result.policy,
            str(len(result.jobs)),
            str(result.reconciles),
            f"{result.wall_s:.1f}",
            f"{summarize(result).avg_jct_h:.2f}",
        )
        records.append(
            {"metric": "simulate_wall_time", "value": round(result.wall_s, 2), "unit": "s",
             "case": "philly", "jobs": len(result.jobs), "gpus": cluster.total_gpus,
             "policy": result.policy}
        )  # fmt: skip
    console.print(table)
    console.print(f"both policies, 2 processes: {wall_s:.1f} s")
    records.append(
        {"metric": "comparison_wall_time", "value": round(wall_s, 2), "unit": "s",
         "case": "philly", "policies": len(runs), "workers": 2}
    )  # fmt: skip
    return records


if __name__ == "__main__":
    main()
