"""Latency of building the engine's metrics sample from a real Prometheus: 1,000 jobs, 50 queues.

A real Prometheus (Debian's ``/usr/bin/prometheus``, on loopback) gets history backfilled with
promtool: per job one worker pod's ``tide_worker_samples_total``, world size, planned and consumed
samples over the throughput lookback (every job ran at two sizes); per queue Volcano's
``volcano_queue_*_scalar_resources`` in milli-units and two non-elastic pods' kube-state-metrics
series over the demand lookback; every elastic pod's kube-state-metrics series; the nodes. Then
``PrometheusSource.sample`` is timed with the policy's default PromQL:

- cold: a new source, which reads the whole throughput and demand history;
- warm: the same source one decision interval later, again and again, which reads only the
  points since its last round (the steady state of a running engine).

Prints a table; ``--json PATH`` writes the records.

    python benchmarks/observe_latency.py --json benchmarks/out/observe_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metrics_collector.prometheus import PrometheusConnection, PrometheusSource  # noqa: E402
from scheduler_policy.policy.spec import MetricsSettings  # noqa: E402
from tests.prometheus_server import PrometheusServer, find_binaries  # noqa: E402

INTERVAL_S = 60.0
WORKER_SCRAPE_S = 30.0
KSM_SCRAPE_S = 60.0
DEMAND_SCRAPE_S = 120.0


def _labels(**labels: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


class BlockFiles:
    """OpenMetrics files, one per 2 h block of time: promtool 2.42 reads its whole input once for
    every 2 h block it spans, so one file over 7 days is read 84 times; files of one block each
    are read once."""

    BLOCK_S = 7200

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[int, TextIO] = {}
        self.family = ""
        self.headed: dict[int, str] = {}
        self.samples = 0

    def start_family(self, name: str, kind: str) -> None:
        self.family = f"# TYPE {name} {kind}\n"

    def write(self, sample: str, labels: str, value: float, t_s: float) -> None:
        block = int(t_s // self.BLOCK_S)
        out = self.files.get(block)
        if out is None:
            out = self.files[block] = (self.folder / f"block-{block}.om").open("w")
        if self.headed.get(block) != self.family:
            out.write(self.family)
            self.headed[block] = self.family
        out.write(f"{sample}{{{labels}}} {value} {t_s:.0f}\n")
        self.samples += 1

    def close(self) -> list[Path]:
        for out in self.files.values():
            out.write("# EOF\n")
            out.close()
        return [self.folder / f"block-{b}.om" for b in sorted(self.files)]


def _gauge(out: BlockFiles, name: str, labels: str, value: float, start_s: float, end_s: float,
           every_s: float) -> None:  # fmt: skip
    t = start_s
    while t <= end_s:
        out.write(name, labels, value, t)
        t += every_s


def _jobs(jobs: int, queues: int) -> Iterator[tuple[str, str, str, int]]:
    for i in range(jobs):
        yield "ml", f"job-{i:04d}", f"q{i % queues:02d}", 1 + i % 4


def write_history(out: BlockFiles, *, jobs: int, queues: int, now_s: float,
                  settings: MetricsSettings) -> None:  # fmt: skip
    """Write the whole backfill into ``out``."""
    start = now_s - settings.lookback_s
    demand_start = now_s - settings.demand_lookback_s
    end = now_s - 5
    half = start + (end - start) / 2
    out.start_family("tide_worker_samples", "counter")
    for ns, job, _, size in _jobs(jobs, queues):
        labels = _labels(namespace=ns, volcano_job=job, pod=f"{job}-worker-0")
        # The first half of the lookback at `size` workers, the second at `size + 1`.
        count, t = 0.0, start
        while t <= end:
            rate = 40.0 * size if t < half else 40.0 * (size + 1) * 0.9
            out.write("tide_worker_samples_total", labels, round(count), t)
            count += rate * WORKER_SCRAPE_S
            t += WORKER_SCRAPE_S
    out.start_family("tide_worker_world_size", "gauge")
    for ns, job, _, size in _jobs(jobs, queues):
        labels = _labels(namespace=ns, volcano_job=job, pod=f"{job}-worker-0")
        t = start
        while t <= end:
            out.write("tide_worker_world_size", labels, size if t < half else size + 1, t)
            t += WORKER_SCRAPE_S
    for name, value in (("tide_worker_planned_samples", 1e9),
                        ("tide_worker_consumed_samples", 1e8)):  # fmt: skip
        out.start_family(name, "gauge")
        for ns, job, _, _ in _jobs(jobs, queues):
            labels = _labels(namespace=ns, volcano_job=job, pod=f"{job}-worker-0")
            _gauge(out, name, labels, value, end - 1800, end, WORKER_SCRAPE_S)
    for figure in ("allocated", "request", "deserved"):
        name = f"volcano_queue_{figure}_scalar_resources"
        out.start_family(name, "gauge")
        for q in range(queues):
            labels = _labels(queue_name=f"q{q:02d}", resource="nvidia.com/gpu")
            _gauge(out, name, labels, 40000, start, end, WORKER_SCRAPE_S)
    nodes = max(1, jobs // 4)
    out.start_family("kube_node_status_allocatable", "gauge")
    for n in range(nodes):
        labels = _labels(node=f"node-{n}", resource="nvidia_com_gpu", unit="integer")
        _gauge(out, "kube_node_status_allocatable", labels, 8, start, end, KSM_SCRAPE_S)
    pods = [(ns, f"{job}-worker-0", q, float(size + 1), True, start, KSM_SCRAPE_S)
            for ns, job, q, size in _jobs(jobs, queues)]  # fmt: skip
    pods += [("prod", f"serve-{q:02d}-{k}", f"q{q:02d}", 4.0, False, demand_start,
              DEMAND_SCRAPE_S) for q in range(queues) for k in range(2)]  # fmt: skip
    for family in ("kube_pod_container_resource_requests", "kube_pod_status_phase",
                   "kube_pod_labels"):  # fmt: skip
        out.start_family(family, "gauge")
        for i, (ns, pod, q, gpus, elastic, first, every) in enumerate(pods):
            who = {"namespace": ns, "pod": pod}
            if family == "kube_pod_container_resource_requests":
                labels = _labels(**who, container="main", node=f"node-{i % nodes}",
                                 resource="nvidia_com_gpu", unit="integer")  # fmt: skip
                _gauge(out, family, labels, gpus, first, end, every)
            elif family == "kube_pod_status_phase":
                _gauge(out, family, _labels(**who, phase="Running"), 1, first, end, every)
                _gauge(out, family, _labels(**who, phase="Pending"), 0, first, end, every)
            else:
                labels = _labels(**who, label_volcano_sh_queue_name=q,
                                 label_tide_io_elastic="true" if elastic else "")  # fmt: skip
                _gauge(out, family, labels, 1, first, end, every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--cold-runs", type=int, default=3, help="new sources timed")
    parser.add_argument("--warm-runs", type=int, default=20, help="later rounds timed")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args()
    settings = MetricsSettings()  # the policy defaults: 6 h of throughput, 7 days of demand
    _, promtool = find_binaries()
    now_s = time.time()
    with tempfile.TemporaryDirectory(prefix="tide-observe-bench-") as tmp:
        server = PrometheusServer(Path(tmp) / "prometheus", ready_timeout_s=300)
        started = time.perf_counter()
        files = BlockFiles(Path(tmp))
        write_history(files, jobs=args.jobs, queues=args.queues, now_s=now_s, settings=settings)
        samples = files.samples
        for path in files.close():
            subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(path),
                            str(server.tsdb_dir)], check=True, capture_output=True)  # fmt: skip
            path.unlink()
        backfill_s = time.perf_counter() - started
        server.start()
        try:
            # The first round runs where the history still has the warm rounds ahead of it.
            first_s = now_s - args.warm_runs * INTERVAL_S - 60
            cold, warm = [], []
            for _ in range(args.cold_runs):
                source = PrometheusSource(connection=PrometheusConnection(url=server.url),
                                          settings=settings, interval_s=INTERVAL_S)  # fmt: skip
                began = time.perf_counter()
                sample = source.sample(now_s=first_s)
                cold.append(time.perf_counter() - began)
                assert sample.fresh, source.last_report.problems[:3]
            for k in range(1, args.warm_runs + 1):
                began = time.perf_counter()
                sample = source.sample(now_s=first_s + k * INTERVAL_S)
                warm.append(time.perf_counter() - began)
            assert sample.fresh, source.last_report.problems[:3]
            assert len(sample.job_throughput) == args.jobs
            assert not sample.stale_jobs, list(sample.stale_jobs.items())[:3]
            sizes = {len(h) for h in sample.job_throughput.values()}
            assert sizes == {2}, f"every job ran at two sizes, got point counts {sizes}"
            assert len(sample.queue_demand_history) == args.queues
        finally:
            server.stop()
    cold_median, warm_median = statistics.median(cold), statistics.median(warm)
    print(f"PrometheusSource.sample, {args.jobs} jobs in {args.queues} queues, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}")  # fmt: skip
    print(f"backfill: {samples:,} samples in {backfill_s:.1f} s")
    print(f"{'round':>6} {'runs':>5} {'median s':>9} {'max s':>7}")
    print(f"{'cold':>6} {len(cold):>5} {cold_median:>9.3f} {max(cold):>7.3f}")
    print(f"{'warm':>6} {len(warm):>5} {warm_median:>9.3f} {max(warm):>7.3f}")
    base = {"jobs": args.jobs, "queues": args.queues}
    records = [
        {"metric": "observe_latency_median", "value": round(warm_median, 4), "unit": "s",
         **base, "round": "warm", "runs": len(warm)},
        {"metric": "observe_latency_cold_median", "value": round(cold_median, 4), "unit": "s",
         **base, "round": "cold", "runs": len(cold),
         "lookback_s": settings.lookback_s, "demand_lookback_s": settings.demand_lookback_s},
    ]  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
