"""Adaptive-batch statistics read from the workers' metrics, pure and through a real Prometheus."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from metrics_collector.batch_stats import batch_statistics
from metrics_collector.prometheus import PrometheusConnection, PrometheusSource
from metrics_collector.querier import InstantSeries
from scheduler_policy.policy.spec import MetricsSettings
from scheduler_policy.vocabulary.state import BatchStatistics, JobKey, StepTimes
from tests.metrics_collector.builders import gauge, times
from tests.prometheus_server import Exporter, PrometheusFactory, PrometheusServer, Series
from worker_runtime.metrics import AdaptiveMetrics

BERT = JobKey("ml/bert")


def series(value: float, **labels: str) -> InstantSeries:
    return InstantSeries(labels={"namespace": "ml", "volcano_job": "bert", **labels}, value=value)


def shaped(value: float, nodes: str = "1", replicas: str = "2", local: str = "32") -> InstantSeries:
    return series(value, nodes=nodes, replicas=replicas, local_batch=local)


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        (
            {
                "job_optim_step_seconds": [shaped(0.5), shaped(0.9, "2", "4", "16")],
                "job_accumulation_step_seconds": [shaped(0.3)],
                "job_sync_seconds": [shaped(0.2), shaped(0.6, "2", "4", "16")],
                "job_grad_sqr": [series(2.0)],
                "job_grad_var": [series(30.0)],
                "job_batch_size": [series(128.0)],
                "job_progress": [series(10.0)],
                "job_planned_progress": [series(100.0)],
            },
            BatchStatistics(
                batch_size=128, grad_sqr=2.0, grad_var=30.0, progress=10.0,
                planned_progress=100.0,
                step_times=(
                    StepTimes(nodes=1, replicas=2, local_batch_size=32, optim_step_s=0.5,
                              accumulation_step_s=0.3, sync_s=0.2),
                    StepTimes(nodes=2, replicas=4, local_batch_size=16, optim_step_s=0.9,
                              sync_s=0.6),
                ),
            ),
        ),
        (
            {"job_grad_sqr": [series(math.nan)], "job_grad_var": [series(3.0)]},
            BatchStatistics(batch_size=0, grad_var=3.0),
        ),
        (
            {
                "job_optim_step_seconds": [shaped(math.nan)],
                "job_accumulation_step_seconds": [shaped(0.3)],
                "job_sync_seconds": [shaped(math.nan)],
            },
            BatchStatistics(
                batch_size=0,
                step_times=(StepTimes(nodes=1, replicas=2, local_batch_size=32,
                                      optim_step_s=math.nan, accumulation_step_s=0.3),),
            ),
        ),
    ],
    ids=["every-figure", "nan-gauge-and-missing-ones", "nan-means-keep-the-rest"],
)  # fmt: skip
def test_what_is_there_is_read_and_nothing_is_made_up(results, expected) -> None:
    found, problems = batch_statistics(results)
    assert problems == []
    assert list(found) == [BERT]
    got = found[BERT]
    assert got.step_times == expected.step_times or all(  # NaN != NaN: compare field by field
        (a.nodes, a.replicas, a.local_batch_size, a.accumulation_step_s, a.sync_s)
        == (b.nodes, b.replicas, b.local_batch_size, b.accumulation_step_s, b.sync_s)
        and math.isnan(a.optim_step_s) == math.isnan(b.optim_step_s)
        for a, b in zip(got.step_times, expected.step_times, strict=True)
    )
    assert replace(got, step_times=()) == replace(expected, step_times=())


def test_a_series_with_a_bad_shape_is_left_out_by_name() -> None:
    found, problems = batch_statistics(
        {"job_optim_step_seconds": [shaped(0.5, replicas="x"), shaped(0.4, local="16")]}
    )
    assert found == {
        BERT: BatchStatistics(
            batch_size=0,
            step_times=(StepTimes(nodes=1, replicas=2, local_batch_size=16, optim_step_s=0.4),),
        )
    }
    assert problems == [
        "job_optim_step_seconds of ml/bert: shape labels {'nodes': '1', 'replicas': 'x', "
        "'local_batch': '32'} are not whole numbers >= 1"
    ]


def test_no_batch_series_no_statistics() -> None:
    assert batch_statistics({"job_grad_sqr": []}) == ({}, [])


# ---------------------------------------------------------------- through a real Prometheus

SETTINGS = MetricsSettings(rate_window_s=120.0, lookback_s=3600.0, demand_lookback_s=3600.0)


def source(server: PrometheusServer, settings: MetricsSettings = SETTINGS) -> PrometheusSource:
    return PrometheusSource(
        connection=PrometheusConnection(url=server.url, timeout_s=5.0, attempts=2, backoff_s=0.05),
        settings=settings,
        interval_s=60.0,
    )


def histogram(
    name: str, labels: dict[str, str], *, mean_s: float, per_s: float, at: list[float]
) -> list[Series]:
    """A step histogram's ``_sum`` and ``_count`` as a worker's would rise: ``per_s``
    observations a second, each ``mean_s`` long."""
    first = at[0]
    return [
        Series(f"{name}_count", labels, [(t, per_s * (t - first)) for t in at], type="unknown"),
        Series(
            f"{name}_sum", labels, [(t, mean_s * per_s * (t - first)) for t in at], type="unknown"
        ),
    ]


def adaptive_job(now: float) -> list[Series]:
    """bert: 2 workers on one node for 20 min, then 4 on two nodes; a NaN grad_sqr on one pod,
    no sync measured at 2 workers; gpt: only its gauges, its grad_var missing."""
    before, after = times(now - 1800, now - 1215), times(now - 1200, now - 5)
    out: list[Series] = []
    for i in range(2):
        pod = {"namespace": "ml", "volcano_job": "bert", "pod": f"bert-{i}"}
        shape = pod | {"nodes": "1", "replicas": "2", "local_batch": "32"}
        out += histogram("tide_worker_optim_step_seconds", shape, mean_s=0.4, per_s=2, at=before)
        out += histogram("tide_worker_accumulation_step_seconds", shape, mean_s=0.3, per_s=2,
                         at=before)  # fmt: skip
    for i in range(4):
        pod = {"namespace": "ml", "volcano_job": "bert", "pod": f"bert-{i}"}
        shape = pod | {"nodes": "2", "replicas": "4", "local_batch": "16"}
        mean = 0.5 + 0.1 * i  # the ranks differ: the mean is over all of them
        out += histogram("tide_worker_optim_step_seconds", shape, mean_s=mean, per_s=1, at=after)
        out += histogram("tide_worker_sync_seconds", shape, mean_s=0.25, per_s=1, at=after)
        out += [
            gauge("tide_worker_grad_sqr", pod, math.nan if i == 3 else 2.0, after),
            gauge("tide_worker_grad_var", pod, 40.0, after),
            gauge("tide_worker_batch_size", pod, 128.0, after),
            gauge("tide_worker_progress", pod, 500.0, after),
            gauge("tide_worker_planned_progress", pod, 2000.0, after),
        ]
    gpt = {"namespace": "ml", "volcano_job": "gpt", "pod": "gpt-0"}
    out += [gauge("tide_worker_grad_sqr", gpt, 1.0, after),
            gauge("tide_worker_batch_size", gpt, 64.0, after)]  # fmt: skip
    return out


@pytest.mark.prometheus
def test_statistics_through_prometheus_backfilled(prometheus_factory: PrometheusFactory) -> None:
    now = time.time()
    server = prometheus_factory.start(series=adaptive_job(now))
    sample = source(server).sample(now_s=now)
    bert = sample.job_batch_statistics[BERT]
    one_node, two_nodes = bert.step_times
    assert (one_node.nodes, one_node.replicas, one_node.local_batch_size) == (1, 2, 32)
    assert one_node.optim_step_s == pytest.approx(0.4, rel=1e-6)
    assert one_node.accumulation_step_s == pytest.approx(0.3, rel=1e-6)
    assert one_node.sync_s is None
    assert (two_nodes.nodes, two_nodes.replicas, two_nodes.local_batch_size) == (2, 4, 16)
    assert two_nodes.optim_step_s == pytest.approx(0.65, rel=1e-6)  # mean of 0.5 … 0.8
    assert two_nodes.accumulation_step_s is None
    assert two_nodes.sync_s == pytest.approx(0.25, rel=1e-6)
    # avg ignores nothing: one pod's NaN makes the job's grad_sqr NaN, which is not a value.
    assert bert.grad_sqr is None
    assert (bert.grad_var, bert.batch_size, bert.progress, bert.planned_progress) == (
        40.0, 128, 500.0, 2000.0,
    )  # fmt: skip
    assert sample.job_batch_statistics[JobKey("ml/gpt")] == BatchStatistics(
        batch_size=64, grad_sqr=1.0
    )


@pytest.mark.prometheus
def test_statistics_from_a_live_worker_endpoint(prometheus_factory: PrometheusFactory) -> None:
    """The worker's own AdaptiveMetrics, scraped, read back as the engine's BatchStatistics."""
    registry = CollectorRegistry()
    worker = AdaptiveMetrics(registry=registry, job_name="live", namespace="ml", pod="live-0")
    worker.grad_sqr.set(3.0)
    worker.grad_var.set(12.0)
    worker.batch_size.set(96)
    worker.progress.set(7.5)
    worker.set_planned_progress(70.0)
    with Exporter(registry) as exporter:
        server = prometheus_factory.start(scrape_targets=[exporter.target], scrape_interval_s=0.5)
        prom = source(server, replace(SETTINGS, lookback_s=60.0))
        key = JobKey("ml/live")
        deadline = time.monotonic() + 30
        while True:  # a step of each kind per round, until two scrapes show them rising
            # As ``AdaptiveMetrics.observe_step`` records a step at shape (1 node, 2 workers, 48).
            shape_labels = {"volcano_job": "live", "namespace": "ml", "pod": "live-0",
                            "nodes": "1", "replicas": "2", "local_batch": "48"}  # fmt: skip
            worker.optim_step_seconds.labels(**shape_labels).observe(0.2)
            for seconds in (0.1, 0.1):
                worker.accumulation_step_seconds.labels(**shape_labels).observe(seconds)
            worker.sync_seconds.labels(**shape_labels).observe(0.05)
            found = prom.sample(now_s=time.time()).job_batch_statistics.get(key)
            if found is not None and found.step_times and found.grad_sqr is not None:
                [shape] = found.step_times
                if math.isfinite(shape.optim_step_s):
                    break
            assert time.monotonic() < deadline, prom.last_report.problems
            time.sleep(0.3)
    assert (shape.nodes, shape.replicas, shape.local_batch_size) == (1, 2, 48)
    assert shape.optim_step_s == pytest.approx(0.2)
    assert shape.accumulation_step_s == pytest.approx(0.1)
    assert shape.sync_s == pytest.approx(0.05)
    assert (found.grad_sqr, found.grad_var, found.batch_size) == (3.0, 12.0, 96)
    assert (found.progress, found.planned_progress) == (7.5, 70.0)
