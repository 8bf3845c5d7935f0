"""Statistical efficiency of a batch larger than the one a job was tuned for (AdaScale; pure).

With ``grad_sqr`` the squared norm of the true gradient and ``grad_var`` the trace of the
gradient's covariance at the *initial* batch ``B0`` (both estimated by the worker runtime's
``worker_runtime.gradient_stats``), a step at global batch ``B = scale * B0`` is worth

    ``gain(scale) = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)``

steps at ``B0`` (Johnson et al., "AdaScale SGD", ICML 2020; the rule AdaptDL's scaling rules
use): ``1 <= gain <= scale``, equal to ``scale`` when the gradient is all noise and to ``1`` when
it is noise-free. The statistical efficiency of ``B`` is ``gain / scale`` (Pollux's ``E``).

One definition for the worker (which sets its learning rate and counts its progress with it,
``worker_runtime.adascale``) and the engine (which predicts the worker's goodput with it,
:mod:`scheduler_policy.models.goodput`); no torch here.
"""

from __future__ import annotations

import math

# Floor of grad_var: an estimate of zero noise (or a negative one from a noisy difference) would
# make the gain 1 at every scale and the efficiency vanish; AdaptDL floors it the same way.
VAR_FLOOR = 1e-6


def gain(*, grad_sqr: float, grad_var: float, scale: float) -> float:
    """Steps at the initial batch one step at ``scale`` times that batch is worth.

    Args:
        grad_sqr: Squared norm of the true gradient (negative estimates count as 0).
        grad_var: Gradient variance at the initial batch (floored at :data:`VAR_FLOOR`).
        scale: Global batch over the initial batch, ``> 0``.

    Returns:
        The gain, between ``min(1, scale)`` and ``max(1, scale)``.

    Raises:
        ValueError: When ``scale`` is not positive or a statistic is not finite.
    """
    if not scale > 0:
        raise ValueError(f"scale: must be > 0, got {scale}")
    if not (math.isfinite(grad_sqr) and math.isfinite(grad_var)):
        raise ValueError(f"gradient statistics: must be finite, got {grad_sqr}, {grad_var}")
    sqr = max(grad_sqr, 0.0)
    var = max(grad_var, VAR_FLOOR)
    return (var + sqr) / (var / scale + sqr)


def efficiency(*, grad_sqr: float, grad_var: float, scale: float) -> float:
    """Statistical efficiency of a batch ``scale`` times the initial one: ``gain / scale``.

    Args:
        grad_sqr: Squared norm of the true gradient.
        grad_var: Gradient variance at the initial batch.
        scale: Global batch over the initial batch, ``> 0``.

    Returns:
        Progress per sample relative to the initial batch, in ``(0, 1]`` for ``scale >= 1``.

    Raises:
        ValueError: As :func:`gain`.
    """
    return gain(grad_sqr=grad_sqr, grad_var=grad_var, scale=scale) / scale
