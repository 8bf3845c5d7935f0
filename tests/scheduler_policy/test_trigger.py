"""The event-triggered reconcile's rule: new pending gangs and withheld pods reconcile at once."""

from __future__ import annotations

import pytest

from scheduler_policy.engine.trigger import reconcile_trigger, seen_gangs
from scheduler_policy.vocabulary.state import Observation, PendingGang, QueueName


def _gang(key: str) -> PendingGang:
    return PendingGang(key=key, queue=QueueName("prod"), min_member=2, gpus=2.0)


TRIGGERS = [
    ("nothing new", {"ns/a"}, ("ns/a",), 0, None),
    ("nothing pending", set(), (), 0, None),
    ("a gang the last reconcile saw", {"ns/a", "ns/b"}, ("ns/b",), 0, None),
    ("a new pending gang", {"ns/a"}, ("ns/a", "ns/b"), 0, "1 new pending gang(s): ns/b"),
    (
        "many new gangs are counted",
        set(),
        ("ns/a", "ns/b", "ns/c", "ns/d", "ns/e"),
        0,
        "5 new pending gang(s): ns/a, ns/b, ns/c and 2 more",
    ),
    ("withheld pods", {"ns/a"}, ("ns/a",), 3, "the extender withheld 3 pod(s) from eviction"),
    (
        "both",
        set(),
        ("ns/a",),
        1,
        "1 new pending gang(s): ns/a; the extender withheld 1 pod(s) from eviction",
    ),
]


@pytest.mark.parametrize(
    ("seen", "pending", "withheld", "expected"),
    [t[1:] for t in TRIGGERS],
    ids=[t[0] for t in TRIGGERS],
)
def test_reconcile_trigger(
    seen: set[str], pending: tuple[str, ...], withheld: int, expected: str | None
) -> None:
    gangs = tuple(_gang(k) for k in pending)
    assert reconcile_trigger(seen=seen, pending_gangs=gangs, withheld_pods=withheld) == expected


def test_negative_withheld_pods_are_refused_naming_the_input() -> None:
    with pytest.raises(ValueError, match="withheld_pods: must be >= 0, got -1"):
        reconcile_trigger(seen=(), pending_gangs=(), withheld_pods=-1)


def test_seen_gangs_are_the_observations_pending_gangs() -> None:
    observation = Observation(
        time_s=0.0,
        queues=(),
        jobs=(),
        cluster_free_gpus=0.0,
        pending_gangs=(_gang("ns/a"), _gang("ns/b")),
    )
    assert seen_gangs(observation) == {"ns/a", "ns/b"}
    assert seen_gangs(None) == frozenset()
