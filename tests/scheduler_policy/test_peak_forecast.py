"""PeakForecaster: forecasts falls, recalibrates its quantile, falls back to the recent peak and
says why; its features read no future; its forecast is finite and never negative."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.exceptions import NotFittedError

from scheduler_policy.models.demand_grid import DemandGrid, Target, features, target
from scheduler_policy.models.peak_forecast import (
    ForecastChoice,
    PeakForecaster,
    conformal_offset,
    coverage,
)
from scheduler_policy.vocabulary.state import DemandPoint
from simulations.demand_series import read_helios

START_S = 1_600_000_000.0
DAY_S = 86400.0


def make_grid(gpus: np.ndarray, *, step_s: float = 60.0) -> DemandGrid:
    return DemandGrid(start_s=START_S, step_s=step_s, gpus=np.asarray(gpus, dtype=np.float64))


def fitted(gpus: np.ndarray, **hyper: object) -> PeakForecaster:
    grid = make_grid(gpus)
    return PeakForecaster(**hyper).fit_grid(grid, end=grid.size)  # type: ignore[arg-type]


def batch_jobs(days: float) -> np.ndarray:
    """2 GPUs always, and every 2 h a batch job of 8 GPUs that runs exactly 60 minutes."""
    minutes = np.arange(int(days * 1440))
    return 2.0 + 8.0 * ((minutes % 120) < 60)


def near_idle(days: float, *, seed: int) -> np.ndarray:
    """Idle, with a job of 1–4 GPUs for 10–90 minutes arriving about every 5 hours."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(days * 1440))
    t = 0
    while t < out.size:
        t += int(rng.exponential(300))
        out[t : t + int(rng.integers(10, 90))] += float(rng.integers(1, 5))
        t += 1
    return out


def regime_change() -> np.ndarray:
    """Four days of ``batch_jobs`` (once a job ends, nothing comes for an hour), then two days
    that swing between 2 and 10 GPUs at random intervals of 5 to 25 minutes: what the model
    learned (forecast low once a job ended) no longer holds; the recent peak does."""
    rng = np.random.default_rng(5)
    spans = rng.integers(5, 26, size=2 * 1440 // 5)
    swing = np.repeat(2.0 + 8.0 * (np.arange(spans.size) % 2), spans)[: 2 * 1440]
    return np.concatenate([batch_jobs(4), swing])


def test_a_falling_series_forecasts_a_fall() -> None:
    gpus = batch_jobs(8)
    model = fitted(gpus, quantile=0.9, horizon_s=1800.0, target="point")
    assert model.choice_ is ForecastChoice.MODEL, model.reason_
    # 40 minutes into a 60-minute job: in 30 minutes it has ended, and the model knows it.
    origin = gpus.size - 120 * 3 + 40
    assert gpus[origin] == 10.0
    forecast = float(model.predict_index([origin])[0])
    assert forecast < 6.0


def test_the_peak_forecast_drops_once_a_job_ended_while_the_recent_peak_holds() -> None:
    gpus = batch_jobs(8)
    model = fitted(gpus, quantile=0.9, horizon_s=1800.0)
    assert model.choice_ is ForecastChoice.MODEL, model.reason_
    origin = gpus.size - 120 * 3 + 65  # 5 minutes after a job ended; the next starts at 120
    assert gpus[origin] == 2.0 and gpus[origin - 10] == 10.0  # the recent peak is 10
    assert float(model.predict_index([origin])[0]) < 4.0


@pytest.mark.parametrize("seed", [1, 2, 3], ids=["seed-1", "seed-2", "seed-3"])
def test_near_idle_queue_coverage_is_recalibrated(seed: int) -> None:
    gpus = near_idle(12, seed=seed)
    history, ahead = gpus[: 10 * 1440], gpus
    model = fitted(history, quantile=0.9, horizon_s=1800.0)
    # Unseen days: forecasts at each origin of days 10–12 read the series up to it.
    grid = make_grid(ahead)
    served = PeakForecaster(quantile=0.9, horizon_s=1800.0).fit_grid(grid, end=history.size)
    origins = np.arange(history.size, ahead.size - 30, 10)
    actual = target(grid, horizon_steps=30, kind=Target.PEAK)[origins]
    got = coverage(actual, served.predict_index(origins))
    # The demand is zero on most origins, so a forecast that never falls below "now" covers
    # far above q; the recalibrated one stays near it.
    never_falls = coverage(actual, np.maximum(ahead[origins], served.predict_index(origins)))
    assert model.holdout_coverage_ is not None
    assert 0.8 <= got <= 0.96, (got, served.reason_)
    assert got <= never_falls


def test_the_fallback_is_chosen_when_the_model_loses_on_held_out_data_and_says_why() -> None:
    model = fitted(regime_change(), quantile=0.9, horizon_s=1800.0)
    assert model.choice_ is ForecastChoice.RECENT_PEAK
    assert model.holdout_pinball_["recent_peak"] < model.holdout_pinball_["model"]
    assert "recent peak" in model.reason_ and "does not beat" in model.reason_
    assert "pinball" in model.reason_


@pytest.mark.parametrize(
    ("minutes", "reason"),
    [(30, "too little history"), (600, "fewer than 500")],
    ids=["half-an-hour", "ten-hours"],
)
def test_short_history_serves_the_recent_peak_and_says_so(minutes: int, reason: str) -> None:
    gpus = np.full(minutes, 3.0)
    gpus[-5] = 7.0
    model = fitted(gpus, quantile=0.9, horizon_s=1800.0)
    assert model.choice_ is ForecastChoice.RECENT_PEAK and model.model_ is None
    assert reason in model.reason_
    assert model.forecast_at(START_S + (minutes - 1) * 60.0) >= 7.0 - 1e-9


def test_features_read_no_future() -> None:
    gpus = near_idle(3, seed=4) + batch_jobs(3)
    full = features(make_grid(gpus), horizon_steps=30)
    cut = 2 * 1440 + 17
    head = features(make_grid(gpus[:cut]), horizon_steps=30)
    np.testing.assert_array_equal(full[:cut], head)


@pytest.mark.parametrize(
    ("residuals", "quantile", "expected"),
    [
        (np.arange(1.0, 10.0), 0.9, 9.0),  # ⌈10 × 0.9⌉ = 9th of 9
        (np.arange(1.0, 20.0), 0.5, 10.0),
        (np.array([-3.0, -2.0, -1.0, 0.0]), 0.5, -1.0),  # a negative offset: forecasts lower
    ],
    ids=["top-of-nine", "median", "negative"],
)
def test_conformal_offset(residuals: np.ndarray, quantile: float, expected: float) -> None:
    assert conformal_offset(residuals, quantile) == expected


@pytest.mark.parametrize(
    ("hyper", "message"),
    [
        ({"quantile": 1.0}, "PeakForecaster.quantile: must be in (0, 1), got 1.0"),
        ({"horizon_s": 0.0}, "PeakForecaster.horizon_s: must be > 0 seconds"),
        ({"target": "mean"}, "PeakForecaster.target: must be 'peak' or 'point', got 'mean'"),
    ],
    ids=["quantile", "horizon", "target"],
)
def test_bad_hyperparameters_are_named(hyper: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PeakForecaster(**hyper).fit(np.array([[START_S]]), np.array([1.0]))  # type: ignore[arg-type]


def test_bad_input_is_named_and_predict_needs_a_fit() -> None:
    with pytest.raises(ValueError, match=r"demand must be finite and >= 0, got -1\.0 at sample 1"):
        PeakForecaster().fit(np.array([[START_S], [START_S + 60]]), np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="no demand history"):
        PeakForecaster().fit_points([])
    with pytest.raises(NotFittedError):
        PeakForecaster().forecast_at(START_S)


def test_fit_points_is_fit_on_the_engine_history() -> None:
    gpus = batch_jobs(4)
    points = [DemandPoint(START_S + 60.0 * i, float(g)) for i, g in enumerate(gpus)]
    from_points = PeakForecaster().fit_points(points)
    direct = fitted(gpus)
    at = START_S + 60.0 * (gpus.size - 1)
    assert from_points.forecast_at(at) == pytest.approx(direct.forecast_at(at))
    assert from_points.reason_ == direct.reason_


@settings(max_examples=20, deadline=None)
@given(
    gpus=hnp.arrays(
        np.float64,
        st.integers(1, 400),
        elements=st.floats(0.0, 64.0, allow_nan=False, allow_infinity=False),
    ),
    quantile=st.floats(0.05, 0.95),
    kind=st.sampled_from(["peak", "point"]),
)
def test_forecast_is_finite_and_never_negative(
    gpus: np.ndarray, quantile: float, kind: str
) -> None:
    grid = make_grid(np.round(gpus))
    model = PeakForecaster(
        quantile=quantile,
        horizon_s=600.0,
        target=kind,
        calibration_s=3600.0,
        min_train_rows=50,
    ).fit_grid(grid, end=grid.size)
    forecast = model.predict_index(np.arange(grid.size))
    assert np.all(np.isfinite(forecast)) and np.all(forecast >= 0.0)


HELIOS = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "helios-artifact"


@pytest.mark.parametrize("vc", ["vc3sl", "vccaA"], ids=["vc3sl", "vccaA"])
def test_a_busy_helios_queue_is_fitted_and_covers_near_q(vc: str) -> None:
    path = HELIOS / "earth_vcs" / vc / "cluster_sequence_vc.csv"
    if not path.exists():
        pytest.skip(f"{path} not found: the Helios sequences live in ../shared")
    name, grid = read_helios(path)
    model = PeakForecaster(quantile=0.9).fit_grid(grid, end=20 * 1440)
    assert name == vc and model.holdout_coverage_ is not None
    assert set(model.holdout_pinball_) == {"model", "recent_peak"}
    assert model.reason_.startswith(("learned model", "recent peak"))
    # The ten days after the fit, unseen.
    origins = np.arange(20 * 1440, 30 * 1440, 10)
    actual = target(grid, horizon_steps=30, kind=Target.PEAK)[origins]
    assert 0.85 <= coverage(actual, model.predict_index(origins)) <= 0.96
