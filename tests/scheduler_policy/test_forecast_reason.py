"""The engine says which forecast a queue's headroom follows and why: in the fit phase's
``Fits``, in the plan, and in the sentence of a decision that shrinks for headroom."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_policy.decision.budget import QueueBudget
from scheduler_policy.decision.messages import decision_message
from scheduler_policy.decision.pipeline import decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import Headroom
from scheduler_policy.vocabulary.state import DemandPoint, Reason
from tests.scheduler_policy.builders import (
    NOW_S,
    make_job,
    make_observation,
    make_policy,
    make_queue,
)


def batch_history(days: int) -> tuple[DemandPoint, ...]:
    """2 GPUs always, and a job of 8 GPUs for the first hour of every two, one point a minute."""
    minutes = days * 1440
    return tuple(
        DemandPoint(NOW_S - 60.0 * (minutes - i), 2.0 + 8.0 * ((i % 120) < 60))
        for i in range(minutes)
    )


@pytest.mark.parametrize(
    ("days", "served"),
    [(7, "learned model"), (2, "recent peak")],
    ids=["learned-on-a-week", "two-days-too-short"],
)
def test_the_plan_says_which_forecast_the_headroom_follows(days: int, served: str) -> None:
    policy = make_policy()
    policy = replace(policy, queues=(replace(policy.queues[0],
                     headroom=Headroom(forecast_quantile=0.9, horizon_s=1800)),))  # fmt: skip
    queue = replace(make_queue(capability=32), demand_history=batch_history(days))
    observation = make_observation(make_job("a"), queues=(queue,))
    fits = ModelCache().fit(observation, policy)
    reason = fits.forecast_reasons[queue.name]
    assert reason.startswith(served) and "recalibrated by" in reason
    plan = decide(observation, policy, fits=fits)
    assert plan.forecast_reasons == {queue.name: reason}
    assert plan.budgets[queue.name].forecast_reason == reason


def test_a_shrink_for_headroom_names_the_forecast_and_why() -> None:
    why = "recent peak, recalibrated by +0.00 GPUs on recent residuals: too little history"
    budget = QueueBudget(
        queue="q",
        elastic_gpus=2.0,
        limit_gpus=8.0,
        held_nonelastic_gpus=2.0,
        pending_gpus=0.0,
        headroom_gpus=4.0,
        forecast_reason=why,
    )
    message = decision_message(
        Reason.SHRINK_FOR_HEADROOM,
        job=make_job("a"),
        target=1,
        recommended=1,
        gain=0.0,
        next_gain=0.0,
        budget=budget,
        defaults=make_policy().defaults,
        measured=True,
    )
    assert message == f"queue q keeps 4 GPU(s) of headroom for its demand; its forecast: {why}"
    plain = decision_message(
        Reason.SHRINK_FOR_HEADROOM,
        job=make_job("a"),
        target=1,
        recommended=1,
        gain=0.0,
        next_gain=0.0,
        budget=replace(budget, forecast_reason=""),
        defaults=make_policy().defaults,
        measured=True,
    )
    assert plain == "queue q keeps 4 GPU(s) of headroom for its demand"
