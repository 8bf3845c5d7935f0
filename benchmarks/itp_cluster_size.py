"""The ITP policy-quality case on smaller clusters: do the targets come within reach, and does
tide meet them there?

    python benchmarks/itp_cluster_size.py [--json PATH] [--seeds 0,1,2] [--itp-days 7]
                                          [--nodes 80,64,56,48]

On the policy-quality ITP case (cluster04's first days on 80 nodes x 8 GPUs) no policy can meet
the average-JCT targets: the fluid lower bound is above them on every seed. That case sizes the
cluster for the trace, so static hardly queues. This replays the same jobs (seeds 0-2: which half
of the jobs is elastic) on the same queues with fewer nodes, with tide, ``static`` and
``threshold``, and prints per cluster size the medians over seeds of tide's average JCT against
both baselines, the bound's against both (whether the targets are within reach of any policy),
and the non-elastic jobs' p95 queueing delay. A what-if: the policy-quality case stays as it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from policy_quality import REPO, case_bounds, jct_targets, queue_target
from rich.console import Console
from rich.table import Table

from simulations.api import SHARED_TRACES, PolicyRun, default_policy_for, load_workload, run_one
from simulations.cluster_config import ClusterSpec, load_cluster
from simulations.report import Summary, summarize
from simulations.run import RunOptions
from simulations.workload import Workload

POLICIES = ("tide", "static", "threshold")

Unit = tuple[int, int, Workload, ClusterSpec, str]
"""One run: GPUs, seed, workload, cluster, policy ("bound" for the lower bounds)."""


def _run(unit: Unit) -> tuple[int, int, str, Summary | float]:
    gpus, seed, workload, cluster, policy = unit
    if policy == "bound":
        return gpus, seed, policy, case_bounds((workload, cluster))[1]
    options = RunOptions(metrics=dataclasses.replace(RunOptions().metrics, seed=seed))
    run = PolicyRun(policy, policy, default_policy_for(cluster) if policy == "tide" else None)
    return gpus, seed, policy, summarize(run_one(run, workload=workload, cluster=cluster,
                                                 options=options))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument("--seeds", default="0,1,2", help="which half of the jobs is elastic")
    parser.add_argument("--itp-days", type=float, default=7.0, help="days of cluster04")
    parser.add_argument("--nodes", default="80,64,56,48", help="cluster sizes, 8-GPU nodes")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    itp = SHARED_TRACES / "elasticflow-itp" / "raw-traces.tar.gz"
    if not itp.exists():
        raise SystemExit(f"{itp} absent: this benchmark needs the ITP traces")
    base = load_cluster(REPO / "manifests" / "clusters" / "itp-640.yaml")
    units: list[Unit] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        full = load_workload(trace=itp, member="cluster04.csv", seed=seed)
        jobs = tuple(j for j in full.jobs if j.submit_s < args.itp_days * 86400)
        workload = dataclasses.replace(full, name=f"itp-cluster04-{args.itp_days:g}d", jobs=jobs)
        for nodes in (int(n) for n in args.nodes.split(",")):
            cluster = dataclasses.replace(base, name=f"itp-{nodes * 8}", nodes=nodes)
            gpus = cluster.total_gpus
            units += [(gpus, seed, workload, cluster, p) for p in (*POLICIES, "bound")]
    with ProcessPoolExecutor(args.workers) as pool:
        found = {(g, s, p): x for g, s, p, x in pool.map(_run, units)}
    runs = {k: x for k, x in found.items() if isinstance(x, Summary)}
    bound = {(g, s): x for (g, s, p), x in found.items() if isinstance(x, float)}

    def avg_jct_h(who: str, gpus: int, seed: int) -> float:
        return bound[(gpus, seed)] if who == "bound" else runs[(gpus, seed, who)].avg_jct_h

    title = f"ITP cluster04, {args.itp_days:g} days, by cluster size: medians over seeds"
    table = Table(title=title)
    columns = ("GPUs", "seeds", "JCT / static", "JCT / threshold", "met",
               "bound / static", "bound / threshold", "within reach",
               "non-elastic p95 h: tide (static, threshold)")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    for gpus in sorted({g for g, _ in bound}, reverse=True):
        seeds = sorted(s for g, s in bound if g == gpus)
        ratios = {
            (top, under): statistics.median(
                avg_jct_h(top, gpus, s) / avg_jct_h(under, gpus, s) for s in seeds
            )
            for top in ("tide", "bound")
            for under in ("static", "threshold")
        }
        p95 = {
            who: statistics.median(runs[(gpus, s, who)].p95_queue_nonelastic_h for s in seeds)
            for who in POLICIES
        }
        met = jct_targets(ratios[("tide", "static")], ratios[("tide", "threshold")]) and (
            queue_target(p95["tide"], p95["static"], p95["threshold"])
        )
        reach = jct_targets(ratios[("bound", "static")], ratios[("bound", "threshold")])
        table.add_row(
            str(gpus), str(len(seeds)),
            *(f"{ratios[('tide', u)]:.2f}" for u in ("static", "threshold")),
            "yes" if met else "no",
            *(f"{ratios[('bound', u)]:.2f}" for u in ("static", "threshold")),
            "yes" if reach else "no",
            f"{p95['tide']:.2f} ({p95['static']:.2f}, {p95['threshold']:.2f})",
        )  # fmt: skip
        record: dict[str, object] = {"gpus": gpus, "seeds": len(seeds), "targets_met": met,
                                     "jct_targets_within_bound": reach}  # fmt: skip
        record |= {f"{t}_vs_{u}_median": round(v, 4) for (t, u), v in ratios.items()}
        record |= {f"p95_queue_nonelastic_{who}_median_h": round(v, 4) for who, v in p95.items()
                   if not math.isnan(v)}  # fmt: skip
        records.append(record)
    Console(width=160).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
