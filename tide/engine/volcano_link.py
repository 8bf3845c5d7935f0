"""``VolcanoLink``: the engine's ``Link`` on a real API server (the Volcano client and the Lease).

One ``ApiClient`` serves both, so the Lease and the Jobs are read with the same credentials.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduler_policy.adapters.leader import LeaseApi
from scheduler_policy.adapters.volcano import VolcanoClient, from_kubeconfig
from scheduler_policy.vocabulary.errors import TemporaryError
from scheduler_policy.vocabulary.protocols import ClusterClient

if TYPE_CHECKING:
    from tide.engine.options import EngineOptions


class VolcanoLink:
    """The Volcano client and the leader Lease over one API connection. See ``Link``.

    Args:
        options: the kubeconfig (None: in-cluster), the namespace, and ``once`` (list at each
            call instead of watching).

    Raises:
        PermanentError: the kubeconfig or the in-cluster configuration cannot be loaded.
    """

    def __init__(self, options: EngineOptions) -> None:
        path = str(options.kubeconfig) if options.kubeconfig is not None else None
        self._api = from_kubeconfig(path)
        self._once = options.once
        self.client = VolcanoClient(self._api, namespace=options.namespace, watch=not options.once)

    @property
    def cluster(self) -> ClusterClient:
        """See ``Link``."""
        client: ClusterClient = self.client
        return client

    def lease_api(self, *, namespace: str, name: str) -> LeaseApi:
        """See ``Link``."""
        return LeaseApi(self._api, namespace=namespace, name=name)

    def sync(self, *, timeout_s: float) -> None:
        """See ``Link``."""
        if self._once:
            self.client.list_queues()  # a probe: raises when the server cannot be reached
            return
        self.client.start()
        if not self.client.wait_synced(timeout_s):
            raise TemporaryError(f"the watches did not sync within {timeout_s:.0f} s")

    def on_change(self, callback: Callable[[str], None]) -> None:
        """See ``Link``."""
        self.client.on_change(callback)

    def stop(self) -> None:
        """See ``Link``."""
        self.client.stop()
        self._api.close()  # type: ignore[no-untyped-call]
