"""The recorded ``reclaimable`` body and small editors of its copies, for the extender's tests.

The body (``../shared/volcano-wire/v1.15.1/extender-reclaimable-request.json``) is what Volcano
v1.15.1 posted while a production gang (``default/prod``, 3 x 8 GPUs) reclaimed GPUs from the
elastic research job ``default/elastic``: the evictees are its workers 1, 5, 10, 12 and 17, one
GPU each, on ``gpu-2``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from scheduler_policy.extender import ExtenderView, ShrinkingJob
from scheduler_policy.vocabulary.state import JobKey

WIRE = Path(__file__).resolve().parents[3] / ".." / "shared" / "volcano-wire" / "v1.15.1"
RECORDED = WIRE / "extender-reclaimable-request.json"
needs_wire = pytest.mark.skipif(
    not RECORDED.exists(),
    reason=f"the recorded reclaimable body is absent at {RECORDED} (../shared absent)",
)

ELASTIC = JobKey("default/elastic")
RECORDED_INDICES = (1, 5, 10, 12, 17)
NOW_S = 1_000_000.0

Edit = Callable[[dict[str, Any]], None]


@cache
def _recorded_text() -> str:
    return RECORDED.read_text()


def recorded_body(*edits: Edit) -> dict[str, Any]:
    """A fresh copy of the recorded body with ``edits`` applied in order."""
    body: dict[str, Any] = json.loads(_recorded_text())
    for edit in edits:
        edit(body)
    return body


def encode(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body).encode()


def evictee_named(body: dict[str, Any], index: int) -> dict[str, Any]:
    """The evictee whose pod has task index ``index``."""
    for info in body["evictees"]:
        if info["Pod"]["metadata"]["labels"]["volcano.sh/task-index"] == str(index):
            return info  # type: ignore[no-any-return]
    raise KeyError(index)


def annotate(index: int, key: str, value: str) -> Edit:
    def edit(body: dict[str, Any]) -> None:
        evictee_named(body, index)["Pod"]["metadata"].setdefault("annotations", {})[key] = value

    return edit


def label(index: int, key: str, value: str | None) -> Edit:
    """Set (or, with None, remove) a label on the pod, and the annotation of the same name."""

    def edit(body: dict[str, Any]) -> None:
        metadata = evictee_named(body, index)["Pod"]["metadata"]
        for where in ("labels", "annotations"):
            if value is None:
                metadata.get(where, {}).pop(key, None)
            else:
                metadata.setdefault(where, {})[key] = value

    return edit


def set_field(index: int, key: str, value: Any) -> Edit:
    def edit(body: dict[str, Any]) -> None:
        evictee_named(body, index)[key] = value

    return edit


def grace(index: int, seconds: Any) -> Edit:
    def edit(body: dict[str, Any]) -> None:
        evictee_named(body, index)["Pod"]["spec"]["terminationGracePeriodSeconds"] = seconds

    return edit


def many_evictees(count: int) -> dict[str, Any]:
    """The recorded body with ``count`` evictees: copies of its first, varied UID, name, index."""
    body = recorded_body()
    template = body["evictees"][0]
    evictees = []
    for i in range(count):
        info = copy.deepcopy(template)
        info["UID"] = f"00000000-0000-0000-0000-{i:012d}"
        info["Name"] = f"elastic-worker-{i}"
        pod = info["Pod"]
        pod["metadata"]["name"] = info["Name"]
        pod["metadata"]["uid"] = info["UID"]
        for where in ("labels", "annotations"):
            pod["metadata"][where]["volcano.sh/task-index"] = str(i)
        evictees.append(info)
    body["evictees"] = evictees
    return body


def make_view(
    *,
    target: int = 10,
    minimum: int = 2,
    job: JobKey = ELASTIC,
    task: str = "worker",
    leader: bool = True,
    made_s: float = NOW_S,
) -> ExtenderView:
    """A view in which tide shrinks ``job`` to ``target`` replicas (minimum ``minimum``)."""
    shrinking = ShrinkingJob(key=job, task=task, target_replicas=target, min_replicas=minimum)
    return ExtenderView(jobs={job: shrinking}, leader=leader, made_s=made_s)
