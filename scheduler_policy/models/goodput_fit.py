"""The fit phase's goodput half: an adaptive-batch job's curve is its goodput, kept across rounds.

``ModelCache.fit`` asks :meth:`GoodputFits.curve` first for every running elastic job; a job it
answers None for (no bounds, statistics not yet enough, or a failed fit) gets its throughput
curve as before. A job's step model (:class:`~scheduler_policy.models.step_model.StepModel`) is
refitted when it was measured at a shape (nodes, replicas, micro batch) the last fit had not
seen, or ``refit_s`` after the last fit; the curve itself is rebuilt only when its inputs changed
(the gradient statistics, the current batch and size, the bounds, the node size).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field

from scheduler_policy.models.curve import JobCurve
from scheduler_policy.models.goodput import (
    GoodputCurve,
    goodput_curve,
    missing_input,
    remaining_progress,
    usable_step_times,
)
from scheduler_policy.models.step_model import StepModel
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import JobKey, JobState

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Fitted:
    shapes: frozenset[tuple[int, int, int]]
    fitted_at_s: float
    model: StepModel
    inputs: tuple[object, ...] = ()
    curve: JobCurve | None = None


@dataclass(slots=True)
class GoodputFits:
    """Per-job step models and goodput curves, with a count of the step-model fits.

    Attributes:
        refit_s: least time between two fits of a job's step model when no new shape was
            measured.
        fits: step-model fits done so far.
    """

    refit_s: float = 600.0
    fits: int = 0
    _jobs: dict[JobKey, _Fitted] = field(default_factory=dict)

    def curve(self, job: JobState, *, now_s: float, gpus_per_node: float) -> JobCurve | None:
        """The job's goodput as a scaling curve, or None when it has none (see the module
        docstring). A failed fit is logged and answers None: the throughput curve serves.

        Args:
            job: a running elastic job.
            now_s: the reconcile time.
            gpus_per_node: the cluster's node size.

        Returns:
            A curve whose values are progress per second (``JobCurve.goodput`` set), or None.
        """
        bounds, stats = job.batch_bounds, job.batch_statistics
        if bounds is None or stats is None or missing_input(bounds, stats) is not None:
            return None
        points = usable_step_times(stats)
        shapes = frozenset((p.nodes, p.replicas, p.local_batch_size) for p in points)
        cached = self._jobs.get(job.key)
        due = cached is None or now_s - cached.fitted_at_s >= self.refit_s
        if due or cached is None or not shapes <= cached.shapes:
            try:
                model = StepModel().fit(points)
            except ModelFitError as e:
                logger.warning(
                    "job %s: goodput step model failed, throughput serves: %s", job.key, e
                )
                self._jobs.pop(job.key, None)
                return None
            self.fits += 1
            cached = _Fitted(shapes, now_s, model)
            self._jobs[job.key] = cached
        # The table depends on the fitted model, not on the means it was fitted to (they drift
        # every round in production), nor on the progress (only the remaining work does).
        inputs = (
            bounds,
            stats.grad_sqr,
            stats.grad_var,
            stats.batch_size,
            shapes,
            cached.fitted_at_s,
            job.current_replicas,
            job.max_replicas,
            job.gpus_per_replica,
            gpus_per_node,
        )
        if cached.inputs != inputs:
            found = goodput_curve(
                bounds=bounds,
                statistics=stats,
                max_replicas=job.max_replicas,
                current_replicas=job.current_replicas,
                gpus_per_replica=job.gpus_per_replica,
                gpus_per_node=gpus_per_node,
                model=cached.model,
            )
            cached.inputs, cached.curve = inputs, None if found is None else as_job_curve(found)
        curve = cached.curve
        if curve is None or curve.goodput is None:
            return None
        remaining = remaining_progress(stats)
        if remaining != curve.goodput.remaining_progress:
            goodput = dataclasses.replace(curve.goodput, remaining_progress=remaining)
            curve = cached.curve = dataclasses.replace(curve, goodput=goodput)
        return curve

    def latest(self) -> dict[JobKey, GoodputCurve]:
        """Each job's goodput curve as the last fit phase served it (jobs served a throughput
        curve instead are left out)."""
        return {
            key: fitted.curve.goodput
            for key, fitted in sorted(self._jobs.items())
            if fitted.curve is not None and fitted.curve.goodput is not None
        }

    def forget(self, keep: set[JobKey]) -> None:
        """Drop the fits of jobs that no longer exist."""
        for key in [k for k in self._jobs if k not in keep]:
            del self._jobs[key]


def as_job_curve(curve: GoodputCurve) -> JobCurve:
    """A goodput curve as the curve ``decide`` reads: its table serves every size; λ is G(1)
    and σ the contention matched at two replicas (1 + σ = 2·G(1)/G(2)) for the placement code
    that ranks shrinks by it."""
    g1, g2 = curve.at(1), curve.at(2)
    sigma = max(0.0, 2.0 * g1 / g2 - 1.0) if g1 > 0 and g2 > 0 else 0.0
    return JobCurve(
        g1 if g1 > 0 else 1.0,
        sigma if math.isfinite(sigma) else 0.0,
        0.0,
        measured=True,
        sizes=curve.measured_sizes,
        goodput=curve,
    )
