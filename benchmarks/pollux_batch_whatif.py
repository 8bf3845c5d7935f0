"""What if Pollux's jobs chose their batch size at every size? Pollux workloads 1-4, every policy.

    python benchmarks/pollux_batch_whatif.py [--json PATH] [--workers 2]

A what-if, not a tide feature: tide's worker runtime keeps the global batch fixed, or grows it
with the world size by a fixed rule; it does not choose batch sizes, and it exports samples/s,
not statistical efficiency. This script measures whether that capability, which Pollux has,
would be the lever for the workloads where tide misses its targets.

Three replays of each workload on Pollux's 64-GPU cluster:

- ``fixed``: every job at the global batch it was submitted with (``policy_quality.py``'s case);
- ``adaptive``: at each size n, every job trains at whichever measured global batch B (with
  ``B / n`` at least the smallest measured per-GPU batch) makes the most progress per second:
  ``iterations/s at (n, B) x I(B0) / I(B)``, where ``I(B)`` is the iterations to the job's
  epochs at batch B (``validation-<B>.csv``) and B0 its submitted batch. Work stays counted in
  iterations at B0, and the job exports that rate (goodput) as its throughput, so the engine sees
  the curve it would need a statistical-efficiency estimate to measure. ``I(B0) / I(B)`` is the
  average efficiency over a whole run at B (Pollux re-estimates it as training goes);
- ``adaptive, static at B0``: the elastic policies replay ``adaptive``; ``static`` replays
  ``fixed`` (Volcano as-is, the job as its user wrote it).

Prints average JCT per policy and tide's ratios to static and threshold.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulations.api import SHARED_TRACES, PolicyRun, default_policy_for, load_workload, run_one
from simulations.cluster_config import load_cluster
from simulations.controllers import BASELINE_NAMES
from simulations.pollux import (
    MAX_REPLICAS,
    application_profile,
    max_useful_replicas,
    total_iterations,
)
from simulations.profiles import ScalingProfile
from simulations.report import summarize
from simulations.run import RunOptions
from simulations.workload import Workload, WorkloadJob

REPO = Path(__file__).resolve().parents[1]
POLLUX = SHARED_TRACES / "pollux-osdi21"
POLICIES = ("tide", *BASELINE_NAMES)


def adaptive_profile(app: str, batch: int) -> ScalingProfile:
    """Progress (iterations at ``batch``-equivalent) per second, at the best batch per size."""
    traces = POLLUX / "traces"
    batches = sorted(int(p.stem.split("-")[1]) for p in (traces / app).glob("validation-*.csv"))
    with (traces / app / "placements.csv").open(newline="") as f:
        min_local = min(float(r["local_bsz"]) for r in csv.DictReader(f))
    work = total_iterations(traces, app, batch)
    fixed = application_profile(traces, app, batch)
    rates = []
    for n in range(1, MAX_REPLICAS + 1):
        options = [
            application_profile(traces, app, b).rate(n) * work / total_iterations(traces, app, b)
            for b in batches
            if b / n >= min_local
        ]
        rates.append(max([fixed.rate(n), *options]))
    return ScalingProfile(f"pollux/{app}@{batch}~adaptive", tuple(rates), float(batch))


def _adaptive(workload: Workload) -> Workload:
    def job(j: WorkloadJob) -> WorkloadJob:
        app, batch = j.profile.name.removeprefix("pollux/").split("@")
        profile = adaptive_profile(app, int(batch))
        top = min(MAX_REPLICAS, max(j.requested_replicas, max_useful_replicas(profile)))
        return dataclasses.replace(j, profile=profile, max_replicas=top)

    return dataclasses.replace(workload, jobs=tuple(job(j) for j in workload.jobs))


def _case(args: tuple[int, str, str]) -> tuple[int, str, str, float]:
    index, variant, policy = args
    cluster = load_cluster(REPO / "manifests" / "clusters" / "pollux-64.yaml")
    workload = load_workload(trace=POLLUX / "workloads" / f"workload-{index}.csv")
    if variant == "adaptive" or (variant == "adaptive, static at B0" and policy != "static"):
        workload = _adaptive(workload)
    run = PolicyRun(policy, policy, default_policy_for(cluster) if policy == "tide" else None)
    summary = summarize(run_one(run, workload=workload, cluster=cluster, options=RunOptions()))
    return index, variant, policy, summary.avg_jct_h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not (POLLUX / "workloads").is_dir():
        raise SystemExit(f"needs Pollux's traces at {POLLUX}")
    variants = ("fixed", "adaptive", "adaptive, static at B0")
    cases = [(i, v, p) for i in range(1, 5) for v in variants for p in POLICIES]
    with ProcessPoolExecutor(args.workers) as pool:
        jct = {(i, v, p): h for i, v, p, h in pool.map(_case, cases)}
    table = Table(title="Pollux workloads: fixed vs adaptive batch, average JCT h")
    for col in ("workload", "batch", *POLICIES, "tide / static", "tide / threshold"):
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    for i in range(1, 5):
        for v in variants:
            row = {p: jct[(i, v, p)] for p in POLICIES}
            vs_static, vs_threshold = row["tide"] / row["static"], row["tide"] / row["threshold"]
            table.add_row(
                f"pollux-{i}",
                v,
                *(f"{row[p]:.3f}" for p in POLICIES),
                f"{vs_static:.2f}",
                f"{vs_threshold:.2f}",
            )
            records += [
                {"metric": "avg_jct", "value": round(h, 4), "unit": "h", "case": f"pollux-{i}",
                 "batch": v, "policy": p}
                for p, h in row.items()
                if math.isfinite(h)
            ]  # fmt: skip
    Console(width=160).print(table)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
