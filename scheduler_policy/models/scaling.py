"""How a job's training throughput grows with its replicas: the Universal Scalability Law.

X(n) = λ·n / (1 + σ·(n − 1) + κ·n·(n − 1)), with λ the one-replica throughput (samples/s), σ the
contention (serial fraction) and κ the coherency (crosstalk) coefficient. Dividing n by X makes the
law linear in its parameters:

    n / X(n) = a + b·(n − 1) + c·n·(n − 1),  a = 1/λ,  b = σ/λ,  c = κ/λ,  a, b, c ≥ 0,

so a fit is one non-negative least squares problem. Only relative speedups matter to the allocator,
so a job with no history gets the prior's shape with λ = 1 (`prior_model`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_consistent_length, check_is_fitted, column_or_1d

from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import ThroughputPoint

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _sk_validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    _sk_validate_data = None

FloatArray = npt.NDArray[np.float64]


def usl_throughput(
    lam: npt.ArrayLike, sigma: npt.ArrayLike, kappa: npt.ArrayLike, n: npt.ArrayLike
) -> FloatArray:
    """Universal Scalability Law throughput, vectorised with numpy broadcasting.

    Args:
        lam: one-replica throughput λ, samples/s.
        sigma: contention coefficient σ ≥ 0, dimensionless.
        kappa: coherency coefficient κ ≥ 0, dimensionless.
        n: replicas (may be fractional); all four broadcast against each other.

    Returns:
        X(n) = λ·n / (1 + σ·(n − 1) + κ·n·(n − 1)) in samples/s, shaped as the broadcast inputs.
    """
    lam_a = np.asarray(lam, dtype=np.float64)
    sigma_a = np.asarray(sigma, dtype=np.float64)
    kappa_a = np.asarray(kappa, dtype=np.float64)
    n_a = np.asarray(n, dtype=np.float64)
    result: FloatArray = lam_a * n_a / (1.0 + sigma_a * (n_a - 1.0) + kappa_a * n_a * (n_a - 1.0))
    return result


def _validate(estimator: BaseEstimator, X: Any, y: Any = "no_validation", *, reset: bool) -> Any:
    """scikit-learn's input validation, on whichever API the installed version has."""
    # Non-finite values pass here so that the model's own checks name them.
    kwargs: dict[str, Any] = {"dtype": np.float64, "reset": reset}
    if isinstance(y, str) and y == "no_validation":
        if _sk_validate_data is not None:
            return _sk_validate_data(estimator, X, ensure_all_finite=False, **kwargs)
        return estimator._validate_data(X, force_all_finite=False, **kwargs)  # pragma: no cover
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None")
    if _sk_validate_data is not None:
        X_arr = _sk_validate_data(estimator, X, ensure_all_finite=False, **kwargs)
    else:  # pragma: no cover
        X_arr = estimator._validate_data(X, force_all_finite=False, **kwargs)
    y_arr = column_or_1d(np.asarray(y, dtype=np.float64), warn=True)
    check_consistent_length(X_arr, y_arr)
    return X_arr, y_arr


def _replicas_column(X: FloatArray, name: str) -> FloatArray:
    """The replicas column of X, checked: one feature, finite, ≥ 1.

    Raises:
        ValueError: X has other than one column, or a replica count is not finite or below 1.
    """
    if X.shape[1] != 1:
        raise ValueError(f"{name}: X must have one column (replicas), got {X.shape[1]} columns")
    n: FloatArray = X[:, 0]
    if np.any(n < 0):
        # The wording "Negative values in data" is scikit-learn's convention for such input.
        bad = float(n[n < 0][0])
        raise ValueError(
            f"Negative values in data passed to {name}: replicas must be >= 1, got {bad}"
        )
    bad_mask = ~np.isfinite(n) | (n < 1.0)
    if np.any(bad_mask):
        raise ValueError(f"{name}: replicas must be finite and >= 1, got {float(n[bad_mask][0])}")
    return n


def _nnls(rows: FloatArray, target: FloatArray, sizes: FloatArray) -> FloatArray:
    """`scipy.optimize.nnls`, its failure raised as `ModelFitError`."""
    try:
        coef, _ = nnls(rows, target)
    except (RuntimeError, ValueError) as e:
        raise ModelFitError(f"ScalingModel.fit: nnls failed on sizes {sizes.tolist()}: {e}") from e
    result: FloatArray = np.asarray(coef, dtype=np.float64)
    return result


class ScalingModel(RegressorMixin, BaseEstimator):  # type: ignore[misc]  # sklearn is untyped
    """Throughput (samples/s) of one job as a function of its replicas, a USL fit.

    Args:
        prior_sigma: σ0, the contention a job is assumed to have before it has run at two sizes.
        prior_kappa: κ0, the coherency a job is assumed to have before it has run at three sizes.
        prior_weight: w, strength of the shrinkage toward (σ0, κ0); divided by the square of the
            number of distinct sizes seen, so the data take over as the job runs at more sizes. 0
            disables it (then a fit with fewer than three sizes may be unidentified and raise).

    Attributes:
        lambda_: λ, fitted one-replica throughput, samples/s.
        sigma_: σ, fitted contention coefficient.
        kappa_: κ, fitted coherency coefficient.
        n_sizes_: distinct replica counts in the training data.
        max_size_seen_: the largest replica count in the training data.
        relative_error_: mean |X̂ − X| / X over the training points (not aggregated).
        n_features_in_: always 1.
    """

    def __init__(
        self, *, prior_sigma: float = 0.05, prior_kappa: float = 0.0005, prior_weight: float = 1.0
    ) -> None:
        self.prior_sigma = prior_sigma
        self.prior_kappa = prior_kappa
        self.prior_weight = prior_weight

    def __sklearn_tags__(self) -> Any:
        """See base class. Replicas and throughput are positive."""
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        tags.target_tags.positive_only = True
        return tags

    def _check_hyperparameters(self) -> None:
        for name in ("prior_sigma", "prior_kappa", "prior_weight"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise ValueError(
                    f"ScalingModel.{name}: must be a finite number >= 0, got {value!r}"
                )

    def fit(self, X: Any, y: Any) -> ScalingModel:
        """Fit λ, σ, κ to measured throughput.

        Args:
            X: shape (n_samples, 1), the replicas each measurement ran with (≥ 1).
            y: shape (n_samples,), measured throughput, samples/s (finite, > 0).

        Returns:
            self, fitted.

        Raises:
            ValueError: invalid hyperparameters, replicas, or throughput (the message names it).
            ModelFitError: the least-squares solve failed or gave an unusable λ.
        """
        self._check_hyperparameters()
        X_arr, y_arr = _validate(self, X, y, reset=True)
        return self._fit_validated(_replicas_column(X_arr, "ScalingModel.fit"), y_arr)

    def _fit_validated(self, n: FloatArray, y_arr: FloatArray) -> ScalingModel:
        """``fit`` after scikit-learn's input validation (which costs more than the fit itself;
        ``from_points`` builds well-formed arrays and skips it)."""
        bad_y = ~np.isfinite(y_arr) | (y_arr <= 0)
        if np.any(bad_y):
            raise ValueError(
                "ScalingModel.fit: throughput samples_per_s must be finite and > 0, "
                f"got {float(y_arr[bad_y][0])}"
            )
        # Repeated measurements at one size: the median, robust to a slow or fast outlier.
        # (Grouped in Python: a history has a few dozen points at most, and np.unique plus an
        # np.median per size took 15 times as long, most of a refit.)
        by_size: dict[float, list[float]] = {}
        for size, value in zip(n.tolist(), y_arr.tolist(), strict=True):
            by_size.setdefault(size, []).append(value)
        ordered = sorted(by_size)
        sizes = np.array(ordered, dtype=np.float64)
        x_med = np.array([statistics.median(by_size[s]) for s in ordered], dtype=np.float64)
        sigma0, kappa0 = float(self.prior_sigma), float(self.prior_kappa)
        if sizes.size == 1:
            # One size cannot separate λ from σ, κ: pin σ = σ0, κ = κ0 and solve the point for λ,
            # λ = X(n)·(1 + σ0(n − 1) + κ0·n(n − 1)) / n.
            s = float(sizes[0])
            lam = float(x_med[0]) * (1.0 + sigma0 * (s - 1.0) + kappa0 * s * (s - 1.0)) / s
            sigma, kappa = sigma0, kappa0
        else:
            lam, sigma, kappa = self._solve(sizes, x_med, sigma0, kappa0)
        if not (np.isfinite(lam) and lam > 0 and np.isfinite(sigma) and np.isfinite(kappa)):
            raise ModelFitError(
                f"ScalingModel.fit: unusable fit lambda={lam}, sigma={sigma}, kappa={kappa} "
                f"from sizes {sizes.tolist()}"
            )
        self.lambda_ = lam
        self.sigma_ = sigma
        self.kappa_ = kappa
        self.n_sizes_ = int(sizes.size)
        self.max_size_seen_ = float(sizes.max())
        pred = usl_throughput(lam, sigma, kappa, n)
        self.relative_error_ = float(np.mean(np.abs(pred - y_arr) / y_arr))
        return self

    def _solve(
        self, sizes: FloatArray, x_med: FloatArray, sigma0: float, kappa0: float
    ) -> tuple[float, float, float]:
        """Non-negative least squares on the linearised law plus the prior's rows.

        Returns:
            (λ, σ, κ).

        Raises:
            ModelFitError: nnls failed, or a = 1/λ came out 0 (the data say nothing about λ).
        """
        t = sizes / x_med  # n / X(n), replicas per (samples/s)
        design = np.column_stack([np.ones_like(sizes), sizes - 1.0, sizes * (sizes - 1.0)])
        # Work in units of the prior's a0 so every row is dimensionless:
        # a0 = median over sizes of t / (1 + σ0(n − 1) + κ0·n(n − 1)).
        scale = float(np.median(t / (design @ np.array([1.0, sigma0, kappa0]))))
        # Data rows are divided by t: each residual is the relative error of n/X(n), ≈ that of X.
        rows = design * (scale / t)[:, None]
        target = np.ones_like(sizes)
        if self.prior_weight <= 0:
            coef = _nnls(rows, target, sizes)
        else:
            # Prior rows w·(b − σ0·a) = 0 and w·(c − κ0·a) = 0, each scaled by its term's share of
            # the denominator at n_ref = the largest size seen, so a row's residual reads as a
            # relative throughput error there, in the same units as a data row. With two sizes
            # the data fit exactly along a line and these rows only choose the point on it
            # nearest the prior; with three or more they bias the fit slightly, hence
            # w = prior_weight / (distinct sizes)²: the prior fades as the sizes accrue.
            n_ref = float(sizes.max())
            denom = 1.0 + sigma0 * (n_ref - 1.0) + kappa0 * n_ref * (n_ref - 1.0)
            w = float(self.prior_weight) / sizes.size**2
            w_sigma = w * (n_ref - 1.0) / denom
            w_kappa = w * n_ref * (n_ref - 1.0) / denom
            # A third row w_a·(a/a0 − 1) = 0 anchors λ near the prior's estimate a0: sizes that
            # exclude n = 1 admit a = 0 (infinite λ) as a way out of a far-off prior. w_a starts
            # at w and grows tenfold only while the solution still has a = 0: the weakest
            # anchor that identifies λ.
            for step in range(7):
                w_a = w * 10.0**step
                prior_rows = np.array(
                    [
                        [-w_sigma * sigma0, w_sigma, 0.0],
                        [-w_kappa * kappa0, 0.0, w_kappa],
                        [w_a, 0.0, 0.0],
                    ]
                )
                coef = _nnls(
                    np.vstack([rows, prior_rows]), np.concatenate([target, [0.0, 0.0, w_a]]), sizes
                )
                if coef[0] > 0:
                    break
        a, b, c = (float(v) * scale for v in coef)
        if not (np.isfinite(a) and a > 0):
            raise ModelFitError(
                f"ScalingModel.fit: a = 1/lambda came out {a} on sizes {sizes.tolist()}; "
                "the data do not identify the one-replica throughput (raise prior_weight)"
            )
        # λ = 1/a, σ = b/a, κ = c/a.
        return 1.0 / a, b / a, c / a

    def predict(self, X: Any) -> FloatArray:
        """Throughput at the given replicas.

        Args:
            X: shape (n_samples, 1), replicas (≥ 1, may be fractional).

        Returns:
            shape (n_samples,), predicted throughput in samples/s.

        Raises:
            NotFittedError: before `fit`.
            ValueError: X is not one column of finite replicas ≥ 1.
        """
        check_is_fitted(self)
        X_arr = _validate(self, X, reset=False)
        n = _replicas_column(X_arr, "ScalingModel.predict")
        return usl_throughput(self.lambda_, self.sigma_, self.kappa_, n)

    def throughput(self, n: float) -> float:
        """Predicted throughput at n replicas, samples/s.

        Raises:
            NotFittedError: before `fit`.
        """
        check_is_fitted(self)
        return float(usl_throughput(self.lambda_, self.sigma_, self.kappa_, n))

    def speedup(self, n_from: float, n_to: float) -> float:
        """X(n_to) / X(n_from), dimensionless.

        Raises:
            NotFittedError: before `fit`.
            ValueError: either size is below 1.
        """
        for name, value in (("n_from", n_from), ("n_to", n_to)):
            if not (np.isfinite(value) and value >= 1):
                raise ValueError(f"ScalingModel.speedup: {name} must be >= 1, got {value}")
        return self.throughput(n_to) / self.throughput(n_from)

    def marginal_gain(self, n: float) -> float:
        """X(n + 1) / X(n) − 1: the relative throughput one more replica adds at size n.

        Raises:
            NotFittedError: before `fit`.
            ValueError: n is below 1.
        """
        return self.speedup(n, n + 1) - 1.0

    @classmethod
    def from_points(cls, points: Sequence[ThroughputPoint], **hyper: float) -> ScalingModel:
        """Fit a `ScalingModel` to a job's throughput history.

        Args:
            points: the job's measurements; at least one.
            **hyper: `ScalingModel` hyperparameters.

        Returns:
            The fitted model; the prior's (`prior_model`) when `points` is empty.

        Raises:
            ValueError, ModelFitError: as `ScalingModel.fit`.
        """
        if not points:
            return cls.prior_model(**hyper)
        X = np.array([[float(p.replicas)] for p in points], dtype=np.float64)
        y = np.array([p.samples_per_s for p in points], dtype=np.float64)
        model = cls(**hyper)
        model._check_hyperparameters()
        model.n_features_in_ = 1
        return model._fit_validated(_replicas_column(X, "ScalingModel.from_points"), y)

    @classmethod
    def prior_model(cls, **hyper: float) -> ScalingModel:
        """A model in the fitted state with λ = 1 and the prior's σ, κ, for jobs with no history.

        Args:
            **hyper: `ScalingModel` hyperparameters (the prior's σ0, κ0 are used).

        Returns:
            A `ScalingModel` whose `n_sizes_` is 0 and `relative_error_` is NaN (nothing measured).
        """
        model = cls(**hyper)
        model._check_hyperparameters()
        model.lambda_ = 1.0
        model.sigma_ = float(model.prior_sigma)
        model.kappa_ = float(model.prior_kappa)
        model.n_sizes_ = 0
        model.max_size_seen_ = 0.0
        model.relative_error_ = float("nan")
        model.n_features_in_ = 1
        return model


from_points = ScalingModel.from_points
"""Module-level alias of `ScalingModel.from_points`."""

prior_model = ScalingModel.prior_model
"""Module-level alias of `ScalingModel.prior_model`."""
