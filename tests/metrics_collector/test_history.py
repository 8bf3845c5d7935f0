"""``tide history export``: Prometheus history → tide's trace format → the same jobs, replayable.

The round trip writes a cluster's series into a real Prometheus by backfill (tests/
prometheus_server.py), exports them with the command, and reads the trace back.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from metrics_collector.history import (
    QUERIES,
    HistoryError,
    HistoryLabels,
    export_history,
    parse_time,
)
from metrics_collector.prometheus import PrometheusConnection, PrometheusQuerier
from metrics_collector.promql import MAX_POINTS_PER_SERIES
from metrics_collector.sampling import RangeSeries
from simulations.traces import load_tide_trace, read_trace_rows
from tests.prometheus_server import PrometheusFactory, PrometheusServer, Series
from tide.cli import app

runner = CliRunner()
STEP_S = 15.0


# -- a cluster's hour, as the series it exports ---------------------------------------------


def _grid(start: float, end: float) -> list[float]:
    return [start + STEP_S * i for i in range(round((end - start) / STEP_S) + 1)]


def _pod(
    *,
    ns: str,
    pod: str,
    job: str,
    queue: str,
    elastic: bool,
    gpus: int,
    created: float,
    runs: tuple[float, float],
) -> list[Series]:
    """What kube-state-metrics says of one pod: labels, GPU request, phase, creation time.

    The pod exists from ``created`` to 5 min after its run; it is Running during ``runs`` and
    Succeeded after it (kube-state-metrics' phase series read 0 for the other phases)."""
    start, end = runs
    exists = _grid(created, end + 300)
    labels = {
        "namespace": ns,
        "pod": pod,
        "label_volcano_sh_job_name": job,
        "label_volcano_sh_queue_name": queue,
    }
    if elastic:
        labels["label_tide_io_elastic"] = "true"
    ident = {"namespace": ns, "pod": pod}
    request = {**ident, "container": "trainer", "resource": "nvidia_com_gpu", "unit": "integer"}
    return [
        Series("kube_pod_labels", labels, [(t, 1.0) for t in exists]),
        Series("kube_pod_created", ident, [(t, created) for t in exists]),
        Series("kube_pod_container_resource_requests", request, [(t, gpus) for t in exists]),
        Series(
            "kube_pod_status_phase",
            {**ident, "phase": "Running"},
            [(t, 1.0 if start <= t <= end else 0.0) for t in exists],
        ),
    ]


def _worker(
    *, ns: str, job: str, pod: str, runs: Sequence[tuple[float, float, float, int]]
) -> list[Series]:
    """One pod's worker metrics: for each (start, end, samples/s, world size) a process whose
    counter starts at 0; nothing is served between two of them (the restart)."""
    labels = {"namespace": ns, "volcano_job": job, "pod": pod}
    counter: list[tuple[float, float]] = []
    world: list[tuple[float, float]] = []
    for start, end, per_s, size in runs:
        counter += [(t, per_s * (t - start)) for t in _grid(start, end)]
        world += [(t, float(size)) for t in _grid(start, end)]
    return [
        Series("tide_worker_samples_total", labels, counter, type="counter"),
        Series("tide_worker_world_size", labels, world),
    ]


def _cluster(base: float) -> list[Series]:
    """An hour of a cluster (times from ``base``, a multiple of the step):

    - ml/bert (elastic, research, 1 GPU a pod): pods 0 and 1 created at +60, run 2 x 100
      samples/s from +120; at +1320 it grows to 4 (pods 2 and 3 created then, Running from
      +1335); the workers restart and from +1350 run 4 x 90 samples/s until +2550.
    - prod/serve (not elastic, production): 2 pods x 4 GPUs, created at +300, Running
      +330 to +1530, no worker metrics.
    - ml/notebook: one pod without GPUs (skipped).
    """
    series: list[Series] = []
    bert = {"ns": "ml", "job": "bert", "queue": "research", "elastic": True, "gpus": 1}
    for i in (0, 1):
        series += _pod(
            pod=f"bert-worker-{i}", created=base + 60, runs=(base + 120, base + 2550), **bert
        )
        series += _worker(
            ns="ml",
            job="bert",
            pod=f"bert-worker-{i}",
            runs=[(base + 120, base + 1320, 100.0, 2), (base + 1350, base + 2550, 90.0, 4)],
        )
    for i in (2, 3):
        series += _pod(
            pod=f"bert-worker-{i}", created=base + 1320, runs=(base + 1335, base + 2550), **bert
        )
        series += _worker(
            ns="ml", job="bert", pod=f"bert-worker-{i}", runs=[(base + 1350, base + 2550, 90.0, 4)]
        )
    for i in (0, 1):
        series += _pod(
            ns="prod",
            pod=f"serve-worker-{i}",
            job="serve",
            queue="production",
            elastic=False,
            gpus=4,
            created=base + 300,
            runs=(base + 330, base + 1530),
        )
    series += _pod(
        ns="ml",
        pod="notebook-0",
        job="notebook",
        queue="research",
        elastic=False,
        gpus=0,
        created=base + 30,
        runs=(base + 30, base + 3000),
    )
    return series


@pytest.fixture
def history_server(prometheus_factory: PrometheusFactory) -> tuple[PrometheusServer, float]:
    """A Prometheus holding ``_cluster``'s hour, ending 5 minutes ago.

    Backfilled series carry no staleness markers, so a lookback shorter than the sample spacing
    stands in for the markers real scraping writes when a pod's series ends."""
    base = math.floor((time.time() - 3300 - 300) / STEP_S) * STEP_S
    server = prometheus_factory.start(
        series=_cluster(base), extra_args=["--query.lookback-delta=10s"]
    )
    return server, base


def _export(server: PrometheusServer, base: float, out: Path, *extra: str) -> str:
    result = runner.invoke(
        app,
        [
            "history",
            "export",
            "--prometheus",
            server.url,
            "--start",
            f"{base:.0f}",
            "--end",
            f"{base + 3300:.0f}",
            "--step",
            f"{STEP_S:g}",
            "--out",
            str(out),
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.prometheus
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_round_trip_through_prometheus(
    history_server: tuple[PrometheusServer, float], tmp_path: Path, suffix: str
) -> None:
    server, base = history_server
    out = tmp_path / f"cluster{suffix}"
    output = _export(server, base, out)
    assert "2 jobs (1 with measured throughput), 1 skipped" in output
    assert "ml/notebook: none of its pods requested GPUs" in output
    bert, serve = read_trace_rows(out)

    # Arrival, from the first pod's creation; the trace starts at the first arrival.
    assert (bert.job_id, bert.submit_s) == ("ml/bert", 0.0)
    assert (serve.job_id, serve.submit_s) == ("prod/serve", 240.0)
    # Sizes and shape.
    assert (bert.replicas, bert.min_replicas, bert.max_replicas) == (2, 2, 4)
    assert (bert.elastic, bert.gpus_per_replica, bert.queue) == (True, 1, "research")
    assert (serve.replicas, serve.min_replicas, serve.max_replicas) == (2, 2, 2)
    assert (serve.elastic, serve.gpus_per_replica, serve.queue) == (False, 4, "production")
    # Replicas over time, seconds after submission: 2 from +60 (run start), 4 from +1275.
    assert bert.replicas_over_time == ((60.0, 2), (1275.0, 4))
    assert serve.replicas_over_time == ((30.0, 2),)
    # Throughput by replicas: 2 x 100 and 4 x 90 samples/s, exactly (stable intervals only).
    assert [(m.replicas, m.samples_per_s) for m in bert.throughput] == [
        (2, pytest.approx(200.0, rel=1e-6)),
        (4, pytest.approx(360.0, rel=1e-6)),
    ]
    # Work: 1200 s x 200 + 1200 s x 360 = 672,000 samples = 3,360 s at 2 replicas; the
    # non-elastic job's duration is its run time, within one step.
    assert bert.duration_s == pytest.approx(672_000 / 200, rel=1e-6)
    assert serve.duration_s == pytest.approx(1200.0, abs=STEP_S)

    workload = load_tide_trace(out)
    jobs = {j.key: j for j in workload.jobs}
    assert jobs["ml/bert"].work_units == pytest.approx(672_000.0, rel=1e-6)
    assert jobs["ml/bert"].profile.rate(3) == pytest.approx(280.0, rel=1e-6)

    sim = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(out),
            "--policies",
            "tide,static",
            "--out",
            str(tmp_path / "s"),
        ],
    )
    assert sim.exit_code == 0, sim.output
    with (tmp_path / "s" / "jobs.csv").open() as f:
        replayed = {(r["policy"], r["job"]): r for r in csv.DictReader(f)}
    assert {k for k in replayed} == {
        (policy, job) for policy in ("tide", "static") for job in ("ml/bert", "prod/serve")
    }
    assert all(float(r["work_done"]) == 1.0 for r in replayed.values())
    # Static keeps bert at 2 replicas: its 3,360 s plus the cluster's 30 s start-up.
    assert float(replayed[("static", "ml/bert")]["jct_h"]) == pytest.approx(3390 / 3600, abs=2e-3)
    assert float(replayed[("tide", "ml/bert")]["jct_h"]) < 3390 / 3600


@pytest.mark.prometheus
def test_labels_are_overridable(
    history_server: tuple[PrometheusServer, float], tmp_path: Path
) -> None:
    server, base = history_server
    out = tmp_path / "t.csv"
    # Reading the queue from the job-name label puts every job in a "queue" named after it.
    _export(server, base, out, "--queue-label", "label_volcano_sh_job_name", "-q")
    assert {r.job_id: r.queue for r in read_trace_rows(out)} == {
        "ml/bert": "bert",
        "prod/serve": "serve",
    }


@pytest.mark.prometheus
def test_prometheus_refusing_a_query_is_a_history_error(
    prometheus_factory: PrometheusFactory,
) -> None:
    server = prometheus_factory.start()
    querier = PrometheusQuerier(PrometheusConnection(url=server.url))
    try:
        # A label name PromQL cannot parse: Prometheus answers 400, the export names the server.
        with pytest.raises(HistoryError, match="400") as info:
            export_history(
                querier=querier,
                start_s=0,
                end_s=60,
                labels=HistoryLabels(job="not a label"),
                where=server.url,
            )
    finally:
        querier.close()
    assert info.value.where == server.url


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start", "2026-12-01T09:00:00", "--end", "10"], "--start: error: give a time zone"),
        (["--start", "yesterday", "--end", "10"], "--start: error: expected RFC 3339"),
        (["--start", "100", "--end", "10"], "--end: error: must be after --start"),
        (["--start", "0", "--end", "10", "--step", "0"], "--step: error: must be a positive"),
        (["--start", "0", "--end", "10", "--prometheus", "ftp://x"], "--prometheus: error: url"),
        (
            ["--start", "0", "--end", "10", "--prometheus", "http://127.0.0.1:9"],
            "http://127.0.0.1:9: error: range query",
        ),
    ],
    ids=["no-zone", "not-a-time", "end-before-start", "zero-step", "not-http", "unreachable"],
)
def test_bad_arguments_exit_1_naming_what_is_wrong(
    tmp_path: Path, args: list[str], message: str
) -> None:
    base = ["history", "export", "--prometheus", "http://127.0.0.1:9", "--out", str(tmp_path / "o")]
    result = runner.invoke(app, [*base, "-q", *args])
    assert result.exit_code == 1
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1764579600", 1764579600.0),
        ("2025-12-01T09:00:00Z", 1764579600.0),
        ("2025-12-01T10:00:00+01:00", 1764579600.0),
        ("1764579600.5", 1764579600.5),
    ],
    ids=["epoch", "rfc3339-utc", "rfc3339-offset", "epoch-fraction"],
)
def test_parse_time(text: str, seconds: float) -> None:
    assert parse_time(text, option="--start") == seconds


class RecordingQuerier:
    """A fake at our own boundary: answers nothing, records every range asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float, float]] = []

    def range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> list[RangeSeries]:
        self.calls.append((query, start_s, end_s, step_s))
        return []


def test_long_export_is_chunked_and_reports_progress() -> None:
    querier = RecordingQuerier()
    seen: list[tuple[int, int]] = []
    day = 86400.0
    history = export_history(
        querier=querier,
        start_s=0.0,
        end_s=3 * day,
        step_s=15.0,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert history.jobs == ()
    per_query = math.ceil((3 * day / 15 + 1) / MAX_POINTS_PER_SERIES)
    assert per_query == 2
    assert len(querier.calls) == QUERIES * per_query
    assert all(
        (end - start) / step + 1 <= MAX_POINTS_PER_SERIES for _, start, end, step in querier.calls
    )
    assert (
        seen[-1] == (QUERIES * per_query, QUERIES * per_query) and len(seen) == QUERIES * per_query
    )


class CannedQuerier:
    """A fake at our own boundary: answers each query by the first metric name it contains."""

    def __init__(self, series: dict[str, list[RangeSeries]]) -> None:
        self.series = series

    def range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> list[RangeSeries]:
        name = min(self.series, key=lambda n: (query.find(n) < 0, query.find(n)))
        if name not in query:
            return []
        return [
            RangeSeries(s.labels, [(t, v) for t, v in s.points if start_s <= t <= end_s])
            for s in self.series[name]
        ]


def _one_job(
    counters: dict[str, list[float]], sizes: dict[str, list[float]]
) -> dict[str, list[RangeSeries]]:
    """A running two-pod job on the grid 0, 10, 20, ..., with the given worker series."""
    times = [10.0 * i for i in range(len(next(iter(counters.values()))))]

    def rs(labels: dict[str, str], values: Sequence[float]) -> RangeSeries:
        return RangeSeries(labels, list(zip(times, values, strict=True)))

    pods = ("p0", "p1")
    kube = {"namespace": "ns"}
    label = {"label_volcano_sh_job_name": "j", "label_volcano_sh_queue_name": "q"}
    return {
        "kube_pod_container_resource_requests": [
            rs({**kube, "pod": p}, [1] * len(times)) for p in pods
        ],
        "kube_pod_status_phase": [rs({**kube, "pod": p}, [1] * len(times)) for p in pods],
        "kube_pod_created": [rs({**kube, "pod": p}, [0] * len(times)) for p in pods],
        "kube_pod_labels": [rs({**kube, "pod": p, **label}, [1] * len(times)) for p in pods],
        "tide_worker_samples_total": [
            rs({"namespace": "ns", "volcano_job": "j", "pod": p}, v) for p, v in counters.items()
        ],
        "tide_worker_world_size": [
            rs({"namespace": "ns", "volcano_job": "j", "pod": p}, v) for p, v in sizes.items()
        ],
    }


@pytest.mark.parametrize(
    ("counters", "sizes", "expected", "work"),
    [
        (
            {"p0": [0, 100, 200, 300], "p1": [0, 100, 200, 300]},
            {"p0": [2, 2, 2, 2], "p1": [2, 2, 2, 2]},
            [(2, 20.0)],
            600.0,
        ),
        (
            {"p0": [0, 100, 200, 300], "p1": [0, 100, 200, 300]},
            {"p0": [2, 2, 2, 2], "p1": [3, 3, 3, 3]},
            [],
            600.0,
        ),
        (
            {"p0": [0, 100, 50], "p1": [0, 100, 50]},
            {"p0": [2, 2, 2], "p1": [2, 2, 2]},
            [],
            2 * (100 + 50),
        ),
        (
            {"p0": [0, 100, 200, 300, 40, 140, 240], "p1": [0, 100, 200, 300, 40, 140, 240]},
            {"p0": [2, 2, 2, 2, 2, 2, 2], "p1": [2, 2, 2, 2, 2, 2, 2]},
            [(2, 20.0)],
            2 * (300 + 40 + 200),
        ),
    ],
    ids=[
        "steady-two-pods",
        "pods-disagree-on-world-size",
        "one-stable-interval-is-too-few",
        "reset-interval-left-out-of-throughput",
    ],
)
def test_throughput_only_from_stable_intervals(
    counters: dict[str, list[float]],
    sizes: dict[str, list[float]],
    expected: list[tuple[int, float]],
    work: float,
) -> None:
    history = export_history(
        querier=CannedQuerier(_one_job(counters, sizes)), start_s=0.0, end_s=60.0, step_s=10.0
    )
    (job,) = history.jobs
    assert [(m.replicas, m.samples_per_s) for m in job.throughput] == expected
    assert job.work_samples == pytest.approx(work)


@given(
    segments=st.lists(
        st.tuples(st.integers(1, 4), st.integers(2, 6), st.floats(1.0, 1000.0)),
        min_size=1,
        max_size=5,
    )
)
def test_throughput_is_each_sizes_pods_times_their_rate(
    segments: list[tuple[int, int, float]],
) -> None:
    # Segments of (pods, grid intervals, samples/s per pod), each a fresh membership whose
    # counters start at 0, one missing grid point (the restart) between two.
    step = 10.0
    counters: dict[str, list[tuple[float, float]]] = {f"p{i}": [] for i in range(4)}
    sizes: dict[str, list[tuple[float, float]]] = {f"p{i}": [] for i in range(4)}
    t = 0.0
    for pods, intervals, per_s in segments:
        for k in range(intervals + 1):
            for i in range(pods):
                counters[f"p{i}"].append((t + k * step, per_s * k * step))
                sizes[f"p{i}"].append((t + k * step, float(pods)))
        t += (intervals + 2) * step
    end = t
    kube = [
        RangeSeries(
            {"namespace": "ns", "pod": f"p{i}"}, [(x * step, 1.0) for x in range(int(end / step))]
        )
        for i in range(4)
    ]
    labels = [RangeSeries({**s.labels, "label_volcano_sh_job_name": "j"}, s.points) for s in kube]
    worker = {"namespace": "ns", "volcano_job": "j"}
    querier = CannedQuerier(
        {
            "kube_pod_container_resource_requests": kube,
            "kube_pod_status_phase": kube,
            "kube_pod_created": [RangeSeries(s.labels, [(0.0, 0.0)]) for s in kube],
            "kube_pod_labels": labels,
            "tide_worker_samples_total": [
                RangeSeries({**worker, "pod": p}, v) for p, v in counters.items() if v
            ],
            "tide_worker_world_size": [
                RangeSeries({**worker, "pod": p}, v) for p, v in sizes.items() if v
            ],
        }
    )
    (job,) = export_history(querier=querier, start_s=0.0, end_s=end, step_s=step).jobs
    expected: dict[int, tuple[float, float]] = {}
    for pods, intervals, per_s in segments:
        samples, seconds = expected.get(pods, (0.0, 0.0))
        expected[pods] = (samples + pods * per_s * intervals * step, seconds + intervals * step)
    assert {m.replicas: m.samples_per_s for m in job.throughput} == pytest.approx(
        {n: samples / seconds for n, (samples, seconds) in expected.items()}
    )
    assert job.work_samples == pytest.approx(sum(s for s, _ in expected.values()))
