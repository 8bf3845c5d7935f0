"""``JobMemory`` as the annotation tide stores on each Volcano Job, and back.

The stabilizer's memory (the last rescale and the recent recommendations) must survive the
engine's restarts, so it lives on the object it is about (STYLE.md 12)::

    metadata:
      annotations:
        tide.io/memory: '{"v":2,"lastRescaleS":1700000000.5,"recommendations":[[1699999940.0,4]],
                          "requestedReplicas":6}'

So does the size the job's owner asked for (``requestedReplicas``: the scaling task's replicas
when tide first wrote to the Job, before any change of its own; starvation aging measures a
job's share against it): once tide has changed the replicas, the Job no longer says it.

The value is compact JSON, versioned by ``"v"``: version 2 (written) adds
``requestedReplicas``, absent when not known; a version-1 value (written before it) still reads,
with the asked size unknown. Floats are written as Python's ``repr`` writes
them (the shortest string that reads back to the same float), so a memory read back is exactly
the memory written: the simulator, which stores every job's memory through this codec, decides
exactly as it would holding the objects.

Size: at most ``MAX_RECOMMENDATIONS`` recommendations are kept, the newest; an older one is
dropped (and a warning logged) only when a job's recommendation changed more often than that
within the longest stabilization window. With times finite and replicas within int32 (as
Kubernetes replicas are), each recommendation takes at most 38 bytes (the asked size 32 more,
once), so the value stays under
``MAX_BYTES`` (10 KiB), far inside the 256 KiB Kubernetes allows for all of an object's
annotations together.

Reading never fails: an absent annotation is no memory, and a corrupt or foreign one (bad JSON,
an unknown version, wrong types) is no memory too, with a warning that names the job and what
was wrong; the job then starts afresh (no cooldown, empty windows) rather than stopping the loop.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler_policy.policy.annotations import MEMORY
from scheduler_policy.vocabulary.state import JobMemory, Recommendation

__all__ = [
    "MAX_BYTES",
    "MAX_RECOMMENDATIONS",
    "MEMORY_ANNOTATION",
    "READ_VERSIONS",
    "VERSION",
    "StoredMemory",
    "decode_memory",
    "decode_stored",
    "encode_memory",
    "memory_from_annotations",
    "stored_from_annotations",
]

logger = logging.getLogger(__name__)

MEMORY_ANNOTATION = MEMORY
"""The annotation the memory is stored in, ``tide.io/memory``."""

VERSION = 2
"""The format written."""

READ_VERSIONS = (1, 2)
"""The formats read; a value of another version is read as no memory."""

MAX_RECOMMENDATIONS = 256
"""Recommendations kept in one value, the newest."""

MAX_BYTES = 10 * 1024
"""An upper bound on the encoded value's length, bytes (it is ASCII)."""

_INT32_MAX = 2**31 - 1
_KEYS = {
    1: frozenset(("v", "lastRescaleS", "recommendations")),
    2: frozenset(("v", "lastRescaleS", "recommendations", "requestedReplicas")),
}


@dataclass(frozen=True, slots=True)
class StoredMemory:
    """What the annotation holds: the stabilizer's memory and the job's asked size.

    Attributes:
        memory: the stabilizer's memory.
        requested_replicas: the scaling task's replicas its owner asked for; None when the
            value does not say (version 1, or written without it).
    """

    memory: JobMemory
    requested_replicas: int | None = None


def _finite_float(value: object) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)


def encode_memory(
    memory: JobMemory, *, job: str = "?", requested_replicas: int | None = None
) -> str:
    """The annotation value for ``memory`` (and the job's asked size).

    Args:
        memory: what the stabilizer remembers about one job.
        job: the job (``namespace/name``), named in errors and in the warning below.
        requested_replicas: the replicas the job's owner asked for; None leaves it out.

    Returns:
        Compact JSON, at most ``MAX_BYTES`` long. When ``memory`` holds more than
        ``MAX_RECOMMENDATIONS`` recommendations, only the newest are written, and a warning
        says how many were dropped.

    Raises:
        ValueError: a time is not finite, or replicas (or ``requested_replicas``) are not an
            integer in [0, 2**31 − 1]; the message names the job and the value.
    """
    if requested_replicas is not None and (
        type(requested_replicas) is not int or not 0 <= requested_replicas <= _INT32_MAX
    ):
        raise ValueError(
            f"job {job}: requested_replicas must be an integer in [0, {_INT32_MAX}], "
            f"got {requested_replicas!r}"
        )
    last = memory.last_rescale_s
    if last is not None and not _finite_float(last):
        raise ValueError(f"job {job}: memory.last_rescale_s must be a finite number, got {last!r}")
    recommendations = memory.recommendations
    if len(recommendations) > MAX_RECOMMENDATIONS:
        logger.warning(
            "job %s: memory holds %d recommendations; keeping the newest %d",
            job, len(recommendations), MAX_RECOMMENDATIONS,
        )  # fmt: skip
        recommendations = recommendations[-MAX_RECOMMENDATIONS:]
    for i, (time_s, replicas) in enumerate(recommendations):
        if not _finite_float(time_s):
            raise ValueError(
                f"job {job}: memory.recommendations[{i}].time_s must be a finite number, "
                f"got {time_s!r}"
            )
        if type(replicas) is not int or not 0 <= replicas <= _INT32_MAX:
            raise ValueError(
                f"job {job}: memory.recommendations[{i}].replicas must be an integer in "
                f"[0, {_INT32_MAX}], got {replicas!r}"
            )
    # Recommendations are tuples, which json writes as arrays; floats are written by repr.
    value: dict[str, object] = {
        "v": VERSION,
        "lastRescaleS": last,
        "recommendations": recommendations,
    }
    if requested_replicas is not None:
        value["requestedReplicas"] = requested_replicas
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def decode_memory(value: str | None, *, job: str = "?") -> JobMemory:
    """The memory stored in an annotation value.

    Args:
        value: the annotation's value; None when the job has none.
        job: the job (``namespace/name``), named in the warning.

    Returns:
        The memory; an empty ``JobMemory()`` for None, and for a corrupt or foreign value
        (after a warning naming the job and what was wrong). Never raises.
    """
    return decode_stored(value, job=job).memory


def decode_stored(value: str | None, *, job: str = "?") -> StoredMemory:
    """The memory and the asked size stored in an annotation value.

    Args:
        value: the annotation's value; None when the job has none.
        job: the job (``namespace/name``), named in the warning.

    Returns:
        What it holds; no memory and no asked size for None, and for a corrupt or foreign
        value (after a warning naming the job and what was wrong). Never raises.
    """
    if value is None:
        return _NOTHING
    parsed = _parse(value)
    if isinstance(parsed, StoredMemory):
        return parsed
    logger.warning(
        "job %s: ignoring annotation %s (%s); starting with no memory",
        job, MEMORY_ANNOTATION, parsed,
    )  # fmt: skip
    return _NOTHING


_NOTHING = StoredMemory(JobMemory())


def memory_from_annotations(annotations: Mapping[str, str], *, job: str = "?") -> JobMemory:
    """The memory stored in a job's annotations (``decode_memory`` of ``tide.io/memory``)."""
    return decode_memory(annotations.get(MEMORY_ANNOTATION), job=job)


def stored_from_annotations(annotations: Mapping[str, str], *, job: str = "?") -> StoredMemory:
    """What a job's annotations store (``decode_stored`` of ``tide.io/memory``)."""
    return decode_stored(annotations.get(MEMORY_ANNOTATION), job=job)


def _parse(value: str) -> StoredMemory | str:
    """What ``value`` holds, or what is wrong with it."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    try:
        data = json.loads(value)
    except (ValueError, RecursionError) as e:
        return f"not JSON: {e}"
    if not isinstance(data, dict):
        return f"must be a JSON object, got {type(data).__name__}"
    version = data.get("v")
    if type(version) is not int or version not in READ_VERSIONS:
        known = " and ".join(map(str, READ_VERSIONS))
        return f"unknown version {version!r}, this engine reads versions {known}"
    unknown = set(data) - _KEYS[version]
    if unknown:
        return f"unknown field(s) {', '.join(sorted(map(str, unknown)))}"
    last = data.get("lastRescaleS")
    if last is not None and not _finite_float(last):
        return f"lastRescaleS must be a finite number or null, got {last!r}"
    items = data.get("recommendations", [])
    if not isinstance(items, list):
        return f"recommendations must be a list, got {type(items).__name__}"
    recommendations = []
    previous = -math.inf
    for i, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 2):
            return f"recommendations[{i}] must be a [time, replicas] pair, got {item!r}"
        time_s, replicas = item
        if not _finite_float(time_s):
            return f"recommendations[{i}] time must be a finite number, got {time_s!r}"
        if type(replicas) is not int or replicas < 0:
            return f"recommendations[{i}] replicas must be a non-negative integer, got {replicas!r}"
        if time_s < previous:
            return f"recommendations[{i}] is older than the one before it"
        previous = time_s
        recommendations.append(Recommendation(float(time_s), replicas))
    requested = data.get("requestedReplicas")
    if requested is not None and (type(requested) is not int or not 0 <= requested <= _INT32_MAX):
        return (
            f"requestedReplicas must be an integer in [0, {_INT32_MAX}] or null, got {requested!r}"
        )
    memory = JobMemory(
        last_rescale_s=None if last is None else float(last),
        recommendations=tuple(recommendations),
    )
    return StoredMemory(memory, requested)
