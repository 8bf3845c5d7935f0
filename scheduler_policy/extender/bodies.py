"""The bodies Volcano's ``extender`` plugin posts for ``reclaimable`` and ``preemptable``.

Volcano sends its Go structs with their untagged field names: ``{"evictor": TaskInfo,
"evictees": [TaskInfo, ...]}``, each TaskInfo with ``UID``, ``Job`` (``"<ns>/<PodGroup name>"``),
``Name``, ``Namespace``, ``TaskRole``, ``Resreq.ScalarResources`` in milli-units, ``NodeName``,
``Preemptable`` and ``Pod`` (the whole Pod). Recorded: ``../shared/volcano-wire/v1.15.1/
extender-reclaimable-request.json``.

The TaskInfo's own fields are read strictly (a missing or ill-typed one is a ``BodyError`` naming
its path); what is read from the Pod (labels, annotations, grace period) is read leniently: a
label tide cannot read makes the pod not tide's (no job, no index), it never refuses the request,
so that one odd pod never costs the others their answer.

Bodies are decoded by the typed structs of ``typed.py`` (msgspec: only the fields read here
are decoded); a body or TaskInfo they do not take is read again by the standard decoder
below, which defines what is refused and with what message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from scheduler_policy.extender.scan import decode_body, gc_paused
from scheduler_policy.extender.typed import (
    GPU_RESOURCE,
    JOB_NAME_LABEL,
    NULL,
    PREEMPTABLE_LABEL,
    TASK_INDEX_LABEL,
    TASK_SPEC_LABEL,
    MarksView,
    TaskInfoView,
    split_body,
    task_info,
    typed_body,
)
from scheduler_policy.policy.annotations import ELASTIC
from scheduler_policy.vocabulary.errors import TideError
from scheduler_policy.vocabulary.state import JobKey

__all__ = [
    "DEFAULT_GRACE_PERIOD_S",
    "GPU_RESOURCE",
    "JOB_NAME_LABEL",
    "MAX_BODY_BYTES",
    "PREEMPTABLE_LABEL",
    "TASK_INDEX_LABEL",
    "TASK_SPEC_LABEL",
    "BodyError",
    "EvictionRequest",
    "ExtenderError",
    "Task",
    "parse_eviction",
]

DEFAULT_GRACE_PERIOD_S = 30.0
"""Kubernetes' default ``terminationGracePeriodSeconds``."""

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest body read: the recorded TaskInfo is about 5.6 KB, so room for ~3,000 evictees
(a reclaim's evictees are the pods on one node, far fewer)."""

_MILLI = 1000.0


class ExtenderError(TideError):
    """Base of the extender's errors."""


class BodyError(ExtenderError, ValueError):
    """A request body that is not what Volcano sends; the message names what is wrong and where."""


class Task(msgspec.Struct, frozen=True, gc=False):
    """One TaskInfo of a request: a pod Volcano proposes to evict, or the one it evicts for.

    A frozen ``msgspec.Struct`` rather than a frozen dataclass: a 1,000-evictee body makes 1,000
    of them, which took 2-3 ms of CPU as dataclasses (each field set through
    ``object.__setattr__``) against 0.2 ms, timed on the 2-core machine. ``gc=False``: it holds
    only strings, numbers and bytes, so it can be in no cycle. Equality and the repr leave
    ``text`` out, as the dataclass did: two spellings of the same TaskInfo are the same task.

    Attributes:
        uid: the pod's UID (``UID``): Volcano matches victims by it.
        podgroup: the PodGroup key ``namespace/name`` (``Job``).
        name: the pod's name.
        namespace: the pod's namespace.
        role: the task's name (``TaskRole``, else the pod's ``volcano.sh/task-spec``); "" unknown.
        node: the node it is bound to (``NodeName``); None when not bound.
        gpus: GPUs it requests (``Resreq.ScalarResources["nvidia.com/gpu"]`` / 1000).
        preemptable: False when Volcano says so (``Preemptable``) or the pod is marked
            ``volcano.sh/preemptable: "false"`` (annotation or label).
        job: the Volcano Job key ``namespace/<volcano.sh/job-name>``; None when the pod has none.
        task_index: the pod's ``volcano.sh/task-index``; None when absent or not an integer.
        grace_period_s: the pod's ``spec.terminationGracePeriodSeconds`` (default 30 s).
        text: the TaskInfo's JSON text (UTF-8) exactly as Volcano sent it, echoed back in the
            victims (``raw`` decodes it).
        elastic: the pod is marked ``tide.io/elastic: "true"`` (label or annotation): a pod of
            an elastic tide Job, even one tide has not planned for yet.
    """

    uid: str
    podgroup: str
    name: str
    namespace: str
    role: str
    node: str | None
    gpus: float
    preemptable: bool
    job: JobKey | None
    task_index: int | None
    grace_period_s: float
    text: bytes
    elastic: bool = False

    def _compared(self) -> tuple[object, ...]:
        return (
            self.uid,
            self.podgroup,
            self.name,
            self.namespace,
            self.role,
            self.node,
            self.gpus,
            self.preemptable,
            self.job,
            self.task_index,
            self.grace_period_s,
            self.elastic,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Task):
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        return (
            f"Task(uid={self.uid!r}, name={self.name!r}, job={self.job!r}, "
            f"task_index={self.task_index})"
        )

    @property
    def raw(self) -> Mapping[str, Any]:
        """The TaskInfo as Volcano sent it, decoded from ``text`` (each call decodes anew).

        Only the text is kept: holding the decoded Pods of a large request (a million objects
        for 1,000 evictees) made every garbage collection walk them.
        """
        decoded: Mapping[str, Any] = json.loads(self.text.decode("utf-8"))
        return decoded


@dataclass(frozen=True, slots=True)
class EvictionRequest:
    """A ``reclaimable`` or ``preemptable`` request.

    Attributes:
        evictor: the task Volcano evicts for; None when the body says ``null``.
        evictees: the tasks it proposes to evict, in its order.
    """

    evictor: Task | None
    evictees: tuple[Task, ...]


def parse_eviction(raw: bytes | bytearray, *, max_bytes: int = MAX_BODY_BYTES) -> EvictionRequest:
    """Read a ``reclaimable``/``preemptable`` body.

    Args:
        raw: the HTTP body.
        max_bytes: the largest body accepted, bytes.

    Returns:
        The evictor and the evictees.

    Raises:
        BodyError: the body is too large, not JSON, not an object, or a TaskInfo field is missing
            or ill-typed (the message names its path, e.g. ``evictees[3].UID``). Nothing else
            is raised, whatever the input.
    """
    if len(raw) > max_bytes:
        raise BodyError(f"body is {len(raw)} bytes, more than the {max_bytes} accepted")
    with gc_paused():  # see scan.py: the decoded body is freed before the collector resumes
        return _read(raw)


def _read(raw: bytes | bytearray) -> EvictionRequest:
    """The body through the typed decoder (``typed.py``); what it does not take, through the
    standard reader, whose errors name the fault and its path."""
    try:
        if not raw.isascii():  # ASCII is UTF-8; else check it: msgspec does not check the
            raw.decode("utf-8")  # text it skips (isascii builds no 5 MB copy to find out)
        view = split_body(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError):  # the standard reader names the fault
        return _read_standard(raw)
    texts = view.evictees or []
    try:
        typed = typed_body(raw)
    except msgspec.MsgspecError:  # one odd TaskInfo: decode each alone, the odd one read again
        typed = None
    if typed is None or len(typed.evictees or ()) != len(texts):
        evictor = None if bytes(view.evictor) == NULL else _fast_task(view.evictor, "evictor")
        evictees = tuple(_fast_task(item, f"evictees[{i}]") for i, item in enumerate(texts))
        return EvictionRequest(evictor=evictor, evictees=evictees)
    evictor = None
    if typed.evictor is not None:
        evictor = _view_task(typed.evictor, view.evictor) or _standard_task(view.evictor, "evictor")
    return EvictionRequest(
        evictor=evictor,
        evictees=tuple(
            _view_task(info, text) or _standard_task(text, f"evictees[{i}]")
            for i, (info, text) in enumerate(zip(typed.evictees or (), texts, strict=True))
        ),
    )


def _fast_task(raw: msgspec.Raw, path: str) -> Task:
    """One TaskInfo through the typed decoder; anything unusual through ``_standard_task``,
    which names the fault (or reads the odd Pod leniently)."""
    try:
        info = task_info(raw)
    except msgspec.MsgspecError:
        return _standard_task(raw, path)
    return _view_task(info, raw) or _standard_task(raw, path)


def _view_task(info: TaskInfoView, raw: msgspec.Raw) -> Task | None:
    """The Task of a decoded TaskInfo and its text; None when the standard reader must judge it
    (a required field missing, GPUs not a finite number >= 0)."""
    uid, podgroup, name, namespace = info.uid, info.podgroup, info.name, info.namespace
    if not uid or podgroup is None or name is None or namespace is None:
        return None
    gpus = 0.0
    resreq = info.resreq
    if resreq is not None and resreq.scalars is not None:
        milli = resreq.scalars.gpu_milli
        if not math.isfinite(milli) or milli < 0:
            return None
        gpus = milli / _MILLI
    labels = annotations = _NO_MARKS
    grace_period_s = DEFAULT_GRACE_PERIOD_S
    pod = info.pod
    if pod is not None:
        metadata = pod.metadata
        if metadata is not None:
            labels = metadata.labels or _NO_MARKS
            annotations = metadata.annotations or _NO_MARKS
        if pod.spec is not None and pod.spec.grace is not None:
            grace_period_s = _grace_period_s(pod.spec.grace)
    # A label wins over the annotation of the same key, as in ``_make_task``.
    job_name = labels.job_name if labels.job_name is not None else annotations.job_name
    spec = labels.task_spec if labels.task_spec is not None else annotations.task_spec
    index = labels.task_index if labels.task_index is not None else annotations.task_index
    marked = labels.preemptable if labels.preemptable is not None else annotations.preemptable
    elastic = labels.elastic if labels.elastic is not None else annotations.elastic
    return Task(
        uid=uid,
        podgroup=podgroup,
        name=name,
        namespace=namespace,
        role=info.role or spec or "",
        node=info.node or None,
        gpus=gpus,
        preemptable=info.preemptable and _not_false(marked),
        job=JobKey(f"{namespace}/{job_name}") if job_name else None,
        task_index=_index(index),
        grace_period_s=grace_period_s,
        text=bytes(raw),
        elastic=_true(elastic),
    )


_NO_MARKS = MarksView()


def _standard_task(raw: msgspec.Raw, path: str) -> Task:
    text = bytes(raw)
    try:
        info = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise BodyError("body is not JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int too long
        raise BodyError(f"body is not JSON: {_short(str(e))}") from None
    return _task(info, path, text=text)


def _read_standard(raw: bytes | bytearray) -> EvictionRequest:
    """The body through the standard decoder, every value checked with its path."""
    try:
        text = raw.decode("utf-8")
        document, texts = decode_body(text)
    except RecursionError:
        raise BodyError("body is not JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int too long
        raise BodyError(f"body is not JSON: {_short(str(e))}") from None
    if not isinstance(document, dict):
        raise BodyError(f"body must be a JSON object, got {_kind(document)}")
    evictor_raw = document.get("evictor")
    evictor = None if evictor_raw is None else _task(evictor_raw, "evictor", text=None)
    evictees_raw = document.get("evictees")
    if evictees_raw is None:  # Go marshals an empty (nil) slice as null
        evictees_raw = []
    if not isinstance(evictees_raw, list):
        raise BodyError(f"evictees: must be a list, got {_kind(evictees_raw)}")
    if texts is None or len(texts) != len(evictees_raw):  # duplicate keys: re-encode
        texts = [json.dumps(item) for item in evictees_raw]
    encoded = [text.encode() for text in texts]
    evictees = tuple(
        _task(item, f"evictees[{i}]", text=text)
        for i, (item, text) in enumerate(zip(evictees_raw, encoded, strict=True))
    )
    return EvictionRequest(evictor=evictor, evictees=evictees)


def _task(info: Any, path: str, *, text: bytes | None) -> Task:
    if not isinstance(info, dict):
        raise BodyError(f"{path}: must be a TaskInfo object, got {_kind(info)}")
    uid = _string(info, "UID", path, required=True)
    if not uid:
        raise BodyError(f"{path}.UID: must not be empty")
    podgroup = _string(info, "Job", path, required=True)
    name = _string(info, "Name", path, required=True)
    namespace = _string(info, "Namespace", path, required=True)
    role = _string(info, "TaskRole", path, required=False)
    node = _string(info, "NodeName", path, required=False)
    preemptable = info.get("Preemptable", True)
    if not isinstance(preemptable, bool):
        raise BodyError(f"{path}.Preemptable: must be true or false, got {_kind(preemptable)}")
    gpus = _gpus(info.get("Resreq"), f"{path}.Resreq")
    pod = info.get("Pod")
    if pod is not None and not isinstance(pod, dict):
        raise BodyError(f"{path}.Pod: must be a Pod object, got {_kind(pod)}")
    labels, annotations, grace_period_s = _pod_fields(pod or {})
    return _make_task(
        uid=uid,
        podgroup=podgroup,
        name=name,
        namespace=namespace,
        role=role,
        node=node,
        preemptable=preemptable,
        gpus=gpus,
        labels=labels,
        annotations=annotations,
        grace_period_s=grace_period_s,
        text=json.dumps(info).encode() if text is None else text,
    )


def _make_task(
    *,
    uid: str,
    podgroup: str,
    name: str,
    namespace: str,
    role: str,
    node: str,
    preemptable: bool,
    gpus: float,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    grace_period_s: float,
    text: bytes,
) -> Task:
    """The Task of checked TaskInfo fields and the Pod's string labels and annotations."""

    def marked(key: str) -> str | None:
        return labels.get(key, annotations.get(key))

    job_name = marked(JOB_NAME_LABEL)
    return Task(
        uid=uid,
        podgroup=podgroup,
        name=name,
        namespace=namespace,
        role=role or marked(TASK_SPEC_LABEL) or "",
        node=node or None,
        gpus=gpus,
        preemptable=preemptable and _not_false(marked(PREEMPTABLE_LABEL)),
        job=JobKey(f"{namespace}/{job_name}") if job_name else None,
        task_index=_index(marked(TASK_INDEX_LABEL)),
        grace_period_s=grace_period_s,
        text=text,
        elastic=_true(marked(ELASTIC)),
    )


def _string(info: dict[str, Any], key: str, path: str, *, required: bool) -> str:
    value = info.get(key)
    if value is None:
        if required:
            raise BodyError(f"{path}.{key}: missing")
        return ""
    if not isinstance(value, str):
        raise BodyError(f"{path}.{key}: must be a string, got {_kind(value)}")
    return value


def _gpus(resreq: Any, path: str) -> float:
    if resreq is None:
        return 0.0
    if not isinstance(resreq, dict):
        raise BodyError(f"{path}: must be an object, got {_kind(resreq)}")
    scalars = resreq.get("ScalarResources")
    if scalars is None:  # Go's nil map
        return 0.0
    if not isinstance(scalars, dict):
        raise BodyError(f"{path}.ScalarResources: must be an object, got {_kind(scalars)}")
    milli = scalars.get(GPU_RESOURCE, 0)
    where = f'{path}.ScalarResources["{GPU_RESOURCE}"]'
    if isinstance(milli, bool) or not isinstance(milli, (int, float)):
        raise BodyError(f"{where}: must be a number, got {_kind(milli)}")
    value = _finite(milli)
    if value is None or value < 0:
        raise BodyError(f"{where}: must be a finite number >= 0, got {_short(repr(milli))}")
    return value / _MILLI


def _pod_fields(pod: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], float]:
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    spec = pod.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    grace_period_s = _grace_period_s(spec.get("terminationGracePeriodSeconds"))
    return _strings(metadata.get("labels")), _strings(metadata.get("annotations")), grace_period_s


def _grace_period_s(grace: Any) -> float:
    """``terminationGracePeriodSeconds`` when a finite number >= 0, else Kubernetes' default."""
    if isinstance(grace, (int, float)) and not isinstance(grace, bool):
        value = _finite(grace)
        if value is not None and value >= 0:
            return value
    return DEFAULT_GRACE_PERIOD_S


def _finite(number: float) -> float | None:
    """The number as a finite float; None when it is NaN, infinite or too large for a float."""
    try:
        value = float(number)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _strings(mapping: Any) -> dict[str, str]:
    if not isinstance(mapping, dict):
        return {}
    return {k: v for k, v in mapping.items() if isinstance(v, str)}


def _index(text: str | None) -> int | None:
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 9:
        return None
    return int(text)


def _not_false(text: str | None) -> bool:
    return text is None or text.strip().lower() != "false"


def _true(text: str | None) -> bool:
    return text == "true"  # as the engine reads a Job's annotation and tide's PromQL the label


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
