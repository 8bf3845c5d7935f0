"""The scheduler extender, pure: Volcano's ``reclaimable``/``preemptable`` bodies and tide's answer.

No network here: ``tide.engine.http`` serves it.
"""

from scheduler_policy.extender.answer import (
    DEFAULT_GRACE_MARGIN_S,
    VERBS,
    Answer,
    AnswerReason,
    Extender,
    ExtenderView,
    ShrinkingJob,
)
from scheduler_policy.extender.bodies import (
    MAX_BODY_BYTES,
    BodyError,
    EvictionRequest,
    ExtenderError,
    Task,
    parse_eviction,
)

__all__ = [
    "DEFAULT_GRACE_MARGIN_S",
    "MAX_BODY_BYTES",
    "VERBS",
    "Answer",
    "AnswerReason",
    "BodyError",
    "EvictionRequest",
    "Extender",
    "ExtenderError",
    "ExtenderView",
    "ShrinkingJob",
    "Task",
    "parse_eviction",
]
