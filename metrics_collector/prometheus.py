"""``PrometheusSource``: the engine's ``MetricsSource`` on a real Prometheus.

The only module that imports ``prometheus_api_client`` (an import-linter contract says so). It
turns the client's HTTP and its exceptions into ``Querier`` answers and the project's own errors,
retries what may pass (connection errors, timeouts, 5xx) with a bounded backoff inside a time
budget well under the decision interval, and leaves the rest to ``SampleBuilder``.

Typical use::

    source = PrometheusSource(
        connection=PrometheusConnection(url="https://prometheus.monitoring:9090",
                                        bearer_token_file="/var/run/secrets/tide/token",
                                        ca_file="/etc/tide/ca.crt"),
        settings=policy.metrics, interval_s=policy.interval_s)
    sample = source.sample(now_s=time.time())
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from metrics_collector.querier import InstantSeries, QueryRefused, QueryUnavailable, RangeSeries
from metrics_collector.sampling import SampleBuilder, SampleReport
from scheduler_policy.policy.spec import MetricsSettings
from scheduler_policy.vocabulary.protocols import MetricsSample

logger = logging.getLogger(__name__)

_RETRY_STATUS = ("HTTP Status Code 5", "HTTP Status Code 429")


@dataclass(frozen=True, slots=True)
class PrometheusConnection:
    """How to reach Prometheus.

    Attributes:
        url: the server, e.g. ``http://prometheus.monitoring:9090`` (no trailing ``/api``).
        bearer_token_file: a file holding a bearer token, read on every sample (tokens rotate).
        basic_auth: ``(username, password)``.
        ca_file: a CA bundle to verify the server's TLS certificate with.
        headers: further HTTP headers (e.g. ``X-Scope-OrgID`` for a multi-tenant proxy).
        timeout_s: the most one request may take.
        attempts: tries per query when the server does not answer (at least 1).
        backoff_s: the wait before the second try; it doubles before each further one.
        budget_fraction: the share of the decision interval one sample may spend in all,
            retries included; past it the sample is stale.
        min_budget_s: the least time one sample may spend, whatever the interval (a very
            short interval would otherwise leave no time for a query at all).
    """

    url: str
    bearer_token_file: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    attempts: int = 3
    backoff_s: float = 0.25
    budget_fraction: float = 0.5
    min_budget_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url: must start with http:// or https://, got {self.url!r}")
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be a positive number, got {self.timeout_s}")
        if self.attempts < 1:
            raise ValueError(f"attempts: must be at least 1, got {self.attempts}")
        if not math.isfinite(self.backoff_s) or self.backoff_s < 0:
            raise ValueError(f"backoff_s: must be >= 0, got {self.backoff_s}")
        if not 0 < self.budget_fraction <= 1:
            raise ValueError(f"budget_fraction: must be in (0, 1], got {self.budget_fraction}")
        if not math.isfinite(self.min_budget_s) or self.min_budget_s < 0:
            raise ValueError(f"min_budget_s: must be >= 0, got {self.min_budget_s}")


def _float(value: str) -> float:
    # Prometheus writes values as strings: "1.5", "NaN", "+Inf", "-Inf".
    return float(value)


class PrometheusQuerier:
    """A ``Querier`` over HTTP with bounded retries inside a per-sample deadline.

    Args:
        connection: where and how to connect.
    """

    def __init__(self, connection: PrometheusConnection) -> None:
        self.connection = connection
        session = requests.Session()
        session.verify = connection.ca_file if connection.ca_file else True
        # The client's own retry (urllib3, with sleeps of its own) is off: ours is bounded.
        self._client = PrometheusConnect(
            url=connection.url.rstrip("/"),
            headers=dict(connection.headers),
            retry=Retry(total=0, raise_on_status=False),
            auth=connection.basic_auth,
            session=session,
        )
        self.deadline = math.inf  # monotonic; set per sample
        self.unavailable: str | None = None  # why no query can go out this round, if so

    def close(self) -> None:
        self._client.close()

    def refresh_headers(self) -> None:
        """Re-read the bearer token file (kubelet rotates projected tokens)."""
        headers = dict(self.connection.headers)
        if self.connection.bearer_token_file:
            try:
                token = Path(self.connection.bearer_token_file).read_text().strip()
            except OSError as e:
                raise QueryUnavailable(
                    f"bearer token file {self.connection.bearer_token_file}: {e}"
                ) from e
            headers["Authorization"] = f"Bearer {token}"
        self._client.headers = headers

    def _call(self, what: str, request: Any) -> list[dict[str, Any]]:
        """Run ``request(timeout)`` with retries; what it returns is the result list."""
        if self.unavailable is not None:
            raise QueryUnavailable(self.unavailable)
        attempts = self.connection.attempts
        wait_s = self.connection.backoff_s
        last = "no attempt made"
        for attempt in range(1, attempts + 1):
            left_s = self.deadline - time.monotonic()
            if left_s <= 0:
                last = f"the sample's time budget is spent (last: {last})"
                break
            try:
                result: list[dict[str, Any]] = request(min(self.connection.timeout_s, left_s))
                return result
            except PrometheusApiClientException as e:
                if not str(e).startswith(_RETRY_STATUS):
                    raise QueryRefused(f"{what}: {e}") from e
                last = str(e)
            except (requests.RequestException, ValueError) as e:  # ValueError: a bad JSON body
                last = f"{type(e).__name__}: {e}"
            if attempt < attempts:
                pause_s = min(wait_s, self.deadline - time.monotonic())
                if pause_s > 0:
                    time.sleep(pause_s)
                wait_s *= 2
        raise QueryUnavailable(f"{what}: {last}"[:500])

    def instant(self, query: str, *, time_s: float) -> list[InstantSeries]:
        """See ``Querier.instant``."""
        result = self._call(
            f"query {query!r}",
            lambda timeout: self._client.custom_query(
                query, params={"time": f"{time_s:.3f}"}, timeout=timeout
            ),
        )
        try:
            return [InstantSeries(s["metric"], _float(s["value"][1])) for s in result]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise QueryRefused(f"query {query!r}: not an instant vector: {e}") from e

    def range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> list[RangeSeries]:
        """See ``Querier.range``."""
        start = datetime.fromtimestamp(start_s, tz=timezone.utc)
        end = datetime.fromtimestamp(end_s, tz=timezone.utc)
        step = f"{step_s:g}s"
        result = self._call(
            f"range query {query!r}",
            lambda timeout: self._client.custom_query_range(
                query, start_time=start, end_time=end, step=step, timeout=timeout
            ),
        )
        try:
            return [
                RangeSeries(s["metric"], [(float(t), _float(v)) for t, v in s["values"]])
                for s in result
            ]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise QueryRefused(f"range query {query!r}: not a range vector: {e}") from e


class PrometheusSource:
    """The engine's metrics from a real Prometheus. See ``MetricsSource``.

    Args:
        connection: where and how to reach Prometheus.
        settings: the policy's ``spec.metrics`` (PromQL templates, windows, lookbacks).
        interval_s: the decision interval: series older than twice it are stale, history is
            read at its step, and one sample spends at most ``budget_fraction`` of it.
        cluster_figures: read the cluster's allocatable and requested GPUs from Prometheus
            (kube-state-metrics); False when the Kubernetes API gives them (``tide engine``,
            whose Volcano client watches the nodes and pods), and the sample's
            ``cluster_free_gpus`` is then NaN.

    Attributes:
        last_report: what the last sample saw (problems, stale series, Volcano's queue figures).
    """

    def __init__(
        self,
        *,
        connection: PrometheusConnection,
        settings: MetricsSettings | None = None,
        interval_s: float = 60.0,
        cluster_figures: bool = True,
    ) -> None:
        self.connection = connection
        self.interval_s = interval_s
        self._querier = PrometheusQuerier(connection)
        self._builder = SampleBuilder(
            self._querier,
            settings=settings or MetricsSettings(),
            interval_s=interval_s,
            cluster_figures=cluster_figures,
        )

    @property
    def last_report(self) -> SampleReport:
        return self._builder.last_report

    def sample(self, *, now_s: float) -> MetricsSample:
        """See base class. Never raises for Prometheus trouble: the sample is stale instead."""
        budget_s = max(
            self.connection.min_budget_s, self.connection.budget_fraction * self.interval_s
        )
        self._querier.deadline = time.monotonic() + budget_s
        self._querier.unavailable = None
        try:
            self._querier.refresh_headers()
        except QueryUnavailable as e:
            # The builder reports it as unreachable: every query fails with this sentence.
            self._querier.unavailable = str(e)
        return self._builder.sample(now_s=now_s)

    def close(self) -> None:
        """Stop the query threads and release the HTTP connections."""
        self._builder.close()
        self._querier.close()
