"""The tuned policy file `tide tune` writes reads back as the same policy."""

from __future__ import annotations

import dataclasses

import yaml
from hypothesis import given
from hypothesis import strategies as st

from scheduler_policy.policy.file import parse_policy, policy_yaml
from scheduler_policy.policy.spec import Defaults, ElasticPolicy, Headroom, Objective, QueuePolicy
from scheduler_policy.vocabulary.state import QueueName
from simulations.api import default_policy_for
from simulations.cluster_config import BUILTIN_CLUSTER


def test_policy_yaml_round_trips():
    policy = ElasticPolicy(
        name="tuned",
        interval_s=30.0,
        model_refit_s=900.0,
        objective=Objective.SPEEDUP,
        defaults=Defaults(
            tolerance=0.1,
            restart_cost_s=45.0,
            cooldown_s=120.0,
            max_step_up=2,
            max_step_down=3,
            window_up_s=60.0,
            window_down_s=600.0,
            assumed_remaining_s=7200.0,
        ),
        queues=(
            QueuePolicy(
                QueueName("research"),
                borrow=True,
                max_elastic_gpus=12.0,
                headroom=Headroom(gpus=2.0, forecast_quantile=0.9, horizon_s=900.0),
            ),
            QueuePolicy(QueueName("production"), elastic=False),
        ),
    )
    assert parse_policy(yaml.safe_load(policy_yaml(policy)), source="tuned.yaml") == policy


def test_a_policy_for_other_queues_is_flagged():
    from simulations.api import policy_queue_warnings
    from simulations.cluster_config import BUILTIN_CLUSTER

    other = ElasticPolicy(name="p", queues=(QueuePolicy(QueueName("default")),))
    assert policy_queue_warnings(other, BUILTIN_CLUSTER) == [
        "policy p names queue(s) default that cluster small-mixed lacks "
        "(it has production, research)",
        "policy p scales none of cluster small-mixed's queues: tide will change nothing and "
        "run as Volcano does on its own",
    ]
    fitting = ElasticPolicy(name="q", queues=(QueuePolicy(QueueName("research"), borrow=True),))
    assert policy_queue_warnings(fitting, BUILTIN_CLUSTER) == []


_SECONDS = st.floats(min_value=0.0, max_value=1e9, allow_nan=False)
_POSITIVE_SECONDS = st.floats(min_value=1e-3, max_value=1e9, allow_nan=False)


@given(
    interval=_POSITIVE_SECONDS,
    cooldown=_SECONDS,
    window=_SECONDS,
    remaining=_POSITIVE_SECONDS,
    tolerance=st.floats(min_value=0.0, max_value=0.999),
    headroom=st.integers(min_value=0, max_value=10_000).map(float),  # GPUs are whole
    quantile=st.none() | st.floats(min_value=0.01, max_value=0.99),
    cap=st.none() | st.integers(min_value=0, max_value=10_000).map(float),
)
def test_the_written_policy_reads_back_as_the_policy_that_ran(
    interval: float,
    cooldown: float,
    window: float,
    remaining: float,
    tolerance: float,
    headroom: float,
    quantile: float | None,
    cap: float | None,
) -> None:
    base = default_policy_for(BUILTIN_CLUSTER)
    policy = dataclasses.replace(
        base,
        interval_s=interval,
        defaults=dataclasses.replace(
            base.defaults,
            cooldown_s=cooldown,
            window_down_s=window,
            assumed_remaining_s=remaining,
            tolerance=tolerance,
        ),
        queues=(
            dataclasses.replace(
                base.queues[0],
                headroom=Headroom(gpus=headroom, forecast_quantile=quantile, horizon_s=interval),
                max_elastic_gpus=cap,
            ),
            *base.queues[1:],
        ),
    )
    assert parse_policy(yaml.safe_load(policy_yaml(policy)), source="t") == policy
