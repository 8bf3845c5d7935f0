"""The tuned policy file `tide tune` writes reads back as the same policy."""

from __future__ import annotations

import yaml

from scheduler_policy.model import QueueName
from scheduler_policy.policy import Defaults, ElasticPolicy, Headroom, Objective, QueuePolicy
from scheduler_policy.policy_file import parse_policy
from simulations.tune import policy_yaml


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
