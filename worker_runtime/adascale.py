"""AdaScale: learning rate and progress of a batch larger than the one the job was tuned for.

Pure arithmetic on the gradient statistics (no torch). With ``grad_sqr`` the squared norm of the
true gradient and ``grad_var`` the trace of the gradient's covariance at the *initial* batch
``B0`` (both estimated by :mod:`worker_runtime.gradient_stats`), a step at global batch
``B = scale * B0`` is worth

    ``gain(scale) = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)``

steps at ``B0`` (Johnson et al., "AdaScale SGD", ICML 2020; the rule AdaptDL's scaling rules
use): ``1 <= gain <= scale``, equal to ``scale`` when the gradient is all noise and to ``1`` when
it is noise-free. The statistical efficiency of ``B`` is ``gain / scale`` (Pollux's ``E``).
Both are defined once, in :mod:`scheduler_policy.models.efficiency`, where the engine predicts
this worker's goodput with the same arithmetic.

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

# One definition of the gain and the efficiency, shared with the engine (which predicts this
# worker's goodput with them); re-exported here for the worker's own callers.
from scheduler_policy.models.efficiency import VAR_FLOOR, efficiency, gain

__all__ = ["VAR_FLOOR", "OptimizerKind", "efficiency", "gain", "lr_factor"]


class OptimizerKind(enum.Enum):
    """Which learning-rate rule an optimizer follows."""

    SGD = "sgd"
    ADAM = "adam"


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
