"""The q-quantile of a queue's peak non-elastic demand over the next horizon: what headroom holds.

A gradient-boosted quantile regressor learns the signed change from the demand now to the
target (the peak over the next horizon, or the demand at its end), so it can forecast a fall as
well as a rise, from the series and the job-level signals the engine has (``demand_grid``'s
features). Its quantile is then recalibrated on the most recent residuals, conformal-style: the
offset added is the q-quantile of (actual − forecast) over the calibration window, so a queue
whose demand seldom moves does not over-cover. Finally a held-out score picks, per queue, the
model or the engine's fallback (the recent peak, recalibrated the same way), and says why.

The fit is one gradient-boosting fit on the history before the calibration window; the window
(the last ``calibration_s``) is split in two: offsets from its first half score both candidates on
its second half, and the offset kept is the one from the whole window.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.utils.validation import check_array, check_is_fitted, column_or_1d
from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]  # no stubs

from scheduler_policy.models.demand_grid import (
    DemandGrid,
    FloatArray,
    Target,
    features,
    recent_peak,
    resample,
    target,
)
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import DemandPoint

_COVERED_EPS = 1e-9
_MODEL_MARGIN = 0.03  # the model serves only when its held-out pinball is 3% below


@functools.cache
def _threadpools() -> Any:
    """The process's thread pools, found once: finding them reads ``/proc/self/maps``, which at
    every prediction cost more than the prediction (scikit-learn's OpenMP runtime is loaded by
    the import above, so it is among them)."""
    return ThreadpoolController()


def _one_openmp_thread() -> Any:
    """A context in which OpenMP runs one thread: on a shared two-core machine more threads
    spin against each other, and a fit can take ten times as long."""
    return _threadpools().limit(limits=1, user_api="openmp")


class ForecastChoice(enum.Enum):
    """Which forecast a queue's headroom follows."""

    MODEL = "model"
    RECENT_PEAK = "recent_peak"


def pinball(actual: FloatArray, forecast: FloatArray, quantile: float) -> float:
    """Mean pinball loss, GPUs: q·(y − ŷ) when under-forecast, (1 − q)·(ŷ − y) when over."""
    diff = actual - forecast
    return float(np.mean(np.maximum(quantile * diff, (quantile - 1.0) * diff)))


def coverage(actual: FloatArray, forecast: FloatArray) -> float:
    """Share of actuals at or below the forecast."""
    return float(np.mean(actual <= forecast + _COVERED_EPS))


def conformal_offset(residuals: FloatArray, quantile: float) -> float:
    """The split-conformal q-quantile of (actual − forecast): the ⌈(m + 1)·q⌉-th smallest of m."""
    ordered = np.sort(residuals)
    k = min(ordered.size, math.ceil((ordered.size + 1) * quantile)) - 1
    return float(ordered[max(0, k)])


class _MeanThenQuantile:
    """A fitted mean model and the quantile model of its residuals: their sum is the forecast."""

    def __init__(
        self, mean: HistGradientBoostingRegressor, margin: HistGradientBoostingRegressor
    ) -> None:
        self.mean = mean
        self.margin = margin

    def predict(self, table: FloatArray) -> FloatArray:
        with _one_openmp_thread():
            result: FloatArray = np.asarray(
                self.mean.predict(table), dtype=np.float64
            ) + np.asarray(self.margin.predict(table), dtype=np.float64)
        return result


class PeakForecaster(RegressorMixin, BaseEstimator):  # type: ignore[misc]  # sklearn is untyped
    """The q-quantile of a queue's demand target over the next `horizon_s`, recalibrated.

    Args:
        quantile: q in (0, 1) (0.9: exceeded about one time in ten).
        horizon_s: seconds ahead.
        step_s: the grid history is resampled onto, seconds.
        target: "peak" (the most demand over the horizon) or "point" (the demand at its end).
        calibration_s: the most recent history the quantile is recalibrated on and the
            model scored on against the recent peak.
        max_train_rows: at most this many training origins (evenly spaced): bounds fit time.
        min_train_rows: fewer training origins than this and the forecast is the recent peak.
        random_state: seed of the gradient-boosting fit.

    Attributes:
        choice_: which forecast is served (``ForecastChoice``).
        reason_: why, in a sentence.
        offset_gpus_: the conformal offset added to the served forecast, GPUs.
        holdout_pinball_: held-out pinball loss of each candidate ("model", "recent_peak"),
            GPUs; empty without enough history to hold some out.
        holdout_coverage_: the served candidate's held-out coverage; None likewise.
        grid_: the history on the grid.
        n_features_in_: 1 (time) or 3 (time, pending GPUs, running jobs).
    """

    def __init__(
        self,
        *,
        quantile: float = 0.9,
        horizon_s: float = 1800.0,
        step_s: float = 60.0,
        target: str = "peak",
        calibration_s: float = 4 * 86400.0,
        max_train_rows: int = 4000,
        min_train_rows: int = 500,
        random_state: int = 0,
    ) -> None:
        self.quantile = quantile
        self.horizon_s = horizon_s
        self.step_s = step_s
        self.target = target
        self.calibration_s = calibration_s
        self.max_train_rows = max_train_rows
        self.min_train_rows = min_train_rows
        self.random_state = random_state

    def _check_hyperparameters(self) -> Target:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"PeakForecaster.quantile: must be in (0, 1), got {self.quantile}")
        for name in ("horizon_s", "step_s", "calibration_s"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"PeakForecaster.{name}: must be > 0 seconds, got {value}")
        for name in ("max_train_rows", "min_train_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"PeakForecaster.{name}: must be >= 1, got {getattr(self, name)}")
        try:
            return Target(self.target)
        except ValueError:
            raise ValueError(
                f"PeakForecaster.target: must be 'peak' or 'point', got {self.target!r}"
            ) from None

    def fit(self, X: Any, y: Any) -> PeakForecaster:
        """Learn the queue's demand from its history.

        Args:
            X: shape (n, 1) sample times in seconds since the epoch, non-decreasing; or (n, 3)
                with the pending GPUs and running jobs at those times (NaN where unknown).
            y: shape (n,), GPUs requested at those times (finite, ≥ 0).

        Returns:
            self, fitted.

        Raises:
            ValueError: invalid hyperparameters or input (as ``demand_grid.resample``).
            ModelFitError: the gradient-boosting fit failed.
        """
        self._check_hyperparameters()
        data = check_array(X, dtype=np.float64, ensure_all_finite="allow-nan")
        if data.shape[1] not in (1, 3):
            raise ValueError(
                f"PeakForecaster.fit: X must be 1 or 3 columns (time, pending GPUs, running "
                f"jobs), got {data.shape[1]}"
            )
        gpus = column_or_1d(np.asarray(y, dtype=np.float64))
        extra = data.shape[1] == 3
        grid = resample(
            times_s=data[:, 0],
            gpus=gpus,
            step_s=float(self.step_s),
            pending_gpus=data[:, 1] if extra else None,
            running_jobs=data[:, 2] if extra else None,
            what="PeakForecaster.fit",
        )
        self.n_features_in_ = data.shape[1]
        return self.fit_grid(grid, end=grid.size)

    def fit_points(self, points: Sequence[DemandPoint]) -> PeakForecaster:
        """Fit to a queue's demand history (oldest first), as the engine holds it.

        Raises:
            ValueError, ModelFitError: as ``fit`` (an empty history is a ValueError).
        """
        if not points:
            raise ValueError("PeakForecaster.fit_points: no demand history")
        X = np.array([[p.time_s] for p in points], dtype=np.float64)
        y = np.array([p.gpus for p in points], dtype=np.float64)
        return self.fit(X, y)

    def fit_grid(
        self, grid: DemandGrid, *, end: int, table: FloatArray | None = None
    ) -> PeakForecaster:
        """Fit on grid points before `end` (the origin time: nothing later is read).

        Args:
            grid: the history on the grid (``step_s`` must match).
            end: grid points 0 .. end − 1 are known.
            table: ``features(grid, ...)`` when the caller has computed it (a rolling evaluation
                computes it once); else computed here.

        Returns:
            self, fitted.

        Raises:
            ValueError: invalid hyperparameters, or a grid of another step.
            ModelFitError: the gradient-boosting fit failed.
        """
        kind = self._check_hyperparameters()
        if not math.isclose(grid.step_s, float(self.step_s)):
            raise ValueError(
                f"PeakForecaster.fit_grid: grid step {grid.step_s} s, not step_s {self.step_s}"
            )
        if not hasattr(self, "n_features_in_"):
            self.n_features_in_ = 1
        h = grid.steps(float(self.horizon_s))
        self.grid_ = grid
        self.horizon_steps_ = h
        self.table_ = features(grid, horizon_steps=h) if table is None else table
        self.model_: _MeanThenQuantile | None = None
        self.holdout_pinball_: dict[str, float] = {}
        self.holdout_coverage_: float | None = None
        self._ahead: tuple[int, list[float]] = (0, [])
        goal = target(grid, horizon_steps=h, kind=kind)
        now = grid.gpus
        fallback = recent_peak(grid, horizon_steps=h)
        q = float(self.quantile)
        # Origins whose target is known by `end`: i + h < end.
        last = end - h
        cal_steps = grid.steps(float(self.calibration_s))
        cal_start = max(0, last - cal_steps)
        train_end = cal_start - h  # a horizon between keeps training targets off the window
        warm = min(4 * h + 1, max(0, train_end // 4))
        train_rows = max(0, train_end - warm)
        if last <= 1 or train_rows < self.min_train_rows or last - cal_start < 4:
            self.offset_gpus_ = 0.0
            if last > 1:
                recent = slice(cal_start, last)
                self.offset_gpus_ = conformal_offset(goal[recent] - fallback[recent], q)
            return self._serve(
                ForecastChoice.RECENT_PEAK,
                f"too little history to learn from ({max(0, end) * grid.step_s / 3600:.1f} h, "
                f"{train_rows} training origins, fewer than {self.min_train_rows})",
            )
        stride = max(1, math.ceil(train_rows / self.max_train_rows))
        rows = np.arange(warm, train_end, stride)
        # The model learns the signed change from a base: the recent peak for the peak target
        # (it learns when a peak has passed and when one is coming), the demand now for the
        # point target.
        base = fallback if kind is Target.PEAK else now
        self.base_ = base
        # A signal the history never had (an all-NaN column) cannot be binned: left out.
        self.columns_ = np.flatnonzero(np.any(np.isfinite(self.table_[rows]), axis=0))
        model = self._fit_model(self.table_[np.ix_(rows, self.columns_)], goal[rows] - base[rows])
        window = np.arange(cal_start, last)
        raw = model.predict(self.table_[np.ix_(window, self.columns_)])
        model_forecast = base[window] + raw
        actual = goal[window]
        half = window.size // 2
        first, second = slice(0, half), slice(half, window.size)
        scores: dict[str, float] = {}
        for name, forecast in (("model", model_forecast), ("recent_peak", fallback[window])):
            shift = conformal_offset(actual[first] - forecast[first], q)
            scores[name] = pinball(actual[second], np.maximum(forecast[second] + shift, 0.0), q)
        self.holdout_pinball_ = scores
        hours = window.size * grid.step_s / 3600
        # The model must win clearly: on a day or two of held-out data a small edge is noise,
        # and the recent peak is the forecast people can check by eye.
        if scores["model"] < (1.0 - _MODEL_MARGIN) * scores["recent_peak"]:
            self.model_ = model
            self.offset_gpus_ = conformal_offset(actual - model_forecast, q)
            served = np.maximum(model_forecast + self.offset_gpus_, 0.0)
            choice = ForecastChoice.MODEL
            verdict = "beats"
        else:
            self.offset_gpus_ = conformal_offset(actual - fallback[window], q)
            served = np.maximum(fallback[window] + self.offset_gpus_, 0.0)
            choice = ForecastChoice.RECENT_PEAK
            verdict = "does not beat by 3%"
        self.holdout_coverage_ = coverage(actual[second], served[second])
        return self._serve(
            choice,
            f"the model's held-out pinball loss {scores['model']:.3f} GPUs {verdict} the "
            f"recent peak's {scores['recent_peak']:.3f} over the last {hours / 2:.0f} h",
        )

    def _serve(self, choice: ForecastChoice, why: str) -> PeakForecaster:
        self.choice_ = choice
        served = "learned model" if choice is ForecastChoice.MODEL else "recent peak"
        self.reason_ = (
            f"{served}, recalibrated by {self.offset_gpus_:+.2f} GPUs on recent residuals: {why}"
        )
        return self

    def _fit_model(self, table: FloatArray, change: FloatArray) -> _MeanThenQuantile:
        """The change's mean, then the q-quantile of what the mean leaves (both boosted trees).

        A quantile loss alone learns little from demand that mostly stays put: where most
        changes tie at zero its gradient is the same sign for rows that stay and rows that
        fall, so no split separates them. The squared-loss mean does separate them (a job's
        age against its usual duration, a spike that passed); the quantile model then learns
        the upper margin around it (arrivals), on residuals that no longer tie.
        """
        leaf = max(20, change.size // 200)
        mean = HistGradientBoostingRegressor(
            loss="squared_error",
            max_iter=60,
            learning_rate=0.1,
            max_leaf_nodes=15,
            min_samples_leaf=leaf,
            l2_regularization=1.0,
            early_stopping=False,
            random_state=self.random_state,
        )
        margin = HistGradientBoostingRegressor(
            loss="quantile",
            quantile=float(self.quantile),
            max_iter=60,
            learning_rate=0.1,
            max_leaf_nodes=15,
            min_samples_leaf=leaf,
            l2_regularization=1.0,
            early_stopping=False,
            random_state=self.random_state,
        )
        try:
            with _one_openmp_thread():
                mean.fit(table, change)
                margin.fit(table, change - mean.predict(table))
        except (ValueError, FloatingPointError) as e:
            raise ModelFitError(f"PeakForecaster.fit: gradient boosting failed: {e}") from e
        return _MeanThenQuantile(mean, margin)

    def predict_index(self, index: npt.ArrayLike) -> FloatArray:
        """The forecast at grid points `index` of the fitted grid (their features read up to them).

        Returns:
            GPUs, finite and ≥ 0.
        """
        check_is_fitted(self)
        at = np.clip(np.asarray(index, dtype=np.int64), 0, self.grid_.size - 1)
        if self.model_ is None:
            base = recent_peak(self.grid_, horizon_steps=self.horizon_steps_)[at]
        else:
            raw = self.model_.predict(self.table_[np.ix_(at, self.columns_)])
            base = self.base_[at] + raw
        result: FloatArray = np.maximum(np.nan_to_num(base + self.offset_gpus_), 0.0)
        return result

    def predict(self, X: Any) -> FloatArray:
        """The forecast from each time, using the history given to ``fit`` up to that time.

        Args:
            X: shape (m, 1) (or more columns; only the first is read), times in seconds since
                the epoch, not before the first fitted time; past the history's end, its last
                state.

        Returns:
            shape (m,), GPUs, finite and ≥ 0.

        Raises:
            NotFittedError: before ``fit``.
            ValueError: X's times are not finite or fall before the first fitted time.
        """
        check_is_fitted(self)
        times = check_array(X, dtype=np.float64, ensure_all_finite="allow-nan")[:, 0]
        if not np.all(np.isfinite(times)) or np.any(times < self.grid_.start_s):
            raise ValueError(
                f"PeakForecaster.predict: times must be finite and >= the first fitted time "
                f"{self.grid_.start_s}, got {float(np.min(times))}"
            )
        index = np.floor((times - self.grid_.start_s) / self.grid_.step_s).astype(np.int64)
        return self.predict_index(index)

    def forecast_at(self, now_s: float) -> float:
        """``predict`` at one time (the engine asks once per reconcile)."""
        return float(self.predict(np.array([[now_s]]))[0])
