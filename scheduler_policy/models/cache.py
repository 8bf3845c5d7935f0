"""The fit phase: fitted models kept across reconciles, so a steady state refits nothing.

``ModelCache.fit`` runs before ``decide`` and is the only stateful step of a reconcile: it hands
``decide`` a ``Fits`` value (a curve per job, a forecast per queue, and the jobs whose fit failed).

A job's scaling model (``NodeScalingModel``: compute plus sync inside and across nodes) is refitted
when it has run at a (replicas, nodes) the last fit had not seen, when the cluster's node size
changed, or when ``refit_s`` has passed since the last fit. Each refit first scores the previous fit
on the newest point (``ModelAccuracy.scaling_prediction_error``). The node size is the largest
node's allocatable GPUs in the observation, else ``default_gpus_per_node``. A queue's forecaster is
refitted when ``refit_s`` has passed since the last fit was asked for, or its quantile or horizon
changed. The fit runs where ``fitter`` runs it (``forecast_fit``): inline by default (the
simulator: the new fit serves at once), or on a background worker (``tide engine``). Until a fit
of the queue's settings has finished, the queue's headroom follows the recent peak (the most
demand over the last horizon); after, the last good fit serves until the next one is ready, and a
failed fit is logged and counted while the old one stays. Both models can be rebuilt from
Prometheus history, so the cache lives in memory only.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler_policy.models.curve import JobCurve
from scheduler_policy.models.forecast_fit import FitRequest, ForecastFitter, InlineFitter
from scheduler_policy.models.goodput_fit import GoodputFits
from scheduler_policy.models.node_scaling import SYNC_TERMS, NodeScalingModel, design
from scheduler_policy.models.peak_forecast import ForecastChoice, PeakForecaster
from scheduler_policy.policy.spec import ElasticPolicy, Headroom
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import (
    DemandPoint,
    JobKey,
    JobPhase,
    JobState,
    Observation,
    QueueName,
    QueueState,
    ThroughputPoint,
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
    sizes: frozenset[tuple[int, int | None]]  # (replicas, nodes) fitted on
    fitted_at_s: float
    curve: JobCurve
    relative_error: float  # the fit's mean |X̂ − X| / X over its points (NodeScalingModel)
    gpus_per_node: float
    prediction_error: float  # |X̂ − X| / X of the newest point, X̂ from the fit before it (NaN)


@dataclass(slots=True)
class _FittedForecast:
    fitted_at_s: float  # when the fit was asked for (its history ends there)
    quantile: float
    horizon_s: float
    forecaster: PeakForecaster
    reason: str


@dataclass(frozen=True, slots=True)
class ModelAccuracy:
    """How well the cached models fit, for the engine's own metrics.

    Attributes:
        scaling_relative_error: per fitted job, its scaling model's mean relative error over
            the points it was fitted to (``NodeScalingModel.relative_error_``).
        scaling_prediction_error: per job refitted at least twice, |X̂ − X| / X of the newest
            point its last fit used, X̂ predicted by the fit before it (an out-of-sample error).
        forecast_coverage: per queue whose forecaster was scored on held-out history, the
            fraction of held-out peaks at or below the served forecast
            (``PeakForecaster.holdout_coverage_``).
        forecast_gpus: per queue, the latest forecast peak demand.
        forecast_pinball_gpus: per queue scored on held-out history, each candidate's
            held-out pinball loss ("model", "recent_peak"), GPUs.
        forecast_choice: per queue with a forecast, the forecast it serves ("model" or
            "recent_peak"; "recent_peak" also before its first fit has finished).
        forecast_fit_failures: per queue, forecaster fits that failed so far.
        forecast_fit_duration_s: per queue, how long its last finished fit took, seconds.
    """

    scaling_relative_error: dict[JobKey, float]
    forecast_coverage: dict[QueueName, float]
    forecast_gpus: dict[QueueName, float]
    forecast_pinball_gpus: dict[QueueName, dict[str, float]] = field(default_factory=dict)
    forecast_choice: dict[QueueName, str] = field(default_factory=dict)
    scaling_prediction_error: dict[JobKey, float] = field(default_factory=dict)
    forecast_fit_failures: dict[QueueName, int] = field(default_factory=dict)
    forecast_fit_duration_s: dict[QueueName, float] = field(default_factory=dict)


@dataclass(slots=True)
class ModelCache:
    """Per-job scaling curves and per-queue forecasters, with counts of how often each was fitted.

    Attributes:
        refit_s: least time between two refits when nothing new was measured.
        curve_fits: scaling-model fits done so far.
        forecast_fits: forecaster fits finished so far (failed ones included).
        forecast_holdout: kept for callers of the earlier forecaster; every forecaster is now
            scored on its recent history (the same fit), so this changes nothing.
        default_gpus_per_node: the node size sizes are packed on when the observation lists
            no nodes.
        goodput: the adaptive-batch jobs' goodput fits; a job it has a curve for gets that
            curve instead of its throughput curve (``scheduler_policy.models.goodput_fit``).
        fitter: where forecaster fits run (``InlineFitter``: at once, in the reconcile).
    """

    refit_s: float = 600.0
    curve_fits: int = 0
    forecast_fits: int = 0
    forecast_holdout: bool = False
    default_gpus_per_node: float = 8.0
    goodput: GoodputFits = field(default_factory=GoodputFits)
    fitter: ForecastFitter = field(default_factory=InlineFitter)
    _curves: dict[JobKey, _FittedCurve] = field(default_factory=dict)
    _forecasts: dict[QueueName, _FittedForecast] = field(default_factory=dict)
    _priors: dict[tuple[float, float], JobCurve] = field(default_factory=dict)
    _last_forecast: dict[QueueName, float] = field(default_factory=dict)
    _asked: dict[QueueName, tuple[float, float, float]] = field(default_factory=dict)
    _reasons: dict[QueueName, str] = field(default_factory=dict)
    _fit_failures: dict[QueueName, int] = field(default_factory=dict)
    _fit_errors: dict[QueueName, str] = field(default_factory=dict)
    _fit_duration_s: dict[QueueName, float] = field(default_factory=dict)

    def prior_curve(
        self, *, gpus_per_replica: float = 1.0, gpus_per_node: float = math.inf
    ) -> JobCurve:
        """The curve assumed for a job not measured yet (λ = 1: shape only): the model's prior,
        capped across nodes at (1 + cap) times its throughput on one full node."""
        key = (gpus_per_replica, gpus_per_node)
        prior = self._priors.get(key)
        if prior is None:
            model = NodeScalingModel()
            per_node = 1.0
            if gpus_per_replica > 0 and math.isfinite(gpus_per_node):
                per_node = max(1.0, math.floor(gpus_per_node / gpus_per_replica + 1e-9))
            # The prior's own fit: one point on one full node at λ = 1 pins every term to it.
            model.fit([[per_node, 1.0]], [per_node / _prior_time(model, per_node)])
            prior = _curve_of(model, measured=False, sizes=0, gpus_per_node=gpus_per_node)
            self._priors[key] = prior
        return prior

    def gpus_per_node(self, observation: Observation) -> float:
        """The node size sizes are packed on: the largest allocatable GPUs among the
        observation's nodes, else ``default_gpus_per_node``."""
        sizes = [n.allocatable_gpus for n in observation.nodes if n.allocatable_gpus > 0]
        return max(sizes) if sizes else float(self.default_gpus_per_node)

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
        gpn = self.gpus_per_node(observation)
        curves: dict[JobKey, JobCurve] = {}
        failures: dict[JobKey, str] = {}
        for job in observation.jobs:
            if not job.elastic or job.phase is not JobPhase.RUNNING:
                continue  # never planned for: nothing to fit
            try:
                curves[job.key] = self.goodput.curve(
                    job, now_s=now_s, gpus_per_node=gpn
                ) or self.curve(job, now_s=now_s, gpus_per_node=gpn)
            except ModelFitError as e:
                failures[job.key] = str(e)
                logger.warning("%s", e)
        managed = {q.name: q for q in reversed(policy.queues)}  # the first of a name wins
        forecasts = {
            queue.name: self.forecast_gpus(queue, managed[queue.name].headroom, now_s=now_s)
            for queue in observation.queues
            if queue.name in managed
        }
        reasons = {name: self._reasons[name] for name in forecasts if name in self._reasons}
        return Fits(
            curves=curves, failures=failures, forecast_gpus=forecasts, forecast_reasons=reasons
        )

    def curve(self, job: JobState, *, now_s: float, gpus_per_node: float | None = None) -> JobCurve:
        """The job's scaling curve, refitted only when something new was measured.

        Args:
            job: the job, with its throughput history.
            now_s: the reconcile time.
            gpus_per_node: the cluster's node size; None for ``default_gpus_per_node``.

        Returns:
            The fitted curve, or the prior when the job has no usable measurement.

        Raises:
            ModelFitError: the fit failed; the message names the job and the error.
        """
        gpn = float(self.default_gpus_per_node if gpus_per_node is None else gpus_per_node)
        cached = self._curves.get(job.key)
        # The steady state: no (replicas, nodes) measured that the last fit had not seen.
        if (
            cached is not None
            and now_s - cached.fitted_at_s < self.refit_s
            and cached.gpus_per_node == gpn
            and {(p.replicas, p.nodes) for p in job.throughput_history} <= cached.sizes
        ):
            return cached.curve
        points = [p for p in job.throughput_history if p.replicas >= 1 and p.samples_per_s > 0]
        if not points:
            return self.prior_curve(gpus_per_replica=job.gpus_per_replica, gpus_per_node=gpn)
        sizes = frozenset((p.replicas, p.nodes) for p in job.throughput_history)
        try:
            model = NodeScalingModel.from_points(
                points, gpus_per_replica=job.gpus_per_replica, gpus_per_node=gpn
            )
        except (ModelFitError, ValueError) as e:
            raise ModelFitError(f"job {job.key}: scaling model fit failed: {e}") from e
        self.curve_fits += 1
        curve = _curve_of(
            model, measured=True, sizes=len({p.replicas for p in points}), gpus_per_node=gpn
        )
        error = math.nan
        if cached is not None:
            newest = max(points, key=lambda p: p.time_s)
            error = _prediction_error(cached.curve, newest, job.gpus_per_replica)
        self._curves[job.key] = _FittedCurve(
            sizes, now_s, curve, float(model.relative_error_), gpn, error
        )
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
        name = queue.name
        self._collect(name)
        asked = self._asked.get(name)
        due = (
            asked is None
            or now_s - asked[0] >= self.refit_s
            or asked[1:] != (quantile, headroom.horizon_s)
        )
        if due and not self.fitter.in_flight(name):
            request = FitRequest(name, quantile, headroom.horizon_s, now_s, queue.demand_history)
            if self.fitter.submit(request):
                # Remembered when asked, so a failed fit is retried at the next refit time.
                self._asked[name] = (now_s, quantile, headroom.horizon_s)
                self._collect(name)  # an inline fit has finished already
        cached = self._forecasts.get(name)
        if cached is not None and (cached.quantile, cached.horizon_s) == (
            quantile,
            headroom.horizon_s,
        ):
            gpus = max(0.0, float(cached.forecaster.forecast_at(now_s)))
            self._reasons[name] = cached.reason
        else:
            gpus = _recent_peak_gpus(queue.demand_history, horizon_s=headroom.horizon_s)
            why = self._fit_errors.get(name)
            self._reasons[name] = (
                f"recent peak over the last {headroom.horizon_s / 60:.0f} min, not recalibrated: "
                + ("the fit is still running" if why is None else f"the last fit failed: {why}")
            )
        self._last_forecast[name] = gpus
        return gpus

    def _collect(self, name: QueueName) -> None:
        """Take the queue's finished fit, if any: a good one serves from now, a failed one is
        logged and counted and the previous fit stays."""
        outcome = self.fitter.take(name)
        if outcome is None:
            return
        self.forecast_fits += 1
        self._fit_duration_s[name] = outcome.duration_s
        request = outcome.request
        if outcome.forecaster is None:
            self._fit_failures[name] = self._fit_failures.get(name, 0) + 1
            self._fit_errors[name] = outcome.error or "unknown error"
            kept = "the previous fit stays" if name in self._forecasts else "the recent peak serves"
            logger.warning("%s; %s until the next refit", outcome.error, kept)
            return
        self._fit_errors.pop(name, None)
        self._forecasts[name] = _FittedForecast(
            request.asked_s,
            request.quantile,
            request.horizon_s,
            outcome.forecaster,
            outcome.forecaster.reason_,
        )

    def accuracy(self) -> ModelAccuracy:
        """The cached models' own accuracy and the latest forecasts (no fit is done)."""
        coverage: dict[QueueName, float] = {}
        pinball: dict[QueueName, dict[str, float]] = {}
        choice: dict[QueueName, str] = {}
        for name in self._last_forecast:
            choice[name] = ForecastChoice.RECENT_PEAK.value  # until a fit serves
        for name, fitted in self._forecasts.items():
            forecaster = fitted.forecaster
            choice[name] = forecaster.choice_.value
            if forecaster.holdout_coverage_ is not None:
                coverage[name] = float(forecaster.holdout_coverage_)
            if forecaster.holdout_pinball_:
                pinball[name] = dict(forecaster.holdout_pinball_)
        return ModelAccuracy(
            scaling_relative_error={k: c.relative_error for k, c in self._curves.items()},
            scaling_prediction_error={
                k: c.prediction_error
                for k, c in self._curves.items()
                if math.isfinite(c.prediction_error)
            },
            forecast_coverage=coverage,
            forecast_gpus=dict(self._last_forecast),
            forecast_pinball_gpus=pinball,
            forecast_choice=choice,
            forecast_fit_failures=dict(self._fit_failures),
            forecast_fit_duration_s=dict(self._fit_duration_s),
        )

    def forget(self, keep: set[JobKey]) -> None:
        """Drop the curves of jobs that no longer exist."""
        for key in [k for k in self._curves if k not in keep]:
            del self._curves[key]
        self.goodput.forget(keep)


def _recent_peak_gpus(points: tuple[DemandPoint, ...], *, horizon_s: float) -> float:
    """The most demand over the last ``horizon_s`` of ``points`` (oldest first), GPUs: the
    forecast before any fit, as the fallback forecast reads it (``demand_grid.recent_peak``)."""
    newest_s = points[-1].time_s
    recent = [p.gpus for p in points if p.time_s > newest_s - horizon_s]
    return max(0.0, max(recent, default=points[-1].gpus))


def _prior_time(model: NodeScalingModel, replicas: float) -> float:
    """k / X(k, 1) under the model's prior with a = 1: 1 + Σ prior term × its design column."""
    cols = design(replicas, 1.0)
    prior = [float(getattr(model, f"prior_{t}")) for t in SYNC_TERMS]
    return float(cols[0] + sum(c * p for c, p in zip(cols[1:], prior, strict=True)))


def _curve_of(
    model: NodeScalingModel, *, measured: bool, sizes: int, gpus_per_node: float
) -> JobCurve:
    """The fitted model as the curve ``decide`` reads."""
    sync = tuple(float(t) for t in model.terms_)
    # σ for the placement code's USL: the single-node curve matched at two replicas,
    # 1 + σ = 2/X(2, 1) per λ = 1 + p_r/2.
    return JobCurve(
        float(model.lambda_),
        sync[0] / 2.0,
        0.0,
        measured=measured,
        sizes=sizes,
        sync=sync,
        cross_node_max_samples_per_s=float(model.cross_node_max_),
        gpus_per_node=gpus_per_node,
    )


def _prediction_error(curve: JobCurve, point: ThroughputPoint, gpus_per_replica: float) -> float:
    """|X̂ − X| / X of ``point`` under ``curve`` (its nodes, else packed); NaN when unusable."""
    nodes = None if point.nodes is None else float(point.nodes)
    predicted = float(
        curve.throughput(float(point.replicas), gpus_per_replica=gpus_per_replica, nodes=nodes)
    )
    if not (math.isfinite(predicted) and point.samples_per_s > 0):
        return math.nan
    return abs(predicted - point.samples_per_s) / point.samples_per_s
