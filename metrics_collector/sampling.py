"""From Prometheus query results to the engine's ``MetricsSample``.

``SampleBuilder`` asks a ``Querier`` (``metrics_collector.prometheus`` in production) one query per
figure for all queues or jobs at once, never one per job, and keeps the range-query history it has
read so that each round fetches only the newest points. Freshness is per series: a series whose
newest sample is older than twice the decision interval is stale, and an empty result or NaN is
missing, never zero. Cluster- and queue-level trouble makes the sample not ``fresh``; a job's
trouble puts the job in ``stale_jobs`` with a sentence; Prometheus unreachable does both, and
never raises out of ``sample``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from metrics_collector.promql import align_down, chunk_range, placeholder_values, render
from metrics_collector.throughput import JobGrid, representative_points
from scheduler_policy.policy.spec import MetricsSettings
from scheduler_policy.vocabulary.errors import PermanentError, TemporaryError
from scheduler_policy.vocabulary.protocols import MetricsSample
from scheduler_policy.vocabulary.state import DemandPoint, JobKey, QueueName, ThroughputPoint

logger = logging.getLogger(__name__)

MILLI = 1000.0
"""Volcano's scalar resources are milli-units: 1 GPU reads 1000."""

STALE_INTERVALS = 2.0
"""A series whose newest sample is older than this many decision intervals is stale."""


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


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """What Volcano's scheduler says of one queue, in GPUs (None when it exports no such series).

    ``capacity_gpus`` and ``real_capacity_gpus`` exist only with the capacity plugin.
    """

    allocated_gpus: float | None = None
    request_gpus: float | None = None
    deserved_gpus: float | None = None
    capacity_gpus: float | None = None
    real_capacity_gpus: float | None = None


@dataclass(frozen=True, slots=True)
class SampleReport:
    """What the last sample saw beyond the ``MetricsSample`` itself, for logs and metrics.

    Attributes:
        problems: every stale, missing or refused figure, as sentences.
        stale_series: how many series (or whole figures) were stale, missing or NaN.
        queues: Volcano's figures per queue, in GPUs.
        reachable: whether Prometheus answered.
    """

    problems: tuple[str, ...] = ()
    stale_series: int = 0
    queues: Mapping[QueueName, QueueFigures] = field(default_factory=dict)
    reachable: bool = True


def job_key(labels: Mapping[str, str]) -> JobKey | None:
    """``namespace/volcano_job`` from a series' labels; None when either is missing or empty."""
    namespace, name = labels.get("namespace", ""), labels.get("volcano_job", "")
    if not namespace or not name:
        return None
    return JobKey(f"{namespace}/{name}")


class _Round:
    """The problems of one sample, collected as it goes."""

    def __init__(self, *, now_s: float, max_age_s: float) -> None:
        self.now_s = now_s
        self.max_age_s = max_age_s
        self.problems: list[str] = []
        self.stale_series = 0
        self.fresh = True
        self.stale_jobs: dict[JobKey, str] = {}

    def global_problem(self, what: str) -> None:
        self.problems.append(what)
        self.stale_series += 1
        self.fresh = False

    def job_problem(self, job: JobKey, what: str) -> None:
        if job not in self.stale_jobs:  # the first problem names the job's trouble
            self.stale_jobs[job] = what
            self.problems.append(what)
            self.stale_series += 1

    def age_problem(self, what: str, newest_s: float) -> str | None:
        """A sentence when a series' newest sample is NaN or too old; None when it is fresh."""
        if not math.isfinite(newest_s):
            return f"{what}: newest sample time is {newest_s}"
        age_s = self.now_s - newest_s
        if age_s > self.max_age_s:
            return f"{what}: newest sample {age_s:.0f} s old"
        return None


class SampleBuilder:
    """Builds a ``MetricsSample`` from one query per figure, keeping history across rounds.

    Args:
        querier: where queries go.
        settings: the policy's metrics settings (templates, windows, lookbacks).
        interval_s: the decision interval: sets the staleness limit and the history's step.
    """

    def __init__(self, querier: Querier, *, settings: MetricsSettings, interval_s: float) -> None:
        if not math.isfinite(interval_s) or interval_s <= 0:
            raise ValueError(f"interval_s: must be a positive number of seconds, got {interval_s}")
        self.querier = querier
        self.settings = settings
        self.interval_s = interval_s
        # Range queries round their times to whole seconds: keep the grid on whole seconds.
        self.step_s = float(max(1, round(interval_s)))
        self._values = placeholder_values(settings)
        self._grids: dict[JobKey, JobGrid] = {}
        self._last_seen_s: dict[JobKey, float] = {}
        self._grid_end_s: float | None = None
        self._grid_start_s = -math.inf  # the oldest time the grid holds now
        self._demand: dict[QueueName, dict[float, float]] = {}
        self._demand_end_s: float | None = None
        self.last_report = SampleReport()

    def _query(self, name: str) -> str:
        return render(getattr(self.settings.queries, name), self._values, name=name)

    def _instant(self, name: str, now_s: float) -> list[InstantSeries]:
        return self.querier.instant(self._query(name), time_s=now_s)

    def sample(self, *, now_s: float) -> MetricsSample:
        """See ``MetricsSource.sample``; never raises for Prometheus trouble."""
        started = time.perf_counter()
        work = _Round(now_s=now_s, max_age_s=STALE_INTERVALS * self.interval_s)
        free_gpus = 0.0
        queues: dict[QueueName, QueueFigures] = {}
        histories: dict[JobKey, tuple[ThroughputPoint, ...]] = {}
        remaining: dict[JobKey, float] = {}
        reachable = True
        try:
            free_gpus = self._cluster(work)
            queues = self._queues(work)
            histories, remaining = self._jobs(work)
            self._read_demand(work)
        except QueryUnavailable as e:
            reachable = False
            work.global_problem(f"Prometheus unreachable: {e}")
            histories = self._cached_histories()
            for job in histories:
                work.job_problem(job, f"metrics of {job}: Prometheus unreachable")
        allocated = {q: f.allocated_gpus for q, f in queues.items() if f.allocated_gpus is not None}
        self.last_report = SampleReport(
            problems=tuple(work.problems),
            stale_series=work.stale_series,
            queues=queues,
            reachable=reachable,
        )
        if work.problems:
            logger.warning(
                "metrics sample at %.0f: %d problem(s), first: %s",
                now_s, len(work.problems), work.problems[0],
            )  # fmt: skip
        logger.debug("metrics sample took %.3f s", time.perf_counter() - started)
        return MetricsSample(
            fresh=work.fresh,
            cluster_free_gpus=free_gpus,
            stale_jobs=work.stale_jobs,
            job_throughput=histories,
            job_remaining_samples=remaining,
            queue_allocated_gpus=allocated,
            queue_demand_history={
                q: tuple(DemandPoint(t, g) for t, g in sorted(points.items()))
                for q, points in self._demand.items()
                if points
            },
        )

    # ------------------------------------------------------------------ cluster and queues

    def _scalar(self, work: _Round, name: str, what: str) -> float | None:
        try:
            result = self._instant(name, work.now_s)
        except QueryRefused as e:
            work.global_problem(f"{what}: query refused: {e}")
            return None
        if not result:
            work.global_problem(f"{what}: no samples")
            return None
        value = max(s.value for s in result)  # one series by design; max if a rule duplicates it
        if not math.isfinite(value):
            work.global_problem(f"{what}: {value}")
            return None
        return value

    def _cluster(self, work: _Round) -> float:
        allocatable = self._scalar(work, "cluster_allocatable", "cluster allocatable GPUs")
        requested = self._scalar(work, "cluster_requested", "cluster requested GPUs")
        newest = self._scalar(work, "cluster_last_sample", "cluster node figures' sample time")
        if newest is not None:
            problem = work.age_problem("cluster node figures", newest)
            if problem is not None:
                work.global_problem(problem)
        if allocatable is None or requested is None:
            return 0.0
        return max(0.0, allocatable - requested)

    def _per_queue(self, work: _Round, name: str) -> dict[QueueName, float]:
        """``queue_name`` → value of one queue figure; NaN values are problems, not values."""
        try:
            result = self._instant(name, work.now_s)
        except QueryRefused as e:
            work.global_problem(f"queue figure {name}: query refused: {e}")
            return {}
        values: dict[QueueName, float] = {}
        for series in result:
            queue = series.labels.get("queue_name", "")
            if not queue:
                continue
            if not math.isfinite(series.value):
                work.global_problem(f"{name} of queue {queue}: {series.value}")
                continue
            values[QueueName(queue)] = max(series.value, values.get(QueueName(queue), -math.inf))
        return values

    def _queues(self, work: _Round) -> dict[QueueName, QueueFigures]:
        newest = self._per_queue(work, "queue_last_sample")
        stale = set()
        for queue, newest_s in newest.items():
            problem = work.age_problem(f"Volcano figures of queue {queue}", newest_s)
            if problem is not None:  # Volcano < 1.12.4 keeps a gone queue's last value
                work.global_problem(problem)
                stale.add(queue)
        figures: dict[str, dict[QueueName, float]] = {
            field_name: self._per_queue(work, f"queue_{field_name.removesuffix('_gpus')}")
            for field_name in QueueFigures.__dataclass_fields__
        }
        names = set().union(*figures.values()) - stale
        return {
            queue: QueueFigures(
                **{
                    f: (values[queue] / MILLI if queue in values else None)
                    for f, values in figures.items()
                }
            )
            for queue in sorted(names)
        }

    # ------------------------------------------------------------------ jobs

    def _per_job(self, work: _Round, name: str, what: str) -> dict[JobKey, float] | None:
        """``job`` → value of one job figure; None when the query was refused (a problem)."""
        try:
            result = self._instant(name, work.now_s)
        except QueryRefused as e:
            work.problems.append(f"{what}: query refused: {e}")
            work.stale_series += 1
            return None
        values: dict[JobKey, float] = {}
        for series in result:
            job = job_key(series.labels)
            if job is not None:
                values[job] = series.value
        return values

    def _jobs(
        self, work: _Round
    ) -> tuple[dict[JobKey, tuple[ThroughputPoint, ...]], dict[JobKey, float]]:
        newest = self._per_job(work, "job_last_sample", "throughput sample times")
        planned = self._per_job(work, "job_planned_samples", "planned samples") or {}
        consumed = self._per_job(work, "job_consumed_samples", "consumed samples") or {}
        refused = self._read_grids(work)
        for job, newest_s in (newest or {}).items():
            if math.isfinite(newest_s):
                self._last_seen_s[job] = max(newest_s, self._last_seen_s.get(job, -math.inf))
        oldest = work.now_s - self.settings.lookback_s
        for job in [j for j, seen in self._last_seen_s.items() if seen < oldest]:
            del self._last_seen_s[job]
        histories: dict[JobKey, tuple[ThroughputPoint, ...]] = {}
        for job in sorted(set(self._grids) | set(self._last_seen_s)):
            grid = self._grids.get(job, JobGrid())
            histories[job] = self._history(grid)
            self._check_job(work, job, grid, newest, refused)
        remaining = {
            job: max(0.0, planned[job] - consumed[job])
            for job in planned
            if job in consumed and math.isfinite(planned[job]) and math.isfinite(consumed[job])
        }
        return histories, remaining

    def _check_job(
        self,
        work: _Round,
        job: JobKey,
        grid: JobGrid,
        newest: Mapping[JobKey, float] | None,
        refused: str | None,
    ) -> None:
        """Put ``job`` in ``stale_jobs`` when its throughput or world size is not fresh."""
        if refused is not None:
            work.job_problem(job, f"throughput of {job}: {refused}")
            return
        if newest is None:
            work.job_problem(job, f"throughput of {job}: sample times unknown (query refused)")
            return
        if job not in newest:
            seen = self._last_seen_s.get(job)
            rated = max(grid.rates, default=None)
            age = ""
            if seen is not None:
                age = f"; newest sample {work.now_s - seen:.0f} s old"
            elif rated is not None:
                age = f"; newest rate {work.now_s - rated:.0f} s old"
            work.job_problem(job, f"throughput of {job}: no samples{age}")
            return
        problem = work.age_problem(f"throughput of {job}", newest[job])
        if problem is not None:
            work.job_problem(job, problem)
            return
        last_t = self._grid_end_s
        rate = grid.rates.get(last_t, math.nan) if last_t is not None else math.nan
        if not math.isfinite(rate):
            work.job_problem(
                job, f"throughput of {job}: {'NaN' if last_t in grid.rates else 'no rate'} now"
            )
            return
        size = grid.sizes.get(last_t, math.nan) if last_t is not None else math.nan
        if not math.isfinite(size):
            work.job_problem(job, f"world size of {job}: no samples now")

    def _read_grids(self, work: _Round) -> str | None:
        """Fetch the throughput and world-size grid since the last round; a refusal's sentence."""
        end = align_down(work.now_s, self.step_s)
        oldest = align_down(work.now_s - self.settings.lookback_s, self.step_s)
        # Refetch the last point of the round before: it may have been computed before its
        # samples were all scraped.
        start = oldest if self._grid_end_s is None else max(oldest, self._grid_end_s)
        try:
            rates = self._range("job_throughput", start, end)
            sizes = self._range("job_world_size", start, end)
        except QueryRefused as e:
            return f"query refused: {e}"
        by_job: dict[JobKey, tuple[dict[float, float], dict[float, float]]] = {}
        for kind, result in ((0, rates), (1, sizes)):
            for series in result:
                job = job_key(series.labels)
                if job is not None:
                    by_job.setdefault(job, ({}, {}))[kind].update(series.points)
        for job, (job_rates, job_sizes) in by_job.items():
            self._grids.setdefault(job, JobGrid()).merge(rates=job_rates, sizes=job_sizes)
        if self._grid_end_s is not None:  # a point of the refetched round that is gone now
            for job, grid in self._grids.items():
                if job not in by_job:
                    grid.rates.pop(self._grid_end_s, None)
                    grid.sizes.pop(self._grid_end_s, None)
        for job in list(self._grids):
            self._grids[job].trim(oldest)
            if not self._grids[job]:
                del self._grids[job]
        self._grid_end_s = end
        self._grid_start_s = oldest
        return None

    def _range(self, name: str, start_s: float, end_s: float) -> list[RangeSeries]:
        query = self._query(name)
        result: list[RangeSeries] = []
        for first, last in chunk_range(start_s, end_s, self.step_s):
            result.extend(self.querier.range(query, start_s=first, end_s=last, step_s=self.step_s))
        return result

    def _history(self, grid: JobGrid) -> tuple[ThroughputPoint, ...]:
        return representative_points(
            ((t, grid.sizes.get(t, math.nan), r) for t, r in grid.rates.items()),
            rate_window_s=self.settings.rate_window_s,
            # A job whose first point comes after the grid's first began within the lookback.
            grid_start_s=self._grid_start_s + self.step_s,
        )

    def _cached_histories(self) -> dict[JobKey, tuple[ThroughputPoint, ...]]:
        return {job: self._history(grid) for job, grid in sorted(self._grids.items())}

    # ------------------------------------------------------------------ demand

    def _read_demand(self, work: _Round) -> None:
        """Each queue's non-elastic demand since the last round, over the demand lookback."""
        end = align_down(work.now_s, self.step_s)
        oldest = align_down(work.now_s - self.settings.demand_lookback_s, self.step_s)
        start = oldest if self._demand_end_s is None else max(oldest, self._demand_end_s)
        try:
            result = self._range("queue_nonelastic_demand", start, end)
        except QueryRefused as e:
            # The forecast keeps the history it has; no reason to hold every job.
            work.problems.append(f"queue demand history: query refused: {e}")
            work.stale_series += 1
            return
        for series in result:
            queue = series.labels.get("queue_name", "")
            if queue:
                points = self._demand.setdefault(QueueName(queue), {})
                points.update((t, g) for t, g in series.points if math.isfinite(g))
        for queue in list(self._demand):
            points = self._demand[queue]
            for t in [t for t in points if t < oldest]:
                del points[t]
            if not points:
                del self._demand[queue]
        self._demand_end_s = end
