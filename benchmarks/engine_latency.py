"""Latency of the engine's phases on synthetic clusters of 100 to 10,000 jobs.

Each case builds one observation (100 queues, elastic jobs of about 2 GPUs each, measured at a few
sizes, with a steady-state memory of recent recommendations), warms the model cache (a steady
state refits nothing), then times ``decide`` — triage, budgets, allocation, stabilization and the
changes, with their explanations (rendered only when read) — over many runs. Prints a table;
``--json PATH`` writes the records. Beside each size's median, what Python's cyclic garbage
collector took inside the timed runs (the mean per run, and how many collections of each
generation a run set off): part of the time goes there, not to decide's own work. Each size runs
twice: with the interpreter's default collector, and with the observation frozen out of the
collector's reach (``gc.freeze``, what a long-running engine can do once per observation).

It also times the phases around it: ``observe``, joining the jobs as the cluster lists them (no
throughput) with the metrics source's throughput histories and remaining samples; the fit phase
(``ModelCache.fit``) in the steady state, where the cache refits nothing; and one scaling-model
refit (``ScalingModel.from_points`` on a 24-point history at three sizes), what a reconcile pays
per job with new measurements.

    python benchmarks/engine_latency.py --json benchmarks/out/engine_latency.json

``--profile`` also prints the top of a cProfile of ``decide`` at the largest size (its own runs,
after the timed ones; the figures above are not profiled).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import json
import os
import platform
import pstats
import statistics
import time
from pathlib import Path

import numpy as np

from scheduler_policy.engine.reconcile import decide, observe
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.models.scaling import ScalingModel
from scheduler_policy.policy.spec import Defaults, ElasticPolicy, QueuePolicy
from scheduler_policy.vocabulary.protocols import MetricsSample
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobPhase,
    JobState,
    Observation,
    QueueName,
    QueueState,
    Recommendation,
    ThroughputPoint,
)

NOW_S = 1_700_000_000.0


def synthetic(jobs: int, queues: int, *, seed: int) -> tuple[Observation, ElasticPolicy]:
    """A cluster with ``jobs`` elastic jobs spread over ``queues`` queues, ~2 GPUs per job."""
    rng = np.random.default_rng(seed)
    queue_names = [QueueName(f"q{i:03d}") for i in range(queues)]
    per_queue_gpus = 2.4 * jobs / queues  # room for some growth, not for all
    states = []
    for i in range(jobs):
        gpr = float(rng.choice([1.0, 2.0], p=[0.7, 0.3]))
        current = int(rng.integers(1, 3)) if gpr == 1.0 else 1
        sigma, kappa = float(rng.uniform(0.0, 0.2)), float(rng.uniform(0.0, 0.01))
        sizes = sorted({current, max(1, current - 1), current + 1})
        history = tuple(
            ThroughputPoint(
                NOW_S - 600 + k, n, 100.0 * n / (1 + sigma * (n - 1) + kappa * n * (n - 1))
            )
            for k, n in enumerate(sizes)
        )
        states.append(
            JobState(
                key=JobKey(f"ns/job-{i:05d}"),
                queue=queue_names[i % queues],
                gpus_per_replica=gpr,
                min_replicas=1,
                max_replicas=8,
                current_replicas=current,
                phase=JobPhase.RUNNING,
                elastic=True,
                throughput_history=history,
                remaining_samples=float(rng.uniform(1e5, 1e8)),
                last_rescale_s=NOW_S - float(rng.uniform(0, 3600)),
                # Steady state: the memory holds the one recommendation in force.
                recommendations=(Recommendation(NOW_S - 300.0, current),),
            )
        )
    observation = Observation(
        time_s=NOW_S,
        queues=tuple(
            QueueState(q, per_queue_gpus * 1.5, per_queue_gpus, 0.0, 0.0, float(rng.integers(0, 3)))
            for q in queue_names
        ),
        jobs=tuple(states),
        cluster_free_gpus=0.3 * jobs,
    )
    policy = ElasticPolicy(
        name="bench",
        defaults=Defaults(),
        queues=tuple(QueuePolicy(q, borrow=bool(i % 2)) for i, q in enumerate(queue_names)),
    )
    return observation, policy


class _Split:
    """The synthetic observation as the engine reads it: jobs from the cluster, metrics apart."""

    def __init__(self, observation: Observation) -> None:
        self._queues = observation.queues
        self._jobs = [
            dataclasses.replace(j, throughput_history=(), remaining_samples=None)
            for j in observation.jobs
        ]
        self._sample = MetricsSample(
            fresh=True,
            cluster_free_gpus=observation.cluster_free_gpus,
            job_throughput={j.key: j.throughput_history for j in observation.jobs},
            job_remaining_samples={
                j.key: j.remaining_samples
                for j in observation.jobs
                if j.remaining_samples is not None
            },
        )

    def sample(self, *, now_s: float) -> MetricsSample:
        return self._sample

    def list_queues(self) -> tuple[QueueState, ...]:
        return self._queues

    def list_jobs(self) -> list[JobState]:
        return self._jobs

    def list_nodes(self) -> tuple[()]:
        return ()

    def list_pending_gangs(self) -> tuple[()]:
        return ()

    def releasing_gpus(self) -> float:
        return 0.0


def measure_observe(jobs: int, queues: int, runs: int) -> float:
    """Median ms of ``observe`` on the synthetic cluster of ``jobs`` jobs."""
    observation, _ = synthetic(jobs, queues, seed=jobs)
    source = _Split(observation)
    joined = observe(metrics=source, cluster=source, now_s=NOW_S)
    assert joined.jobs == observation.jobs, "observe did not rebuild the observation"
    samples_ms = []
    for _ in range(runs):
        start = time.perf_counter()
        observe(metrics=source, cluster=source, now_s=NOW_S)
        samples_ms.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples_ms)


def measure_refit(runs: int) -> float:
    """Median µs of one scaling-model fit to a 24-point history at 1, 2 and 4 replicas."""
    rng = np.random.default_rng(0)
    history = [
        ThroughputPoint(
            NOW_S - 300.0 * k, n, 100.0 * n / (1 + 0.05 * (n - 1)) * rng.uniform(0.95, 1.05)
        )
        for k, n in enumerate([1, 2, 4] * 8)
    ]
    samples_us = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(100):
            ScalingModel.from_points(history)
        samples_us.append((time.perf_counter() - start) * 1e6 / 100)
    return statistics.median(samples_us)


def measure_fit(jobs: int, queues: int, runs: int) -> float:
    """Median ms of the fit phase in the steady state (every curve cached, no refit)."""
    observation, policy = synthetic(jobs, queues, seed=jobs)
    models = ModelCache(refit_s=3600.0)
    models.fit(observation, policy)  # warm: fit every job once
    fitted = models.curve_fits
    samples_ms = []
    for _ in range(runs):
        start = time.perf_counter()
        models.fit(observation, policy)
        samples_ms.append((time.perf_counter() - start) * 1000.0)
    assert models.curve_fits == fitted, "a steady-state fit refitted a model"
    return statistics.median(samples_ms)


def measure(jobs: int, queues: int, runs: int, *, gc_freeze: bool) -> dict[str, float]:
    """Median and p99 ms of ``decide`` on the synthetic cluster of ``jobs`` jobs."""
    observation, policy = synthetic(jobs, queues, seed=jobs)
    fits = ModelCache(refit_s=3600.0).fit(observation, policy)
    if gc_freeze:
        # What a long-running engine can do once it has built an observation: move the
        # observation's objects out of the cyclic collector's reach, so a full collection
        # does not walk 10,000 jobs' worth of objects in the middle of a decision.
        gc.collect()
        gc.freeze()
    samples_ms = []
    collector = _Collections()
    gc.callbacks.append(collector)
    try:
        for _ in range(runs):
            start = time.perf_counter()
            decide(observation, policy, fits=fits)
            samples_ms.append((time.perf_counter() - start) * 1000.0)
    finally:
        gc.callbacks.remove(collector)
    if gc_freeze:
        gc.unfreeze()
    samples_ms.sort()
    return {
        "median": statistics.median(samples_ms),
        "p99": samples_ms[min(len(samples_ms) - 1, round(0.99 * (len(samples_ms) - 1)))],
        "runs": float(runs),
        # What the cyclic collector took inside the timed runs, per run: where the time goes
        # besides decide's own work (decide does not touch the collector).
        "gc_ms": collector.seconds * 1000.0 / runs,
        **{f"gen{g}_per_run": n / runs for g, n in enumerate(collector.counts)},
    }


class _Collections:
    """A ``gc.callbacks`` entry that counts the collections of each generation and sums
    their time."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.counts[info["generation"]] += 1
        self.seconds += time.perf_counter() - self._started


def profile(jobs: int, queues: int, runs: int, *, top: int = 25) -> None:
    """Print the functions ``decide`` spends the most time in, over ``runs`` runs."""
    observation, policy = synthetic(jobs, queues, seed=jobs)
    fits = ModelCache(refit_s=3600.0).fit(observation, policy)
    decide(observation, policy, fits=fits)  # warm
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        decide(observation, policy, fits=fits)
    profiler.disable()
    print(f"cProfile of decide at {jobs} jobs, {runs} runs (by own time)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="job counts, comma-separated")
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--runs", type=int, default=30, help="timed runs per size (>= 20)")
    parser.add_argument("--json", type=Path, help="write the records here")
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of decide at the largest size"
    )
    args = parser.parse_args()
    records: list[dict[str, object]] = []
    results = {}
    print(
        f"decide, {args.queues} queues, {args.runs} runs per size, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}"
    )
    head = f"{'jobs':>8} {'gc':>8} {'median ms':>10} {'p99 ms':>10} {'in gc ms/run':>13}"
    print(f"{head}  collections/run (gen 0/1/2)")
    sizes = [int(s) for s in args.sizes.split(",")]
    common = {"queues": args.queues, "runs": args.runs}
    for size in sizes:
        for frozen in (False, True):
            result = measure(size, args.queues, args.runs, gc_freeze=frozen)
            gc_mode = "frozen" if frozen else "default"
            if not frozen:
                results[size] = result
            per_gen = "/".join(f"{result[f'gen{g}_per_run']:.2f}" for g in range(3))
            print(
                f"{size:>8} {gc_mode:>8} {result['median']:>10.2f} {result['p99']:>10.2f} "
                f"{result['gc_ms']:>13.2f}  {per_gen}"
            )
            for stat in ("median", "p99"):
                records.append(
                    {
                        "metric": f"decide_latency_{stat}",
                        "value": round(result[stat], 3),
                        "unit": "ms",
                        "jobs": size,
                        **common,
                        "gc": gc_mode,
                    }
                )
            records.append(
                {
                    "metric": "decide_gc_ms_per_run",
                    "value": round(result["gc_ms"], 3),
                    "unit": "ms",
                    "jobs": size,
                    **common,
                    "gc": gc_mode,
                    "collections_per_run": [round(result[f"gen{g}_per_run"], 3) for g in range(3)],
                }
            )
    for name, phase in (("observe", measure_observe), ("fit", measure_fit)):
        print(f"{name}, {args.runs} runs per size")
        print(f"{'jobs':>8} {'median ms':>10}")
        for size in sizes:
            median = phase(size, args.queues, args.runs)
            print(f"{size:>8} {median:>10.2f}")
            records.append(
                {
                    "metric": f"{name}_latency_median",
                    "value": round(median, 3),
                    "unit": "ms",
                    "jobs": size,
                    **common,
                }
            )
    refit_us = measure_refit(args.runs)
    print(f"one scaling-model refit (24 points, 3 sizes): median {refit_us:.1f} µs")
    records.append(
        {
            "metric": "refit_latency_median",
            "value": round(refit_us, 2),
            "unit": "us",
            "points": 24,
            "sizes": 3,
            "runs": args.runs,
        }
    )
    if 1000 in results and 10000 in results:
        ratio = results[10000]["median"] / results[1000]["median"]
        print(f"10k/1k median ratio (default gc): {ratio:.2f}")
        records.append(
            {
                "metric": "decide_latency_scaling_10k_over_1k",
                "value": round(ratio, 3),
                "unit": "ratio",
                "queues": args.queues,
            }
        )
    if args.profile:
        profile(max(sizes), args.queues, args.runs)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
