"""Rolling-origin evaluation of headroom forecasts against naive baselines, without look-ahead.

The test window is a series' last ``test_s``. Every ``refit_s`` within it the forecasts that
learn (tide's ``PeakForecaster`` and the persistence + residual quantile baseline) are refitted
on the grid points known then; between refits each origin's forecast reads the series up to that
origin only. Origins are ``origin_step_s`` apart. Scores: MAE, pinball loss at the quantile and
coverage, each per model, target (peak or point) and horizon.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_policy.models.demand_grid import (
    DAY_S,
    DemandGrid,
    FloatArray,
    Target,
    features,
    recent_peak,
    rolling_mean,
    seasonal_naive,
    target,
)
from scheduler_policy.models.peak_forecast import (
    PeakForecaster,
    conformal_offset,
    coverage,
    pinball,
)

MODELS = (
    "tide",
    "persistence",
    "recent_peak",
    "persistence_residual",
    "seasonal_naive",
    "moving_average",
)
NAIVE_QUANTILE_MODELS = ("recent_peak", "persistence_residual")


@dataclass(frozen=True, slots=True)
class ForecastScore:
    """One figure of an evaluation: a JSON record of ``tide forecast evaluate --json``."""

    metric: str  # "pinball" | "coverage" | "mae"
    value: float
    unit: str  # "gpus" | "ratio"
    model: str
    target: str  # "peak" | "point"
    horizon_s: float
    quantile: float
    series: str

    def record(self) -> dict[str, object]:
        """The record as JSON-ready fields."""
        whole = self.horizon_s.is_integer()
        horizon: float | int = int(self.horizon_s) if whole else self.horizon_s
        return {
            "metric": self.metric,
            "value": self.value,
            "unit": self.unit,
            "model": self.model,
            "target": self.target,
            "horizon_s": horizon,
            "quantile": self.quantile,
            "series": self.series,
        }


@dataclass(frozen=True, slots=True, eq=False)
class ForecastTrace:
    """Forecasts against actuals at each origin of one (target, horizon): what a plot shows.

    Attributes:
        series: the series' name.
        target: "peak" or "point".
        horizon_s: seconds ahead.
        times_s: origin times, seconds since the epoch.
        actual: the target at each origin, GPUs.
        forecasts: per model, its forecast at each origin, GPUs.
        tide_choice: per refit, which forecast tide served (``ForecastChoice`` values).
    """

    series: str
    target: str
    horizon_s: float
    times_s: FloatArray
    actual: FloatArray
    forecasts: dict[str, FloatArray]
    tide_choice: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Scores and traces of one series."""

    scores: tuple[ForecastScore, ...]
    traces: tuple[ForecastTrace, ...]


def _naive(grid: DemandGrid, *, horizon_steps: int, kind: Target) -> dict[str, FloatArray]:
    x = grid.gpus
    h = horizon_steps
    seasonal = seasonal_naive(grid, horizon_steps=h, kind=kind)
    return {
        "persistence": x,
        "recent_peak": recent_peak(grid, horizon_steps=h),
        "seasonal_naive": np.where(np.isnan(seasonal), x, seasonal),  # persistence before a day
        "moving_average": rolling_mean(x, h),
    }


def evaluate_series(
    grid: DemandGrid,
    *,
    name: str,
    horizons_s: Sequence[float],
    quantile: float,
    test_s: float = 10 * DAY_S,
    refit_s: float = DAY_S,
    origin_step_s: float = 600.0,
    targets: Sequence[Target] = (Target.PEAK, Target.POINT),
) -> Evaluation:
    """Score tide's forecast and the naive ones on the series' last `test_s`, rolling origin.

    Args:
        grid: the series on its grid.
        name: the series' name in the records.
        horizons_s: seconds ahead, each > 0.
        quantile: q in (0, 1) for the pinball loss, the coverage and the quantile models.
        test_s: the test window at the series' end, seconds.
        refit_s: seconds between refits within the test window.
        origin_step_s: seconds between forecast origins.
        targets: which targets to score.

    Returns:
        Every (metric, model, target, horizon) score, and a trace per (target, horizon).

    Raises:
        ValueError: a bad horizon or quantile, or a test window that leaves no history or no
            origin to score.
        ModelFitError: a fit of tide's forecaster failed.
    """
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"{name}: quantile must be in (0, 1), got {quantile}")
    if not horizons_s or any(not (h > 0) for h in horizons_s):
        raise ValueError(f"{name}: horizons must be > 0 seconds, got {list(horizons_s)}")
    spans = (("test_s", test_s), ("refit_s", refit_s), ("origin_step_s", origin_step_s))
    for label, value in spans:
        if not value > 0:
            raise ValueError(f"{name}: {label} must be > 0 seconds, got {value}")
    n = grid.size
    start = n - grid.steps(test_s)
    if start < grid.steps(DAY_S):
        raise ValueError(
            f"{name}: {n * grid.step_s / 86400:.1f} days of data; the test window of "
            f"{test_s / 86400:.1f} days must leave at least one day of history before it"
        )
    scores: list[ForecastScore] = []
    traces: list[ForecastTrace] = []
    refit = grid.steps(refit_s)
    stride = grid.steps(origin_step_s)
    for horizon_s in horizons_s:
        h = grid.steps(horizon_s)
        table = features(grid, horizon_steps=h)
        for kind in targets:
            goal = target(grid, horizon_steps=h, kind=kind)
            naive = _naive(grid, horizon_steps=h, kind=kind)
            origins: list[npt.NDArray[np.int64]] = []
            tide: list[FloatArray] = []
            residual: list[FloatArray] = []
            choices: list[str] = []
            for fit_at in range(start, n - h, refit):
                block = np.arange(fit_at, min(fit_at + refit, n - h), stride)
                if block.size == 0:
                    continue
                forecaster = PeakForecaster(
                    quantile=quantile, horizon_s=horizon_s, step_s=grid.step_s, target=kind.value
                ).fit_grid(grid, end=fit_at + 1, table=table)
                choices.append(forecaster.choice_.value)
                origins.append(block)
                tide.append(forecaster.predict_index(block))
                # Persistence + the q-quantile of the change seen over the known history.
                known = np.arange(0, fit_at + 1 - h)
                shift = conformal_offset(goal[known] - grid.gpus[known], quantile)
                residual.append(np.maximum(grid.gpus[block] + shift, 0.0))
            if not origins:
                raise ValueError(f"{name}: no origin to score at horizon {horizon_s} s")
            at = np.concatenate(origins)
            actual = goal[at]
            forecasts = {
                "tide": np.concatenate(tide),
                "persistence_residual": np.concatenate(residual),
                **{model: values[at] for model, values in naive.items()},
            }
            for model in MODELS:
                forecast = forecasts[model]
                figures = (
                    ("mae", float(np.mean(np.abs(actual - forecast))), "gpus"),
                    ("pinball", pinball(actual, forecast, quantile), "gpus"),
                    ("coverage", coverage(actual, forecast), "ratio"),
                )
                scores += [
                    ForecastScore(
                        metric=metric,
                        value=value,
                        unit=unit,
                        model=model,
                        target=kind.value,
                        horizon_s=float(horizon_s),
                        quantile=quantile,
                        series=name,
                    )
                    for metric, value, unit in figures
                ]
            traces.append(
                ForecastTrace(
                    series=name,
                    target=kind.value,
                    horizon_s=float(horizon_s),
                    times_s=(grid.start_s + at * grid.step_s).astype(np.float64),
                    actual=actual,
                    forecasts=forecasts,
                    tide_choice=tuple(choices),
                )
            )
    return Evaluation(scores=tuple(scores), traces=tuple(traces))
