"""What the metrics source asks Prometheus through: a small protocol and its answers.

``metrics_collector.prometheus.PrometheusQuerier`` implements it over HTTP; ``SampleBuilder``
reads only these types, so the client library stops at that one module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler_policy.vocabulary.errors import PermanentError, TemporaryError


@dataclass(frozen=True, slots=True)
class InstantSeries:
    """One series of an instant query: its labels and its value at the query time."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class RangeSeries:
    """One series of a range query: its labels and ``(time_s, value)`` points, oldest first."""

    labels: Mapping[str, str]
    points: Sequence[tuple[float, float]]


class QueryUnavailable(TemporaryError):
    """Prometheus did not answer (connection refused, timeout, 5xx) within the retries."""


class QueryRefused(PermanentError):
    """Prometheus refused the query (bad PromQL, 4xx): retrying it will not help."""


class Querier(Protocol):
    """Runs PromQL against one Prometheus."""

    def instant(self, query: str, *, time_s: float) -> list[InstantSeries]:
        """The query's value at ``time_s``.

        Raises:
            QueryUnavailable: Prometheus did not answer.
            QueryRefused: Prometheus refused the query.
        """
        ...

    def range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> list[RangeSeries]:
        """The query at ``start_s, start_s + step_s, ...`` up to ``end_s``.

        Raises:
            QueryUnavailable: Prometheus did not answer.
            QueryRefused: Prometheus refused the query.
        """
        ...
