"""PrometheusSource against a real Prometheus: history backfilled by promtool, field by field."""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from metrics_collector.prometheus import PrometheusConnection, PrometheusSource
from metrics_collector.sampling import DEMAND_FILL_S, QueueFigures
from scheduler_policy.engine.reconcile import reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import (
    ElasticPolicy,
    MetricsSettings,
    PrometheusQueries,
    QueuePolicy,
)
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobPhase,
    JobState,
    Observation,
    QueueName,
    QueueState,
    Reason,
)
from tests.metrics_collector.builders import (
    gauge,
    ksm_node,
    ksm_pod,
    times,
    volcano_queue,
    worker_pod,
)
from tests.prometheus_server import Exporter, PrometheusFactory, PrometheusServer, Series
from worker_runtime.metrics import WorkerMetrics

pytestmark = pytest.mark.prometheus

INTERVAL_S = 60.0
SETTINGS = MetricsSettings(rate_window_s=120.0, lookback_s=3600.0, demand_lookback_s=3600.0)


def source(server: PrometheusServer, settings: MetricsSettings = SETTINGS) -> PrometheusSource:
    return PrometheusSource(
        connection=PrometheusConnection(url=server.url, timeout_s=5.0, attempts=2, backoff_s=0.05),
        settings=settings,
        interval_s=INTERVAL_S,
    )


def cluster_series(now: float) -> list[Series]:
    """32 GPUs on 4 nodes; queues research (elastic bert, a notebook) and production."""
    at = times(now - 1800, now - 5)
    series: list[Series] = []
    for i in range(4):
        series.append(ksm_node(f"node-{i}", 8, at))
    series += volcano_queue("research", at=at, allocated=5, request=5, deserved=8)
    series += volcano_queue("production", at=at, allocated=8, request=24, deserved=24)
    pods = [
        ("prod", "prod-a", 8, "Running", "node-0", "production", False),
        ("prod", "prod-b", 16, "Pending", "", "production", False),
        ("prod", "prod-c", 8, "Succeeded", "node-1", "production", False),
        ("ml", "notebook", 1, "Running", "node-2", "research", False),
    ] + [("ml", f"bert-worker-{i}", 1, "Running", f"node-{i}", "research", True) for i in range(4)]
    for namespace, pod, gpus, phase, node, queue, elastic in pods:
        series += ksm_pod(
            namespace, pod, gpus=gpus, phase=phase, node=node, queue=queue, elastic=elastic, at=at
        )
    return series


def job_series(now: float) -> list[Series]:
    """bert: 2 workers at 100/s, then 4 at 180/s; gpt: silent for 200 s; nanjob; quiet."""
    before, after = times(now - 1800, now - 1215), times(now - 1200, now - 5)
    series: list[Series] = []
    for i in range(2):
        series += worker_pod("ml", "bert", f"bert-worker-{i}", samples_per_s=50, world_size=2,
                             at=before)  # fmt: skip
    for i in range(4):  # every worker restarts at the rescale: counters from 0 again
        series += worker_pod("ml", "bert", f"bert-worker-{i}", samples_per_s=45, world_size=4,
                             at=after)  # fmt: skip
    series += worker_pod("ml", "gpt", "gpt-worker-0", samples_per_s=60, world_size=1,
                         at=times(now - 1800, now - 200))  # fmt: skip
    nan_at = times(now - 1800, now - 5)
    nan_counter = [(t, 10.0 * (t - nan_at[0]) if t < now - 100 else math.nan) for t in nan_at]
    labels = {"namespace": "ml", "volcano_job": "nanjob", "pod": "nanjob-0"}
    series += [
        Series("tide_worker_samples_total", labels, nan_counter, type="counter"),
        gauge("tide_worker_world_size", labels, 1, nan_at),
    ]
    quiet = {"namespace": "ml", "volcano_job": "quiet", "pod": "quiet-0"}
    series.append(gauge("tide_worker_world_size", quiet, 2, nan_at))
    bert = {"namespace": "ml", "volcano_job": "bert", "pod": "bert-worker-0"}
    gpt = {"namespace": "ml", "volcano_job": "gpt", "pod": "gpt-worker-0"}
    recent = times(now - 600, now - 5)
    series += [
        gauge("tide_worker_planned_samples", bert, 1e6, recent),
        gauge("tide_worker_consumed_samples", bert, 4e5, recent),
        gauge("tide_worker_planned_samples", gpt, 100, recent),
        gauge("tide_worker_consumed_samples", gpt, 150, recent),
        gauge("tide_worker_consumed_samples", quiet, 10, recent),
    ]
    return series


def test_the_sample_field_by_field(prometheus_factory: PrometheusFactory) -> None:
    now = time.time()
    server = prometheus_factory.start(series=cluster_series(now) + job_series(now))
    prom = source(server)
    sample = prom.sample(now_s=now)

    # Cluster and queues: fresh, milli-units converted, capacity absent without the plugin.
    assert sample.fresh, prom.last_report.problems
    assert sample.cluster_free_gpus == pytest.approx(32 - 8 - 1 - 4)
    assert sample.queue_allocated_gpus == {QueueName("research"): 5.0,
                                           QueueName("production"): 8.0}  # fmt: skip
    # The deserved shares Volcano's scheduler computed, which no Queue spec carries.
    assert sample.queue_deserved_gpus == {QueueName("research"): 8.0,
                                          QueueName("production"): 24.0}  # fmt: skip
    assert sample.queue_request_gpus == {QueueName("research"): 5.0,
                                         QueueName("production"): 24.0}  # fmt: skip
    assert prom.last_report.queues[QueueName("production")] == QueueFigures(
        allocated_gpus=8.0, request_gpus=24.0, deserved_gpus=24.0
    )
    # Non-elastic demand: running and pending, not finished, elastic pods left out.
    demand = sample.queue_demand_history
    assert demand[QueueName("production")][-1].gpus == 24.0
    assert demand[QueueName("research")][-1].gpus == 1.0
    assert demand[QueueName("production")][-1].time_s == pytest.approx(now, abs=INTERVAL_S)
    assert len(demand[QueueName("production")]) >= 25  # 30 min of points at a 60 s step

    # One representative point per size bert ran at.
    bert = sample.job_throughput[JobKey("ml/bert")]
    assert [p.replicas for p in bert] == [2, 4]
    assert bert[0].samples_per_s == pytest.approx(100, rel=0.01)
    assert bert[1].samples_per_s == pytest.approx(180, rel=0.01)
    assert bert[0].time_s < now - 1200 < bert[1].time_s
    assert JobKey("ml/bert") not in sample.stale_jobs

    # Staleness per job while bert is fresh; NaN and missing are not zero.
    stale = sample.stale_jobs
    assert re.fullmatch(
        r"throughput of ml/gpt: newest sample 2[01]\d s old", stale[JobKey("ml/gpt")]
    )
    assert stale[JobKey("ml/nanjob")] == "throughput of ml/nanjob: NaN now"
    assert stale[JobKey("ml/quiet")] == "throughput of ml/quiet: no samples"
    assert all(math.isfinite(p.samples_per_s) for h in sample.job_throughput.values() for p in h)

    # Planned − consumed, never negative; no plan, no figure.
    assert sample.job_remaining_samples == {JobKey("ml/bert"): 6e5, JobKey("ml/gpt"): 0.0}
    assert prom.last_report.stale_series == 3


def test_the_next_round_fetches_only_new_points_and_agrees(
    prometheus_factory: PrometheusFactory,
) -> None:
    now = time.time()
    server = prometheus_factory.start(series=cluster_series(now) + job_series(now))
    prom = source(server)
    first = prom.sample(now_s=now - 120)
    second = prom.sample(now_s=now)
    cold = source(server).sample(now_s=now)
    assert second.job_throughput == cold.job_throughput
    assert second.queue_demand_history == cold.queue_demand_history
    assert len(second.queue_demand_history[QueueName("production")]) == (
        len(first.queue_demand_history[QueueName("production")]) + 2
    )


def old(now: float) -> list[float]:
    return times(now - 1800, now - 200)


@pytest.mark.parametrize(
    ("swap", "problem"),
    [
        (
            lambda now: volcano_queue("research", at=old(now), allocated=5),
            r"Volcano figures of queue research: newest sample 2[01]\d s old",
        ),
        (
            lambda now: [ksm_node(f"node-{i}", 8, old(now)) for i in range(4)],
            r"cluster node figures: newest sample 2[01]\d s old",
        ),
        (
            lambda now: [ksm_node("node-0", math.nan, times(now - 60, now - 5))],
            r"cluster allocatable GPUs: nan",
        ),
        (
            lambda now: volcano_queue("research", at=times(now - 60, now - 5), allocated=math.nan),
            r"queue_allocated of queue research: nan",
        ),
    ],
    ids=["queue-stale", "cluster-stale", "cluster-nan", "queue-nan"],
)
def test_cluster_and_queue_trouble_makes_the_sample_not_fresh(
    prometheus_factory: PrometheusFactory, swap: object, problem: str
) -> None:
    now = time.time()
    replaced = swap(now)  # type: ignore[operator]
    replaced = replaced if isinstance(replaced, list) else [replaced]
    names = {(s.name, tuple(sorted(s.labels.items()))) for s in replaced}
    base = [
        s for s in cluster_series(now) if (s.name, tuple(sorted(s.labels.items()))) not in names
    ]
    if any(s.name == "kube_node_status_allocatable" for s in replaced):
        base = [s for s in base if s.name != "kube_node_status_allocatable"]
    server = prometheus_factory.start(series=base + replaced)
    prom = source(server)
    sample = prom.sample(now_s=now)
    assert not sample.fresh
    assert any(re.fullmatch(problem, p) for p in prom.last_report.problems), (
        prom.last_report.problems
    )


def test_queue_figures_missing_for_a_queue_are_no_value_and_no_problem(
    prometheus_factory: PrometheusFactory,
) -> None:
    now = time.time()
    series = [s for s in cluster_series(now) if "production" not in s.labels.get("queue_name", "")]
    server = prometheus_factory.start(series=series)
    prom = source(server)
    sample = prom.sample(now_s=now)
    assert sample.fresh, prom.last_report.problems
    assert sample.queue_allocated_gpus == {QueueName("research"): 5.0}


def test_promql_overrides_are_what_is_read(prometheus_factory: PrometheusFactory) -> None:
    now = time.time()
    at = times(now - 1800, now - 5)
    mine = worker_pod("ml", "mine", "mine-0", samples_per_s=30, world_size=3, at=at,
                      counter_name="my_samples_total")  # fmt: skip
    server = prometheus_factory.start(series=cluster_series(now) + mine)
    queries = replace(
        PrometheusQueries(),
        job_throughput="sum by (namespace, volcano_job) (rate(my_samples_total[2m]))",
        job_last_sample="max by (namespace, volcano_job) (timestamp(my_samples_total))",
        cluster_allocatable="vector(100)",
    )
    prom = source(server, replace(SETTINGS, queries=queries))
    sample = prom.sample(now_s=now)
    assert sample.fresh, prom.last_report.problems
    [point] = sample.job_throughput[JobKey("ml/mine")]
    assert point.replicas == 3
    assert point.samples_per_s == pytest.approx(30, rel=0.01)
    assert sample.cluster_free_gpus == pytest.approx(100 - 13)
    assert sample.stale_jobs == {}


@pytest.mark.parametrize(
    ("override", "fresh", "problem"),
    [
        (
            {"job_throughput": "sum by (namespace, volcano_job) (rate(x[2m])"},
            True,
            "throughput of ml/bert: query refused: range query",
        ),
        (
            {"queue_allocated": "volcano_queue_allocated_scalar_resources{"},
            False,
            "queue figure queue_allocated: query refused: query",
        ),
    ],
    ids=["job-query-refused-holds-jobs", "queue-query-refused-is-not-fresh"],
)
def test_a_refused_query_is_a_problem_not_an_exception(
    prometheus_factory: PrometheusFactory, override: dict[str, str], fresh: bool, problem: str
) -> None:
    now = time.time()
    server = prometheus_factory.start(series=cluster_series(now) + job_series(now))
    prom = source(server, replace(SETTINGS, queries=replace(PrometheusQueries(), **override)))
    sample = prom.sample(now_s=now)
    assert sample.fresh is fresh
    assert any(p.startswith(problem) for p in prom.last_report.problems), prom.last_report.problems


def test_demand_history_fills_a_part_per_round_in_chunks(
    prometheus_factory: PrometheusFactory,
) -> None:
    """Twelve hours at a 1 s step: each round reads six hours more, 21,600 points, over
    Prometheus's limit of 11,000 for one query; the rounds together hold every point once."""
    now = time.time()
    at = [*times(now - 43200 - 600, now - 60, every_s=60), now - 0.5]  # fresh at a 1 s interval
    series = [ksm_node("node-0", 8, at)]
    series += ksm_pod("prod", "p", gpus=2, phase="Running", node="node-0", queue="production",
                      elastic=False, at=at)  # fmt: skip
    series += volcano_queue("production", at=at, allocated=2)
    server = prometheus_factory.start(series=series)
    prom = PrometheusSource(
        connection=PrometheusConnection(url=server.url),
        settings=replace(SETTINGS, demand_lookback_s=43200.0),
        interval_s=1.0,
    )
    lengths = []
    for _ in range(4):
        sample = prom.sample(now_s=now)
        assert sample.fresh, prom.last_report.problems
        history = sample.queue_demand_history[QueueName("production")]
        lengths.append(len(history))
    times_s = [p.time_s for p in history]
    fill = round(DEMAND_FILL_S)  # points per round at a 1 s step
    # The lookback's both ends count: twelve hours are 2 * 21,600 + 1 points.
    assert lengths == [fill, 2 * fill, 2 * fill + 1, 2 * fill + 1]
    assert times_s == sorted(set(times_s))
    assert times_s[-1] - times_s[0] == 43200
    assert {p.gpus for p in history} == {2.0}


def test_a_live_worker_endpoint_then_prometheus_stopped(
    prometheus_factory: PrometheusFactory,
) -> None:
    """A real WorkerMetrics endpoint scraped live; then Prometheus stops and the engine holds."""
    registry = CollectorRegistry()
    worker = WorkerMetrics(registry=registry, job_name="live", namespace="ml", pod="live-0")
    worker.world_size.set(2)
    worker.set_planned_samples(1000)
    worker.consumed_samples.set(400)
    stop = threading.Event()

    def train() -> None:  # 500 samples/s until the test ends (bounded by the event)
        while not stop.wait(0.05):
            worker.samples.inc(25)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    try:
        with Exporter(registry) as exporter:
            server = prometheus_factory.start(scrape_targets=[exporter.target],
                                              scrape_interval_s=0.5)  # fmt: skip
            settings = replace(SETTINGS, rate_window_s=2.0, lookback_s=60.0)
            prom = PrometheusSource(
                connection=PrometheusConnection(url=server.url, timeout_s=2.0, attempts=2,
                                                backoff_s=0.05, min_budget_s=0.0),
                settings=settings,
                interval_s=2.0,
            )  # fmt: skip
            key = JobKey("ml/live")
            deadline = time.monotonic() + 30
            while True:
                sample = prom.sample(now_s=time.time())
                if sample.job_throughput.get(key) and key not in sample.stale_jobs:
                    break
                assert time.monotonic() < deadline, prom.last_report.problems
                time.sleep(0.5)
            [point] = sample.job_throughput[key]
            assert point.replicas == 2
            assert point.samples_per_s == pytest.approx(500, rel=0.3)
            assert sample.job_remaining_samples == {key: 600.0}

            server.stop()
            started = time.monotonic()
            down = prom.sample(now_s=time.time())
            assert time.monotonic() - started < 0.5 * 2.0 + 0.5  # the budget, and some slack
            assert not down.fresh
            assert down.stale_jobs[key] == "metrics of ml/live: Prometheus unreachable"
            assert not prom.last_report.reachable
            # The history read before the outage is kept for the models.
            assert down.job_throughput[key] == sample.job_throughput[key]

            # The engine on this source holds every job and writes nothing.
            job = JobState(key=key, queue=QueueName("q"), gpus_per_replica=1, min_replicas=1,
                           max_replicas=8, current_replicas=2, phase=JobPhase.RUNNING,
                           elastic=True)  # fmt: skip
            queue = QueueState(name=QueueName("q"), capability_gpus=16, deserved_gpus=16,
                               guarantee_gpus=0, allocated_gpus=2,
                               pending_nonelastic_gpus=0)  # fmt: skip
            cluster = FakeCluster(Observation(time_s=0, queues=(queue,), jobs=(job,),
                                              cluster_free_gpus=14))  # fmt: skip
            policy = ElasticPolicy(queues=(QueuePolicy(name=QueueName("q"), borrow=True),))
            result = reconcile(metrics=prom, cluster=cluster, policy=policy, now_s=time.time(),
                               models=ModelCache())  # fmt: skip
            assert not result.observation.metrics_fresh
            assert [(d.job, d.reason) for d in result.decisions] == [
                (key, Reason.HOLD_METRICS_STALE)
            ]
            assert cluster.writes == []
    finally:
        stop.set()
        trainer.join(timeout=5)
