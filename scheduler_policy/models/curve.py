"""What fitting a job's scaling model yields for the decision core: its curve's parameters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobCurve:
    """A job's fitted scaling curve, X(n) = λn / (1 + σ(n−1) + κn(n−1)).

    Attributes:
        lambda_samples_per_s: λ, throughput of one replica (1.0 when ``measured`` is False).
        sigma: σ, contention.
        kappa: κ, coherency delay.
        measured: whether λ comes from the job's own measurements.
        sizes: distinct replica counts the curve was fitted on (0 for the prior); from two on,
            its shape is the job's own too.
    """

    lambda_samples_per_s: float
    sigma: float
    kappa: float
    measured: bool
    sizes: int = 0
