"""Leader election: the pure "may I take it" decision as a table of times, the Lease JSON it
writes, and the elector against an in-memory Lease API that checks resourceVersions."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_policy.adapters.leader import (
    LeaseAction,
    LeaseElector,
    LeaseRecord,
    lease_body,
    next_step,
    read_record,
)
from scheduler_policy.vocabulary.errors import ConflictError, PermanentError


def held_by(holder: str | None, *, duration_s: float = 15.0) -> LeaseRecord:
    return LeaseRecord(
        holder=holder, lease_duration_s=duration_s, transitions=2, resource_version="7"
    )


# (name, record, observed_at_s, now_s, expected action)
STEPS = [
    ("no lease: create it", None, 0.0, 0.0, LeaseAction.CREATE),
    ("released: take it at once", held_by(None), 100.0, 100.0, LeaseAction.TAKE),
    ("mine: renew", held_by("me"), 0.0, 14.0, LeaseAction.RENEW),
    ("mine, long unrenewed: still renew", held_by("me"), 0.0, 100.0, LeaseAction.RENEW),
    ("theirs, just seen: wait", held_by("other"), 50.0, 50.0, LeaseAction.WAIT),
    ("theirs, unchanged 14.9 s of 15: wait", held_by("other"), 0.0, 14.9, LeaseAction.WAIT),
    ("theirs, unchanged a whole duration: take", held_by("other"), 0.0, 15.0, LeaseAction.TAKE),
    ("theirs, 3 s lease expired: take", held_by("other", duration_s=3), 10, 13.5, LeaseAction.TAKE),
    ("theirs, 60 s lease alive: wait", held_by("other", duration_s=60), 0.0, 30, LeaseAction.WAIT),
]  # fmt: skip


@pytest.mark.parametrize(
    ("record", "observed_at_s", "now_s", "action"),
    [s[1:] for s in STEPS],
    ids=[s[0] for s in STEPS],
)
def test_next_step(
    record: LeaseRecord | None, observed_at_s: float, now_s: float, action: LeaseAction
) -> None:
    step = next_step(record=record, identity="me", observed_at_s=observed_at_s, now_s=now_s)
    assert step.action is action
    assert step.why


BAD_LEASES = [
    ("no resourceVersion", {"metadata": {}, "spec": {}}, "resourceVersion"),
    ("zero duration", {"metadata": {"resourceVersion": "1"}, "spec": {"leaseDurationSeconds": 0}},
     "leaseDurationSeconds"),
    ("text transitions", {"metadata": {"resourceVersion": "1"},
                          "spec": {"leaseTransitions": "two"}}, "leaseTransitions"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("lease", "named"), [b[1:] for b in BAD_LEASES], ids=[b[0] for b in BAD_LEASES]
)
def test_an_unusable_lease_is_refused_naming_the_field(lease: dict[str, Any], named: str) -> None:
    with pytest.raises(
        PermanentError, match=f"Lease ns/l: spec.{named}|Lease ns/l: metadata.{named}"
    ):
        read_record(lease, source="ns/l")


def test_the_body_counts_transitions_keeps_acquire_time_and_writes_micro_times() -> None:
    record = LeaseRecord("other", 15.0, 2, "7", acquire_time="2026-01-01T00:00:00.000000Z")
    taken = lease_body(
        name="l", namespace="ns", record=record, action=LeaseAction.TAKE, identity="me",
        lease_duration_s=15, now_s=1_800_000_000.0,
    )  # fmt: skip
    assert taken["metadata"]["resourceVersion"] == "7"
    assert taken["spec"]["leaseTransitions"] == 3
    assert taken["spec"]["renewTime"] == "2027-01-15T08:00:00.000000Z"
    assert taken["spec"]["acquireTime"] == taken["spec"]["renewTime"]
    mine = dataclass_replace(record, holder="me")
    renewed = lease_body(
        name="l", namespace="ns", record=mine, action=LeaseAction.RENEW, identity="me",
        lease_duration_s=15, now_s=1_800_000_005.5,
    )  # fmt: skip
    assert renewed["spec"]["leaseTransitions"] == 2
    assert renewed["spec"]["acquireTime"] == "2026-01-01T00:00:00.000000Z"
    assert renewed["spec"]["renewTime"] == "2027-01-15T08:00:05.500000Z"
    released = lease_body(
        name="l", namespace="ns", record=mine, action=LeaseAction.RENEW, identity=None,
        lease_duration_s=15, now_s=1_800_000_006.0,
    )  # fmt: skip
    assert released["spec"]["holderIdentity"] is None


def dataclass_replace(record: LeaseRecord, **changes: Any) -> LeaseRecord:
    import dataclasses

    return dataclasses.replace(record, **changes)


class MemoryLeases:
    """One Lease in memory with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.namespace, self.name, self.timeout_s = "ns", "tide-engine", 1.0

    @property
    def source(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _store(self, body: dict[str, Any]) -> LeaseRecord:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return read_record(self.lease, source=self.source)

    def read(self) -> LeaseRecord | None:
        return None if self.lease is None else read_record(self.lease, source=self.source)

    def create(self, body: dict[str, Any]) -> LeaseRecord:
        if self.lease is not None:
            raise ConflictError("exists")
        return self._store(body)

    def replace(self, body: dict[str, Any]) -> LeaseRecord:
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ConflictError("stale resourceVersion")
        return self._store(body)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def elector(api: MemoryLeases, clock: Clock, identity: str) -> LeaseElector:
    return LeaseElector(
        api,  # type: ignore[arg-type]
        identity=identity, lease_duration_s=15, renew_every_s=5, monotonic=clock, wall=clock,
    )  # fmt: skip


def test_one_leader_then_takeover_after_expiry_and_at_once_after_release() -> None:
    api, clock = MemoryLeases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert a.try_once().action is LeaseAction.CREATE
    assert b.try_once().action is LeaseAction.WAIT
    assert a.is_leader() and not b.is_leader()
    clock.now_s += 5
    assert a.try_once().action is LeaseAction.RENEW  # a renews: b's view of it changes
    assert b.try_once().action is LeaseAction.WAIT
    # a dies (no more renewals): b waits a whole lease duration from when it last saw a change.
    clock.now_s += 10  # a's last renew is 10 s old: past its renew deadline of 10 s
    assert not a.is_leader()
    assert b.try_once().action is LeaseAction.WAIT
    clock.now_s += 5
    assert b.try_once().action is LeaseAction.TAKE
    assert b.is_leader()
    assert api.read() == dataclass_replace(api.read(), holder="b", transitions=1)  # type: ignore[arg-type]
    # b releases cleanly: a takes it at its next try, without waiting.
    assert b.release()
    assert api.read() is not None and not api.read().held  # type: ignore[union-attr]
    assert a.try_once().action is LeaseAction.TAKE
    assert a.is_leader() and api.read().holder == "a"  # type: ignore[union-attr]


class RacingView:
    """c's view of the Lease: between c's read and its write, ``meanwhile`` writes first."""

    def __init__(self, api: MemoryLeases, meanwhile: Any) -> None:
        self.api, self.meanwhile = api, meanwhile
        self.namespace, self.name, self.timeout_s = api.namespace, api.name, api.timeout_s
        self.source = api.source

    def read(self) -> LeaseRecord | None:
        record = self.api.read()
        self.meanwhile()
        return record

    def create(self, body: dict[str, Any]) -> LeaseRecord:
        return self.api.create(body)

    def replace(self, body: dict[str, Any]) -> LeaseRecord:
        return self.api.replace(body)


def test_a_lost_race_is_a_wait_and_the_winner_leads() -> None:
    api, clock = MemoryLeases(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.try_once()
    c = LeaseElector(
        RacingView(api, b.try_once),  # type: ignore[arg-type]
        identity="c", lease_duration_s=15, renew_every_s=5, monotonic=clock, wall=clock,
    )  # fmt: skip
    b.try_once()
    c.api.meanwhile = lambda: None  # type: ignore[attr-defined]
    c.try_once()
    clock.now_s += 15  # a stopped renewing: b and c both see the Lease expired
    c.api.meanwhile = b.try_once  # type: ignore[attr-defined]
    step = c.try_once()  # c read a's Lease, b took it, c's write with the old version lost
    assert step.action is LeaseAction.WAIT
    assert step.why == "stale resourceVersion"
    assert b.is_leader() and not c.is_leader()
    assert api.read().holder == "b"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"identity": ""}, "identity"), ({"lease_duration_s": 0.5}, "lease_duration_s"),
     ({"renew_every_s": 15}, "renew_every_s"), ({"renew_deadline_s": 20}, "renew_deadline_s")],
    ids=["empty identity", "too short a lease", "renewing slower than the lease",
         "deadline past the lease"],
)  # fmt: skip
def test_bad_settings_are_refused_naming_them(kwargs: dict[str, Any], named: str) -> None:
    settings: dict[str, Any] = {"identity": "a", "lease_duration_s": 15, "renew_every_s": 5}
    settings.update(kwargs)
    with pytest.raises(ValueError, match=named):
        LeaseElector(MemoryLeases(), **settings)  # type: ignore[arg-type]


# -- invariants ---------------------------------------------------------------------------------

holders = st.sampled_from([None, "me", "other", "third"])


@given(
    holder=holders,
    duration_s=st.floats(1, 3600),
    observed_at_s=st.floats(0, 1e6),
    elapsed_s=st.floats(0, 1e4),
)
def test_a_live_lease_of_another_is_never_taken_and_mine_is_always_renewed(
    holder: str | None, duration_s: float, observed_at_s: float, elapsed_s: float
) -> None:
    record = held_by(holder, duration_s=duration_s)
    now_s = observed_at_s + elapsed_s
    step = next_step(record=record, identity="me", observed_at_s=observed_at_s, now_s=now_s)
    if holder == "me":
        assert step.action is LeaseAction.RENEW
    elif holder is None:
        assert step.action is LeaseAction.TAKE
    elif now_s - observed_at_s < duration_s:  # unchanged for less than the Lease's duration
        assert step.action is LeaseAction.WAIT
    else:
        assert step.action is LeaseAction.TAKE


def test_a_leader_that_loses_a_renewal_race_stops_leading_at_once() -> None:
    api, clock = MemoryLeases(), Clock()
    a = elector(api, clock, "a")
    a.try_once()
    assert a.is_leader()
    mine = api.read()
    taken = lease_body(
        name="tide-engine", namespace="ns", record=mine, action=LeaseAction.TAKE, identity="b",
        lease_duration_s=15, now_s=clock.now_s,
    )  # fmt: skip
    # b writes the Lease between a's read and a's renewal (a was paused for too long).
    a.api = RacingView(api, lambda: api.replace(taken))  # type: ignore[assignment]
    clock.now_s += 1
    assert a.try_once().action is LeaseAction.WAIT
    assert not a.is_leader()  # at once, not at its renew deadline
    assert api.read().holder == "b"  # type: ignore[union-attr]
