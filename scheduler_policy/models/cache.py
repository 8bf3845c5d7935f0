"""The fit phase: fitted models kept across reconciles, so a steady state refits nothing.

``ModelCache.fit`` runs before ``decide`` and is the only stateful step of a reconcile: it hands
``decide`` a ``Fits`` value (a curve per job, a forecast per queue, and the jobs whose fit failed).

A job's scaling model is refitted when it has run at a replica count the last fit had not seen, or
when ``refit_s`` has passed since the last fit. A queue's forecaster is refitted when ``refit_s``
has passed or its quantile or horizon changed. Both can be rebuilt from Prometheus history, so the
cache lives in memory only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler_policy.models.curve import JobCurve
from scheduler_policy.models.peak_forecast import PeakForecaster
from scheduler_policy.models.scaling import ScalingModel
from scheduler_policy.policy.spec import ElasticPolicy, Headroom
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobPhase,
    JobState,
    Observation,
    QueueName,
    QueueState,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Fits:
    """What the fit phase hands to ``decide``.

    Attributes:
        curves: the scaling curve of each running elastic job (the prior where it has no usable
            measurement yet).
        failures: the jobs whose fit failed, each with a sentence naming the job and the error;
            ``decide`` holds them.
        forecast_gpus: each managed queue's forecast peak non-elastic demand, GPUs.
        forecast_reasons: per queue with a forecast, which forecast it serves and why (the
            held-out score that picked the learned model or the recent peak), a sentence.
    """

    curves: Mapping[JobKey, JobCurve]
    failures: Mapping[JobKey, str] = field(default_factory=dict)
    forecast_gpus: Mapping[QueueName, float] = field(default_factory=dict)
    forecast_reasons: Mapping[QueueName, str] = field(default_factory=dict)


@dataclass(slots=True)
class _FittedCurve:
    sizes: frozenset[int]
    fitted_at_s: float
    curve: JobCurve
    relative_error: float  # the fit's mean |X̂ − X| / X over its points (ScalingModel)


@dataclass(slots=True)
class _FittedForecast:
    fitted_at_s: float
    quantile: float
    horizon_s: float
    forecaster: PeakForecaster | None  # None: the fit failed; no headroom until the next
    reason: str


@dataclass(frozen=True, slots=True)
class ModelAccuracy:
    """How well the cached models fit, for the engine's own metrics.

    Attributes:
        scaling_relative_error: per fitted job, its scaling model's mean relative error over
            the points it was fitted to (``ScalingModel.relative_error_``).
        forecast_coverage: per queue whose forecaster was scored on held-out history, the
            fraction of held-out peaks at or below the served forecast
            (``PeakForecaster.holdout_coverage_``).
        forecast_gpus: per queue, the latest forecast peak demand.
        forecast_pinball_gpus: per queue scored on held-out history, each candidate's
            held-out pinball loss ("model", "recent_peak"), GPUs.
        forecast_choice: per queue with a forecaster, the forecast it serves ("model" or
            "recent_peak").
    """

    scaling_relative_error: dict[JobKey, float]
    forecast_coverage: dict[QueueName, float]
    forecast_gpus: dict[QueueName, float]
    forecast_pinball_gpus: dict[QueueName, dict[str, float]] = field(default_factory=dict)
    forecast_choice: dict[QueueName, str] = field(default_factory=dict)


@dataclass(slots=True)
class ModelCache:
    """Per-job scaling curves and per-queue forecasters, with counts of how often each was fitted.

    Attributes:
        refit_s: least time between two refits when nothing new was measured.
        curve_fits: scaling-model fits done so far.
        forecast_fits: forecaster fits done so far.
        forecast_holdout: kept for callers of the earlier forecaster; every forecaster is now
            scored on its recent history (the same fit), so this changes nothing.
    """

    refit_s: float = 600.0
    curve_fits: int = 0
    forecast_fits: int = 0
    forecast_holdout: bool = False
    _curves: dict[JobKey, _FittedCurve] = field(default_factory=dict)
    _forecasts: dict[QueueName, _FittedForecast] = field(default_factory=dict)
    _prior: JobCurve | None = None
    _last_forecast: dict[QueueName, float] = field(default_factory=dict)

    def prior_curve(self) -> JobCurve:
        """The curve assumed for a job that has not been measured yet (λ = 1: shape only)."""
        if self._prior is None:
            model = ScalingModel.prior_model()
            self._prior = JobCurve(1.0, float(model.sigma_), float(model.kappa_), measured=False)
        return self._prior

    def fit(self, observation: Observation, policy: ElasticPolicy) -> Fits:
        """Fit what ``decide`` needs for ``observation``: the fit phase of a reconcile.

        Args:
            observation: the cluster now (its ``time_s`` is the fit time).
            policy: the policy in force (which queues are managed, their headroom settings).

        Returns:
            A curve for every running elastic job whose fit did not fail, the failures, and a
            forecast for every queue the policy manages. A failure never raises.
        """
        now_s = observation.time_s
        curves: dict[JobKey, JobCurve] = {}
        failures: dict[JobKey, str] = {}
        for job in observation.jobs:
            if not job.elastic or job.phase is not JobPhase.RUNNING:
                continue  # never planned for: nothing to fit
            try:
                curves[job.key] = self.curve(job, now_s=now_s)
            except ModelFitError as e:
                failures[job.key] = str(e)
                logger.warning("%s", e)
        managed = {q.name: q for q in reversed(policy.queues)}  # the first of a name wins
        forecasts = {
            queue.name: self.forecast_gpus(queue, managed[queue.name].headroom, now_s=now_s)
            for queue in observation.queues
            if queue.name in managed
        }
        reasons = {
            name: self._forecasts[name].reason for name in forecasts if name in self._forecasts
        }
        return Fits(
            curves=curves, failures=failures, forecast_gpus=forecasts, forecast_reasons=reasons
        )

    def curve(self, job: JobState, *, now_s: float) -> JobCurve:
        """The job's scaling curve, refitted only when something new was measured.

        Args:
            job: the job, with its throughput history.
            now_s: the reconcile time.

        Returns:
            The fitted curve, or the prior when the job has no usable measurement.

        Raises:
            ModelFitError: the fit failed; the message names the job and the error.
        """
        cached = self._curves.get(job.key)
        # The steady state: no size measured that the last fit had not seen.
        if (
            cached is not None
            and now_s - cached.fitted_at_s < self.refit_s
            and {p.replicas for p in job.throughput_history} <= cached.sizes
        ):
            return cached.curve
        points = [p for p in job.throughput_history if p.replicas >= 1 and p.samples_per_s > 0]
        if not points:
            return self.prior_curve()
        sizes = frozenset(p.replicas for p in job.throughput_history)
        try:
            model = ScalingModel.from_points(points)
        except (ModelFitError, ValueError) as e:
            raise ModelFitError(f"job {job.key}: scaling model fit failed: {e}") from e
        self.curve_fits += 1
        curve = JobCurve(
            float(model.lambda_),
            float(model.sigma_),
            float(model.kappa_),
            measured=True,
            sizes=len({p.replicas for p in points}),
        )
        self._curves[job.key] = _FittedCurve(sizes, now_s, curve, float(model.relative_error_))
        return curve

    def forecast_gpus(self, queue: QueueState, headroom: Headroom, *, now_s: float) -> float:
        """The queue's forecast peak non-elastic demand over the headroom's horizon.

        Args:
            queue: the queue, with its demand history.
            headroom: the queue's headroom settings; no forecast when its quantile is unset.
            now_s: the reconcile time.

        Returns:
            GPUs at the configured quantile; 0 when no forecast is configured or possible.
        """
        quantile = headroom.forecast_quantile
        if quantile is None or not queue.demand_history:
            return 0.0
        cached = self._forecasts.get(queue.name)
        if (
            cached is None
            or now_s - cached.fitted_at_s >= self.refit_s
            or cached.quantile != quantile
            or cached.horizon_s != headroom.horizon_s
        ):
            forecaster: PeakForecaster | None
            try:
                forecaster = PeakForecaster(
                    quantile=quantile, horizon_s=headroom.horizon_s
                ).fit_points(queue.demand_history)
                reason = forecaster.reason_
            except (ModelFitError, ValueError) as e:
                # Remembered like a fit, so the next try (and warning) waits for the refit time.
                logger.warning(
                    "queue %s: demand forecast failed, no headroom until the next refit: %s",
                    queue.name,
                    e,
                )
                forecaster = None
                reason = f"no forecast until the next refit: {e}"
            self.forecast_fits += 1
            cached = _FittedForecast(now_s, quantile, headroom.horizon_s, forecaster, reason)
            self._forecasts[queue.name] = cached
        if cached.forecaster is None:
            self._last_forecast[queue.name] = 0.0
            return 0.0
        gpus = max(0.0, float(cached.forecaster.forecast_at(now_s)))
        self._last_forecast[queue.name] = gpus
        return gpus

    def accuracy(self) -> ModelAccuracy:
        """The cached models' own accuracy and the latest forecasts (no fit is done)."""
        coverage: dict[QueueName, float] = {}
        pinball: dict[QueueName, dict[str, float]] = {}
        choice: dict[QueueName, str] = {}
        for name, fitted in self._forecasts.items():
            forecaster = fitted.forecaster
            if forecaster is None:
                continue
            choice[name] = forecaster.choice_.value
            if forecaster.holdout_coverage_ is not None:
                coverage[name] = float(forecaster.holdout_coverage_)
            if forecaster.holdout_pinball_:
                pinball[name] = dict(forecaster.holdout_pinball_)
        return ModelAccuracy(
            scaling_relative_error={k: c.relative_error for k, c in self._curves.items()},
            forecast_coverage=coverage,
            forecast_gpus=dict(self._last_forecast),
            forecast_pinball_gpus=pinball,
            forecast_choice=choice,
        )

    def forget(self, keep: set[JobKey]) -> None:
        """Drop the curves of jobs that no longer exist."""
        for key in [k for k in self._curves if k not in keep]:
            del self._curves[key]
