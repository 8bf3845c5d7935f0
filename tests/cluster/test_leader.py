"""Leader election on a real kube-apiserver: one leader of two, a takeover after a dead leader's
Lease expires (a 3 s Lease), an immediate handover after a clean release, and a 409 on a stale
write. Waits are bounded."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from scheduler_policy.adapters.leader import LeaseAction, LeaseApi, LeaseElector, lease_body
from scheduler_policy.vocabulary.errors import ConflictError
from tests.cluster.controlplane import ControlPlane

LEASE_S = 3.0
RENEW_S = 0.5
WAIT_S = 30.0


def wait_for(what: str, probe: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {WAIT_S:g} s")
        time.sleep(0.05)


@pytest.fixture
def api(control_plane: ControlPlane, namespace: str) -> Iterator[Any]:
    with control_plane.api_client() as client:
        yield client


def elector(api: Any, namespace: str, identity: str) -> LeaseElector:
    return LeaseElector(
        LeaseApi(api, namespace=namespace, name="tide-engine"),
        identity=identity, lease_duration_s=LEASE_S, renew_every_s=RENEW_S,
    )  # fmt: skip


def test_one_leader_then_a_takeover_once_the_dead_leaders_lease_expires(
    api: Any, namespace: str
) -> None:
    a, b = elector(api, namespace, "engine-a"), elector(api, namespace, "engine-b")
    a.start()
    wait_for("a to lead", a.is_leader)
    b.start()
    try:
        # Over several renewals of a, b never leads.
        for _ in range(int(2 * LEASE_S / RENEW_S)):
            assert a.is_leader() and not b.is_leader()
            time.sleep(RENEW_S)
        record = a.api.read()
        assert record is not None and record.holder == "engine-a"
        assert record.lease_duration_s == LEASE_S and record.transitions == 0
        assert record.renew_time is not None and len(record.renew_time.split(".")[1]) == 7
        killed_at = time.monotonic()
        a.stop(release=False)  # killed: no release, the Lease must expire
        wait_for("b to take over", b.is_leader)
        # b saw a's last renew at most one period before the kill, so it waited out the Lease.
        assert time.monotonic() - killed_at >= LEASE_S - 2 * RENEW_S
        taken = b.api.read()
        assert taken is not None and taken.holder == "engine-b" and taken.transitions == 1
    finally:
        a.stop(release=False)
        b.stop(release=True)


def test_a_clean_release_hands_over_at_once(api: Any, namespace: str) -> None:
    a, b = elector(api, namespace, "engine-a"), elector(api, namespace, "engine-b")
    assert a.try_once().action is LeaseAction.CREATE
    assert b.try_once().action is LeaseAction.WAIT
    assert a.release()
    released = b.api.read()
    assert released is not None and not released.held
    assert b.try_once().action is LeaseAction.TAKE  # no wait for an expiry
    assert b.is_leader()
    assert not a.release()  # no longer a's to release


def test_a_write_with_a_stale_resource_version_is_a_conflict(api: Any, namespace: str) -> None:
    a = elector(api, namespace, "engine-a")
    a.try_once()
    stale = a.api.read()
    a.try_once()  # a renews: the version moves on
    body = lease_body(
        name="tide-engine", namespace=namespace, record=stale, action=LeaseAction.TAKE,
        identity="engine-c", lease_duration_s=LEASE_S, now_s=time.time(),
    )  # fmt: skip
    with pytest.raises(ConflictError, match="409"):
        a.api.replace(body)
    fresh = lease_body(
        name="tide-engine", namespace=namespace, record=None, action=LeaseAction.CREATE,
        identity="engine-c", lease_duration_s=LEASE_S, now_s=time.time(),
    )  # fmt: skip
    with pytest.raises(ConflictError, match="409"):
        a.api.create(fresh)  # it exists already: c lost the race to create it
    record = a.api.read()
    assert record is not None and record.holder == "engine-a"
