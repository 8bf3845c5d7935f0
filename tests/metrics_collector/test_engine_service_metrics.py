"""The service's series in EngineMetrics: policy validity, reload failures, leadership."""

from __future__ import annotations

import pytest
from prometheus_client.registry import CollectorRegistry

from metrics_collector.engine_metrics import EngineMetrics

# Each scenario: the policy reads in order (True = valid), the leadership changes in order,
# then the expected tide_policy_valid, tide_policy_reload_failures_total and tide_leader
# (None: the series is absent).
SCENARIOS = [
    ("nothing recorded yet", [], [], None, None, None),
    ("a valid policy", [True], [], 1.0, 0.0, None),
    ("an invalid first policy", [False], [], 0.0, 1.0, None),
    ("valid, then refused", [True, False], [], 0.0, 1.0, None),
    ("refused twice, then valid again", [False, False, True], [], 1.0, 2.0, None),
    ("became the leader", [True], [True], 1.0, 0.0, 1.0),
    ("lost the lease", [True], [True, False], 1.0, 0.0, 0.0),
    ("never the leader", [], [False], None, None, 0.0),
]


@pytest.mark.parametrize(
    ("reads", "leadership", "valid", "failures", "leader"),
    [s[1:] for s in SCENARIOS],
    ids=[s[0] for s in SCENARIOS],
)
def test_policy_and_leader_series(
    reads: list[bool],
    leadership: list[bool],
    valid: float | None,
    failures: float | None,
    leader: float | None,
) -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    for ok in reads:
        metrics.record_policy(valid=ok)
    for held in leadership:
        metrics.record_leader(held)
    assert registry.get_sample_value("tide_policy_valid") == valid
    assert registry.get_sample_value("tide_policy_reload_failures_total") == failures
    assert registry.get_sample_value("tide_leader") == leader
