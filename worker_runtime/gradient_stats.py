"""Gradient statistics of a step, ``grad_sqr`` and ``grad_var``, as AdaptDL takes them.

A step averages ``count`` micro-batch gradients ``g_1 .. g_count`` (``count`` = replicas x micro
batches each), each the mean gradient of ``b`` samples, into ``G_B``. With ``G`` the true gradient
and ``V`` the trace of one sample's gradient covariance,
``E|g_i|^2 = |G|^2 + V / b`` and ``E|G_B|^2 = |G|^2 + V / (count b)``, so from
``local`` (the mean of ``|g_i|^2``) and ``total`` (``|G_B|^2``):

- ``grad_sqr = (count total - local) / (count - 1)``, an unbiased estimate of ``|G|^2``;
- ``grad_var = (local - total) scale / (count - 1)`` with ``scale = count b / B0``, an unbiased
  estimate of ``V / B0``: the variance normalised to the initial batch ``B0``.

Each worker sums ``|g_i|^2`` of its own micro batches in parameter hooks, which see the gradient
before DDP all-reduces it; one all-reduce of two scalars per optimizer step adds them up. Both
estimates are smoothed by an exponential average with weight ``0.999 ** scale`` per step (a step of
``scale`` initial batches counts as that many) and bias correction (the average divided by the
sum of its weights), so the first steps are not pulled toward zero.

With one replica and one micro batch (``count = 1``) there is no second gradient in the step:
the previous step's gradient stands in (the differenced estimator). It costs one copy of every
gradient kept between steps (the model's size again in memory) and one more norm per step, and it
is biased: the two gradients are taken at different parameters, one update apart, so a fast-moving
model reads as noisier than it is. Estimates switch between the two estimators when the count
crosses 1; the averages then restart, since their biases differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

SMOOTHING = 0.999


@dataclass(frozen=True, slots=True)
class StepEstimate:
    """One step's raw estimates.

    Attributes:
        grad_sqr: Estimate of the squared norm of the true gradient.
        grad_var: Estimate of the gradient variance at the initial batch.
    """

    grad_sqr: float
    grad_var: float


def estimate(*, local_sqr: float, total_sqr: float, count: int, scale: float) -> StepEstimate:
    """The unbiased estimates from one step's squared norms (see the module docstring).

    Args:
        local_sqr: Mean of the micro-batch gradients' squared norms.
        total_sqr: Squared norm of their mean (the step's gradient).
        count: Micro-batch gradients averaged, ``>= 2``.
        scale: Samples of those gradients over the initial batch, ``> 0``.

    Returns:
        The step's ``grad_sqr`` and ``grad_var``.

    Raises:
        ValueError: When ``count < 2``, ``scale`` is not positive or a norm is not finite.
    """
    if count < 2:
        raise ValueError(f"count: must be >= 2 gradients, got {count}")
    if not scale > 0:
        raise ValueError(f"scale: must be > 0, got {scale}")
    if not (math.isfinite(local_sqr) and math.isfinite(total_sqr)):
        raise ValueError(f"squared norms: must be finite, got {local_sqr}, {total_sqr}")
    return StepEstimate(
        grad_sqr=(count * total_sqr - local_sqr) / (count - 1),
        grad_var=(local_sqr - total_sqr) * scale / (count - 1),
    )


@dataclass(frozen=True, slots=True)
class SmoothedStats:
    """Bias-corrected exponential averages of ``grad_sqr`` and ``grad_var``.

    Attributes:
        sqr_sum: Weighted sum of the ``grad_sqr`` estimates.
        var_sum: Weighted sum of the ``grad_var`` estimates.
        weight: Sum of the weights (``1 - prod(theta)``); 0 before the first step.
        differenced: Whether the estimates came from the differenced estimator.
    """

    sqr_sum: float = 0.0
    var_sum: float = 0.0
    weight: float = 0.0
    differenced: bool = False

    @property
    def ready(self) -> bool:
        """Whether at least one step was averaged."""
        return self.weight > 0.0

    @property
    def grad_sqr(self) -> float:
        """The averaged ``grad_sqr`` (``nan`` before the first step)."""
        return self.sqr_sum / self.weight if self.ready else math.nan

    @property
    def grad_var(self) -> float:
        """The averaged ``grad_var`` (``nan`` before the first step)."""
        return self.var_sum / self.weight if self.ready else math.nan

    def update(
        self, step: StepEstimate, *, scale: float, differenced: bool, smoothing: float = SMOOTHING
    ) -> SmoothedStats:
        """Average in one step.

        Args:
            step: The step's raw estimates.
            scale: The step's samples over the initial batch (its weight: ``smoothing ** scale``
                is kept of the past).
            differenced: Whether ``step`` came from the differenced estimator; a change of
                estimator restarts the averages.
            smoothing: Part of the past kept per initial batch of samples, in ``(0, 1)``.

        Returns:
            The new averages.
        """
        base = self if differenced == self.differenced else SmoothedStats(differenced=differenced)
        theta = smoothing**scale
        return replace(
            base,
            sqr_sum=theta * base.sqr_sum + (1.0 - theta) * step.grad_sqr,
            var_sum=theta * base.var_sum + (1.0 - theta) * step.grad_var,
            weight=theta * base.weight + (1.0 - theta),
        )

    def to_dict(self) -> dict[str, float | bool]:
        """Plain values for a checkpoint."""
        return {
            "sqr_sum": self.sqr_sum,
            "var_sum": self.var_sum,
            "weight": self.weight,
            "differenced": self.differenced,
        }

    @classmethod
    def from_dict(cls, data: dict[str, float | bool]) -> SmoothedStats:
        """The averages a checkpoint holds (see :meth:`to_dict`)."""
        return cls(
            sqr_sum=float(data["sqr_sum"]),
            var_sum=float(data["var_sum"]),
            weight=float(data["weight"]),
            differenced=bool(data["differenced"]),
        )
