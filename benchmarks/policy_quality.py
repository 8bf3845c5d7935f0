"""Every policy on the built-in workload, Pollux workloads 1-4 and an ITP cluster, several seeds.

    python benchmarks/policy_quality.py [--json PATH] [--seeds 0,1,2] [--builtin-seeds 0,...,9]
                                        [--pollux-seeds 0,...,4] [--itp-days 7]

The built-in workload runs twice: at its default (offered load 0.7 of the cluster's GPUs over
24 h) and overloaded (1.5 over 8 h). Prints average JCT, p95 queueing delay of non-elastic jobs
and GPU-hours lost (restarts + kills) per policy and case, and tide's JCT ratio against
``static`` and ``threshold`` (same run, same workload). Targets: tide >= 30% lower average JCT
than static and >= 15% lower than threshold, without a higher p95 queueing delay for non-elastic
jobs. Pollux workloads are all-elastic (no non-elastic jobs); each runs once per
``--pollux-seeds`` seed, which draws the measurement noise the engine sees. The ITP case
replays the first ``--itp-days`` days of cluster04 once per seed (the seed picks which jobs are
elastic). A second table gives each case's average-JCT lower bounds, which say how much of
static's JCT any policy could remove at all: every job alone at its fastest size, never queued,
and the tighter fluid relaxation ``tide simulate`` prints (jobs sharing the GPUs;
``simulations.bounds``), here on a finer grid. A last table judges the targets on medians over
seeds, and says where the fluid bound leaves them within reach of any policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulations.api import SHARED_TRACES, PolicyRun, default_policy_for, load_workload, run_one
from simulations.bounds import alone_jct_bound_h, jct_lower_bound_h
from simulations.cluster_config import BUILTIN_CLUSTER, ClusterSpec, load_cluster
from simulations.controllers import BASELINE_NAMES
from simulations.report import Summary, summarize
from simulations.run import RunOptions
from simulations.workload import Workload

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("tide", *BASELINE_NAMES)
BOUND_VARIABLES = 300_000
"""The fluid bound's grid: finer than the CLI's, within 1% of 1,000,000 variables and 2-8 s a
case (``benchmarks/bound_resolution.py``)."""
BOUND_SOLVE_LIMIT_S = 300.0
"""Long enough for either solver on this grid: no case falls back to the alone bound."""


def _case(args: tuple[str, int, Workload, ClusterSpec]) -> list[tuple[str, int, Summary]]:
    name, seed, workload, cluster = args
    policy = default_policy_for(cluster)
    options = RunOptions(metrics=dataclasses.replace(RunOptions().metrics, seed=seed))
    out = []
    for p in POLICIES:
        run = PolicyRun(p, p, policy if p == "tide" else None)
        out.append(
            (
                name,
                seed,
                summarize(run_one(run, workload=workload, cluster=cluster, options=options)),
            )
        )
    return out


def jct_targets(vs_static: float, vs_threshold: float) -> bool:
    """Whether average-JCT ratios (medians over seeds) meet the targets: 30% below static's,
    15% below threshold's. Given the fluid bound's ratios, whether any policy could."""
    return vs_static <= 0.70 and vs_threshold <= 0.85


def queue_target(tide: float, static: float, threshold: float) -> bool:
    """Whether tide's non-elastic p95 queueing delay is no higher than either baseline's (met
    where there are no non-elastic jobs: NaN)."""
    return math.isnan(tide) or tide <= min(static, threshold)


def case_bounds(args: tuple[Workload, ClusterSpec]) -> tuple[float, float]:
    """A workload's alone and fluid average-JCT lower bounds on a cluster (the fluid one on this
    benchmark's fine grid), from one ``(workload, cluster)`` argument for ``Executor.map``."""
    workload, cluster = args
    fluid = jct_lower_bound_h(
        workload, cluster, max_variables=BOUND_VARIABLES, solve_limit_s=BOUND_SOLVE_LIMIT_S
    )
    return alone_jct_bound_h(workload), fluid


def quality_cases(
    seeds: list[int], builtin_seeds: list[int], itp_days: float, pollux_seeds: list[int]
) -> list[tuple[str, int, Workload, ClusterSpec]]:
    # The built-in workload is small (about 55 jobs in its day), so one job started earlier
    # reorders the rest: it runs on more seeds than the rest, and the targets use the median.
    # "builtin" is the default (offered load 0.7 over 24 h); "builtin-overload" offers 1.5 over
    # 8 h, about what the built-in workload offered before its load was set (1.53).
    cases = [("builtin", s, load_workload(seed=s), BUILTIN_CLUSTER) for s in builtin_seeds]
    cases += [
        ("builtin-overload", s, load_workload(seed=s, load=1.5, duration_s=8 * 3600.0),
         BUILTIN_CLUSTER)
        for s in builtin_seeds
    ]  # fmt: skip
    pollux_cluster = load_cluster(REPO / "manifests" / "clusters" / "pollux-64.yaml")
    for i in range(1, 5):
        path = SHARED_TRACES / "pollux-osdi21" / "workloads" / f"workload-{i}.csv"
        if path.exists():
            # The same jobs at each seed; the seed draws the throughput measurements' noise,
            # and one measurement can reorder every later decision.
            workload = load_workload(trace=path)
            cases += [(f"pollux-{i}", s, workload, pollux_cluster) for s in pollux_seeds]
        else:
            print(f"skip pollux-{i}: {path} absent")
    itp = SHARED_TRACES / "elasticflow-itp" / "raw-traces.tar.gz"
    if itp.exists() and itp_days > 0:
        cluster = load_cluster(REPO / "manifests" / "clusters" / "itp-640.yaml")
        for s in seeds:
            full = load_workload(trace=itp, member="cluster04.csv", seed=s)
            jobs = tuple(j for j in full.jobs if j.submit_s < itp_days * 86400)
            w = dataclasses.replace(full, name=f"itp-cluster04-{itp_days:g}d", jobs=jobs)
            cases.append((w.name, s, w, cluster))
    return cases


def add_case_options(parser: argparse.ArgumentParser) -> None:
    """The options that choose the cases (``cases_from``), ``--json`` and ``--workers``."""
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the ITP case")
    parser.add_argument("--builtin-seeds", default=",".join(map(str, range(10))))
    parser.add_argument("--itp-days", type=float, default=7.0)
    parser.add_argument(
        "--pollux-seeds", default="0,1,2,3,4", help="measurement-noise seeds of Pollux cases"
    )
    parser.add_argument("--workers", type=int, default=2)


def cases_from(args: argparse.Namespace) -> list[tuple[str, int, Workload, ClusterSpec]]:
    """The cases ``add_case_options``'s options choose."""
    return quality_cases(
        [int(s) for s in args.seeds.split(",")],
        [int(s) for s in args.builtin_seeds.split(",")],
        args.itp_days,
        [int(s) for s in args.pollux_seeds.split(",")],
    )


def _targets_table(
    rows: list[tuple[str, int, Summary]],
    records: list[dict[str, object]],
    bounds: dict[tuple[str, int], tuple[float, float]],
) -> Table:
    """The issue's targets per case, medians over the case's seeds (one noisy seed decides
    nothing): tide's average JCT against static (<= 0.70) and threshold (<= 0.85), and its
    non-elastic p95 queueing delay against both (not higher).

    Beside them, the fluid bound's ratios, medians over the same seeds. No policy's average
    JCT is below the bound on any seed, so no policy's median ratio is below the bound's: where
    the bound's is above a target, no policy can meet that target ("JCT within reach": no)."""
    table = Table(title="targets, median over seeds")
    columns = ("case", "seeds", "JCT / static", "JCT / threshold", "non-elastic p95 h", "met",
               "fluid / static", "fluid / threshold", "JCT within reach")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    cases: dict[str, dict[str, list[Summary]]] = {}
    fluid: dict[str, list[float]] = {}  # each case's bound, seed by seed as its runs
    for case, seed, s in rows:
        cases.setdefault(case, {}).setdefault(s.policy, []).append(s)
        if s.policy == "tide":
            fluid.setdefault(case, []).append(bounds[(case, seed)][1])
    for case, by_policy in cases.items():

        def median(policy: str, field: str, runs: dict[str, list[Summary]] = by_policy) -> float:
            return float(statistics.median(getattr(s, field) for s in runs[policy]))

        vs_static = statistics.median(
            t.avg_jct_h / s.avg_jct_h
            for t, s in zip(by_policy["tide"], by_policy["static"], strict=True)
        )
        vs_threshold = statistics.median(
            t.avg_jct_h / s.avg_jct_h
            for t, s in zip(by_policy["tide"], by_policy["threshold"], strict=True)
        )
        queue = {p: median(p, "p95_queue_nonelastic_h") for p in ("tide", "static", "threshold")}
        met = jct_targets(vs_static, vs_threshold) and queue_target(
            queue["tide"], queue["static"], queue["threshold"]
        )
        bound_vs = {
            p: statistics.median(
                b / s.avg_jct_h for b, s in zip(fluid[case], by_policy[p], strict=True)
            )
            for p in ("static", "threshold")
        }
        reach = jct_targets(bound_vs["static"], bound_vs["threshold"])
        table.add_row(
            case,
            str(len(by_policy["tide"])),
            f"{vs_static:.2f}",
            f"{vs_threshold:.2f}",
            "-"
            if math.isnan(queue["tide"])
            else f"{queue['tide']:.2f} (static {queue['static']:.2f}, "
            f"threshold {queue['threshold']:.2f})",
            "yes" if met else "no",
            f"{bound_vs['static']:.2f}",
            f"{bound_vs['threshold']:.2f}",
            "yes" if reach else "no",
        )
        records.append(
            {"metric": "targets_met", "case": case, "value": met, "unit": "bool",
             "jct_vs_static_median": round(vs_static, 4),
             "jct_vs_threshold_median": round(vs_threshold, 4),
             "fluid_bound_vs_static_median": round(bound_vs["static"], 4),
             "fluid_bound_vs_threshold_median": round(bound_vs["threshold"], 4),
             "jct_targets_within_bound": reach}
        )  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_case_options(parser)
    args = parser.parse_args()
    cases = cases_from(args)
    # Each distinct workload's bounds once (a Pollux workload is the same at every seed).
    distinct = {id(workload): (workload, cluster) for _, _, workload, cluster in cases}
    with ProcessPoolExecutor(args.workers) as pool:
        rows = [r for out in pool.map(_case, cases) for r in out]
        found = dict(zip(distinct, pool.map(case_bounds, distinct.values()), strict=True))
    bounds = {(name, seed): found[id(workload)] for name, seed, workload, _ in cases}
    console = Console(width=160)
    table = Table(title="policy quality (h = hours)")
    for col in (
        "case",
        "seed",
        "policy",
        "avg JCT h",
        "p95 JCT h",
        "non-elastic queue p95 h",
        "lost GPU-h",
        "idle GPU-h while waiting",
        "rescales",
        "JCT vs static",
        "JCT vs threshold",
    ):
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    by_key = {(c, s, x.policy): x for c, s, x in rows}
    for case, seed, s in rows:
        static = by_key[(case, seed, "static")].avg_jct_h
        threshold = by_key[(case, seed, "threshold")].avg_jct_h
        lost = s.restart_gpu_hours + s.killed_gpu_hours
        table.add_row(
            case,
            str(seed),
            s.policy,
            f"{s.avg_jct_h:.3f}",
            f"{s.p95_jct_h:.2f}",
            "-" if math.isnan(s.p95_queue_nonelastic_h) else f"{s.p95_queue_nonelastic_h:.2f}",
            f"{lost:.1f}",
            f"{s.idle_while_waiting_gpu_hours:.1f}",
            str(s.rescales),
            f"{s.avg_jct_h / static:.2f}",
            f"{s.avg_jct_h / threshold:.2f}",
        )
        params = {"case": case, "seed": seed, "policy": s.policy}
        records += [
            {"metric": "avg_jct", "value": round(s.avg_jct_h, 4), "unit": "h", **params},
            {"metric": "p95_jct", "value": round(s.p95_jct_h, 4), "unit": "h", **params},
            {"metric": "gpu_hours_lost", "value": round(lost, 3), "unit": "gpu_hours", **params},
            {
                "metric": "gpu_hours_idle_while_waiting",
                "value": round(s.idle_while_waiting_gpu_hours, 3),
                "unit": "gpu_hours",
                **params,
            },
            {"metric": "rescales", "value": s.rescales, "unit": "count", **params},
            # Issue 17's target: tide suffers no abrupt kill where reclaim is on.
            {"metric": "kills", "value": s.kills, "unit": "count", **params},
            {
                "metric": "killed_gpu_hours",
                "value": round(s.killed_gpu_hours, 3),
                "unit": "gpu_hours",
                **params,
            },
            {
                "metric": "avg_jct_vs_static",
                "value": round(s.avg_jct_h / static, 4),
                "unit": "ratio",
                **params,
            },
            {
                "metric": "avg_jct_vs_threshold",
                "value": round(s.avg_jct_h / threshold, 4),
                "unit": "ratio",
                **params,
            },
        ]
        if not math.isnan(s.p95_queue_nonelastic_h):
            records.append(
                {
                    "metric": "p95_queue_nonelastic",
                    "unit": "h",
                    "value": round(s.p95_queue_nonelastic_h, 4),
                    **params,
                }
            )
    console.print(table)
    # What any policy could at best reach: every job alone at its fastest size, never queued;
    # and the fluid relaxation, where jobs share the cluster's GPUs.
    bound_table = Table(title="average JCT lower bounds (no policy can beat them)")
    columns = ("case", "seed", "alone h", "alone / static", "fluid h", "fluid / static",
               "fluid / threshold", "tide / static", "tide / fluid")  # fmt: skip
    for col in columns:
        bound_table.add_column(col, justify="right")
    for (case, seed), (alone, fluid) in bounds.items():
        static = by_key[(case, seed, "static")].avg_jct_h
        threshold = by_key[(case, seed, "threshold")].avg_jct_h
        tide = by_key[(case, seed, "tide")].avg_jct_h
        bound_table.add_row(
            case, str(seed), f"{alone:.3f}", f"{alone / static:.2f}", f"{fluid:.3f}",
            f"{fluid / static:.2f}", f"{fluid / threshold:.2f}", f"{tide / static:.2f}",
            f"{tide / fluid:.2f}",
        )  # fmt: skip
        params = {"case": case, "seed": seed}
        for metric, value in (("avg_jct_lower_bound", alone), ("avg_jct_fluid_bound", fluid)):
            records += [
                {"metric": metric, "value": round(value, 4), "unit": "h", **params},
                {
                    "metric": f"{metric}_vs_static",
                    "value": round(value / static, 4),
                    "unit": "ratio",
                    **params,
                },
            ]
        records.append(
            {"metric": "avg_jct_fluid_bound_vs_threshold", "unit": "ratio",
             "value": round(fluid / threshold, 4), **params}
        )  # fmt: skip
    console.print(bound_table)
    console.print(_targets_table(rows, records, bounds))
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
