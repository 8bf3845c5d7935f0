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

    python benchmarks/headroom_tradeoff.py --forecast [--builtin-seeds 0,1,2] [--json PATH]

compares forecast headroom with fixed headroom of the same size instead (issue 18), on the
built-in workload at both loads: tide with ``headroom.forecastQuantile: 0.9`` (30-minute
horizon) in the non-elastic ``production`` queue, whose demand the forecast follows, then tide
with a fixed ``headroom.gpus`` in the same queue equal to what the forecast kept on average
(time-weighted over the reconciles; the integers on both sides of it), next to tide without
headroom, ``static`` and ``threshold``. It prints per case and seed the non-elastic p95
queueing delay and tide's average JCT of each, and which forecast served (the learned model
needs more history than a day's workload gives: there it is the recalibrated recent peak).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor

from policy_quality import add_case_options, cases_from, quality_cases
from rich.console import Console
from rich.table import Table

from scheduler_policy.extender import Extender
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.state import QueueName
from simulations.api import PolicyRun, default_policy_for, run_one
from simulations.cluster import SimulatedCluster
from simulations.cluster_config import ClusterSpec
from simulations.controllers import TideController
from simulations.report import Summary, summarize
from simulations.run import RunOptions, simulate
from simulations.tune_space import apply_params
from simulations.volcano import JobOrder
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


FORECAST_QUEUE = QueueName("production")  # the built-in cluster's non-elastic queue
FORECAST_QUANTILE = 0.9


@dataclasses.dataclass(slots=True)
class _HeadroomProbe:
    """tide's controller, recording the forecast queue's headroom and forecast at each reconcile."""

    inner: TideController
    log: list[tuple[float, float, str]] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def rigid(self) -> bool:
        return self.inner.rigid

    @property
    def extender(self) -> Extender | None:
        return self.inner.extender

    def control(self, cluster: SimulatedCluster, *, now_s: float) -> int:
        writes = self.inner.control(cluster, now_s=now_s)
        plan = self.inner.last_plan
        budget = None if plan is None else plan.budgets.get(FORECAST_QUEUE)
        if budget is not None:
            self.log.append((now_s, budget.headroom_gpus, budget.forecast_reason))
        return writes

    def order(self) -> JobOrder:
        return self.inner.order()

    def trigger(self, cluster: SimulatedCluster, *, withheld_pods: int) -> str | None:
        return self.inner.trigger(cluster, withheld_pods=withheld_pods)

    def mean_headroom_gpus(self, end_s: float) -> float:
        """Time-weighted mean of the headroom kept, each reconcile's until the next."""
        if not self.log:
            return 0.0
        total = span = 0.0
        for (t, gpus, _), (t_next, _, _) in zip(
            self.log, [*self.log[1:], (end_s, 0.0, "")], strict=True
        ):
            total += gpus * max(0.0, t_next - t)
            span += max(0.0, t_next - t)
        return total / span if span > 0 else self.log[-1][1]


ForecastUnit = tuple[str, int, Workload, ClusterSpec, str, float]
"""One run: case, seed, workload, cluster, variant (none, forecast, fixed, static, threshold),
fixed headroom GPUs."""


def _tide_policy(cluster: ClusterSpec, variant: str, gpus: float) -> ElasticPolicy:
    base = default_policy_for(cluster)
    if variant == "forecast":
        params: dict[str, object] = {
            f"queues.{FORECAST_QUEUE}.headroom.forecastQuantile": FORECAST_QUANTILE
        }
    else:
        params = {f"queues.{FORECAST_QUEUE}.headroom.gpus": gpus}
    return apply_params(base, params)


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    """One run of the forecast comparison."""

    case: str
    seed: int
    variant: str  # none, forecast, fixed, static, threshold
    gpus: float  # the fixed headroom (fixed only)
    avg_jct_h: float
    p95_queue_nonelastic_h: float
    mean_headroom_gpus: float | None = None  # tide runs only
    model_share: float | None = None  # forecast only: share of reconciles the model served

    @property
    def label(self) -> str:
        if self.variant == "fixed":
            return f"fixed {self.gpus:g}"
        return "none (tide)" if self.variant == "none" else self.variant


def _run_forecast(unit: ForecastUnit) -> _Outcome:
    case, seed, workload, cluster, variant, gpus = unit
    options = RunOptions(metrics=dataclasses.replace(RunOptions().metrics, seed=seed))
    if variant in ("static", "threshold"):
        run = PolicyRun(variant, variant, None)
        summary = summarize(run_one(run, workload=workload, cluster=cluster, options=options))
        return _Outcome(
            case, seed, variant, gpus, summary.avg_jct_h, summary.p95_queue_nonelastic_h
        )
    policy = _tide_policy(cluster, variant, gpus)
    probe = _HeadroomProbe(
        TideController(policy=policy, models=ModelCache(refit_s=policy.model_refit_s))
    )
    result = simulate(
        workload=workload,
        cluster=cluster,
        controller=probe,  # type: ignore[arg-type]  # the Controller protocol, wrapped
        options=dataclasses.replace(options, interval_s=policy.interval_s),
    )
    summary = summarize(result)
    served = [why for _, _, why in probe.log if why]
    share = sum(w.startswith("learned model") for w in served) / len(served) if served else 0.0
    return _Outcome(
        case, seed, variant, gpus, summary.avg_jct_h, summary.p95_queue_nonelastic_h,
        probe.mean_headroom_gpus(result.end_s), share if variant == "forecast" else None,
    )  # fmt: skip


_ORDER = {"none": 0, "forecast": 1, "fixed": 2, "static": 3, "threshold": 4}


def forecast_main(args: argparse.Namespace) -> None:
    """Forecast headroom against fixed headroom of the same mean size (``--forecast``)."""
    seeds = [int(s) for s in args.builtin_seeds.split(",")]
    cases = [c for c in quality_cases([], seeds, 0.0, []) if c[0].startswith("builtin")]
    first = [
        (case, seed, workload, cluster, variant, 0.0)
        for case, seed, workload, cluster in cases
        for variant in ("forecast", "none", "static", "threshold")
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(_run_forecast, first))
        kept = {
            (r.case, r.seed): r.mean_headroom_gpus or 0.0 for r in rows if r.variant == "forecast"
        }
        second = [
            (case, seed, workload, cluster, "fixed", gpus)
            for case, seed, workload, cluster in cases
            for gpus in sorted(
                {float(math.floor(kept[case, seed])), float(math.ceil(kept[case, seed]))}
            )
        ]
        rows += list(pool.map(_run_forecast, second))
    table = Table(title=f"forecast headroom (q = {FORECAST_QUANTILE}, 30 min) in {FORECAST_QUEUE} "
                        "against fixed headroom of its mean size")  # fmt: skip
    for col in ("case", "seed", "tide headroom", "GPUs kept (mean)", "non-elastic p95 h",
                "avg JCT h", "learned model served"):  # fmt: skip
        table.add_column(col, justify="right")
    records: list[dict[str, object]] = []
    for r in sorted(rows, key=lambda r: (r.case, r.seed, _ORDER[r.variant], r.gpus)):
        mean = "" if r.mean_headroom_gpus is None else f"{r.mean_headroom_gpus:.2f}"
        share = "" if r.model_share is None else f"{r.model_share:.0%}"
        table.add_row(r.case, str(r.seed), r.label, mean, f"{r.p95_queue_nonelastic_h:.3f}",
                      f"{r.avg_jct_h:.3f}", share)  # fmt: skip
        params = {"case": r.case, "seed": r.seed, "headroom": r.label}
        records += [
            {"metric": "p95_queue_nonelastic", "value": round(r.p95_queue_nonelastic_h, 4),
             "unit": "h", **params},
            {"metric": "avg_jct", "value": round(r.avg_jct_h, 4), "unit": "h", **params},
        ]  # fmt: skip
        if r.mean_headroom_gpus is not None:
            records.append({"metric": "mean_headroom", "value": round(r.mean_headroom_gpus, 3),
                            "unit": "gpus", **params})  # fmt: skip
    Console(width=160).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_case_options(parser)
    parser.add_argument(
        "--forecast",
        action="store_true",
        help="forecast headroom against fixed headroom of the same mean size (built-in cases)",
    )
    args = parser.parse_args()
    if args.forecast:
        forecast_main(args)
        return
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
