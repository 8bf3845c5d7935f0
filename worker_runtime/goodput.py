"""The batch a worker group takes at its size: the candidate with the best goodput (pure, no torch).

Defined in :mod:`scheduler_policy.models.batch_choice` (candidates, the step-time model, the
choice and its switch rule), so that the engine predicts the worker's own choice with the very
same code; re-exported here for the worker runtime.
"""

from __future__ import annotations

from scheduler_policy.models.batch_choice import (
    EXPLORE_FACTOR,
    LOCAL_CANDIDATES,
    MAX_ACCUMULATION,
    SWITCH_SPEEDUP,
    BatchChoice,
    StepSample,
    StepTimeModel,
    StepTimePredictor,
    candidates,
    choose,
    first_choice,
    geometric_sizes,
    goodput,
)

__all__ = [
    "EXPLORE_FACTOR",
    "LOCAL_CANDIDATES",
    "MAX_ACCUMULATION",
    "SWITCH_SPEEDUP",
    "BatchChoice",
    "StepSample",
    "StepTimeModel",
    "StepTimePredictor",
    "candidates",
    "choose",
    "first_choice",
    "geometric_sizes",
    "goodput",
]
