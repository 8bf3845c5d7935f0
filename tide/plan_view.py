"""How ``tide plan`` shows a plan: a table whose reasons and messages are whole at any width
and in a file, and a JSON document that also carries what the table cannot (each queue's
budget, headroom and forecast)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from scheduler_policy.decision.pipeline import Plan
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.state import Observation, QueueName


@dataclass(frozen=True, slots=True)
class QueueView:
    """One managed queue as the engine planned for it this round.

    Attributes:
        queue: the queue.
        elastic_budget_gpus: GPUs its elastic jobs may hold together (mins included), with
            what the round gives back to other queues counted (the budgets decide settled on).
        limit_gpus: what Volcano would let it use (capability, or the deserved share when it
            may not borrow).
        held_nonelastic_gpus: GPUs its non-elastic work holds.
        pending_gpus: GPUs its pending work needs to start.
        headroom_gpus: GPUs kept free of elastic growth (the fixed headroom and the forecast).
        fixed_headroom_gpus: the policy's ``headroom.gpus``.
        forecast_gpus: forecast non-elastic demand over the headroom's horizon, at its
            quantile; 0 when the policy sets no ``forecastQuantile`` or there is no history.
        forecast_quantile: the policy's ``headroom.forecastQuantile``; None for none.
        forecast_horizon_s: how far ahead the forecast looks.
        forecast_reason: which forecast it follows (learned model or recent peak) and why;
            "" without a forecast.
    """

    queue: QueueName
    elastic_budget_gpus: float
    limit_gpus: float
    held_nonelastic_gpus: float
    pending_gpus: float
    headroom_gpus: float
    fixed_headroom_gpus: float
    forecast_gpus: float
    forecast_quantile: float | None
    forecast_horizon_s: float
    forecast_reason: str = ""


def queue_views(observation: Observation, policy: ElasticPolicy, plan: Plan) -> list[QueueView]:
    """Each managed queue's budget, headroom and forecast, as ``decide`` used them.

    Args:
        observation: the cluster as observed.
        policy: the policy in force.
        plan: what ``decide`` returned for them (its budgets and forecasts).

    Returns:
        One view per queue of the observation that the policy manages, in the observation's
        order.
    """
    budgets, forecasts = plan.budgets, plan.forecast_gpus
    views = []
    for queue in observation.queues:
        budget, queue_policy = budgets.get(queue.name), policy.queue(queue.name)
        if budget is None or queue_policy is None:
            continue
        views.append(
            QueueView(
                queue=queue.name,
                elastic_budget_gpus=budget.elastic_gpus,
                limit_gpus=budget.limit_gpus,
                held_nonelastic_gpus=budget.held_nonelastic_gpus,
                pending_gpus=budget.pending_gpus,
                headroom_gpus=budget.headroom_gpus,
                fixed_headroom_gpus=queue_policy.headroom.gpus,
                forecast_gpus=forecasts.get(queue.name, 0.0),
                forecast_quantile=queue_policy.headroom.forecast_quantile,
                forecast_horizon_s=queue_policy.headroom.horizon_s,
                forecast_reason=plan.forecast_reasons.get(queue.name, ""),
            )
        )
    return views


def plan_renderable(plan: Plan) -> Group:
    """The plan for a terminal or a file: per decision, a line with the job, its replicas and
    the reason, then the message below it, indented. Nothing is cropped at any width: a line
    wraps at spaces and a word longer than the line folds onto the next (COLUMNS=60, or 80
    when the output goes to a file); the reason, an identifier to grep for, stays on one line
    whenever the width allows.

    Args:
        plan: what ``decide`` returned.

    Returns:
        What to print.
    """
    jobs = max((len(d.job) for d in plan.decisions), default=0)
    arrows = [f"{d.current_replicas} → {d.target_replicas}" for d in plan.decisions]
    wide = max(map(len, arrows), default=0)
    parts: list[Text | Padding] = [Text("tide plan", style="bold")]
    if not plan.decisions:
        parts.append(Text("no elastic jobs to decide for"))
    for d, arrow in zip(plan.decisions, arrows, strict=True):
        style = (
            "green"
            if d.target_replicas > d.current_replicas
            else ("yellow" if d.target_replicas < d.current_replicas else "")
        )
        line = Text.assemble(
            (d.job.ljust(jobs), "bold"), "  ", (arrow.rjust(wide), style), "  ", d.reason.value
        )
        line.overflow = "fold"
        message = Text(d.message, overflow="fold")
        parts += [line, Padding(message, (0, 0, 0, 4), expand=False)]
    return Group(*parts)


def plan_document(plan: Plan, queues: list[QueueView]) -> dict[str, object]:
    """The plan as ``tide plan --json`` prints it.

    Args:
        plan: what ``decide`` returned.
        queues: each managed queue's budget, headroom and forecast (``queue_views``).

    Returns:
        ``{"decisions": [...], "queues": [...]}``; GPUs and seconds in the keys' units.
    """
    return {
        "decisions": [
            {
                "job": d.job,
                "current_replicas": d.current_replicas,
                "target_replicas": d.target_replicas,
                "reason": d.reason.value,
                "message": d.message,
            }
            for d in plan.decisions
        ],
        "queues": [
            {
                "queue": q.queue,
                "elastic_budget_gpus": q.elastic_budget_gpus,
                "limit_gpus": q.limit_gpus,
                "held_nonelastic_gpus": q.held_nonelastic_gpus,
                "pending_gpus": q.pending_gpus,
                "headroom_gpus": q.headroom_gpus,
                "headroom": {
                    "fixed_gpus": q.fixed_headroom_gpus,
                    "forecast_gpus": q.forecast_gpus,
                    "forecast_quantile": q.forecast_quantile,
                    "forecast_horizon_s": q.forecast_horizon_s,
                    "forecast_reason": q.forecast_reason,
                },
            }
            for q in queues
        ],
    }
