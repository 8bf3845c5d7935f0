"""The API server's audit log as the tests read it: one event per request, with its code."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One event per request: the one written when the response is complete (it has the code).
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


@dataclass(frozen=True)
class AuditRequest:
    """One request the API server saw, from its audit log (level Metadata, stage ResponseComplete).

    Attributes:
        user: the authenticated user name (``system:serviceaccount:<ns>:<name>`` for a SA token).
        groups: the user's groups.
        verb: the Kubernetes verb (get, list, watch, create, update, patch, delete, ...).
        api_group: the resource's API group ("" for the core group).
        resource: the resource's plural ("" for a non-resource URL such as /healthz).
        subresource: e.g. "status", "scale", "token", else "".
        namespace: the object's namespace, "" when cluster-scoped.
        name: the object's name, "" for a list or a create without a name.
        code: the HTTP response code.
        request_uri: the path and query the client sent.
        received_at_s: when the request arrived, seconds since the epoch.
    """

    user: str
    groups: tuple[str, ...]
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    request_uri: str
    received_at_s: float


def _parse_time_s(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_audit_event(event: Mapping[str, Any]) -> AuditRequest:
    """The fields of one audit event (a JSON object of the audit log) tests compare.

    Args:
        event: one line of the log, parsed.

    Returns:
        The request it records.
    """
    user = event.get("user") or {}
    ref = event.get("objectRef") or {}
    status = event.get("responseStatus") or {}
    return AuditRequest(
        user=str(user.get("username", "")),
        groups=tuple(str(g) for g in user.get("groups") or ()),
        verb=str(event.get("verb", "")),
        api_group=str(ref.get("apiGroup", "")),
        resource=str(ref.get("resource", "")),
        subresource=str(ref.get("subresource", "")),
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int(status.get("code", 0)),
        request_uri=str(event.get("requestURI", "")),
        received_at_s=_parse_time_s(str(event["requestReceivedTimestamp"])),
    )


class AuditLogReader:
    """Reads an audit log as it grows, parsing each complete line once.

    Args:
        path: the log (JSON lines), which may not exist yet.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._requests: list[AuditRequest] = []
        self._lock = threading.Lock()

    def requests(self, since: float | None = None) -> list[AuditRequest]:
        """Every request logged so far, oldest first.

        Args:
            since: keep only requests received at or after this time (seconds since the epoch).

        Returns:
            One AuditRequest per complete line (a line being written right now waits for the
            next call).
        """
        with self._lock:
            try:
                with open(self._path, "rb") as log:
                    log.seek(self._offset)
                    chunk = log.read()
            except FileNotFoundError:
                chunk = b""
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offset += len(complete)
            for line in complete.splitlines():
                if line.strip():
                    self._requests.append(parse_audit_event(json.loads(line)))
            if since is None:
                return list(self._requests)
            return [r for r in self._requests if r.received_at_s >= since]


def read_audit_log(path: Path, since: float | None = None) -> list[AuditRequest]:
    """The requests of an audit log file, oldest first (see :meth:`AuditLogReader.requests`)."""
    return AuditLogReader(path).requests(since)
