"""tide with adaptive batch against Pollux's published figures: Pollux workloads 1-4, 5 noise seeds.

    nice -n 10 python benchmarks/goodput.py [--json PATH] [--workers 2] [--seeds 0,1,2,3,4]
                                            [--load-seeds 0] [--loads 1,0.5,1.5]
                                            [--workloads 1,2,3,4] [--baselines static,tiresias]
                                            [--variants goodput,throughput,submitted]

Each Pollux workload on Pollux's 16 x 4 GPU cluster (``manifests/clusters/pollux-64.yaml``),
each row a way to run it:

- ``tide, adaptive, goodput``: every job but ncf adapts its batch as the worker runtime does
  (``simulations.adaptive_batch``: work counted in Pollux's progress, the batch re-chosen at
  each resize and epoch) and the engine is told what the workers report (``BatchStatistics``,
  ``BatchBounds``): it ranks an adaptive job by goodput where its goodput model applies;
- ``tide, adaptive, throughput only``: the same jobs, but the engine sees their throughput only
  (``MetricsOptions.batch_statistics`` False), as an engine without a goodput model does;
- ``tide, submitted batch``: every job at the batch its trace row gives (``--no-adaptive-batch``);
- the baselines, always at the submitted batch, as in Pollux's own comparison.

Seeds draw the measurement noise the engine sees (throughput and step times); a baseline that
reads no measurement (static, tiresias, optimus with the true curves) gives the same figure at
every seed, so it runs at the first seed only. Loads: 1x is the workload as published; 0.5x
keeps every other job (by submission order: the same window, half the arrivals); 1.5x divides
every submission time by 1.5 (the same jobs, arriving 1.5x as fast). Pollux's own load variants
(``workloads-0.5``, ``workloads-1.5`` in its repository) are not in the shared traces. Only 1x
has published Pollux figures: 0.580 / 0.923 / 0.608 / 0.756 h (mean 0.717).

Prints one table per load (mean average JCT over the seeds per workload, the mean of the four,
and its ratio to Pollux's published mean at 1x) and writes every run's figure with ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulations.api import SHARED_TRACES, PolicyRun, default_policy_for, load_workload, run_one
from simulations.cluster_config import load_cluster
from simulations.report import summarize
from simulations.run import RunOptions
from simulations.workload import Workload

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = SHARED_TRACES / "pollux-osdi21" / "workloads"
POLLUX_PUBLISHED_H = (0.580, 0.923, 0.608, 0.756)
"""Pollux's published average JCT at 1x on workloads 1-4 (Qiao et al., OSDI'21), hours."""
NOISE_FREE_BASELINES = frozenset({"static", "tiresias", "optimus"})
"""Baselines that read no measurement: one run per workload and load."""

TIDE_VARIANTS = {
    "tide, adaptive, goodput": (True, True),
    "tide, adaptive, throughput only": (True, False),
    "tide, submitted batch": (False, True),
}
"""Row label -> (jobs adapt their batch, the engine is told their batch statistics)."""
VARIANT_NAMES = {
    "goodput": "tide, adaptive, goodput",
    "throughput": "tide, adaptive, throughput only",
    "submitted": "tide, submitted batch",
}
"""``--variants`` names of the tide rows."""


def scaled(workload: Workload, load: float) -> Workload:
    """``workload`` at ``load`` times its arrivals (see the module docstring: 0.5 keeps every
    other job, another load divides the submission times by it)."""
    if load == 1.0:
        return workload
    if load == 0.5:
        jobs = workload.jobs[::2]
    else:
        jobs = tuple(dataclasses.replace(j, submit_s=j.submit_s / load) for j in workload.jobs)
    return dataclasses.replace(workload, name=f"{workload.name}@{load:g}x", jobs=jobs)


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One run's figure."""

    case: str
    load: float
    seed: int
    policy: str
    batch_model: str
    engine_told_batch_statistics: bool
    avg_jct_h: float
    finished: int
    jobs: int
    wall_s: float


def _case(args: tuple[int, float, int, str]) -> Record:
    index, load, seed, label = args
    cluster = load_cluster(REPO / "manifests" / "clusters" / "pollux-64.yaml")
    workload = scaled(load_workload(trace=WORKLOADS / f"workload-{index}.csv"), load)
    adapts, told = TIDE_VARIANTS.get(label, (False, False))
    metrics = dataclasses.replace(RunOptions().metrics, seed=seed, batch_statistics=told)
    options = RunOptions(metrics=metrics, adaptive_batch=adapts)
    kind = "tide" if label in TIDE_VARIANTS else label
    run = PolicyRun(label, kind, default_policy_for(cluster) if kind == "tide" else None)
    result = run_one(run, workload=workload, cluster=cluster, options=options)
    summary = summarize(result)
    return Record(
        case=f"pollux-{index}",
        load=load,
        seed=seed,
        policy=label,
        batch_model=summary.batch_model,
        engine_told_batch_statistics=told and kind == "tide",
        avg_jct_h=summary.avg_jct_h,
        finished=summary.finished,
        jobs=summary.jobs,
        wall_s=round(result.wall_s, 1),
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2,3,4", help="noise seeds at 1x load")
    parser.add_argument("--load-seeds", default="0", help="noise seeds at the other loads")
    parser.add_argument("--loads", default="1,0.5,1.5")
    parser.add_argument("--workloads", default="1,2,3,4")
    parser.add_argument("--baselines", default="static,tiresias,optimus")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANT_NAMES),
        help="tide rows: goodput,throughput,submitted",
    )
    args = parser.parse_args()
    if not WORKLOADS.is_dir():
        raise SystemExit(f"needs Pollux's workloads at {WORKLOADS}")
    loads = [float(x) for x in args.loads.split(",")]
    if not all(load > 0 for load in loads):
        raise SystemExit(f"--loads: each load must be > 0, got {args.loads}")
    indices = _ints(args.workloads)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANT_NAMES]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANT_NAMES)}")
    variants = [VARIANT_NAMES[v] for v in names]
    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]  # "" for none
    rows = [*variants, *baselines]
    cases = []
    for load in loads:
        seeds = _ints(args.seeds) if load == 1.0 else _ints(args.load_seeds)
        for seed in seeds:
            for i in indices:
                cases += [
                    (i, load, seed, label)
                    for label in rows
                    if seed == seeds[0] or label not in NOISE_FREE_BASELINES
                ]
    # Seed by seed (a run cut short has whole seeds), the tide runs of each seed first.
    cases.sort(key=lambda c: (c[1] != 1.0, c[2], c[3] not in TIDE_VARIANTS))
    started = time.perf_counter()
    records: list[Record] = []
    with ProcessPoolExecutor(args.workers) as pool:
        for r in pool.map(_case, cases):
            records.append(r)
            print(
                f"[{len(records)}/{len(cases)} {time.perf_counter() - started:.0f} s] {r.case} "
                f"{r.load:g}x seed {r.seed} {r.policy}: {r.avg_jct_h:.4f} h ({r.batch_model})",
                flush=True,
            )
    wall = time.perf_counter() - started
    console = Console(width=160)
    for load in loads:
        table = Table(title=f"Pollux workloads at {load:g}x load: mean average JCT over seeds, h")
        for col in ("policy", "batch", *(f"pollux-{i}" for i in indices), "mean", "vs 0.717"):
            table.add_column(col, justify="right")
        if load == 1.0 and indices == [1, 2, 3, 4]:
            table.add_row(
                "Pollux (published)",
                "adaptive",
                *(f"{h:.3f}" for h in POLLUX_PUBLISHED_H),
                f"{statistics.mean(POLLUX_PUBLISHED_H):.3f}",
                "1.00",
            )
        for label in rows:
            per = []
            model = ""
            for i in indices:
                mine = [
                    r
                    for r in records
                    if r.policy == label and r.case == f"pollux-{i}" and r.load == load
                ]
                per.append(statistics.mean(r.avg_jct_h for r in mine))
                model = mine[0].batch_model
            mean = statistics.mean(per)
            ratio = mean / statistics.mean(POLLUX_PUBLISHED_H)
            table.add_row(
                label,
                model,
                *(f"{h:.3f}" for h in per),
                f"{mean:.3f}",
                f"{ratio:.2f}" if load == 1.0 and indices == [1, 2, 3, 4] else "",
            )
        console.print(table)
    console.print(
        "batch: 'adaptive' counts work in Pollux's progress at the batch the workers choose "
        "(simulations.adaptive_batch), 'submitted' in iterations at each job's own batch; "
        "0.5x keeps every other job, 1.5x divides submission times by 1.5; "
        f"{len(records)} runs in {wall:.0f} s on {args.workers} workers"
    )
    if args.json:
        out = [
            {
                "metric": "avg_jct",
                "value": round(r.avg_jct_h, 4),
                "unit": "h",
                **{k: v for k, v in dataclasses.asdict(r).items() if k != "avg_jct_h"},
            }
            for r in records
            if math.isfinite(r.avg_jct_h)
        ]
        meta = {
            "published_pollux_1x_h": POLLUX_PUBLISHED_H,
            "published_pollux_1x_mean_h": round(statistics.mean(POLLUX_PUBLISHED_H), 4),
            "loads": {
                "1": "as published",
                "0.5": "every other job by submission order",
                "other": "submission times divided by the load",
            },
            "wall_s": round(wall, 1),
            "workers": args.workers,
        }
        args.json.write_text(json.dumps({"meta": meta, "records": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
