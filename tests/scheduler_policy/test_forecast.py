"""DemandForecaster: falls back honestly, learns a daily cycle, covers its quantile on real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from scheduler_policy.models.forecast import DemandForecaster
from scheduler_policy.vocabulary.state import DemandPoint

START_S = 1_600_000_000.0  # a Sunday, 12:26:40 UTC; the cycle below is in UTC time of day
DAY_S = 86400.0
HELIOS = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "helios-artifact"


def make_daily_cycle(
    days: float, *, seed: int = 0, step_s: float = 60.0
) -> tuple[np.ndarray, np.ndarray]:
    """(times, gpus): demand 20 ± 15 GPUs peaking at 06:00 UTC, with seeded noise of 3 GPUs."""
    rng = np.random.default_rng(seed)
    t = START_S + np.arange(0.0, days * DAY_S, step_s)
    level = 20.0 + 15.0 * np.sin(2.0 * np.pi * np.mod(t, DAY_S) / DAY_S)
    return t, np.maximum(0.0, np.round(level + rng.normal(0.0, 3.0, t.size)))


@pytest.mark.parametrize(
    ("minutes", "hyper", "reason"),
    [
        (60, {}, "60 history points, fewer than 120"),
        (200, {"horizon_s": 7200.0}, "under two horizons"),
        (1, {}, "1 history points"),
    ],
    ids=["under-min-points", "under-two-horizons", "single-point"],
)
def test_short_history_falls_back_to_the_recent_peak_and_says_so(
    minutes: int, hyper: dict[str, float], reason: str
) -> None:
    t = START_S + 60.0 * np.arange(minutes)
    y = np.full(minutes, 4.0)
    y[minutes // 2] = 9.0  # a spike inside the last horizon is the persistence forecast
    model = DemandForecaster(**hyper).fit(t[:, None], y)
    assert model.fallback_
    assert reason in model.fallback_reason_
    assert model.coverage_ is None and model.pinball_loss_ is None
    assert model.forecast_at(t[-1]) == 9.0


def test_learns_a_daily_cycle() -> None:
    t, y = make_daily_cycle(8)
    model = DemandForecaster(quantile=0.9).fit(t[:, None], y)
    assert not model.fallback_ and model.fallback_reason_ == ""
    last_day = t[-1440:]
    forecast = model.predict(last_day[:, None])
    hour = np.mod(last_day, DAY_S) // 3600
    # Demand peaks at 06:00 UTC (35 GPUs) and bottoms at 18:00 (5 GPUs).
    assert (
        forecast[(hour >= 4) & (hour < 8)].mean() > forecast[(hour >= 16) & (hour < 20)].mean() + 20
    )
    # One held-out day is about 46 independent 30-minute windows; tolerance is wider than ±0.1.
    assert model.coverage_ is not None and abs(model.coverage_ - 0.9) <= 0.12
    assert model.pinball_loss_ is not None and 0.0 < model.pinball_loss_ < 3.0


def test_higher_quantile_forecasts_more() -> None:
    t, y = make_daily_cycle(5, seed=1)
    at = t[-720:, None]
    median = DemandForecaster(quantile=0.5).fit(t[:, None], y).predict(at)
    high = DemandForecaster(quantile=0.9).fit(t[:, None], y).predict(at)
    assert high.mean() > median.mean() + 1.0
    assert np.mean(high >= median) > 0.9


@pytest.mark.parametrize("quantile", [0.1, 0.5, 0.9], ids=["q10", "q50", "q90"])
def test_never_negative_and_never_below_demand_now(quantile: float) -> None:
    rng = np.random.default_rng(7)
    t = START_S + 60.0 * np.arange(3 * 1440)
    y = np.where(rng.random(t.size) < 0.7, 0.0, rng.integers(1, 8, t.size).astype(float))
    model = DemandForecaster(quantile=quantile).fit(t[:, None], y)
    forecast = model.predict(t[:, None])
    assert np.all(forecast >= 0.0)
    assert np.all(forecast >= y)


def test_times_past_the_history_use_the_last_state() -> None:
    t, y = make_daily_cycle(3)
    model = DemandForecaster().fit(t[:, None], y)
    later = model.forecast_at(t[-1] + 3600.0)
    assert np.isfinite(later) and later >= y[-1]


@pytest.mark.parametrize(
    ("X", "y", "hyper", "error", "match"),
    [
        ([[2.0], [1.0]], [1.0, 1.0], {}, ValueError, "sorted"),
        ([[1.0], [2.0]], [1.0, -1.0], {}, ValueError, r"gpus must be finite and >= 0, got -1\.0"),
        ([[1.0], [2.0]], [1.0, float("nan")], {}, ValueError, "gpus must be finite"),
        (
            [[1.0], [2.0]],
            [1.0, 1.0],
            {"quantile": 1.5},
            ValueError,
            r"must be in \(0, 1\), got 1\.5",
        ),
        ([[1.0], [2.0]], [1.0, 1.0], {"step_s": 0.0}, ValueError, r"step_s: must be > 0"),
        ([[1.0, 2.0]], [1.0], {}, ValueError, "one column of times"),
    ],
    ids=["unsorted", "negative-gpus", "nan-gpus", "quantile-1.5", "zero-step", "two-columns"],
)
def test_invalid_input_is_rejected(
    X: list[list[float]],
    y: list[float],
    hyper: dict[str, float],
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        DemandForecaster(**hyper).fit(X, y)


def test_predict_before_fit_and_before_history() -> None:
    with pytest.raises(NotFittedError):
        DemandForecaster().forecast_at(START_S)
    t, y = make_daily_cycle(0.5)
    model = DemandForecaster().fit(t[:, None], y)
    with pytest.raises(ValueError, match="first fitted time"):
        model.forecast_at(START_S - 60.0)


def test_from_points_and_clone() -> None:
    t, y = make_daily_cycle(1)
    points = [DemandPoint(time_s=float(a), gpus=float(b)) for a, b in zip(t, y, strict=True)]
    model = DemandForecaster.from_points(points, quantile=0.8)
    twin = clone(model).fit(t[:, None], y)
    np.testing.assert_array_equal(model.predict(t[-10:, None]), twin.predict(t[-10:, None]))
    assert model.get_params()["quantile"] == 0.8
    with pytest.raises(ValueError, match="no demand history"):
        DemandForecaster.from_points([])


def _helios_demand(vc: str) -> np.ndarray:
    """Per-minute GPUs requested (running + pending) by a Helios Earth virtual cluster, May 2020."""
    path = HELIOS / "earth_vcs" / vc / "cluster_sequence_vc.csv"
    if not path.exists():
        pytest.skip(f"Helios trace not present at {path}")
    header = path.open().readline().strip().split(",")
    cols = (header.index("running_gpu_num"), header.index("pending_gpu_num"))
    data = np.loadtxt(path, delimiter=",", skiprows=1, usecols=cols)
    demand: np.ndarray = data.sum(axis=1)
    return demand


@pytest.mark.parametrize("vc", ["vc3sl", "vcJLV"])
def test_coverage_on_a_held_out_helios_day(vc: str) -> None:
    demand = _helios_demand(vc)
    window = slice(7 * 1440, 15 * 1440)  # 8 days from 2020-05-08; the last day is held out
    t = 1_588_291_200.0 + 60.0 * np.arange(demand.size)  # 2020-05-01 00:00 UTC
    model = DemandForecaster(quantile=0.9).fit(t[window, None], demand[window])
    assert not model.fallback_
    assert model.coverage_ is not None and abs(model.coverage_ - 0.9) <= 0.1


@pytest.mark.parametrize("points", [310, 330, 350])
def test_a_day_and_a_bit_of_history_fits(points: int) -> None:
    # Just over a day of 5-minute points: the daily lag is a feature, but the held-out check's
    # training rows all lie within the first day, where it is unknown (an all-NaN column that
    # gradient boosting cannot bin). The fit must still succeed.
    history = [DemandPoint(1000.0 + 300.0 * i, float((i * 7) % 11)) for i in range(points)]
    model = DemandForecaster.from_points(history, quantile=0.9, horizon_s=1800)
    assert not model.fallback_
    assert model.forecast_at(history[-1].time_s) >= history[-1].gpus


def test_a_failed_forecast_is_not_retried_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_policy.models.cache import ModelCache
    from scheduler_policy.policy.spec import Headroom
    from scheduler_policy.vocabulary.errors import ModelFitError
    from scheduler_policy.vocabulary.state import QueueName, QueueState

    calls = []

    def failing(points: object, **hyper: object) -> DemandForecaster:
        calls.append(1)
        raise ModelFitError("boom")

    monkeypatch.setattr(DemandForecaster, "from_points", failing)
    history = tuple(DemandPoint(60.0 * i, 1.0) for i in range(10))
    queue = QueueState(QueueName("q"), 8.0, 8.0, 0.0, 0.0, 0.0, demand_history=history)
    cache = ModelCache(refit_s=600.0)
    headroom = Headroom(forecast_quantile=0.9)
    assert cache.forecast_gpus(queue, headroom, now_s=1000.0) == 0.0
    assert cache.forecast_gpus(queue, headroom, now_s=1060.0) == 0.0  # not refitted
    assert len(calls) == 1
    assert cache.forecast_gpus(queue, headroom, now_s=1700.0) == 0.0  # refit time passed
    assert len(calls) == 2


def test_forecast_at_gives_what_predict_gives_at_each_time() -> None:
    """A reconcile every 30 s, across several look-ahead blocks and back in time."""
    t, y = make_daily_cycle(3, seed=2)
    model = DemandForecaster(quantile=0.9).fit(t[:, None], y)
    times = [*(t[-1] - 600.0 + 30.0 * np.arange(200)), t[-1] - 3 * DAY_S / 2, t[-1] + 7 * DAY_S]
    expected = model.predict(np.array(times)[:, None])
    assert [model.forecast_at(s) for s in times] == expected.tolist()
    with pytest.raises(ValueError, match="first fitted time"):
        model.forecast_at(START_S - 1.0)
    with pytest.raises(ValueError):
        model.forecast_at(float("nan"))


def test_without_holdout_the_model_is_the_same_and_unscored() -> None:
    t, y = make_daily_cycle(3, seed=3)
    scored = DemandForecaster(quantile=0.9).fit(t[:, None], y)
    unscored = DemandForecaster(quantile=0.9, holdout=False).fit(t[:, None], y)
    assert scored.coverage_ is not None and scored.pinball_loss_ is not None
    assert unscored.coverage_ is None and unscored.pinball_loss_ is None
    at = t[-720:, None]
    np.testing.assert_array_equal(unscored.predict(at), scored.predict(at))
