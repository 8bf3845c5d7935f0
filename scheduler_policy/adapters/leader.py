"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that only one engine writes.

Two halves, as the rest of the engine: ``next_step`` is the pure decision of what one elector
should do with the Lease it read (create it, take it, renew it, or wait), table-tested with
times; ``LeaseElector`` performs it against the API and keeps trying in a thread.

Expiry is judged as client-go's ``leaderelection`` judges it, on the elector's own clock: a Lease
is expired when its record (holder, renew time, resourceVersion) has not changed for
``leaseDurationSeconds`` since this elector first saw it. The holder's ``renewTime`` is
written for people and other tools, never compared with the local clock, so clock skew
between engines cannot hand the Lease to two of them. Writes carry the resourceVersion read:
a 409 means someone else wrote first, and this round is lost.

A leader counts itself leader only while its last successful renew is younger than
``renew_deadline_s`` (less than the Lease duration), so it stops writing before any follower
may take the Lease over.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import urllib3
from kubernetes.client import ApiClient

from scheduler_policy.vocabulary.errors import ConflictError, PermanentError, TemporaryError

logger = logging.getLogger(__name__)

LEASE_DURATION_S = 15.0
RENEW_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A Lease as read from the API.

    Attributes:
        holder: ``spec.holderIdentity``; None or empty when nobody holds it.
        lease_duration_s: ``spec.leaseDurationSeconds``.
        transitions: ``spec.leaseTransitions``.
        resource_version: ``metadata.resourceVersion``, for optimistic concurrency.
        acquire_time: ``spec.acquireTime`` as written (RFC 3339), kept on renew.
        renew_time: ``spec.renewTime`` as written.
    """

    holder: str | None
    lease_duration_s: float
    transitions: int
    resource_version: str
    acquire_time: str | None = None
    renew_time: str | None = None

    @property
    def held(self) -> bool:
        """True when someone holds the Lease."""
        return bool(self.holder)


class LeaseAction(enum.Enum):
    """What an elector does after reading the Lease."""

    CREATE = "Create"  # no Lease exists: create it, held by me
    TAKE = "Take"  # free or expired: write myself as holder (a transition)
    RENEW = "Renew"  # mine: write a new renew time
    WAIT = "Wait"  # someone else's and alive: write nothing


@dataclass(frozen=True, slots=True)
class LeaseStep:
    """What ``next_step`` decided, with a sentence for the log.

    Attributes:
        action: what to do.
        why: why, for people.
    """

    action: LeaseAction
    why: str


def next_step(
    *,
    record: LeaseRecord | None,
    identity: str,
    observed_at_s: float,
    now_s: float,
) -> LeaseStep:
    """Decide what an elector does with the Lease it just read.

    Args:
        record: the Lease, or None when it does not exist.
        identity: this elector's identity.
        observed_at_s: when this elector first saw this very record (same holder, renew time
            and resourceVersion), on its own monotonic clock, seconds.
        now_s: now, on the same clock, seconds.

    Returns:
        The action, with why.
    """
    if record is None:
        return LeaseStep(LeaseAction.CREATE, "no Lease exists yet")
    if not record.held:
        return LeaseStep(LeaseAction.TAKE, "the Lease was released")
    if record.holder == identity:
        return LeaseStep(LeaseAction.RENEW, "the Lease is mine")
    unchanged_s = now_s - observed_at_s
    if unchanged_s >= record.lease_duration_s:
        return LeaseStep(
            LeaseAction.TAKE,
            f"{record.holder} has not renewed for {unchanged_s:.1f} s "
            f"(lease duration {record.lease_duration_s:g} s)",
        )
    return LeaseStep(
        LeaseAction.WAIT,
        f"{record.holder} holds the Lease (renewed within the last {unchanged_s:.1f} s)",
    )


def _micro_time(now_s: float) -> str:
    # A MicroTime must carry exactly six fractional digits (RFC 3339 micro).
    return datetime.fromtimestamp(now_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_record(lease: Mapping[str, Any], *, source: str) -> LeaseRecord:
    """Translate a Lease JSON object into a ``LeaseRecord``.

    Args:
        lease: the Lease as the API returned it.
        source: the Lease's ``namespace/name``, for errors.

    Returns:
        The record.

    Raises:
        PermanentError: the object is not a Lease this elector can use.
    """
    metadata = lease.get("metadata") or {}
    spec = lease.get("spec") or {}
    version = metadata.get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise PermanentError(f"Lease {source}: metadata.resourceVersion missing, got {version!r}")
    duration = spec.get("leaseDurationSeconds", LEASE_DURATION_S)
    if isinstance(duration, bool) or not isinstance(duration, int | float) or duration <= 0:
        raise PermanentError(
            f"Lease {source}: spec.leaseDurationSeconds must be a positive number, got {duration!r}"
        )
    transitions = spec.get("leaseTransitions") or 0
    if isinstance(transitions, bool) or not isinstance(transitions, int) or transitions < 0:
        raise PermanentError(
            f"Lease {source}: spec.leaseTransitions must be a non-negative integer, "
            f"got {transitions!r}"
        )
    holder = spec.get("holderIdentity")
    return LeaseRecord(
        holder=holder if isinstance(holder, str) and holder else None,
        lease_duration_s=float(duration),
        transitions=transitions,
        resource_version=version,
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
    )


def lease_body(
    *,
    name: str,
    namespace: str,
    record: LeaseRecord | None,
    action: LeaseAction,
    identity: str | None,
    lease_duration_s: float,
    now_s: float,
) -> dict[str, Any]:
    """The Lease to write for ``action`` (or for a release, with ``identity`` None).

    Args:
        name: the Lease's name.
        namespace: its namespace.
        record: the Lease as read (None for ``CREATE``).
        action: ``CREATE``, ``TAKE`` or ``RENEW``; a release passes ``RENEW`` with no identity.
        identity: the new holder; None releases.
        lease_duration_s: the duration to write.
        now_s: the wall clock, seconds since the epoch (written, never compared).

    Returns:
        The Lease as JSON, with the resourceVersion read so that a concurrent write fails.
    """
    stamp = _micro_time(now_s)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    transitions = 0
    acquire = stamp
    if record is not None:
        metadata["resourceVersion"] = record.resource_version
        transitions = record.transitions
        if action is LeaseAction.TAKE:  # a new holder, as client-go counts them
            transitions += 1
        else:
            acquire = record.acquire_time or stamp
    spec: dict[str, Any] = {
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, math.ceil(lease_duration_s)),
        "leaseTransitions": transitions,
        "acquireTime": acquire,
        "renewTime": stamp,
    }
    if identity is None:  # released: nobody holds it, nobody renews it
        spec["holderIdentity"] = None
        spec["acquireTime"] = None
        spec["renewTime"] = None
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": spec,
    }


class LeaseApi:
    """Reads and writes one Lease as JSON over an ``ApiClient`` (no model round trip).

    The generated Lease model would write ``renewTime`` without its six fractional digits,
    which the API server refuses for a MicroTime; so the bodies go out as written here.

    Args:
        api_client: a configured ``kubernetes.client.ApiClient``.
        namespace: the Lease's namespace.
        name: the Lease's name.
        timeout_s: the most one request may take.
    """

    def __init__(
        self, api_client: ApiClient, *, namespace: str, name: str, timeout_s: float = 5.0
    ) -> None:
        self._api = api_client
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s

    @property
    def source(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> dict[str, Any]:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        params = self._api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*params, _request_timeout=self.timeout_s)
            response.read()  # type: ignore[no-untyped-call]
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise TemporaryError(f"Lease {self.source}: {method} failed: {e}") from e
        status = int(response.status)
        text = (response.data or b"").decode("utf-8", "replace")
        if status == 404:
            raise LookupError(self.source)
        if status == 409:
            raise ConflictError(f"Lease {self.source}: written by someone else first (409)")
        if status in (401, 403, 422, 400):
            raise PermanentError(f"Lease {self.source}: {method} refused ({status}): {text[:300]}")
        if not 200 <= status < 300:
            raise TemporaryError(f"Lease {self.source}: {method} failed ({status}): {text[:300]}")
        try:
            document = json.loads(text)
        except json.JSONDecodeError as e:
            raise TemporaryError(f"Lease {self.source}: answer is not JSON: {e}") from e
        if not isinstance(document, dict):
            raise TemporaryError(f"Lease {self.source}: answer is not an object")
        return document

    def _path(self, *, named: bool) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        return f"{base}/{self.name}" if named else base

    def read(self) -> LeaseRecord | None:
        """The Lease, or None when it does not exist.

        Raises:
            TemporaryError: the API could not be reached.
            PermanentError: the read was refused, or the object is unusable.
        """
        try:
            return read_record(
                self._request("GET", self._path(named=True), None), source=self.source
            )
        except LookupError:
            return None

    def create(self, body: Mapping[str, Any]) -> LeaseRecord:
        """Create the Lease.

        Raises:
            ConflictError: it exists already (someone else created it first).
        """
        return read_record(self._request("POST", self._path(named=False), body), source=self.source)

    def replace(self, body: Mapping[str, Any]) -> LeaseRecord:
        """Replace the Lease; the body's resourceVersion must still be current.

        Raises:
            ConflictError: someone else wrote it since it was read.
        """
        try:
            return read_record(
                self._request("PUT", self._path(named=True), body), source=self.source
            )
        except LookupError as e:
            raise ConflictError(f"Lease {self.source}: deleted since it was read") from e


class LeaseElector:
    """Acquires and renews a Lease in a background thread.

    Args:
        api: where the Lease is (``LeaseApi``).
        identity: this engine's identity (the pod's name, say); unique among the engines.
        lease_duration_s: ``leaseDurationSeconds`` written, and how long a follower waits for
            an unrenewed Lease before it takes it.
        renew_every_s: how often the thread reads and renews (or tries to take) the Lease.
        renew_deadline_s: how long after its last successful renew a leader still counts
            itself leader; default two thirds of the duration.
        on_change: called with True or False (from the elector's thread) when leadership
            changes hands here.
        monotonic: the clock expiry is judged on.
        wall: the clock written into ``renewTime`` and ``acquireTime``.
    """

    def __init__(
        self,
        api: LeaseApi,
        *,
        identity: str,
        lease_duration_s: float = LEASE_DURATION_S,
        renew_every_s: float = RENEW_EVERY_S,
        renew_deadline_s: float | None = None,
        on_change: Callable[[bool], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not identity:
            raise ValueError("identity: must not be empty")
        if not math.isfinite(lease_duration_s) or lease_duration_s < 1:
            raise ValueError(f"lease_duration_s: must be at least 1 s, got {lease_duration_s}")
        if not 0 < renew_every_s < lease_duration_s:
            raise ValueError(
                f"renew_every_s: must be in (0, lease_duration_s={lease_duration_s:g}), "
                f"got {renew_every_s}"
            )
        deadline_s = renew_deadline_s if renew_deadline_s is not None else lease_duration_s * 2 / 3
        if not renew_every_s <= deadline_s < lease_duration_s:
            raise ValueError(
                f"renew_deadline_s: must be in [renew_every_s, lease_duration_s), got {deadline_s}"
            )
        self.api = api
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_every_s = renew_every_s
        self.renew_deadline_s = deadline_s
        self._on_change = on_change
        self._monotonic = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self._renewed_at: float | None = None  # monotonic time of my last successful write
        self._seen: tuple[str | None, str | None, str] | None = None
        self._seen_at = 0.0
        self._reported = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while my last successful acquire or renew is within the renew deadline."""
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self._monotonic() - renewed < self.renew_deadline_s

    def try_once(self) -> LeaseStep:
        """Read the Lease and act on it once: create, take, renew or wait.

        Returns:
            What was decided (a lost race reads as ``WAIT``).

        Raises:
            TemporaryError: the API could not be reached (not a conflict).
            PermanentError: the API refused the read or write.
        """
        record = self.api.read()
        now = self._monotonic()
        seen = (record.holder, record.renew_time, record.resource_version) if record else None
        if seen != self._seen:
            self._seen, self._seen_at = seen, now
        step = next_step(
            record=record, identity=self.identity, observed_at_s=self._seen_at, now_s=now
        )
        if step.action is LeaseAction.WAIT:
            with self._lock:  # the Lease is someone else's: I am not the leader
                self._renewed_at = None
            return step
        body = lease_body(
            name=self.api.name,
            namespace=self.api.namespace,
            record=record,
            action=step.action,
            identity=self.identity,
            lease_duration_s=self.lease_duration_s,
            now_s=self._wall(),
        )
        try:
            written = self.api.create(body) if record is None else self.api.replace(body)
        except ConflictError as e:  # someone else wrote first: whatever I held, I hold no more
            logger.info("Lease %s: %s", self.api.source, e)
            with self._lock:
                self._renewed_at = None
            return LeaseStep(LeaseAction.WAIT, str(e))
        with self._lock:
            self._renewed_at = now
        self._seen = (written.holder, written.renew_time, written.resource_version)
        self._seen_at = now
        if step.action is not LeaseAction.RENEW:
            logger.info("Lease %s: %s took it: %s", self.api.source, self.identity, step.why)
        return step

    def _notify(self) -> None:
        leader = self.is_leader()
        if leader != self._reported:
            self._reported = leader
            logger.info(
                "Lease %s: %s is %s", self.api.source, self.identity,
                "the leader" if leader else "a follower",
            )  # fmt: skip
            if self._on_change is not None:
                self._on_change(leader)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_once()
            except (TemporaryError, PermanentError) as e:
                logger.warning("Lease %s: %s", self.api.source, e)
            except Exception:  # the elector must outlive any surprise; the next try may pass
                logger.exception("Lease %s: unexpected error", self.api.source)
            self._notify()
            self._stop.wait(self.renew_every_s)

    def start(self) -> None:
        """Start trying in a background thread (a daemon)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tide-lease", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop the thread; with ``release``, clear ``holderIdentity`` if the Lease is mine.

        Args:
            release: hand the Lease over at once (a clean stop); False leaves it to expire.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.api.timeout_s * 3 + self.renew_every_s)
            self._thread = None
        was_leader = self.is_leader()
        with self._lock:
            self._renewed_at = None
        if release and was_leader:
            self.release()
        self._notify()

    def release(self) -> bool:
        """Clear ``holderIdentity`` if the Lease is still mine.

        Returns:
            True when it was released, False when it was not mine or could not be written.
        """
        try:
            record = self.api.read()
            if record is None or record.holder != self.identity:
                return False
            body = lease_body(
                name=self.api.name,
                namespace=self.api.namespace,
                record=record,
                action=LeaseAction.RENEW,
                identity=None,
                lease_duration_s=self.lease_duration_s,
                now_s=self._wall(),
            )
            self.api.replace(body)
        except (TemporaryError, PermanentError) as e:
            logger.warning(
                "Lease %s: release failed, it will expire instead: %s", self.api.source, e
            )
            return False
        logger.info("Lease %s: %s released it", self.api.source, self.identity)
        return True
