"""Observations written as YAML or JSON, for ``tide plan`` and for tests.

The format mirrors the dataclasses in ``vocabulary.state`` with camelCase keys::

    time: 1700000000               # the decision time, seconds since the epoch (required)
    clusterGpus: 48                # optional: the cluster's allocatable GPUs, to check the rest
    clusterFreeGpus: 6
    metricsFresh: true             # false: the cluster- or queue-level figures are stale
    queues:
      - {name: research, capabilityGpus: 32, deservedGpus: 16, allocatedGpus: 10}
    jobs:
      - key: team-a/bert
        queue: research
        gpusPerReplica: 1
        minReplicas: 1             # a job's tide.io/* annotations, if given, override these
        maxReplicas: 8
        currentReplicas: 2
        scheduledReplicas: 2       # pods bound to a node; the rest wait for GPUs (default: all)
        phase: Running
        elastic: true
        throughput: [{time: 1699999000, replicas: 2, samplesPerS: 190, nodes: 1}]  # nodes: optional
        metricsFresh: true         # false: this job's own throughput is stale (it holds)
        staleReason: "..."         # with metricsFresh false: what was stale, for `tide plan`
        annotations: {tide.io/max-replicas: "16"}   # tide.io/memory too, as tide stores it
        batchBounds: {...}         # an adaptive-batch job's bounds and what its workers report:
        batchStatistics: {...}     # see scheduler_policy.adapters.observation_batch

Every problem names the file and its path; all problems are reported at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from scheduler_policy.adapters.observation_batch import read_bounds, read_statistics
from scheduler_policy.adapters.volcano_job import annotated_job
from scheduler_policy.policy.fields import (
    Section,
    boolean,
    duration,
    finite_number,
    non_negative,
    nonempty_string,
    optional_non_negative,
    read_yaml_documents,
    section,
    show,
)
from scheduler_policy.vocabulary.errors import ObservationError, PolicyError
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobPhase,
    JobState,
    Observation,
    QueueName,
    QueueState,
    ThroughputPoint,
)

_TOP = ("time", "clusterGpus", "clusterFreeGpus", "metricsFresh", "queues", "jobs")
_QUEUE = (
    "name", "capabilityGpus", "deservedGpus", "guaranteeGpus", "allocatedGpus",
    "pendingNonelasticGpus", "weight", "requestGpus",
)  # fmt: skip
_JOB = (
    "key", "queue", "gpusPerReplica", "minReplicas", "maxReplicas", "currentReplicas",
    "scheduledReplicas", "phase", "elastic", "task", "restartCost", "remainingSamples",
    "lastRescale", "annotations", "throughput", "nonelasticGpus", "metricsFresh", "staleReason",
    "batchBounds", "batchStatistics",
)  # fmt: skip
_POINT = ("time", "replicas", "samplesPerS", "nodes")
_PHASES = {phase.value: phase for phase in JobPhase}


def _count(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{path}: must be a non-negative integer, got {show(value)}")
    return value


def _optional_nodes(value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: must be an integer >= 1 (nodes spanned), got {show(value)}")
    return value


def _positive(value: object, path: str) -> float:
    number = finite_number(value, path)
    if number <= 0:
        raise ValueError(f"{path}: must be > 0, got {show(value)}")
    return number


def _phase(value: object, path: str) -> JobPhase:
    if not isinstance(value, str) or value not in _PHASES:
        raise ValueError(f"{path}: must be one of {', '.join(_PHASES)}, got {show(value)}")
    return _PHASES[value]


def _items(section: Section, key: str) -> list[tuple[str, object]]:
    value = section.mapping.get(key, [])
    path = f"{section.path}.{key}" if section.path else key
    if not isinstance(value, list):
        section.problems.append(f"{path}: must be a list, got {show(value)}")
        return []
    return [(f"{path}[{i}]", item) for i, item in enumerate(value)]


def _queue(value: object, path: str, problems: list[str]) -> QueueState | None:
    q = section(value, path=path, allowed=_QUEUE, problems=problems)
    if q is None:
        return None
    if "name" not in q.mapping:
        problems.append(f"{path}.name: is required")
    return QueueState(
        name=QueueName(q.get("name", "", nonempty_string)),
        capability_gpus=q.get("capabilityGpus", None, optional_non_negative),
        deserved_gpus=q.get("deservedGpus", None, optional_non_negative),
        guarantee_gpus=q.get("guaranteeGpus", 0.0, non_negative),
        allocated_gpus=q.get("allocatedGpus", 0.0, non_negative),
        pending_nonelastic_gpus=q.get("pendingNonelasticGpus", 0.0, non_negative),
        weight=q.get("weight", 1.0, non_negative),
        request_gpus=q.get("requestGpus", None, optional_non_negative),
    )


def _point(value: object, path: str, problems: list[str]) -> ThroughputPoint | None:
    p = section(value, path=path, allowed=_POINT, problems=problems)
    if p is None:
        return None
    if "time" not in p.mapping:
        problems.append(f"{path}.time: is required (when the sample was taken, seconds)")
    return ThroughputPoint(
        time_s=p.get("time", 0.0, non_negative),
        replicas=p.get("replicas", 1, _count),
        samples_per_s=p.get("samplesPerS", 0.0, non_negative),
        nodes=p.get("nodes", None, _optional_nodes),
    )


def _job(value: object, path: str, problems: list[str]) -> JobState | None:
    j = section(value, path=path, allowed=_JOB, problems=problems)
    if j is None:
        return None
    j.require("key", "queue")
    points = [_point(v, p, problems) for p, v in _items(j, "throughput")]
    job = JobState(
        key=JobKey(j.get("key", "", nonempty_string)),
        queue=QueueName(j.get("queue", "", nonempty_string)),
        gpus_per_replica=j.get("gpusPerReplica", 1.0, _positive),
        min_replicas=j.get("minReplicas", 1, _count),
        max_replicas=j.get("maxReplicas", 1, _count),
        current_replicas=j.get("currentReplicas", 1, _count),
        scheduled_replicas=j.get("scheduledReplicas", None, _count),
        phase=j.get("phase", JobPhase.RUNNING, _phase),
        elastic=j.get("elastic", False, boolean),
        task=j.get("task", "worker", nonempty_string),
        restart_cost_s=j.get("restartCost", None, duration),
        remaining_samples=j.get("remainingSamples", None, optional_non_negative),
        last_rescale_s=j.get("lastRescale", None, optional_non_negative),
        throughput_history=tuple(p for p in points if p is not None),
        nonelastic_gpus=j.get("nonelasticGpus", 0.0, non_negative),
        batch_bounds=(
            read_bounds(j.mapping["batchBounds"], f"{path}.batchBounds", problems)
            if "batchBounds" in j.mapping
            else None
        ),
        batch_statistics=(
            read_statistics(j.mapping["batchStatistics"], f"{path}.batchStatistics", problems)
            if "batchStatistics" in j.mapping
            else None
        ),
    )
    fresh = j.get("metricsFresh", True, boolean)
    stale_reason = j.get("staleReason", None, _optional_sentence)
    if stale_reason is not None and fresh:
        problems.append(f"{path}.staleReason: given for a job whose metricsFresh is true")
    if not fresh:
        job = dataclasses.replace(
            job, stale_reason=stale_reason or "the metrics source marked them stale"
        )
    annotations = j.mapping.get("annotations", {})
    if not isinstance(annotations, Mapping):
        problems.append(f"{path}.annotations: must be a mapping, got {show(annotations)}")
        return job
    # A bad annotation makes this one job unplannable (InvalidJobSpec), not the file.
    return annotated_job(job, {str(k): str(v) for k, v in annotations.items()},
                         source=f"{path} ({job.key})")  # fmt: skip


def _optional_sentence(value: object, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}: must be a sentence saying what was stale, got {show(value)}")
    return value.strip()


def _refuse_duplicates(
    named: list[tuple[str, str]], field: str, what: str, problems: list[str]
) -> None:
    """A problem for each ``(path, name)`` whose name an earlier one already has."""
    first: dict[str, str] = {}
    for path, name in named:
        if name in first:
            problems.append(
                f"{path}.{field}: duplicate {what} {name!r}, first defined at {first[name]}"
            )
        else:
            first[name] = path


def _check_against_time_and_size(
    top: Section,
    jobs: list[JobState | None],
    job_items: list[tuple[str, object]],
    queues: list[QueueState | None],
    problems: list[str],
) -> None:
    """What no field says alone: a throughput sample after the observation's time (from the
    future: a clock or unit mix-up), and free or allocated GPUs above ``clusterGpus``."""
    scratch: list[str] = []  # the fields' own problems are reported where they are read
    now = Section(top.mapping, top.path, scratch).get("time", None, non_negative)
    if now is not None:
        for (path, _), job in zip(job_items, jobs, strict=True):
            for i, point in enumerate(job.throughput_history if job is not None else ()):
                if point.time_s > now:
                    problems.append(
                        f"{path}.throughput[{i}].time: {point.time_s:g} is after the "
                        f"observation's time {now:g} (a sample from the future)"
                    )
    total = Section(top.mapping, top.path, scratch).get("clusterGpus", None, non_negative)
    free = Section(top.mapping, top.path, scratch).get("clusterFreeGpus", None, non_negative)
    if total is None:
        return
    if free is not None and free > total:
        problems.append(
            f"clusterFreeGpus: {free:g} is above the cluster's {total:g} GPUs (clusterGpus)"
        )
    allocated = sum(q.allocated_gpus for q in queues if q is not None)
    if free is not None and free <= total and free + allocated > total:
        problems.append(
            f"clusterFreeGpus: {free:g} free and {allocated:g} allocated to queues add up to "
            f"more than the cluster's {total:g} GPUs (clusterGpus)"
        )


def parse_observation(data: object, *, source: str) -> Observation:
    """Build an observation from parsed YAML or JSON.

    Args:
        data: the parsed document.
        source: the file it came from, named in errors.

    Returns:
        The observation.

    Raises:
        ObservationError: every problem in the document, each with its path and value.
    """
    problems: list[str] = []
    top = section(data, path="", allowed=_TOP, problems=problems)
    if top is None:
        raise ObservationError(f"{source}: {problems[0]}")
    queue_items = list(_items(top, "queues"))
    job_items = list(_items(top, "jobs"))
    queues = [_queue(v, p, problems) for p, v in queue_items]
    jobs = [_job(v, p, problems) for p, v in job_items]
    # A queue or a job given twice would be planned twice (two writes to one Job).
    _refuse_duplicates(
        [(p, q.name) for (p, _), q in zip(queue_items, queues, strict=True) if q is not None],
        "name",
        "queue",
        problems,
    )
    _refuse_duplicates(
        [(p, j.key) for (p, _), j in zip(job_items, jobs, strict=True) if j is not None],
        "key",
        "job",
        problems,
    )
    if "time" not in top.mapping:
        problems.append("time: is required (the decision time, seconds since the epoch)")
    _check_against_time_and_size(top, jobs, job_items, queues, problems)
    observation = Observation(
        time_s=top.get("time", 0.0, non_negative),
        queues=tuple(q for q in queues if q is not None),
        jobs=tuple(j for j in jobs if j is not None),
        cluster_free_gpus=top.get("clusterFreeGpus", 0.0, non_negative),
        metrics_fresh=top.get("metricsFresh", True, boolean),
    )
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ObservationError(f"{source}: {len(problems)} problem(s):\n{listing}")
    return observation


def load_observation(path: str | Path) -> Observation:
    """Read an observation from a YAML or JSON file (JSON is YAML).

    Raises:
        ObservationError: the file cannot be read or is invalid.
    """
    try:
        documents = read_yaml_documents(path)
    except PolicyError as e:
        raise ObservationError(str(e)) from e
    if len(documents) != 1:
        raise ObservationError(f"{path}: must hold exactly one document, found {len(documents)}")
    return parse_observation(documents[0], source=str(path))


def example_observation_path() -> Path:
    """The built-in example observation that ``tide plan`` uses with no arguments."""
    return Path(str(resources.files("scheduler_policy") / "examples" / "observation.yaml"))


def example_policy_path() -> Path:
    """The built-in example policy that ``tide plan`` uses with no ``--policy``."""
    return Path(str(resources.files("scheduler_policy") / "examples" / "policy.yaml"))
