"""The engine's own metrics, as a ``prometheus_client`` Collector with an injectable registry.

The loop calls ``record`` after each reconcile (``record_failure`` when one raised); a scrape
reads the snapshot the last call built, so scraping costs no engine work and sees one round
whole. Names follow Prometheus' conventions: the ``tide_`` prefix, base units as suffixes,
``_total`` on counters. Jobs are labelled ``namespace`` and ``volcano_job`` as the workers'
metrics are, queues ``queue_name`` as Volcano's are.

Exported:

- ``tide_decisions_total{reason}``: decisions made, by CamelCase reason (counter).
- ``tide_replica_writes_total{outcome}``: writes ``applied`` and ``failed`` (counter).
- ``tide_job_replicas{namespace, volcano_job}`` and ``tide_job_target_replicas{...}``: each
  elastic job's replicas now and the latest target.
- ``tide_queue_budget_gpus{queue_name}``, ``tide_queue_forecast_gpus``,
  ``tide_queue_headroom_gpus``: GPUs the queue's elastic jobs may hold together, the forecast
  peak non-elastic demand (queues with a forecast only), and the GPUs kept free (fixed headroom
  plus forecast).
- ``tide_scaling_model_relative_error_ratio{namespace, volcano_job}``: mean relative error of each
  fitted scaling model over its points; ``tide_scaling_model_error_ratio{namespace,
  volcano_job}``: its recent out-of-sample error, |X̂ − X| / X of the newest point its last fit
  took in, X̂ predicted by the fit before (jobs refitted at least twice);
  ``tide_forecast_coverage_ratio{queue_name}``: the share of held-out peaks each queue's served
  forecast covered; ``tide_forecast_pinball_gpus{queue_name, model}``: the held-out pinball loss
  of each candidate (``model``, ``recent_peak``) on the queue's recent history;
  ``tide_forecast_model{queue_name, model}``: 1 for the candidate the queue's headroom follows, 0
  for the other; ``tide_forecast_fit_failures_total{queue_name}``: forecaster fits that failed
  (the previous fit, or the recent peak, kept serving); ``tide_forecast_fit_duration_seconds
  {queue_name}``: how long each queue's last finished fit took (in the background in
  ``tide engine``).
- ``tide_job_goodput_batch_size{namespace, volcano_job}`` and
  ``tide_job_goodput_iterations_per_second{...}``: for each job whose curve is its goodput (it
  adapts its batch), the global batch its workers are predicted to take at the target
  replicas, and its predicted progress there (scale-invariant iterations per second).
- ``tide_reconcile_duration_seconds``: histogram of reconcile durations, failures included.
- ``tide_reconcile_failures_total``: reconciles that raised.
- ``tide_last_reconcile_timestamp_seconds``: when the last successful reconcile finished.
- ``tide_metrics_fresh``: 1 when the last observation's metrics were fresh, else 0.
- ``tide_metrics_stale_series``: series (or whole figures) stale, missing or NaN in the last
  sample, stale jobs included.
- ``tide_policy_valid``: 1 when the policy file last read was valid (and is in force), else 0;
  ``tide_policy_reload_failures_total``: policy files refused (counter). Both are set by the
  service's ``record_policy``, absent until it is first called.
- ``tide_leader``: 1 while this engine holds the leader Lease (and so may write), else 0; set
  by ``record_leader``, absent until it is first called.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter
from collections.abc import Iterable, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from metrics_collector.sampling import SampleReport
from scheduler_policy.engine.reconcile import ReconcileResult
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.vocabulary.state import JobKey

DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _job_labels(key: JobKey) -> list[str]:
    namespace, _, name = key.partition("/")
    return [namespace, name]


def _goodput(result: ReconcileResult, models: ModelCache) -> list[Metric]:
    """The adaptive-batch jobs' predicted batch and goodput at their targets."""
    curves = models.goodput.latest()
    labels = ["namespace", "volcano_job"]
    batch = GaugeMetricFamily(
        "tide_job_goodput_batch_size",
        "Global batch the engine predicts an adaptive-batch job's workers take at its target.",
        labels=labels,
    )
    rate = GaugeMetricFamily(
        "tide_job_goodput_iterations_per_second",
        "Predicted progress of an adaptive-batch job at its target replicas, scale-invariant "
        "iterations per second.",
        labels=labels,
    )
    for d in result.decisions:
        curve = curves.get(d.job)
        if curve is not None:
            batch.add_metric(_job_labels(d.job), curve.batch_at(d.target_replicas))
            rate.add_metric(_job_labels(d.job), curve.at(d.target_replicas))
    return [batch, rate]


class EngineMetrics(Collector):
    """Exports what the engine decided and how it fared.

    Args:
        registry: where to register; None registers nowhere (call ``registry.register`` later).
        buckets_s: the upper bounds of the reconcile duration histogram, in seconds.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        buckets_s: Sequence[float] = DURATION_BUCKETS_S,
    ) -> None:
        if list(buckets_s) != sorted(set(buckets_s)) or not buckets_s:
            raise ValueError(f"buckets_s: must be increasing and non-empty, got {buckets_s}")
        self._lock = threading.Lock()
        self._buckets_s = tuple(float(b) for b in buckets_s)
        self._bucket_counts = [0] * (len(self._buckets_s) + 1)  # the last one is +Inf
        self._duration_sum_s = 0.0
        self._decisions: Counter[str] = Counter()
        self._writes: Counter[str] = Counter({"applied": 0, "failed": 0})
        self._failures = 0
        self._policy_valid: bool | None = None
        self._policy_failures = 0
        self._leader: bool | None = None
        self._snapshot: list[Metric] = []
        if registry is not None:
            registry.register(self)

    def _observe_duration(self, duration_s: float) -> None:
        if not math.isfinite(duration_s) or duration_s < 0:
            raise ValueError(f"duration_s: must be a non-negative number, got {duration_s}")
        self._bucket_counts[bisect.bisect_left(self._buckets_s, duration_s)] += 1
        self._duration_sum_s += duration_s

    def record(
        self,
        result: ReconcileResult,
        *,
        models: ModelCache,
        duration_s: float,
        finished_s: float,
        report: SampleReport | None = None,
    ) -> None:
        """Take in one successful reconcile.

        Args:
            result: what ``reconcile`` returned.
            models: the model cache it used (forecasts and the models' accuracy).
            duration_s: how long it took.
            finished_s: when it finished, seconds since the epoch.
            report: the metrics source's report of its sample, when it gives one
                (``PrometheusSource.last_report``); else the stale count is the held jobs'.

        Raises:
            ValueError: ``duration_s`` is negative or not finite.
        """
        observation = result.observation
        accuracy = models.accuracy()
        # The budgets as the decisions used them; the forecasts of the queues that have one.
        budgets = result.plan.budgets if result.plan is not None else {}
        fallback = 0 if observation.metrics_fresh else 1  # a source without a report
        stale = report.stale_series if report is not None else fallback
        with self._lock:
            self._observe_duration(duration_s)
            self._decisions.update(d.reason.value for d in result.decisions)
            self._writes["applied"] += len(result.applied)
            self._writes["failed"] += len(result.failed)
            families: list[Metric] = []
            current = GaugeMetricFamily(
                "tide_job_replicas", "Replicas of each elastic job now.",
                labels=["namespace", "volcano_job"],
            )  # fmt: skip
            target = GaugeMetricFamily(
                "tide_job_target_replicas", "Replicas the engine wants for each elastic job.",
                labels=["namespace", "volcano_job"],
            )  # fmt: skip
            for d in result.decisions:
                current.add_metric(_job_labels(d.job), d.current_replicas)
                target.add_metric(_job_labels(d.job), d.target_replicas)
            families += [current, target, *_goodput(result, models)]
            queue_labels = ["queue_name"]
            budget = GaugeMetricFamily(
                "tide_queue_budget_gpus",
                "GPUs each managed queue's elastic jobs may hold together this round.",
                labels=queue_labels,
            )
            headroom = GaugeMetricFamily(
                "tide_queue_headroom_gpus",
                "GPUs each queue keeps free of elastic growth (fixed plus forecast).",
                labels=queue_labels,
            )
            for name, b in sorted(budgets.items()):
                if math.isfinite(b.elastic_gpus):
                    budget.add_metric([name], b.elastic_gpus)
                headroom.add_metric([name], b.headroom_gpus)
            forecast = GaugeMetricFamily(
                "tide_queue_forecast_gpus",
                "Forecast peak GPU demand of each queue's non-elastic work over the horizon.",
                labels=queue_labels,
            )
            for name, gpus in sorted(accuracy.forecast_gpus.items()):
                forecast.add_metric([name], gpus)
            families += [budget, headroom, forecast]
            error = GaugeMetricFamily(
                "tide_scaling_model_relative_error_ratio",
                "Mean relative error of each job's scaling model over the points it was fitted to.",
                labels=["namespace", "volcano_job"],
            )
            for key, value in sorted(accuracy.scaling_relative_error.items()):
                if math.isfinite(value):
                    error.add_metric(_job_labels(key), value)
            recent = GaugeMetricFamily(
                "tide_scaling_model_error_ratio",
                "Relative error of each job's newest throughput point against the prediction "
                "the scaling model's previous fit made for it.",
                labels=["namespace", "volcano_job"],
            )
            for key, value in sorted(accuracy.scaling_prediction_error.items()):
                recent.add_metric(_job_labels(key), value)
            families.append(recent)
            coverage = GaugeMetricFamily(
                "tide_forecast_coverage_ratio",
                "Share of held-out demand peaks at or below each queue's forecast.",
                labels=queue_labels,
            )
            for name, value in sorted(accuracy.forecast_coverage.items()):
                coverage.add_metric([name], value)
            pinball = GaugeMetricFamily(
                "tide_forecast_pinball_gpus",
                "Held-out pinball loss of each queue's forecast candidates (the learned model "
                "and the recent peak), on its most recent history.",
                labels=[*queue_labels, "model"],
            )
            for name, losses in sorted(accuracy.forecast_pinball_gpus.items()):
                for model, loss in sorted(losses.items()):
                    pinball.add_metric([name, model], loss)
            served = GaugeMetricFamily(
                "tide_forecast_model",
                "1 for the forecast each queue's headroom follows (model: learned, "
                "recent_peak: the fallback), 0 for the other.",
                labels=[*queue_labels, "model"],
            )
            for name, choice in sorted(accuracy.forecast_choice.items()):
                for model in ("model", "recent_peak"):
                    served.add_metric([name, model], 1.0 if model == choice else 0.0)
            failed = CounterMetricFamily(
                "tide_forecast_fit_failures",
                "Forecaster fits that failed, per queue (the previous fit kept serving).",
                labels=queue_labels,
            )
            for name, count in sorted(accuracy.forecast_fit_failures.items()):
                failed.add_metric([name], float(count))
            fit_time = GaugeMetricFamily(
                "tide_forecast_fit_duration_seconds",
                "How long each queue's last finished forecaster fit took.",
                labels=queue_labels,
            )
            for name, seconds in sorted(accuracy.forecast_fit_duration_s.items()):
                fit_time.add_metric([name], seconds)
            families += [error, coverage, pinball, served, failed, fit_time]
            families.append(
                GaugeMetricFamily(
                    "tide_last_reconcile_timestamp_seconds",
                    "When the last successful reconcile finished, seconds since the epoch.",
                    value=finished_s,
                )
            )
            families.append(
                GaugeMetricFamily(
                    "tide_metrics_fresh",
                    "1 when the last observation's metrics were fresh, else 0.",
                    value=1.0 if observation.metrics_fresh else 0.0,
                )
            )
            families.append(
                GaugeMetricFamily(
                    "tide_metrics_stale_series",
                    "Series stale, missing or NaN in the last metrics sample.",
                    value=stale,
                )
            )
            self._snapshot = families

    def record_failure(self, *, duration_s: float) -> None:
        """Take in a reconcile that raised after ``duration_s`` seconds."""
        with self._lock:
            self._observe_duration(duration_s)
            self._failures += 1

    def record_policy(self, *, valid: bool) -> None:
        """Take in one read of the policy file.

        Args:
            valid: whether it was valid (and took effect); an invalid one counts as a reload
                failure, and ``tide_policy_valid`` reads 0 until a valid one is read.
        """
        with self._lock:
            self._policy_valid = valid
            if not valid:
                self._policy_failures += 1

    def record_leader(self, leader: bool) -> None:
        """Take in whether this engine is the leader now."""
        with self._lock:
            self._leader = leader

    def _service(self) -> list[Metric]:
        families: list[Metric] = []
        if self._policy_valid is not None:
            families.append(
                CounterMetricFamily(
                    "tide_policy_reload_failures",
                    "Policy files refused as invalid; the policy in force stayed.",
                    value=self._policy_failures,
                )
            )
            families.append(
                GaugeMetricFamily(
                    "tide_policy_valid",
                    "1 when the policy file last read was valid, else 0.",
                    value=1.0 if self._policy_valid else 0.0,
                )
            )
        if self._leader is not None:
            families.append(
                GaugeMetricFamily(
                    "tide_leader",
                    "1 while this engine holds the leader Lease and may write, else 0.",
                    value=1.0 if self._leader else 0.0,
                )
            )
        return families

    def _counters(self) -> Iterable[Metric]:
        decisions = CounterMetricFamily(
            "tide_decisions", "Decisions made, by reason.", labels=["reason"]
        )
        for reason, count in sorted(self._decisions.items()):
            decisions.add_metric([reason], count)
        writes = CounterMetricFamily(
            "tide_replica_writes", "Replica writes, by outcome.", labels=["outcome"]
        )
        for outcome, count in sorted(self._writes.items()):
            writes.add_metric([outcome], count)
        failures = CounterMetricFamily(
            "tide_reconcile_failures", "Reconciles that raised.", value=self._failures
        )
        cumulative, buckets = 0, []
        for bound, count in zip((*self._buckets_s, math.inf), self._bucket_counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
        duration = HistogramMetricFamily(
            "tide_reconcile_duration_seconds",
            "Wall time of one reconcile, failures included.",
            buckets=buckets,
            sum_value=self._duration_sum_s,
        )
        return [decisions, writes, failures, duration]

    def collect(self) -> Iterable[Metric]:
        """See ``prometheus_client.registry.Collector``."""
        with self._lock:
            return [*self._counters(), *self._service(), *self._snapshot]
