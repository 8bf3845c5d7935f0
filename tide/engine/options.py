"""What ``tide engine`` is asked for (``EngineOptions``), what it connects through (``Link``),
and why it cannot run (``EngineFailure``)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from scheduler_policy.vocabulary.protocols import ClusterClient

if TYPE_CHECKING:
    from scheduler_policy.adapters.leader import LeaseApi

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class EngineFailure(Exception):
    """``tide engine`` cannot run (or its one round failed); the message says why."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """What ``tide engine`` was asked for.

    Attributes:
        policy_path: the ElasticPolicy file.
        kubeconfig: a kubeconfig file; None for the in-cluster service account.
        prometheus_url: Prometheus' URL; None when the command line gives none.
        host: the address the HTTP server binds.
        port: its port (0 picks a free one).
        dry_run: decide and log, never write (and hold no Lease).
        once: one reconcile, then exit.
        lease_namespace: the leader Lease's namespace.
        lease_name: the leader Lease's name.
        namespace: the namespace whose Jobs are managed; None for all.
        identity: this engine's identity in the Lease.
        lease_duration_s: the Lease's duration, seconds.
        renew_every_s: how often the Lease is renewed (or tried for), seconds.
    """

    policy_path: Path
    kubeconfig: Path | None = None
    prometheus_url: str | None = None
    host: str = "0.0.0.0"
    port: int = 8080
    dry_run: bool = False
    once: bool = False
    lease_namespace: str = "default"
    lease_name: str = "tide-engine"
    namespace: str | None = None
    identity: str = ""
    lease_duration_s: float = 15.0
    renew_every_s: float = 5.0


class Link(Protocol):
    """The engine's connection to the API server: the cluster client and the Lease."""

    @property
    def cluster(self) -> ClusterClient:
        """Queues, jobs and writes."""
        ...

    def lease_api(self, *, namespace: str, name: str) -> LeaseApi:
        """The leader Lease ``namespace/name`` over the same connection."""
        ...

    def sync(self, *, timeout_s: float) -> None:
        """Start watching (long-running) or probe the server once (``--once``).

        Raises:
            TideError: the server cannot be reached, or did not sync within ``timeout_s``.
        """
        ...

    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(why)`` when a pending gang appears (reconcile now)."""
        ...

    def stop(self) -> None:
        """Stop the watches."""
        ...


def default_lease_namespace() -> str:
    """The pod's own namespace when in a cluster, else ``default``."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def default_identity() -> str:
    """The host (the pod's name in a cluster) and a random suffix: unique per process."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as a host and a port.

    Raises:
        ValueError: not HOST:PORT with a port in 0..65535; the message quotes the value.
    """
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen: must be HOST:PORT with a port in 0..65535, got {value!r}")
    return host, int(port)
