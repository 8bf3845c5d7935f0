"""What headroom in the elastic queue buys non-elastic jobs, and what it costs in average JCT.

    python benchmarks/headroom_tradeoff.py [--json PATH] [--seeds 0,1,2] [--builtin-seeds ...]
                                           [--itp-days 7]

tide's default policy lends every idle GPU to elastic jobs and gives GPUs back when non-elastic
work arrives; ``threshold`` keeps idle GPUs as a margin instead. A queue's ``headroom.gpus``
makes tide keep a margin too. This replays the policy-quality cases that have non-elastic jobs
(the built-in workload at its default load and overloaded, and the ITP cluster's first days)
with tide at several headrooms in the elastic ``research`` queue, next to ``static`` and
``threshold`` on the same workloads, and prints per case and headroom the medians over seeds
of tide's average JCT against both and of the non-elastic jobs' p95 queueing delay: the
policy-quality target asks for tide's JCT 30% below static's and 15% below threshold's
without a higher non-elastic p95 than either.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from concurrent.futures import ProcessPoolExecutor

from policy_quality import add_case_options, cases_from
from rich.console import Console
from rich.table import Table

from simulations.api import PolicyRun, default_policy_for, run_one
from simulations.cluster_config import ClusterSpec
from simulations.report import Summary, summarize
from simulations.run import RunOptions
from simulations.tune_space import apply_params
from simulations.workload import Workload

BUILTIN_HEADROOMS = (0.0, 1.0, 2.0, 4.0, 6.0)
ITP_HEADROOMS = (0.0, 16.0, 32.0, 64.0)  # the ITP cluster has 640 GPUs, 20 times as many

Unit = tuple[str, int, Workload, ClusterSpec, str, float]
"""One run: case, seed, workload, cluster, policy, research headroom (tide only)."""


def _run(unit: Unit) -> tuple[str, int, str, float, Summary]:
    case, seed, workload, cluster, policy, headroom = unit
    options = RunOptions(metrics=dataclasses.replace(RunOptions().metrics, seed=seed))
    tide = None
    if policy == "tide":
        tide = apply_params(
            default_policy_for(cluster), {"queues.research.headroom.gpus": headroom}
        )
    run = PolicyRun(policy, policy, tide)
    summary = summarize(run_one(run, workload=workload, cluster=cluster, options=options))
    return case, seed, policy, headroom, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_case_options(parser)
    args = parser.parse_args()
    # Pollux workloads are all elastic: no non-elastic jobs to protect.
    cases = [c for c in cases_from(args) if not c[0].startswith("pollux")]
    units: list[Unit] = []
    for case, seed, workload, cluster in cases:
        headrooms = ITP_HEADROOMS if case.startswith("itp") else BUILTIN_HEADROOMS
        units += [(case, seed, workload, cluster, "tide", h) for h in headrooms]
        units += [(case, seed, workload, cluster, p, 0.0) for p in ("static", "threshold")]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_run, units))
    baseline = {(c, s, p): x for c, s, p, _, x in results if p != "tide"}
    tide: dict[tuple[str, float], list[tuple[int, Summary]]] = {}
    for c, s, p, h, x in results:
        if p == "tide":
            tide.setdefault((c, h), []).append((s, x))

    table = Table(title="headroom in the research queue: medians over seeds")
    for col in (
        "case",
        "headroom GPUs",
        "JCT / static",
        "JCT / threshold",
        "non-elastic p95 h: tide (static, threshold)",
        "p95 not higher",
    ):
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    for (case, headroom), runs in tide.items():
        vs_static = statistics.median(
            x.avg_jct_h / baseline[(case, s, "static")].avg_jct_h for s, x in runs
        )
        vs_threshold = statistics.median(
            x.avg_jct_h / baseline[(case, s, "threshold")].avg_jct_h for s, x in runs
        )
        p95 = {
            p: statistics.median(baseline[(case, s, p)].p95_queue_nonelastic_h for s, _ in runs)
            for p in ("static", "threshold")
        }
        p95_tide = statistics.median(x.p95_queue_nonelastic_h for _, x in runs)
        not_higher = p95_tide <= min(p95.values())
        table.add_row(
            case,
            f"{headroom:g}",
            f"{vs_static:.3f}",
            f"{vs_threshold:.3f}",
            f"{p95_tide:.2f} ({p95['static']:.2f}, {p95['threshold']:.2f})",
            "yes" if not_higher else "no",
        )
        params = {"case": case, "headroom_gpus": headroom, "seeds": len(runs)}
        records += [
            {"metric": "avg_jct_vs_static_median", "value": round(vs_static, 4),
             "unit": "ratio", **params},
            {"metric": "avg_jct_vs_threshold_median", "value": round(vs_threshold, 4),
             "unit": "ratio", **params},
            {"metric": "p95_queue_nonelastic_median", "value": round(p95_tide, 4), "unit": "h",
             "static": round(p95["static"], 4), "threshold": round(p95["threshold"], 4),
             **params},
        ]  # fmt: skip
    Console(width=140).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
