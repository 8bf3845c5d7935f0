"""A cluster's Prometheus history as the jobs that ran in it, ready to write as a replayable trace.

Which series, and the labels they must carry (all overridable through ``HistoryLabels``):

- kube-state-metrics, with the pods' Volcano labels exported
  (``--metric-labels-allowlist=pods=[volcano.sh/job-name,volcano.sh/queue-name,tide.io/elastic]``;
  Volcano's job controller sets the first two on every pod it makes):
  ``kube_pod_labels{label_volcano_sh_job_name, label_volcano_sh_queue_name, label_tide_io_elastic}``
  says which pod belongs to which Volcano Job and queue, and whether tide may resize it;
  ``kube_pod_container_resource_requests{resource="nvidia_com_gpu"}`` its GPUs;
  ``kube_pod_status_phase{phase="Running"}`` when it ran; ``kube_pod_created`` when it was made.
- the worker runtime (``worker_runtime/metrics.py``): ``tide_worker_samples_total`` and
  ``tide_worker_world_size`` with labels ``namespace``, ``volcano_job``, ``pod``.

A job is a Volcano Job: ``namespace/name``. It arrives when its first pod is created (Volcano makes
a job's pods once it is enqueued, so time spent pending before that is not seen); it runs from the
first to the last grid point at which one of its GPU pods is Running; its replicas at a time are
its GPU pods Running then. Its throughput at a size is measured over the grid intervals in which
the same pods reported worker metrics at both ends, all with one world size and no counter reset:
the sum of their counters' increase over those intervals' time. Its work is the samples its pods'
counters gained over the run (each reset restarts from zero). Pods without GPUs are left out; a job
without GPU pods is skipped and named in ``ClusterHistory.skipped``.

Range queries are cut into chunks within Prometheus's limit of 11,000 points per series
(``metrics_collector.promql.chunk_range``). Prometheus is reached through a ``RangeQuerier``: in
production ``metrics_collector.prometheus.PrometheusQuerier``, the engine's own client (its
connection settings: bearer token, basic auth, CA bundle).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from metrics_collector.promql import chunk_range
from metrics_collector.sampling import QueryRefused, QueryUnavailable, RangeSeries
from scheduler_policy.vocabulary.errors import TideError

QUERIES = 6
"""Range queries an export runs (each over every chunk): pods' labels, GPU requests, Running
phase, creation time; workers' sample counters and world sizes."""

MIN_STABLE_INTERVALS = 2
"""Stable grid intervals a size needs before its throughput is reported."""


class HistoryError(TideError):
    """The history cannot be read: bad arguments, or Prometheus unreachable or refusing.

    Attributes:
        where: what is wrong: an option (``--step``) or Prometheus's URL.
        problem: what is wrong with it.
    """

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type[HistoryError], tuple[str, str]]:
        return type(self), (self.where, self.problem)


class RangeQuerier(Protocol):
    """Runs PromQL range queries against one Prometheus."""

    def range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> list[RangeSeries]:
        """The query at ``start_s, start_s + step_s, ...`` up to ``end_s`` (one chunk).

        Raises:
            QueryUnavailable: Prometheus did not answer.
            QueryRefused: Prometheus refused the query.
        """
        ...


@dataclass(frozen=True, slots=True)
class HistoryLabels:
    """The label names the export reads (kube-state-metrics spells ``a.b/c`` as ``label_a_b_c``).

    Attributes:
        job: the pod label naming its Volcano Job.
        queue: the pod label naming its Volcano Queue.
        elastic: the pod label that is ``"true"`` on pods of jobs tide may resize.
        gpu_resource: kube-state-metrics' ``resource`` value for GPUs.
    """

    job: str = "label_volcano_sh_job_name"
    queue: str = "label_volcano_sh_queue_name"
    elastic: str = "label_tide_io_elastic"
    gpu_resource: str = "nvidia_com_gpu"


@dataclass(frozen=True, slots=True)
class MeasuredThroughput:
    """A job's throughput at one size, measured over its stable intervals.

    Attributes:
        replicas: pods reporting worker metrics.
        samples_per_s: samples per second over all of them.
        measured_s: seconds of stable intervals it averages.
    """

    replicas: int
    samples_per_s: float
    measured_s: float


@dataclass(frozen=True, slots=True)
class HistoryJob:
    """One Volcano Job as Prometheus saw it.

    Attributes:
        key: ``namespace/name``.
        queue: its Volcano Queue, or None when its pods did not say.
        elastic: whether its pods carry the elastic label, or its size changed.
        submit_s: when its first pod was created, seconds since the epoch.
        start_s: the first grid time one of its GPU pods ran.
        end_s: one step after the last grid time one ran.
        gpus_per_replica: the most GPUs one of its pods requested.
        replicas: its first size held for two grid points (else its largest).
        min_replicas: its smallest size while running (its ``replicas`` if not elastic).
        max_replicas: its largest size.
        replicas_over_time: ``(time_s, replicas)`` at each change, from ``start_s``.
        throughput: measured samples/s by size; empty without worker metrics.
        work_samples: samples its pods trained on over the run; None without worker metrics.
    """

    key: str
    queue: str | None
    elastic: bool
    submit_s: float
    start_s: float
    end_s: float
    gpus_per_replica: int
    replicas: int
    min_replicas: int
    max_replicas: int
    replicas_over_time: tuple[tuple[float, int], ...]
    throughput: tuple[MeasuredThroughput, ...] = ()
    work_samples: float | None = None

    @property
    def run_s(self) -> float:
        """Seconds from its start to its end."""
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class ClusterHistory:
    """What an export found.

    Attributes:
        start_s: the range's first grid time, seconds since the epoch.
        end_s: the range's end.
        step_s: the grid's step.
        jobs: the jobs, by submission time.
        skipped: one sentence per job left out, naming it and why.
    """

    start_s: float
    end_s: float
    step_s: float
    jobs: tuple[HistoryJob, ...]
    skipped: tuple[str, ...] = ()


def parse_time(text: str, *, option: str) -> float:
    """Seconds since the epoch from RFC 3339 (``2026-12-01T09:00:00Z``) or epoch seconds.

    Raises:
        HistoryError: neither, or RFC 3339 without a time zone; the message names ``option``.
    """
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or value < 0:
            raise HistoryError(option, f"must be a time >= 0, got {text!r}")
        return value
    try:
        stamp = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise HistoryError(
            option, f"expected RFC 3339 (2026-12-01T09:00:00Z) or epoch seconds, got {text!r}"
        ) from None
    if stamp.tzinfo is None:
        raise HistoryError(option, f"give a time zone (Z or +hh:mm), got {text!r}")
    return stamp.timestamp()


Grid = dict[float, float]
"""Values by grid time."""


@dataclass
class _Reader:
    """Runs every query over every chunk, counting progress."""

    querier: RangeQuerier
    where: str
    windows: list[tuple[float, float]]
    step_s: float
    progress: Callable[[int, int], None] | None
    done: int = 0

    def series(self, query: str, keys: Sequence[str]) -> dict[tuple[str, ...], Grid]:
        merged: dict[tuple[str, ...], Grid] = {}
        for start, end in self.windows:
            try:
                found = self.querier.range(query, start_s=start, end_s=end, step_s=self.step_s)
            except (QueryUnavailable, QueryRefused) as e:
                raise HistoryError(self.where, str(e)) from e
            for s in found:
                key = tuple(s.labels.get(k, "") for k in keys)
                grid = merged.setdefault(key, {})
                grid.update((round(t, 3), v) for t, v in s.points if math.isfinite(v))
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, QUERIES * len(self.windows))
        return merged


@dataclass
class _Pod:
    job: str
    queue: str | None = None
    elastic: bool = False
    gpus: int = 0
    created_s: float | None = None
    running: set[float] = field(default_factory=set)
    seen: set[float] = field(default_factory=set)


def export_history(
    *,
    querier: RangeQuerier,
    start_s: float,
    end_s: float,
    step_s: float = 30.0,
    labels: HistoryLabels = HistoryLabels(),
    progress: Callable[[int, int], None] | None = None,
    where: str = "prometheus",
) -> ClusterHistory:
    """Read the jobs that ran between ``start_s`` and ``end_s`` (see the module docstring).

    Args:
        querier: reaches Prometheus.
        start_s: the range's start, seconds since the epoch (aligned down to the step).
        end_s: the range's end, after ``start_s``.
        step_s: seconds between grid points; replicas, run times and throughput are read at
            this resolution (keep it at least the scrape interval).
        labels: the label names to read.
        progress: called with (chunks done, chunks in all) after each chunk.
        where: Prometheus's name in messages (its URL).

    Returns:
        The jobs, and the ones skipped with the reason.

    Raises:
        HistoryError: a bad range or step, or Prometheus unreachable or refusing a query.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise HistoryError("--step", f"must be a positive number of seconds, got {step_s!r}")
    if not end_s > start_s:
        raise HistoryError("--end", f"must be after --start, got {end_s:g} <= {start_s:g}")
    start_s = math.floor(start_s / step_s) * step_s
    reader = _Reader(
        querier=querier,
        where=where,
        windows=chunk_range(start_s, end_s, step_s),
        step_s=step_s,
        progress=progress,
    )
    pods = _read_pods(reader, labels)
    worker_keys = ("namespace", "volcano_job", "pod")
    samples = reader.series(
        "sum by (namespace, volcano_job, pod) (tide_worker_samples_total)", worker_keys
    )
    sizes = reader.series(
        "max by (namespace, volcano_job, pod) (tide_worker_world_size)", worker_keys
    )
    by_job: dict[str, list[_Pod]] = {}
    for (namespace, _pod), pod in sorted(pods.items()):
        by_job.setdefault(f"{namespace}/{pod.job}", []).append(pod)
    jobs: list[HistoryJob] = []
    skipped: list[str] = []
    for key, members in sorted(by_job.items()):
        namespace, _, name = key.partition("/")
        job_samples = {k[2]: g for k, g in samples.items() if k[:2] == (namespace, name)}
        job_sizes = {k[2]: g for k, g in sizes.items() if k[:2] == (namespace, name)}
        try:
            jobs.append(_job(key, members, samples=job_samples, sizes=job_sizes, step_s=step_s))
        except ValueError as e:
            skipped.append(f"{key}: {e}")
    jobs.sort(key=lambda j: (j.submit_s, j.key))
    return ClusterHistory(
        start_s=start_s, end_s=end_s, step_s=step_s, jobs=tuple(jobs), skipped=tuple(skipped)
    )


def _read_pods(reader: _Reader, labels: HistoryLabels) -> dict[tuple[str, str], _Pod]:
    job, queue, elastic = labels.job, labels.queue, labels.elastic
    of_jobs = f'max by (namespace, pod) (kube_pod_labels{{{job}!=""}})'
    pods: dict[tuple[str, str], _Pod] = {}
    listing = reader.series(
        f'max by (namespace, pod, {job}, {queue}, {elastic}) (kube_pod_labels{{{job}!=""}})',
        ("namespace", "pod", job, queue, elastic),
    )
    for (namespace, pod, name, queue_name, flag), grid in listing.items():
        entry = pods.setdefault((namespace, pod), _Pod(job=name))
        entry.queue = queue_name or entry.queue
        entry.elastic = entry.elastic or flag == "true"
        entry.seen.update(grid)
    keys = ("namespace", "pod")
    gpu = f'resource="{labels.gpu_resource}"'
    requests = reader.series(
        f"sum by (namespace, pod) (kube_pod_container_resource_requests{{{gpu}}})"
        f" * on (namespace, pod) group_left () {of_jobs}",
        keys,
    )
    running = reader.series(
        '(max by (namespace, pod) (kube_pod_status_phase{phase="Running"}) == 1)'
        f" * on (namespace, pod) group_left () {of_jobs}",
        keys,
    )
    created = reader.series(
        f"max by (namespace, pod) (kube_pod_created) * on (namespace, pod) group_left () {of_jobs}",
        keys,
    )
    for (namespace, pod), grid in requests.items():
        if (namespace, pod) in pods and grid:
            pods[(namespace, pod)].gpus = max(round(v) for v in grid.values())
    for (namespace, pod), grid in running.items():
        if (namespace, pod) in pods:
            pods[(namespace, pod)].running.update(t for t, v in grid.items() if v >= 1)
    for (namespace, pod), grid in created.items():
        if (namespace, pod) in pods and grid:
            pods[(namespace, pod)].created_s = min(grid.values())
    return pods


def _job(
    key: str,
    members: list[_Pod],
    *,
    samples: Mapping[str, Grid],
    sizes: Mapping[str, Grid],
    step_s: float,
) -> HistoryJob:
    gpu_pods = [p for p in members if p.gpus > 0]
    if not gpu_pods:
        raise ValueError("none of its pods requested GPUs")
    times = sorted(set().union(*(p.running for p in gpu_pods)))
    if not times:
        raise ValueError("none of its GPU pods was seen Running")
    start, last = times[0], times[-1]
    grid = [start + i * step_s for i in range(round((last - start) / step_s) + 1)]
    counts = [sum(1 for p in gpu_pods if round(t, 3) in p.running) for t in grid]
    history: list[tuple[float, int]] = []
    for t, n in zip(grid, counts, strict=True):
        if not history or history[-1][1] != n:
            history.append((t, n))
    running_sizes = [n for n in counts if n > 0]
    held = [a for a, b in itertools.pairwise(counts) if a == b and a > 0]
    replicas = held[0] if held else max(running_sizes)
    elastic = any(p.elastic for p in members) or min(running_sizes) != max(running_sizes)
    created = [p.created_s for p in members if p.created_s is not None]
    submit = min(created) if created else min(min(p.seen, default=start) for p in members)
    throughput, work = _throughput(samples, sizes, step_s=step_s)
    return HistoryJob(
        key=key,
        queue=next((p.queue for p in members if p.queue), None),
        elastic=elastic,
        submit_s=min(submit, start),
        start_s=start,
        end_s=last + step_s,
        gpus_per_replica=max(p.gpus for p in gpu_pods),
        replicas=replicas if elastic else max(running_sizes),
        min_replicas=min(running_sizes) if elastic else max(running_sizes),
        max_replicas=max(running_sizes),
        replicas_over_time=tuple(history),
        throughput=throughput,
        work_samples=work,
    )


def _throughput(
    samples: Mapping[str, Grid], sizes: Mapping[str, Grid], *, step_s: float
) -> tuple[tuple[MeasuredThroughput, ...], float | None]:
    """Throughput by size over stable intervals, and the samples trained in all."""
    if not samples:
        return (), None
    times = sorted(set().union(*(g.keys() for g in samples.values())))
    work = 0.0
    per_size: dict[int, tuple[float, float, int]] = {}  # pods -> (samples, seconds, intervals)
    for a, b in itertools.pairwise(times):
        if b - a > step_s * 1.5:
            continue  # a gap: nothing was reported in between
        stable = True
        gained = 0.0
        reporting = 0
        world: set[float] = set()
        for pod, grid in samples.items():
            before, after = grid.get(a), grid.get(b)
            if after is None:
                stable = stable and before is None
                continue
            if before is None or after < before:  # a new pod, or its counter restarted
                work += after
                stable = False
                continue
            gained += after - before
            reporting += 1
            size = sizes.get(pod, {})
            world.update(v for v in (size.get(a), size.get(b)) if v is not None)
            stable = stable and a in size and b in size
        work += gained
        if stable and reporting and len(world) == 1:
            total, seconds, count = per_size.get(reporting, (0.0, 0.0, 0))
            per_size[reporting] = (total + gained, seconds + (b - a), count + 1)
    points = tuple(
        MeasuredThroughput(replicas=n, samples_per_s=total / seconds, measured_s=seconds)
        for n, (total, seconds, count) in sorted(per_size.items())
        if count >= MIN_STABLE_INTERVALS and total > 0
    )
    return points, work
