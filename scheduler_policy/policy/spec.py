"""The ElasticPolicy a cluster admin writes, as frozen dataclasses.

Parsing lives in ``policy_file``; this module only says what a policy is. Durations are seconds
(``*_s``), GPU amounts are whole or fractional GPUs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from scheduler_policy.vocabulary.state import QueueName


class Objective(str, enum.Enum):
    """What the allocator's greedy ranks replicas by.

    ``completionTime`` (the default): a replica's relative speedup per GPU divided by the job's
    expected remaining time, so jobs nearer completion come first — shortest-remaining-time-
    first, which is what minimises average completion time. ``speedup``: relative speedup per
    GPU alone, which spreads GPUs in proportion to how well jobs scale, whatever their length.
    """

    COMPLETION_TIME = "completionTime"
    SPEEDUP = "speedup"


@dataclass(frozen=True, slots=True)
class Defaults:
    """Damping and cost settings that apply to every job unless a job's annotations override them.

    Attributes:
        tolerance: the least predicted relative throughput gain worth a rescale (0.05 = 5%).
        restart_cost_s: seconds of progress a membership change costs a job.
        cooldown_s: least time between two rescales of one job.
        max_step_up: most replicas added to one job in one decision, while its scaling curve
            is a prediction (not yet measured at two sizes); a measured job moves in one step,
            since every change restarts it whatever the step.
        max_step_down: likewise, most replicas removed.
        window_up_s: scale up only to the lowest target recommended over this window.
        window_down_s: scale down only to the highest target recommended over this window.
        assumed_remaining_s: remaining run time assumed for a job that does not report its progress.
    """

    tolerance: float = 0.05
    restart_cost_s: float = 30.0
    cooldown_s: float = 300.0
    max_step_up: int = 4
    max_step_down: int = 2
    window_up_s: float = 0.0
    window_down_s: float = 300.0
    assumed_remaining_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Headroom:
    """GPUs a queue keeps free of elastic growth for its non-elastic work.

    Attributes:
        gpus: a fixed number of GPUs.
        forecast_quantile: if set, also keep the forecast demand at this quantile (0 < q < 1).
        horizon_s: how far ahead the forecast looks.
    """

    gpus: float = 0.0
    forecast_quantile: float | None = None
    horizon_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """How tide treats one Volcano Queue.

    Attributes:
        name: the queue's name.
        elastic: whether tide scales this queue's jobs at all.
        borrow: whether its jobs may grow into idle GPUs beyond the queue's deserved share.
        headroom: GPUs kept free for non-elastic work.
        max_elastic_gpus: a cap on the GPUs the queue's elastic jobs hold together; None for none.
    """

    name: QueueName
    elastic: bool = True
    borrow: bool = False
    headroom: Headroom = field(default_factory=Headroom)
    max_elastic_gpus: float | None = None


@dataclass(frozen=True, slots=True)
class ElasticPolicy:
    """A whole policy file.

    Attributes:
        name: ``metadata.name``.
        interval_s: seconds between two reconciles.
        model_refit_s: least time between two refits of one job's scaling model when nothing new
            was measured.
        objective: what the allocator ranks replicas by.
        defaults: settings for every job.
        queues: the queues tide manages; jobs in other queues are left alone.
    """

    name: str = "default"
    interval_s: float = 60.0
    model_refit_s: float = 600.0
    objective: Objective = Objective.COMPLETION_TIME
    defaults: Defaults = field(default_factory=Defaults)
    queues: tuple[QueuePolicy, ...] = ()

    def queue(self, name: QueueName) -> QueuePolicy | None:
        """The policy for queue ``name``, or None when tide does not manage it."""
        for queue in self.queues:
            if queue.name == name:
                return queue
        return None
