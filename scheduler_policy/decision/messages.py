"""The sentence for people that goes with each decision's reason (logs, Events, `tide plan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler_policy.decision.budget import QueueBudget
from scheduler_policy.decision.placement import GangFit
from scheduler_policy.models.goodput import GoodputColumns
from scheduler_policy.policy.spec import Defaults
from scheduler_policy.vocabulary.state import JobKey, JobState, PendingGang, QueueName, Reason


@dataclass(frozen=True, slots=True)
class DecisionBatch:
    """The explanation of one round's allocator decisions, all of them: what their sentences are
    made from, as columns (one entry per job), and the budget of each queue.

    Every decision of the round carries this one object as its ``why`` and it writes the
    sentence of whichever job is asked for, when someone reads it. Most of a large round's
    decisions are holds whose sentence nobody reads.
    """

    reasons: Sequence[Reason]
    jobs: Sequence[JobState]
    targets: Sequence[int]
    recommended: Sequence[int]
    gains: Sequence[float]
    next_gains: Sequence[float]
    budgets: Mapping[QueueName, QueueBudget]
    measured: Sequence[bool]
    defaults: Defaults
    goodput: GoodputColumns | None = None
    # Each job's position in the columns, filled when the first sentence is asked for.
    _rows: dict[JobKey, int] = field(default_factory=dict, init=False, compare=False, repr=False)

    def render(self, job: JobKey) -> str:
        """See base class (``Explanation``): ``job``'s sentence; see ``decision_message``.

        Raises:
            KeyError: ``job`` has no decision in this batch.
        """
        if not self._rows:
            self._rows.update((state.key, i) for i, state in enumerate(self.jobs))
        index = self._rows.get(job)
        if index is None:
            raise KeyError(f"job {job} has no decision in this round's batch")
        state = self.jobs[index]
        return decision_message(
            self.reasons[index],
            job=state,
            target=self.targets[index],
            recommended=self.recommended[index],
            gain=self.gains[index],
            next_gain=self.next_gains[index],
            budget=self.budgets[state.queue],
            defaults=self.defaults,
            measured=self.measured[index],
            goodput_batch=(
                None if self.goodput is None else self.goodput.batch(index, self.targets[index])
            ),
        )


def _gpus(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


def not_measured_message(job: JobState) -> str:
    """The sentence of a job that holds because no throughput of it was measured yet."""
    return (
        f"job {job.key}: no throughput measured yet; holding {job.current_replicas} replicas "
        "until the first measurement (no growth on the prior scaling curve alone)"
    )


def decision_message(
    reason: Reason,
    *,
    job: JobState,
    target: int,
    recommended: int,
    gain: float,
    next_gain: float,
    budget: QueueBudget,
    defaults: Defaults,
    measured: bool,
    goodput_batch: int | None = None,
) -> str:
    """One sentence saying why ``job`` goes to ``target`` replicas.

    Args:
        reason: the decision's reason.
        job: the job.
        target: the final target.
        recommended: the allocator's target before damping.
        gain: predicted relative throughput change from current to ``recommended``.
        next_gain: relative speedup of one more replica above ``recommended``.
        budget: the job's queue budget.
        defaults: the policy's defaults.
        measured: whether the job's scaling curve comes from its own measurements.
        goodput_batch: set when the job's curve is its goodput (it adapts its batch): the
            global batch its workers would take at ``target`` replicas.

    Returns:
        The sentence.
    """
    curve = "" if measured else " (no throughput measured yet: prior scaling curve)"
    what, note = "throughput", ""
    if goodput_batch is not None:
        what = "goodput"
        curve = note = (
            f" (goodput curve: progress per second at the batch its workers would take, "
            f"{goodput_batch} at {target} replicas)"
        )
    queue = f"queue {budget.queue}"
    if reason is Reason.SCALE_UP_FOR_IDLE_GPUS:
        return (
            f"{queue} has room for elastic growth; {target} replicas predicted "
            f"{gain:+.0%} {what}{curve}"
        )
    if reason is Reason.SHRINK_FOR_PENDING_WORK:
        return (
            f"pending work needs {_gpus(budget.pending_gpus)} GPU(s) of {queue}; "
            f"giving back replicas gracefully before Volcano's reclaim would kill them"
        )
    if reason is Reason.SHRINK_FOR_HEADROOM:
        kept = f"{queue} keeps {_gpus(budget.headroom_gpus)} GPU(s) of headroom for its demand"
        return f"{kept}; its forecast: {budget.forecast_reason}" if budget.forecast_reason else kept
    if reason is Reason.SHRINK_OVER_BUDGET:
        return (
            f"{queue}'s elastic jobs hold more than its budget of "
            f"{_gpus(budget.elastic_gpus)} GPU(s)"
        )
    if reason is Reason.SHRINK_FOR_BETTER_USE:
        return (
            f"its last replicas would speed up other jobs of {queue} far more than they speed "
            f"up this one; {target} replicas predicted {gain:+.0%}{note}"
        )
    if reason is Reason.SHRINK_LOW_EFFICIENCY:
        return f"the last replicas slow the job down; {target} replicas predicted {gain:+.0%}{note}"
    if reason is Reason.RESTART_COST_EXCEEDS_GAIN:
        return (
            f"one more replica would add {next_gain:+.0%} {what}, less than a "
            f"{_restart_cost(job, defaults):g}s restart is worth over the remaining run{curve}"
        )
    if reason is Reason.WITHIN_TOLERANCE:
        return (
            f"{recommended} replicas predicted {gain:+.0%} {what}, within the "
            f"{defaults.tolerance:.0%} tolerance"
        )
    if reason is Reason.LIMITED_BY_BOUNDS:
        return f"kept within [{job.min_replicas}, {job.max_replicas}] replicas"
    if reason is Reason.LIMITED_BY_RATE:
        return (
            f"wanted {recommended}; moving at most +{defaults.max_step_up}/"
            f"-{defaults.max_step_down} replicas per decision"
        )
    if reason is Reason.COOLDOWN:
        return (
            f"wanted {recommended}; rescaled at {job.last_rescale_s:g}s, "
            f"cooldown is {defaults.cooldown_s:g}s"
        )
    if reason is Reason.STABILIZATION_WINDOW:
        return f"wanted {recommended}; recent recommendations disagree, holding at {target}"
    if reason is Reason.WITHDRAW_UNPLACED:
        waiting = job.current_replicas - job.held_replicas
        return (
            f"withdrawing {job.current_replicas - target} of {waiting} replica(s) still waiting "
            f"for GPUs, which restarts nothing; the job keeps the {job.held_replicas} it runs "
            f"(more would not fit {queue}'s budget and idle GPUs, or not be worth a restart)"
        )
    if reason is Reason.AT_TARGET:
        return f"{target} replicas fit {queue}'s budget and are worth their GPUs{curve}"
    return str(reason.value)


def _restart_cost(job: JobState, defaults: Defaults) -> float:
    return defaults.restart_cost_s if job.restart_cost_s is None else job.restart_cost_s


def _gang(gang: PendingGang) -> str:
    return f"pending gang {gang.key} ({gang.min_member} x {_gpus(gang.gpus_per_pod)} GPU(s))"


@dataclass(frozen=True, slots=True)
class GangShapeWhy:
    """The explanation of a job shrunk further so that pending gangs fit on whole nodes
    (``Reason.SHRINK_FOR_GANG_SHAPE``).

    Attributes:
        job: the job.
        queue: its queue.
        target: its new target.
        settled: the target its queue's budget alone gave it.
        extra_gpus: GPUs it gives up beyond that budget.
        gangs: the gangs it shrinks for, with what each one's further shrinks cost in all.
    """

    job: JobKey
    queue: QueueName
    target: int
    settled: int
    extra_gpus: float
    gangs: tuple[GangFit, ...]

    def render(self, job: JobKey) -> str:
        """See base class (``Explanation``): the sentence of ``self.job``, whichever job asks."""
        return gang_shape_message(self)


def gang_shape_message(why: GangShapeWhy) -> str:
    """One sentence saying which gangs a further shrink makes room for, on which nodes, and
    what it costs beyond the queue's budget.

    Args:
        why: the job's explanation.

    Returns:
        The sentence.
    """
    gangs = []
    for fit in why.gangs:
        nodes = ", ".join(fit.freed_nodes) or "its nodes"
        alone = fit.shrunk == (why.job,)
        total = (
            "" if alone else f"; its further shrinks give up {_gpus(fit.extra_gpus)} GPU(s) in all"
        )
        gangs.append(f"{_gang(fit.gang)} needs whole nodes: this frees {nodes} for it{total}")
    return (
        f"{'; '.join(gangs)}; Volcano deletes the highest task indices first, so "
        f"{why.target} replicas, not the {why.settled} that queue {why.queue}'s budget leaves: "
        f"{_gpus(why.extra_gpus)} GPU(s) beyond the budget"
    )


def gang_fit_message(fit: GangFit) -> str:
    """One sentence on whether a pending gang's pods fit the nodes after this round's targets.

    Args:
        fit: what the shape problem found for the gang.

    Returns:
        The sentence.
    """
    if not fit.fits:
        return f"{_gang(fit.gang)} cannot be placed: {fit.problem}; changing nothing for it"
    if not fit.shrunk:
        return f"{_gang(fit.gang)} fits on {', '.join(fit.nodes) or 'no node'} as planned"
    return (
        f"{_gang(fit.gang)} fits on {', '.join(fit.nodes)} once {', '.join(fit.shrunk)} "
        f"shrink further, {_gpus(fit.extra_gpus)} GPU(s) beyond the budgets"
    )
