"""The engine's own metrics: a fresh registry per test, read with get_sample_value."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metrics_collector.engine_metrics import EngineMetrics
from metrics_collector.sampling import SampleReport
from scheduler_policy.engine.reconcile import ReconcileResult, reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.models.node_scaling import NodeScalingModel
from scheduler_policy.policy.spec import ElasticPolicy, Headroom
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.state import DemandPoint
from tests.scheduler_policy.builders import (
    NOW_S,
    make_job,
    make_observation,
    make_policy,
    make_queue,
)

JOB_A = {"namespace": "ns", "volcano_job": "a"}
JOB_B = {"namespace": "ns", "volcano_job": "b"}


def run_once(
    metrics: EngineMetrics,
    *,
    fresh: bool = True,
    policy: ElasticPolicy | None = None,
    models: ModelCache | None = None,
    report: SampleReport | None = None,
    duration_s: float = 0.03,
) -> ReconcileResult:
    cluster = FakeCluster(
        make_observation(
            make_job("a", current=2), make_job("b", current=6, sizes=(6,)),
            free=4, fresh=fresh, queues=(make_queue(capability=16),),
        )
    )  # fmt: skip
    policy = policy or make_policy(headroom_gpus=2.0)
    models = models or ModelCache()
    result = reconcile(metrics=cluster, cluster=cluster, policy=policy, now_s=NOW_S, models=models)
    metrics.record(result, models=models, duration_s=duration_s,
                   finished_s=NOW_S + duration_s, report=report)  # fmt: skip
    return result


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_reconcile_exports_decisions_replicas_budgets_and_timing() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    result = run_once(metrics)
    reasons = {d.reason.value for d in result.decisions}
    for reason in reasons:
        expected = sum(d.reason.value == reason for d in result.decisions)
        assert value(registry, "tide_decisions_total", reason=reason) == expected
    by_job = {d.job: d for d in result.decisions}
    a = by_job[next(k for k in by_job if k.endswith("/a"))]
    assert value(registry, "tide_job_replicas", **JOB_A) == a.current_replicas == 2
    assert value(registry, "tide_job_target_replicas", **JOB_A) == a.target_replicas
    assert value(registry, "tide_replica_writes_total", outcome="applied") == len(result.applied)
    assert value(registry, "tide_replica_writes_total", outcome="failed") == 0
    # Capability 16, no non-elastic work, 2 GPUs of fixed headroom.
    assert value(registry, "tide_queue_headroom_gpus", queue_name="q") == 2.0
    assert value(registry, "tide_queue_budget_gpus", queue_name="q") == 14.0
    # No forecast configured: no forecast series (not a made-up 0).
    assert value(registry, "tide_queue_forecast_gpus", queue_name="q") is None
    assert value(registry, "tide_reconcile_duration_seconds_count") == 1
    assert value(registry, "tide_reconcile_duration_seconds_sum") == pytest.approx(0.03)
    assert value(registry, "tide_reconcile_duration_seconds_bucket", le="0.025") == 0
    assert value(registry, "tide_reconcile_duration_seconds_bucket", le="0.05") == 1
    assert value(registry, "tide_last_reconcile_timestamp_seconds") == NOW_S + 0.03
    assert value(registry, "tide_metrics_fresh") == 1
    assert value(registry, "tide_metrics_stale_series") == 0
    # The scaling model's own figure for the points it was fitted to.
    history = make_job("a").throughput_history
    expected_error = NodeScalingModel.from_points(history, gpus_per_node=8.0).relative_error_
    error = value(registry, "tide_scaling_model_relative_error_ratio", **JOB_A)
    assert error == pytest.approx(expected_error)
    assert error is not None and 0 < error < 0.01


def test_the_scaling_models_recent_error_is_the_previous_fits_miss_on_the_newest_point() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    models = ModelCache()
    for sizes in ((1, 2), (1, 2, 4)):  # the second round brings a point at 4 replicas
        cluster = FakeCluster(make_observation(make_job("a", sizes=sizes), free=4))
        result = reconcile(
            metrics=cluster, cluster=cluster, policy=make_policy(), now_s=NOW_S, models=models
        )
        metrics.record(result, models=models, duration_s=0.01, finished_s=NOW_S)
        if sizes == (1, 2):
            assert value(registry, "tide_scaling_model_error_ratio", **JOB_A) is None
    history = make_job("a", sizes=(1, 2, 4)).throughput_history
    before = NodeScalingModel.from_points(history[:2], gpus_per_node=8.0)
    expected = abs(before.throughput(4, 1) - history[2].samples_per_s) / history[2].samples_per_s
    error = value(registry, "tide_scaling_model_error_ratio", **JOB_A)
    assert error == pytest.approx(expected) and error > 0


def test_counters_add_up_and_gauges_follow_the_latest_round() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    first = run_once(metrics)
    second = run_once(metrics, fresh=False, report=SampleReport(stale_series=4), duration_s=2.0)
    assert all(d.reason.value == "HoldMetricsStale" for d in second.decisions)
    held = value(registry, "tide_decisions_total", reason="HoldMetricsStale")
    assert held == len(second.decisions) + sum(
        d.reason.value == "HoldMetricsStale" for d in first.decisions
    )
    assert value(registry, "tide_job_target_replicas", **JOB_B) == 6
    assert value(registry, "tide_metrics_fresh") == 0
    assert value(registry, "tide_metrics_stale_series") == 4
    assert value(registry, "tide_reconcile_duration_seconds_count") == 2
    assert value(registry, "tide_reconcile_duration_seconds_bucket", le="1.0") == 1
    assert value(registry, "tide_reconcile_duration_seconds_bucket", le="+Inf") == 2
    metrics.record_failure(duration_s=0.5)
    assert value(registry, "tide_reconcile_failures_total") == 1
    assert value(registry, "tide_reconcile_duration_seconds_count") == 3
    assert value(registry, "tide_last_reconcile_timestamp_seconds") == NOW_S + 2.0


def test_forecast_and_its_coverage_are_exported_when_scored() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    # Six days of a daily pattern at a 5 min step: enough to hold the last four out.
    history = tuple(
        DemandPoint(NOW_S - 6 * 86400 + 300 * i, 4.0 + 4.0 * math.sin(2 * math.pi * i / 288))
        for i in range(6 * 288)
    )
    policy = make_policy()
    policy = replace(policy, queues=(replace(policy.queues[0],
                     headroom=Headroom(forecast_quantile=0.9, horizon_s=1800)),))  # fmt: skip
    models = ModelCache(forecast_holdout=True)
    cluster = FakeCluster(make_observation(make_job("a"), queues=(
        replace(make_queue(capability=32), demand_history=history),)))  # fmt: skip
    result = reconcile(metrics=cluster, cluster=cluster, policy=policy, now_s=NOW_S, models=models)
    metrics.record(result, models=models, duration_s=0.1, finished_s=NOW_S)
    forecast = value(registry, "tide_queue_forecast_gpus", queue_name="q")
    assert forecast is not None and 0 < forecast <= 9
    assert value(registry, "tide_queue_headroom_gpus", queue_name="q") == pytest.approx(forecast)
    coverage = value(registry, "tide_forecast_coverage_ratio", queue_name="q")
    assert coverage is not None and 0 <= coverage <= 1
    # Which forecast the headroom follows, and each candidate's held-out pinball loss.
    served = {m: value(registry, "tide_forecast_model", queue_name="q", model=m)
              for m in ("model", "recent_peak")}  # fmt: skip
    assert sorted(served.values()) == [0.0, 1.0]
    for model in ("model", "recent_peak"):
        loss = value(registry, "tide_forecast_pinball_gpus", queue_name="q", model=model)
        assert loss is not None and loss >= 0


def test_names_follow_the_conventions() -> None:
    registry = CollectorRegistry()
    run_once(EngineMetrics(registry))
    text = generate_latest(registry).decode()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert all(name.startswith("tide_") for name in families)
    for name, kind in families.items():
        if kind == "counter":
            assert f"{name}_total" in text, name
    assert families["tide_reconcile_duration_seconds"] == "histogram"


def test_registers_nowhere_when_asked_and_refuses_bad_buckets() -> None:
    metrics = EngineMetrics(None)
    registry = CollectorRegistry()
    registry.register(metrics)
    assert value(registry, "tide_reconcile_failures_total") == 0
    with pytest.raises(ValueError, match="buckets_s"):
        EngineMetrics(None, buckets_s=(1.0, 0.5))
    with pytest.raises(ValueError, match="duration_s"):
        metrics.record_failure(duration_s=-1.0)
