"""AdaScale: learning rate and progress of a batch larger than the one the job was tuned for.

Pure arithmetic on the gradient statistics (no torch). With ``grad_sqr`` the squared norm of the
true gradient and ``grad_var`` the trace of the gradient's covariance at the *initial* batch
``B0`` (both estimated by :mod:`worker_runtime.gradient_stats`), a step at global batch
``B = scale * B0`` is worth

    ``gain(scale) = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)``

steps at ``B0`` (Johnson et al., "AdaScale SGD", ICML 2020; the rule AdaptDL's scaling rules
use): ``1 <= gain <= scale``, equal to ``scale`` when the gradient is all noise and to ``1`` when
it is noise-free. The statistical efficiency of ``B`` is ``gain / scale`` (Pollux's ``E``).

Progress is counted in scale-invariant iterations: each step adds its gain, so a schedule keyed
on progress (a warm-up over the first ``k`` iterations, a decay at iteration ``n``) means the same
thing whatever batch the run takes.

Learning rate: SGD (with or without momentum) multiplies the base rate by the gain; Adam-like
optimizers (Adam, AdamW, Adamax, NAdam, RAdam, RMSprop) by ``sqrt(scale)``, the square-root rule
for adaptive optimizers, and their moment estimates restart when the scale changes (see
:func:`worker_runtime.adaptive.reset_adam_state`). AdaptDL's own Adam rule takes ``sqrt(gain)``,
which is the more cautious of the two when the gradient is not all noise.
"""

from __future__ import annotations

import enum
import math

# Floor of grad_var: an estimate of zero noise (or a negative one from a noisy difference) would
# make the gain 1 at every scale and the efficiency vanish; AdaptDL floors it the same way.
VAR_FLOOR = 1e-6


class OptimizerKind(enum.Enum):
    """Which learning-rate rule an optimizer follows."""

    SGD = "sgd"
    ADAM = "adam"


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


def lr_factor(*, kind: OptimizerKind, gain_value: float, scale: float) -> float:
    """Factor on the base learning rate for one step.

    Args:
        kind: The optimizer's rule.
        gain_value: The step's gain (:func:`gain`).
        scale: Global batch over the initial batch, ``> 0``.

    Returns:
        ``gain_value`` for SGD, ``sqrt(scale)`` for Adam-like optimizers.

    Raises:
        ValueError: When ``scale`` is not positive.
    """
    if not scale > 0:
        raise ValueError(f"scale: must be > 0, got {scale}")
    if kind is OptimizerKind.SGD:
        return gain_value
    return math.sqrt(scale)
