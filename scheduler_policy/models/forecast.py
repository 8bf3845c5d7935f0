"""GPUs a queue's non-elastic work will request over the next horizon, as a quantile.

The target at time t is the peak demand over [t, t + horizon]. A gradient-boosted quantile
regressor (`HistGradientBoostingRegressor(loss="quantile")`) learns how far that peak rises above
the demand now, from lags, recent peaks and change, time of day and day of week, all computed on
a regular `step_s` grid. With little history it falls back to the recent peak (persistence).
"""

from __future__ import annotations

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

from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import DemandPoint

FloatArray = npt.NDArray[np.float64]

_DAY_S = 86400.0
_WEEK_S = 7 * _DAY_S
_MAX_GRID_POINTS = 2_000_000  # about 4 years per minute: a guard against a wrong unit
_LAG_STEPS = (1, 5, 15, 30, 60)
_AHEAD_STEPS = 32  # grid points `forecast_at` predicts at once


@functools.cache
def _threadpools() -> Any:
    """The process's thread pools, found once: finding them reads ``/proc/self/maps``, which at
    every prediction cost more than the prediction (scikit-learn's OpenMP runtime is loaded by
    the import above, so it is among them)."""
    return ThreadpoolController()


def _one_openmp_thread() -> Any:
    """A context in which OpenMP runs one thread: on a shared two-core machine more threads
    spin against each other, and a 0.3 s fit can take ten times as long."""
    return _threadpools().limit(limits=1, user_api="openmp")


def _rolling_max(values: FloatArray, window: int) -> FloatArray:
    """out[i] = max(values[max(0, i − window + 1) .. i]), window ≥ 1."""
    out = values.copy()
    shift = 1
    # Doubling: after k rounds each out[i] covers 2^k trailing points; the last round is clipped.
    while shift < window:
        span = min(shift, window - shift)
        out[span:] = np.maximum(out[span:], out[:-span])
        shift += span
    return out


def _lagged(values: FloatArray, lag: int) -> FloatArray:
    """values shifted back by lag steps, NaN where there is no history."""
    out = np.full_like(values, np.nan)
    if lag < values.size:
        out[lag:] = values[: values.size - lag]
    return out


class DemandForecaster(RegressorMixin, BaseEstimator):  # type: ignore[misc]  # sklearn is untyped
    """The q-quantile of a queue's peak GPU demand over the next `horizon_s`.

    Args:
        quantile: q in (0, 1), the quantile forecast (0.9: exceeded about one time in ten).
        horizon_s: seconds ahead the peak is taken over.
        step_s: the grid history is resampled onto, seconds.
        min_history_points: fewer grid points than this (or less than two horizons) and the
            forecaster falls back to the recent peak.
        random_state: seed of the gradient-boosting fit.
        holdout: whether ``fit`` also scores the model on its history's last day, held out
            (``coverage_``, ``pinball_loss_``): a second fit, about as long as the first.

    Attributes:
        fallback_: True when the forecast is the recent peak, not a learned model.
        fallback_reason_: why, in a sentence; "" when not a fallback.
        coverage_: fraction of held-out peaks at or below the forecast; None without enough
            history to hold some out, or without ``holdout``.
        pinball_loss_: mean pinball loss on the held-out peaks, GPUs; None likewise.
        t0_s_: the first grid time, seconds since the epoch.
        history_: demand on the grid, GPUs (the peak within each step, gaps carried forward).
        n_features_in_: always 1 (time).
    """

    def __init__(
        self,
        *,
        quantile: float = 0.9,
        horizon_s: float = 1800.0,
        step_s: float = 60.0,
        min_history_points: int = 120,
        random_state: int = 0,
        holdout: bool = True,
    ) -> None:
        self.quantile = quantile
        self.horizon_s = horizon_s
        self.step_s = step_s
        self.min_history_points = min_history_points
        self.random_state = random_state
        self.holdout = holdout

    def _check_hyperparameters(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"DemandForecaster.quantile: must be in (0, 1), got {self.quantile}")
        for name in ("horizon_s", "step_s"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"DemandForecaster.{name}: must be > 0 seconds, got {value}")
        if self.min_history_points < 1:
            raise ValueError(
                f"DemandForecaster.min_history_points: must be >= 1, got {self.min_history_points}"
            )

    @property
    def _horizon_steps(self) -> int:
        return max(1, round(self.horizon_s / self.step_s))

    def fit(self, X: Any, y: Any) -> DemandForecaster:
        """Learn the queue's demand from its history.

        Args:
            X: shape (n, 1), sample times in seconds since the epoch, non-decreasing.
            y: shape (n,), GPUs requested at those times (finite, ≥ 0).

        Returns:
            self, fitted.

        Raises:
            ValueError: invalid hyperparameters, unsorted or non-finite times, negative or
                non-finite demand, or a span too long for the grid.
            ModelFitError: the gradient-boosting fit failed.
        """
        self._check_hyperparameters()
        times = check_array(X, dtype=np.float64)
        if times.shape[1] != 1:
            raise ValueError(
                f"DemandForecaster.fit: X must be one column of times, got {times.shape[1]}"
            )
        t = times[:, 0]
        gpus = column_or_1d(np.asarray(y, dtype=np.float64))
        if gpus.size != t.size:
            raise ValueError(f"DemandForecaster.fit: {t.size} times but {gpus.size} demands")
        if not np.all(np.isfinite(t)):
            raise ValueError("DemandForecaster.fit: times must be finite")
        if np.any(np.diff(t) < 0):
            raise ValueError("DemandForecaster.fit: times must be sorted (non-decreasing)")
        bad = ~np.isfinite(gpus) | (gpus < 0)
        if np.any(bad):
            raise ValueError(
                f"DemandForecaster.fit: gpus must be finite and >= 0, got {float(gpus[bad][0])}"
            )
        self.n_features_in_ = 1
        self.t0_s_ = float(t[0])
        self._ahead: tuple[int, list[float]] = (0, [])
        self.history_ = self._resample(t, gpus)
        self.coverage_: float | None = None
        self.pinball_loss_: float | None = None
        self.model_: HistGradientBoostingRegressor | None = None
        h = self._horizon_steps
        n = self.history_.size
        if n < self.min_history_points:
            return self._fall_back(f"{n} history points, fewer than {self.min_history_points}")
        if n < 2 * h + 1:
            return self._fall_back(f"{n * self.step_s:.0f} s of history, under two horizons")
        # Day of week only once two weeks are seen: before, a held-out or new weekday is a value
        # the trees never saw, and they would place it with whichever extreme they split off.
        self.use_weekday_ = n * self.step_s >= 2 * _WEEK_S
        # Yesterday's peak only once some of it is known (an all-NaN column cannot be binned).
        self.use_daily_lag_ = n > round(_DAY_S / self.step_s) + 2 * h
        features = self._features(self.history_, np.arange(n))
        # target_i = peak over grid points i .. i + h, as a rise above the demand now.
        peak = _rolling_max(self.history_, h + 1)[h:]
        rise = peak - self.history_[: n - h]
        rows = n - h
        holdout = min(round(_DAY_S / self.step_s), rows // 4)
        train_end = rows - holdout - h  # h points between keep training targets off the holdout
        # The held-out check needs the daily lag known somewhere in its training rows too: an
        # all-NaN column cannot be binned.
        lag_known = not self.use_daily_lag_ or train_end > round(_DAY_S / self.step_s)
        if self.holdout and holdout >= h and train_end >= self.min_history_points and lag_known:
            model = self._fit_model(features[:train_end], rise[:train_end])
            test = slice(rows - holdout, rows)
            forecast = self.history_[test] + np.maximum(model.predict(features[test]), 0.0)
            actual = peak[test]
            diff = actual - forecast
            q = self.quantile
            self.coverage_ = float(np.mean(actual <= forecast + 1e-9))
            # Pinball loss: q·(y − ŷ) when under-forecast, (1 − q)·(ŷ − y) when over.
            self.pinball_loss_ = float(np.mean(np.maximum(q * diff, (q - 1.0) * diff)))
        self.model_ = self._fit_model(features[:rows], rise)
        self.fallback_ = False
        self.fallback_reason_ = ""
        return self

    def _fall_back(self, reason: str) -> DemandForecaster:
        self.fallback_ = True
        self.fallback_reason_ = f"persistence forecast (recent peak): {reason}"
        return self

    def _fit_model(self, features: FloatArray, target: FloatArray) -> HistGradientBoostingRegressor:
        model = HistGradientBoostingRegressor(
            loss="quantile",
            quantile=self.quantile,
            max_iter=100,
            learning_rate=0.1,
            max_leaf_nodes=15,
            # Leaves of about 200 steps (over three hours per minute) keep the quantile from
            # fitting noise; fewer on short histories so that the trees can still split.
            min_samples_leaf=max(20, min(200, target.size // 20)),
            early_stopping=False,
            random_state=self.random_state,
        )
        try:
            with _one_openmp_thread():
                model.fit(features, target)
        except (ValueError, FloatingPointError) as e:
            raise ModelFitError(f"DemandForecaster.fit: gradient boosting failed: {e}") from e
        return model

    def _resample(self, t: FloatArray, gpus: FloatArray) -> FloatArray:
        """The peak within each `step_s` cell from t0; empty cells carry the last value forward."""
        idx = np.floor((t - t[0]) / self.step_s).astype(np.int64)
        size = int(idx[-1]) + 1
        if size > _MAX_GRID_POINTS:
            raise ValueError(
                f"DemandForecaster.fit: {size} grid points of {self.step_s} s, "
                f"over the limit of {_MAX_GRID_POINTS}"
            )
        grid = np.full(size, np.nan)
        np.fmax.at(grid, idx, gpus)
        filled = ~np.isnan(grid)
        last = np.maximum.accumulate(np.where(filled, np.arange(size), 0))
        result: FloatArray = grid[last]
        return result

    def _features(self, history: FloatArray, index: npt.NDArray[np.int64]) -> FloatArray:
        """Features at grid points `index` of `history` (indices past its end reuse the last)."""
        h = self._horizon_steps
        at = np.minimum(index, history.size - 1)
        day = max(1, round(_DAY_S / self.step_s))
        columns = [history]
        columns += [history - _lagged(history, lag) for lag in _LAG_STEPS]  # recent change
        columns.append(_rolling_max(history, h + 1) - history)  # recent peak above now
        columns.append(_rolling_max(history, 4 * h + 1) - history)
        # The target's value a day ago, minus now: the seasonal-naive forecast, NaN without it.
        peak_ahead = np.full_like(history, np.nan)
        peak_ahead[: history.size - h] = _rolling_max(history, h + 1)[h:]
        if self.use_daily_lag_:
            columns.append(_lagged(peak_ahead, day) - history)
        base = np.column_stack(columns)[at]
        time_s = self.t0_s_ + index * self.step_s
        phase = 2.0 * np.pi * np.mod(time_s, _DAY_S) / _DAY_S
        # Day of week of the UTC epoch day (0 = Thursday, 1 January 1970).
        weekday = np.floor(np.mod(time_s, _WEEK_S) / _DAY_S)
        calendar = [np.sin(phase), np.cos(phase)]
        if self.use_weekday_:
            calendar.append(weekday)
        result: FloatArray = np.hstack([base, np.column_stack(calendar)])
        return result

    def predict(self, X: Any) -> FloatArray:
        """The q-quantile of peak demand over the next horizon from each time.

        Args:
            X: shape (m, 1), times in seconds since the epoch, not before the first fitted time.
                Lags come from the history given to `fit`; past its end, the last known state.

        Returns:
            shape (m,), GPUs, never negative and never below the demand at that time.

        Raises:
            NotFittedError: before `fit`.
            ValueError: X is not one column of finite times at or after the first fitted time.
        """
        check_is_fitted(self)
        times = check_array(X, dtype=np.float64)
        if times.shape[1] != 1:
            raise ValueError(
                f"DemandForecaster.predict: X must be one column of times, got {times.shape[1]}"
            )
        t = times[:, 0]
        if np.any(t < self.t0_s_):
            raise ValueError(
                f"DemandForecaster.predict: times must be >= the first fitted time {self.t0_s_}, "
                f"got {float(t.min())}"
            )
        index = np.floor((t - self.t0_s_) / self.step_s).astype(np.int64)
        at = np.minimum(index, self.history_.size - 1)
        now = self.history_[at]
        if self.model_ is None:
            # Persistence: the peak over the last horizon up to each time.
            recent = _rolling_max(self.history_, self._horizon_steps + 1)[at]
            persisted: FloatArray = np.maximum(recent, 0.0)
            return persisted
        with _one_openmp_thread():
            raw = self.model_.predict(self._features(self.history_, index))
        rise = np.maximum(np.asarray(raw, dtype=np.float64), 0.0)
        result: FloatArray = np.maximum(now + rise, 0.0)
        return result

    def forecast_at(self, now_s: float) -> float:
        """`predict` at one time: GPUs the queue's non-elastic work may peak at by now + horizon.

        An engine asks once per reconcile, at times that move forward: the first call predicts
        the next ``_AHEAD_STEPS`` grid points in one pass (a prediction costs about the same for
        one row as for dozens), and later calls within them are looked up. The values are those
        ``predict`` gives at each time.

        Raises:
            NotFittedError: before `fit`.
            ValueError: now_s is before the first fitted time.
        """
        check_is_fitted(self)
        if not (math.isfinite(now_s) and now_s >= self.t0_s_):
            return float(self.predict(np.array([[now_s]]))[0])  # raises, naming the problem
        index = math.floor((now_s - self.t0_s_) / self.step_s)
        first, values = self._ahead
        if not first <= index < first + len(values):
            times = self.t0_s_ + (index + np.arange(_AHEAD_STEPS, dtype=np.float64)) * self.step_s
            times[0] = now_s
            first, values = index, self.predict(times[:, None]).tolist()
            self._ahead = (first, values)
        return float(values[index - first])

    @classmethod
    def from_points(cls, points: Sequence[DemandPoint], **hyper: Any) -> DemandForecaster:
        """Fit a forecaster to a queue's demand history (oldest first).

        Raises:
            ValueError, ModelFitError: as `fit` (an empty history is a ValueError).
        """
        if not points:
            raise ValueError("DemandForecaster.from_points: no demand history")
        X = np.array([[p.time_s] for p in points], dtype=np.float64)
        y = np.array([p.gpus for p in points], dtype=np.float64)
        return cls(**hyper).fit(X, y)
