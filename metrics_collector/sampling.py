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

import bisect
import logging
import math
import operator
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from metrics_collector.batch_stats import BATCH_QUERIES, batch_statistics
from metrics_collector.promql import align_down, chunk_range, placeholder_values, render
from metrics_collector.querier import (
    InstantSeries,
    Querier,
    QueryRefused,
    QueryUnavailable,
    RangeSeries,
)
from metrics_collector.throughput import JobThroughput
from scheduler_policy.policy.spec import MetricsSettings, PrometheusQueries
from scheduler_policy.vocabulary.protocols import MetricsSample
from scheduler_policy.vocabulary.state import (
    BatchStatistics,
    DemandPoint,
    JobKey,
    QueueName,
    ThroughputPoint,
)

__all__ = [
    "DEMAND_FILL_S",
    "MILLI",
    "STALE_INTERVALS",
    # The query types live in querier.py; named here too for the modules that import them here.
    "InstantSeries",
    "Querier",
    "QueryRefused",
    "QueryUnavailable",
    "QueueFigures",
    "RangeSeries",
    "SampleBuilder",
    "SampleReport",
    "job_key",
]

logger = logging.getLogger(__name__)

MILLI = 1000.0
"""Volcano's scalar resources are milli-units: 1 GPU reads 1000."""

_TIME = operator.attrgetter("time_s")

_RANGE_QUERIES = frozenset(
    {"job_throughput", "job_world_size", "job_nodes", "queue_nonelastic_demand"}
)

DEMAND_FILL_S = 6 * 3600.0
"""Demand history read per round while the lookback fills, newest first: a week at the
interval's step is one heavy query over every pod, too slow for one round on a large cluster
(1,100 pods: a day took 6.5 s on a busy 2-core machine). The default week fills in 28 rounds."""

STALE_INTERVALS = 2.0
"""A series whose newest sample is older than this many decision intervals is stale."""


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

    Every query of a round goes out at its start, ``parallel`` at a time: a round's time is then
    about its slowest query's rather than the sum of all of them.

    Args:
        querier: where queries go (called from ``parallel`` threads at once).
        settings: the policy's metrics settings (templates, windows, lookbacks).
        interval_s: the decision interval: sets the staleness limit and the history's step.
        parallel: queries in flight at once.
        cluster_figures: whether to read the cluster's allocatable and requested GPUs from
            Prometheus (kube-state-metrics). The engine on a cluster reads them from the
            Kubernetes API instead (its nodes and pods, watched: exact and current), and then
            passes False: ``cluster_free_gpus`` is NaN and ``observe`` takes the nodes' figure.

    Raises:
        ValueError: ``interval_s`` or ``parallel`` is out of range, or a template names an
            unknown placeholder (the message names the query).
    """

    def __init__(
        self,
        querier: Querier,
        *,
        settings: MetricsSettings,
        interval_s: float,
        parallel: int = 4,
        cluster_figures: bool = True,
    ) -> None:
        if not math.isfinite(interval_s) or interval_s <= 0:
            raise ValueError(f"interval_s: must be a positive number of seconds, got {interval_s}")
        if parallel < 1:
            raise ValueError(f"parallel: must be at least 1, got {parallel}")
        self.querier = querier
        self.settings = settings
        self.interval_s = interval_s
        self.cluster_figures = cluster_figures
        # Range queries round their times to whole seconds: keep the grid on whole seconds.
        self.step_s = float(max(1, round(interval_s)))
        self._values = placeholder_values(settings)
        self._queries = {
            name: render(getattr(settings.queries, name), self._values, name=name)
            for name in PrometheusQueries.__dataclass_fields__
        }
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="tide-promql")
        self._instants: dict[str, Future[list[InstantSeries]]] = {}
        self._ranges: dict[str, Future[list[RangeSeries]]] = {}
        self._trackers: dict[JobKey, JobThroughput] = {}
        self._last_seen_s: dict[JobKey, float] = {}
        self._grid_end_s: float | None = None
        self._grid_start_s = -math.inf  # the oldest time the grid holds now
        self._demand: dict[QueueName, list[DemandPoint]] = {}
        self._demand_end_s: float | None = None
        self._demand_from_s: float | None = None  # the oldest time the history was read from
        self.last_report = SampleReport()

    def close(self) -> None:
        """Stop the query threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _instant(self, name: str, now_s: float) -> list[InstantSeries]:
        future = self._instants.pop(name, None)
        if future is None:
            return self.querier.instant(self._queries[name], time_s=now_s)
        return future.result()

    def _send(self, now_s: float) -> None:
        """Send every query of the round at ``now_s``; their answers are read as needed."""
        self._instants = {
            name: self._pool.submit(self.querier.instant, query, time_s=now_s)
            for name, query in self._queries.items()
            if name not in _RANGE_QUERIES
            and (self.cluster_figures or not name.startswith("cluster_"))
        }
        grid_start, grid_end, _ = self._grid_window(now_s)
        (new_start, new_end), (fill_start, fill_end) = self._demand_windows(now_s)
        windows = {
            "job_throughput": (grid_start, grid_end),
            "job_world_size": (grid_start, grid_end),
            "job_nodes": (grid_start, grid_end),
            "queue_nonelastic_demand": (new_start, new_end),
            "queue_nonelastic_demand fill": (fill_start, fill_end),
        }
        self._ranges = {
            name: self._pool.submit(self._range_now, name, start, end)
            for name, (start, end) in windows.items()
            if start <= end
        }

    def _grid_window(self, now_s: float) -> tuple[float, float, float]:
        """(start, end, oldest) of the throughput grid's fetch this round."""
        end = align_down(now_s, self.step_s)
        oldest = align_down(now_s - self.settings.lookback_s, self.step_s)
        if self._grid_end_s is None:
            return oldest, end, oldest
        return max(oldest, self._grid_end_s + self.step_s), end, oldest

    def _demand_windows(self, now_s: float) -> tuple[tuple[float, float], tuple[float, float]]:
        """The demand history's two fetches this round: the points since the last round, and
        ``DEMAND_FILL_S`` further back while the lookback is not yet filled (either may be
        empty)."""
        end = align_down(now_s, self.step_s)
        oldest = align_down(now_s - self.settings.demand_lookback_s, self.step_s)
        if self._demand_stale(end) or self._demand_end_s is None or self._demand_from_s is None:
            return (max(oldest, end - DEMAND_FILL_S + self.step_s), end), (1.0, 0.0)
        new = (self._demand_end_s + self.step_s, end)
        fill = (max(oldest, self._demand_from_s - DEMAND_FILL_S), self._demand_from_s - self.step_s)
        return new, fill

    def sample(self, *, now_s: float) -> MetricsSample:
        """See ``MetricsSource.sample``; never raises for Prometheus trouble."""
        started = time.perf_counter()
        work = _Round(now_s=now_s, max_age_s=STALE_INTERVALS * self.interval_s)
        free_gpus = 0.0 if self.cluster_figures else math.nan
        queues: dict[QueueName, QueueFigures] = {}
        histories: dict[JobKey, tuple[ThroughputPoint, ...]] = {}
        remaining: dict[JobKey, float] = {}
        batch: dict[JobKey, BatchStatistics] = {}
        reachable = True
        try:
            self._send(now_s)
            free_gpus = self._cluster(work) if self.cluster_figures else math.nan
            queues = self._queues(work)
            histories, remaining = self._jobs(work)
            batch = self._batch(work)
            self._read_demand(work)
        except QueryUnavailable as e:
            reachable = False
            work.global_problem(f"Prometheus unreachable: {e}")
            histories = self._cached_histories()
            for job in histories:
                work.job_problem(job, f"metrics of {job}: Prometheus unreachable")
        allocated = {q: f.allocated_gpus for q, f in queues.items() if f.allocated_gpus is not None}
        deserved = {q: f.deserved_gpus for q, f in queues.items() if f.deserved_gpus is not None}
        request = {q: f.request_gpus for q, f in queues.items() if f.request_gpus is not None}
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
            queue_deserved_gpus=deserved,
            queue_request_gpus=request,
            queue_demand_history={q: tuple(points) for q, points in self._demand.items()},
            job_batch_statistics=batch,
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
        nothing = JobThroughput(rate_window_s=self.settings.rate_window_s)
        for job in sorted(set(self._trackers) | set(self._last_seen_s)):
            tracker = self._trackers.get(job, nothing)
            histories[job] = tracker.points(oldest_s=oldest)
            self._check_job(work, job, tracker, newest, refused)
        remaining = {
            job: max(0.0, planned[job] - consumed[job])
            for job in planned
            if job in consumed and math.isfinite(planned[job]) and math.isfinite(consumed[job])
        }
        return histories, remaining

    def _batch(self, work: _Round) -> dict[JobKey, BatchStatistics]:
        """Adaptive-batch jobs' statistics (``metrics_collector.batch_stats``); a refused
        query is a problem and its figure absent, never a stale job."""
        results: dict[str, list[InstantSeries]] = {}
        for name in BATCH_QUERIES:
            try:
                results[name] = self._instant(name, work.now_s)
            except QueryRefused as e:
                work.problems.append(f"{name}: query refused: {e}")
        found, problems = batch_statistics(results)
        work.problems.extend(problems)
        return found

    def _check_job(
        self,
        work: _Round,
        job: JobKey,
        tracker: JobThroughput,
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
            age = ""
            if seen is not None:
                age = f"; newest sample {work.now_s - seen:.0f} s old"
            elif tracker.newest_rate_s is not None:
                age = f"; newest rate {work.now_s - tracker.newest_rate_s:.0f} s old"
            work.job_problem(job, f"throughput of {job}: no samples{age}")
            return
        problem = work.age_problem(f"throughput of {job}", newest[job])
        if problem is not None:
            work.job_problem(job, problem)
            return
        current = tracker.newest_s == self._grid_end_s
        if not current or not math.isfinite(tracker.newest_rate):
            state = "NaN" if current and math.isnan(tracker.newest_rate) else "no rate"
            work.job_problem(job, f"throughput of {job}: {state} now")
            return
        if not math.isfinite(tracker.newest_size):
            work.job_problem(job, f"world size of {job}: no samples now")

    def _read_grids(self, work: _Round) -> str | None:
        """Feed the throughput and world-size points since the last round to each job's
        tracker; a refused query's sentence, or None."""
        start, end, oldest = self._grid_window(work.now_s)
        if self._grid_end_s is None:
            self._grid_start_s = oldest
        if start <= end:
            try:
                rates = self._range("job_throughput", start, end)
                sizes = self._range("job_world_size", start, end)
            except QueryRefused as e:
                return f"query refused: {e}"
            try:
                nodes = self._range("job_nodes", start, end)
            except QueryRefused:
                nodes = []  # the nodes are then unknown; throughput and sizes still count
            by_job: dict[JobKey, tuple[dict[float, float], ...]] = {}
            for kind, result in ((0, rates), (1, sizes), (2, nodes)):
                for series in result:
                    job = job_key(series.labels)
                    if job is not None:
                        by_job.setdefault(job, ({}, {}, {}))[kind].update(series.points)
            for job, (job_rates, job_sizes, job_nodes) in by_job.items():
                tracker = self._trackers.get(job)
                if tracker is None:
                    tracker = self._trackers[job] = JobThroughput(
                        rate_window_s=self.settings.rate_window_s,
                        # A job whose first point comes after the grid's first began within it.
                        grid_start_s=self._grid_start_s + self.step_s,
                    )
                for t in sorted(job_rates.keys() | job_sizes.keys()):
                    tracker.add(
                        t,
                        job_sizes.get(t, math.nan),
                        job_rates.get(t, math.nan),
                        nodes=job_nodes.get(t, math.nan),
                    )
            self._grid_end_s = end
        for job in list(self._trackers):
            tracker = self._trackers[job]
            tracker.forget_before(oldest)
            if tracker.newest_s < oldest:
                del self._trackers[job]
        return None

    def _range(self, name: str, start_s: float, end_s: float) -> list[RangeSeries]:
        future = self._ranges.pop(name, None)
        if future is None:
            return self._range_now(name, start_s, end_s)
        return future.result()

    def _range_now(self, name: str, start_s: float, end_s: float) -> list[RangeSeries]:
        query = self._queries[name.removesuffix(" fill")]
        result: list[RangeSeries] = []
        for first, last in chunk_range(start_s, end_s, self.step_s):
            result.extend(self.querier.range(query, start_s=first, end_s=last, step_s=self.step_s))
        return result

    def _cached_histories(self) -> dict[JobKey, tuple[ThroughputPoint, ...]]:
        return {job: tracker.points() for job, tracker in sorted(self._trackers.items())}

    # ------------------------------------------------------------------ demand

    def _demand_stale(self, end_s: float) -> bool:
        """Whether the rounds stopped for longer than a fill: then the history starts over."""
        return self._demand_end_s is not None and end_s - self._demand_end_s > DEMAND_FILL_S

    def _read_demand(self, work: _Round) -> None:
        """Each queue's non-elastic demand since the last round, and further back while the
        lookback fills.

        Points are appended (or, filling, prepended) in time order and trimmed from the front,
        so a round costs its new points and one copy of each queue's list into the sample, not
        the lookback. Trouble here costs the forecast some history, never the round its
        freshness: the next round asks again.
        """
        (new_start, new_end), (fill_start, fill_end) = self._demand_windows(work.now_s)
        oldest = align_down(work.now_s - self.settings.demand_lookback_s, self.step_s)
        if self._demand_stale(new_end):
            self._demand.clear()
            self._demand_end_s = self._demand_from_s = None
        for name, start, end in (
            ("queue_nonelastic_demand", new_start, new_end),
            ("queue_nonelastic_demand fill", fill_start, fill_end),
        ):
            if start > end:
                continue
            try:
                result = self._range(name, start, end)
            except (QueryRefused, QueryUnavailable) as e:
                work.problems.append(f"queue demand history: {e}")
                work.stale_series += 1
                continue
            filling = name.endswith(" fill")
            read: dict[QueueName, list[DemandPoint]] = {}
            for series in result:  # a queue's series comes once per chunk
                queue = series.labels.get("queue_name", "")
                if queue:
                    read.setdefault(QueueName(queue), []).extend(
                        DemandPoint(t, g) for t, g in series.points if math.isfinite(g)
                    )
            for queue, new_points in read.items():
                new_points.sort(key=_TIME)
                points = self._demand.setdefault(queue, [])
                if filling:
                    points[:0] = new_points
                else:
                    points.extend(new_points)
            if filling:
                self._demand_from_s = start
            else:
                if self._demand_end_s is None:
                    self._demand_from_s = start
                self._demand_end_s = end
        if self._demand_from_s is not None:
            self._demand_from_s = max(oldest, self._demand_from_s)
        for queue in list(self._demand):
            points = self._demand[queue]
            cut = bisect.bisect_left(points, oldest, key=_TIME)
            if cut:
                del points[:cut]
            if not points:
                del self._demand[queue]
