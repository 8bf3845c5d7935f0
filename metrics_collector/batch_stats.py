"""Adaptive-batch jobs' statistics from the workers' metrics: pure, from instant query results.

The workers (``worker_runtime.metrics.AdaptiveMetrics``) export, per pod, three step histograms
labelled with the shape they were measured at (``nodes``, ``replicas``, ``local_batch``) and
gauges of the gradient statistics, the batch and the progress. One instant query per figure
(``PrometheusQueries.job_*``) reads all jobs at once: the histograms as the mean per job and shape
over the step window (``_sum`` increase over ``_count`` increase), the gauges per job.

What is there is used, what is not is left out, never made up: a NaN or a missing gauge is None,
a shape whose synchronising step (``optim``) is missing or NaN keeps NaN there (the step model
leaves it out, and uses the shape's other parts), a series whose shape labels are not whole
numbers is skipped, and a job with no ``batch_size`` gauge reads 0 (no current batch known: the
engine then predicts the worker's first choice at every size). A job in none of the results has
no ``BatchStatistics``; its throughput curve serves as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from metrics_collector.querier import InstantSeries
from scheduler_policy.vocabulary.state import BatchStatistics, JobKey, StepTimes

STEP_QUERIES = ("job_optim_step_seconds", "job_accumulation_step_seconds", "job_sync_seconds")
"""The step histograms' means, in ``StepTimes`` field order (optim, accumulation, sync)."""
GAUGE_QUERIES = (
    "job_grad_sqr",
    "job_grad_var",
    "job_batch_size",
    "job_progress",
    "job_planned_progress",
)
BATCH_QUERIES = STEP_QUERIES + GAUGE_QUERIES
"""Every query the statistics read (``PrometheusQueries`` field names)."""

Shape = tuple[int, int, int]  # (nodes, replicas, local batch)


def _key(labels: Mapping[str, str]) -> JobKey | None:
    namespace, name = labels.get("namespace", ""), labels.get("volcano_job", "")
    return JobKey(f"{namespace}/{name}") if namespace and name else None


def _shape(labels: Mapping[str, str]) -> Shape | None:
    try:
        nodes, replicas, local = (int(labels[k]) for k in ("nodes", "replicas", "local_batch"))
    except (KeyError, ValueError):
        return None
    if nodes < 1 or replicas < 1 or local < 1:
        return None
    return nodes, replicas, local


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def batch_statistics(
    results: Mapping[str, Sequence[InstantSeries]],
) -> tuple[dict[JobKey, BatchStatistics], list[str]]:
    """Each job's ``BatchStatistics`` from the batch queries' results.

    Args:
        results: each query's series, by ``PrometheusQueries`` field name (a query that was
            refused or not sent is absent).

    Returns:
        The statistics per job, and a sentence per series left out for bad shape labels.
    """
    problems: list[str] = []
    parts: dict[JobKey, dict[Shape, list[float]]] = {}
    for position, name in enumerate(STEP_QUERIES):
        for series in results.get(name, ()):
            job = _key(series.labels)
            if job is None:
                continue
            shape = _shape(series.labels)
            if shape is None:
                shown = {k: series.labels.get(k) for k in ("nodes", "replicas", "local_batch")}
                problems.append(f"{name} of {job}: shape labels {shown} are not whole numbers >= 1")
                continue
            row = parts.setdefault(job, {}).setdefault(shape, [math.nan] * len(STEP_QUERIES))
            row[position] = series.value
    gauges: dict[JobKey, dict[str, float]] = {}
    for name in GAUGE_QUERIES:
        for series in results.get(name, ()):
            job = _key(series.labels)
            if job is not None and math.isfinite(series.value):
                gauges.setdefault(job, {})[name] = series.value
    found: dict[JobKey, BatchStatistics] = {}
    for job in sorted(parts.keys() | gauges.keys()):
        values = gauges.get(job, {})
        times = tuple(
            StepTimes(
                nodes=nodes,
                replicas=replicas,
                local_batch_size=local,
                optim_step_s=optim,
                accumulation_step_s=_finite(accumulation),
                sync_s=_finite(sync),
            )
            for (nodes, replicas, local), (optim, accumulation, sync) in sorted(
                parts.get(job, {}).items(), key=lambda item: (item[0][1], item[0][0], item[0][2])
            )
        )
        batch = values.get("job_batch_size")
        found[job] = BatchStatistics(
            batch_size=int(batch) if batch is not None and batch >= 1 else 0,
            grad_sqr=values.get("job_grad_sqr"),
            grad_var=values.get("job_grad_var"),
            progress=values.get("job_progress"),
            planned_progress=values.get("job_planned_progress"),
            step_times=times,
        )
    return found, problems
