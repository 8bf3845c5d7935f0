"""Forecaster fits in the background: the reconcile never waits for a fit; the recent peak serves
before the first, the previous fit until the next; a failed fit is logged and counted, and the
old one stays. The fits are held by Events, never timed."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from metrics_collector.engine_metrics import EngineMetrics
from scheduler_policy.decision.pipeline import decide
from scheduler_policy.engine.reconcile import ReconcileResult
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.models.forecast_fit import (
    BackgroundFitter,
    FitRequest,
    InlineFitter,
    fit_points,
    run_fit,
)
from scheduler_policy.models.peak_forecast import PeakForecaster
from scheduler_policy.policy.file import policy_yaml
from scheduler_policy.policy.spec import ElasticPolicy, Headroom
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import DemandPoint, QueueName, QueueState
from tests.scheduler_policy.builders import (
    NOW_S,
    make_job,
    make_observation,
    make_policy,
    make_queue,
)
from tide.engine.service import EngineService

WAIT_S = 20.0  # the most a test waits for a fit it has released; a pass never comes near it
QUEUE = QueueName("q")
HEADROOM = Headroom(forecast_quantile=0.9, horizon_s=1800.0)


def history(*, hours: float = 3.0, end_s: float = NOW_S) -> tuple[DemandPoint, ...]:
    """2 GPUs, and 6 more in the last 20 minutes: the recent peak is 8 GPUs."""
    minutes = int(hours * 60)
    return tuple(
        DemandPoint(end_s - 60.0 * (minutes - 1 - i), 8.0 if i >= minutes - 20 else 2.0)
        for i in range(minutes)
    )


def queue(points: tuple[DemandPoint, ...] = history()) -> QueueState:
    return dataclasses.replace(make_queue(capability=32), demand_history=points)


class HeldFit:
    """A fit that waits for ``release`` (``started`` is set once it runs), then fits for real,
    or raises ``error`` when given."""

    def __init__(self, error: Exception | None = None) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.error = error
        self.calls = 0

    def __call__(self, forecaster: PeakForecaster, points: Sequence[DemandPoint]) -> PeakForecaster:
        self.calls += 1
        self.started.set()
        assert self.release.wait(WAIT_S), "the test never released the fit"
        if self.error is not None:
            raise self.error
        return fit_points(forecaster, points)


class Script:
    """Fits that run the given ``HeldFit``s in turn, one a fit."""

    def __init__(self, *steps: HeldFit) -> None:
        self.steps = list(steps)

    def __call__(self, forecaster: PeakForecaster, points: Sequence[DemandPoint]) -> PeakForecaster:
        return self.steps.pop(0)(forecaster, points)


def released(error: Exception | None = None) -> HeldFit:
    held = HeldFit(error)
    held.release.set()
    return held


def finish(fitter: BackgroundFitter) -> None:
    """Wait until the fitter's worker has nothing left to run."""
    assert fitter.wait_idle(timeout_s=WAIT_S), "the fit did not finish"


@pytest.fixture
def fitters() -> list[BackgroundFitter]:
    made: list[BackgroundFitter] = []
    yield made  # type: ignore[misc]
    for fitter in made:
        fitter.close()


def background(
    fitters: list[BackgroundFitter], fit: Callable[..., PeakForecaster]
) -> BackgroundFitter:
    fitter = BackgroundFitter(fit=fit)
    fitters.append(fitter)
    return fitter


def test_the_recent_peak_serves_until_the_first_fit_then_the_fit(
    fitters: list[BackgroundFitter],
) -> None:
    held = HeldFit()
    fitter = background(fitters, held)
    cache = ModelCache(fitter=fitter)
    # Three reconciles while the fit is held: none waits, each serves the recent peak.
    for i in range(3):
        assert cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S + i) == 8.0
    assert held.started.wait(WAIT_S)
    assert held.calls == 1, "one fit per queue in flight"
    assert cache.forecast_fits == 0
    assert cache.accuracy().forecast_choice == {QUEUE: "recent_peak"}
    held.release.set()
    finish(fitter)
    expected = PeakForecaster(quantile=0.9, horizon_s=1800.0).fit_points(history())
    gpus = cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S + 3)
    assert cache.forecast_fits == 1
    assert gpus == pytest.approx(max(0.0, expected.forecast_at(NOW_S + 3)))
    fits = cache.fit(make_observation(make_job("a"), queues=(queue(),)), _policy())
    assert fits.forecast_reasons[QUEUE] == expected.reason_


def test_the_previous_fit_serves_while_the_next_runs(fitters: list[BackgroundFitter]) -> None:
    second = HeldFit()
    fitter = background(fitters, Script(released(), second))
    cache = ModelCache(fitter=fitter, refit_s=600.0)
    cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S)
    finish(fitter)
    served = cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S + 1)
    assert cache.forecast_fits == 1
    # Due again: the refit is held; the first fit keeps serving (not the recent peak, 8 GPUs).
    later = history(end_s=NOW_S + 700.0)
    assert cache.forecast_gpus(queue(later), HEADROOM, now_s=NOW_S + 700.0) == served
    assert second.started.wait(WAIT_S)
    assert cache.forecast_fits == 1
    second.release.set()
    finish(fitter)
    cache.forecast_gpus(queue(later), HEADROOM, now_s=NOW_S + 701.0)
    assert cache.forecast_fits == 2


def test_a_failed_fit_is_logged_and_counted_and_the_old_one_stays(
    fitters: list[BackgroundFitter], caplog: pytest.LogCaptureFixture
) -> None:
    failing = released(ModelFitError("gradient boosting failed: no splits"))
    fitter = background(fitters, Script(released(), failing))
    cache = ModelCache(fitter=fitter, refit_s=600.0)
    cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S)
    finish(fitter)
    served = cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S + 1)
    reason = cache.fit(make_observation(queues=(queue(),), now_s=NOW_S + 2), _policy())
    with caplog.at_level(logging.WARNING, logger="scheduler_policy.models.cache"):
        cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S + 600.0)
        finish(fitter)
        assert cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S + 601.0) == served
    assert "queue q: demand forecast fit failed: gradient boosting failed" in caplog.text
    assert "the previous fit stays" in caplog.text
    assert cache.accuracy().forecast_fit_failures == {QUEUE: 1}
    again = cache.fit(make_observation(queues=(queue(),), now_s=NOW_S + 602.0), _policy())
    assert again.forecast_reasons == reason.forecast_reasons
    # Not retried before the refit time: the failure is remembered like a fit.
    assert failing.calls == 1
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    observation = make_observation(queues=(queue(),), now_s=NOW_S + 603.0)
    plan = decide(observation, _policy(), fits=cache.fit(observation, _policy()))
    metrics.record(
        ReconcileResult(observation, plan.decisions, (), (), plan),
        models=cache, duration_s=0.1, finished_s=NOW_S + 604.0, report=None,
    )  # fmt: skip
    assert registry.get_sample_value("tide_forecast_fit_failures_total", {"queue_name": "q"}) == 1
    assert registry.get_sample_value("tide_forecast_fit_duration_seconds", {"queue_name": "q"}) >= 0


def test_a_first_fit_that_fails_leaves_the_recent_peak(fitters: list[BackgroundFitter]) -> None:
    failing = released(ValueError("demand history: times must be non-decreasing"))
    fitter = background(fitters, failing)
    cache = ModelCache(fitter=fitter)
    cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S)
    finish(fitter)
    assert cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S + 1) == 8.0
    fits = cache.fit(make_observation(queues=(queue(),), now_s=NOW_S + 2), _policy())
    assert fits.forecast_reasons[QUEUE].startswith("recent peak over the last 30 min")
    assert (
        "the last fit failed: queue q: demand forecast fit failed" in fits.forecast_reasons[QUEUE]
    )


def test_an_inline_fit_serves_in_the_same_reconcile() -> None:
    cache = ModelCache(fitter=InlineFitter())
    expected = PeakForecaster(quantile=0.9, horizon_s=1800.0).fit_points(history())
    assert cache.forecast_gpus(queue(), HEADROOM, now_s=NOW_S) == pytest.approx(
        max(0.0, expected.forecast_at(NOW_S))
    )
    assert cache.forecast_fits == 1


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ModelFitError("no splits"), "queue q: demand forecast fit failed: no splits"),
        (
            ZeroDivisionError("oops"),
            "queue q: demand forecast fit failed (ZeroDivisionError): oops",
        ),
    ],
    ids=["a-model-error", "an-unexpected-error-is-reported-too"],
)
def test_run_fit_turns_every_failure_into_an_outcome(error: Exception, expected: str) -> None:
    def broken(forecaster: PeakForecaster, points: Sequence[DemandPoint]) -> PeakForecaster:
        raise error

    outcome = run_fit(FitRequest(QUEUE, 0.9, 1800.0, NOW_S, history()), fit=broken)
    assert outcome.forecaster is None and outcome.error == expected


def _policy() -> ElasticPolicy:
    policy = make_policy()
    return dataclasses.replace(
        policy, queues=(dataclasses.replace(policy.queues[0], headroom=HEADROOM),)
    )


def test_the_engine_reconciles_while_a_fit_is_held(tmp_path: Path) -> None:
    held = HeldFit()
    fitter = BackgroundFitter(fit=held)
    observation = make_observation(make_job("a", current=2), queues=(queue(),), free=4)
    cluster = FakeCluster(observation)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(_policy()))
    service = EngineService(
        cluster=cluster, make_metrics=lambda _p: cluster, policy_path=path,
        forecast_fitter=fitter, wall=lambda: NOW_S,
    )  # fmt: skip
    try:
        first = service.run_round()
        assert held.started.wait(WAIT_S)
        second = service.run_round()  # the fit is still held: the round does not wait
        for outcome in (first, second):
            assert outcome.result.plan.forecast_reasons[QUEUE].endswith("the fit is still running")
        held.release.set()
        finish(fitter)
        third = service.run_round()
        assert "recalibrated by" in third.result.plan.forecast_reasons[QUEUE]
        assert service.models.forecast_fits == 1
    finally:
        held.release.set()
        service.close()
