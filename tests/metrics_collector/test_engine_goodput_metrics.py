"""The engine exports each adaptive-batch job's predicted batch and goodput at its target."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry

from metrics_collector.engine_metrics import EngineMetrics
from scheduler_policy.engine.reconcile import reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.testing.fake import FakeCluster
from tests.scheduler_policy.builders import NOW_S, make_job, make_observation, make_policy
from tests.scheduler_policy.goodput_builders import BOUNDS, statistics


def test_an_adaptive_job_exports_its_predicted_batch_and_goodput() -> None:
    adaptive = dataclasses.replace(
        make_job("a", current=4), batch_bounds=BOUNDS, batch_statistics=statistics()
    )
    cluster = FakeCluster(make_observation(adaptive, make_job("b", current=2), free=4))
    models = ModelCache()
    result = reconcile(
        metrics=cluster, cluster=cluster, policy=make_policy(), now_s=NOW_S, models=models
    )
    registry = CollectorRegistry()
    EngineMetrics(registry).record(result, models=models, duration_s=0.01, finished_s=NOW_S)
    a = next(d for d in result.decisions if d.job == "ns/a")
    curve = models.goodput.latest()[a.job]
    labels = {"namespace": "ns", "volcano_job": "a"}
    assert registry.get_sample_value("tide_job_goodput_batch_size", labels) == (
        curve.batch_at(a.target_replicas)
    )
    rate = registry.get_sample_value("tide_job_goodput_iterations_per_second", labels)
    assert rate == curve.at(a.target_replicas) > 0
    b = {"namespace": "ns", "volcano_job": "b"}
    assert registry.get_sample_value("tide_job_goodput_batch_size", b) is None
