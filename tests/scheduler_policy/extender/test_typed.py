"""The typed decoder (msgspec) of extender bodies: it reads what Volcano sends without the
standard reader, agrees with that reader on every body, and leaves every fault to it."""

from __future__ import annotations

import gc
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.extender import BodyError, EvictionRequest, parse_eviction
from scheduler_policy.extender import bodies as bodies_module
from scheduler_policy.extender.typed import NULL, split_body, task_info, typed_body
from tests.scheduler_policy.extender.recorded import (
    encode,
    many_evictees,
    needs_wire,
    recorded_body,
)
from tests.scheduler_policy.extender.test_bodies import bodies as body_shapes


def _standard(raw: bytes) -> EvictionRequest:
    with bodies_module.gc_paused():
        return bodies_module._read_standard(raw)


def _no_standard_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the standard reader was used")

    monkeypatch.setattr(bodies_module, "_read_standard", refuse)
    monkeypatch.setattr(bodies_module, "_standard_task", refuse)


@needs_wire
@pytest.mark.parametrize("evictees", [5, 1000], ids=["recorded", "1,000 evictees"])
def test_volcanos_body_is_read_by_the_typed_decoder_alone(
    monkeypatch: pytest.MonkeyPatch, evictees: int
) -> None:
    body = recorded_body() if evictees == 5 else many_evictees(evictees)
    raw = encode(body)
    expected = _standard(raw)
    _no_standard_reader(monkeypatch)

    request = parse_eviction(raw)

    assert request == expected
    assert [t.text for t in request.evictees] == [t.text for t in expected.evictees]
    assert [t.raw for t in request.evictees] == body["evictees"]


def _agree(raw: bytes) -> None:
    try:
        expected = _standard(raw)
    except BodyError as e:
        with pytest.raises(BodyError) as refused:
            parse_eviction(raw)
        assert str(refused.value) == str(e)
        return
    request = parse_eviction(raw)
    assert request == expected
    assert [t.text for t in request.evictees] == [t.text for t in expected.evictees]


@settings(max_examples=300)
@given(body_shapes)
def test_the_typed_read_agrees_with_the_standard_reader_on_any_taskinfo_shape(body: Any) -> None:
    _agree(json.dumps(body).encode())


@settings(max_examples=100)
@given(body_shapes, st.sampled_from([None, 1]))
def test_the_typed_read_agrees_whatever_the_spacing(body: Any, indent: int | None) -> None:
    _agree(json.dumps(body, indent=indent, separators=(" , ", " : ")).encode())


def _evictee(**fields: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"UID": "u-1", "Job": "ns/pg", "Name": "w-0", "Namespace": "ns"}
    for key, value in fields.items():
        if value is _DROP:
            info.pop(key)
        else:
            info[key] = value
    return info


_DROP = object()


def _body(**fields: Any) -> bytes:
    return json.dumps({"evictor": None, "evictees": [_evictee(**fields)]}).encode()


# Each fault the typed decoder meets is refused by the standard reader's sentence, with its path.
FAULTS = [
    ("not JSON", b'{"evictees": [', "body is not JSON"),
    ("not JSON: a NaN", b'{"evictees": [NaN]}', "evictees[0]: must be a TaskInfo object"),
    ("not UTF-8 in a skipped field", b'{"other": "\xff", "evictees": []}', "body is not JSON"),
    ("not an object", b"[1]", "body must be a JSON object, got a list"),
    ("evictees a string", b'{"evictees": "all"}', "evictees: must be a list, got a string"),
    ("UID missing", _body(UID=_DROP), "evictees[0].UID: missing"),
    ("UID null", _body(UID=None), "evictees[0].UID: missing"),
    ("Namespace missing", _body(Namespace=_DROP), "evictees[0].Namespace: missing"),
    ("Job a number", _body(Job=3), "evictees[0].Job: must be a string, got a number"),
    ("Preemptable null", _body(Preemptable=None), "evictees[0].Preemptable: must be true or"),
    ("Resreq a list", _body(Resreq=[]), "evictees[0].Resreq: must be an object, got a list"),
    (
        "GPUs a boolean",
        _body(Resreq={"ScalarResources": {"nvidia.com/gpu": True}}),
        'evictees[0].Resreq.ScalarResources["nvidia.com/gpu"]: must be a number, got a boolean',
    ),
    (
        "GPUs beyond a float",
        _body(Resreq={"ScalarResources": {"nvidia.com/gpu": 10**400}}),
        "must be a finite number >= 0",
    ),
    ("Pod a number", _body(Pod=1), "evictees[0].Pod: must be a Pod object, got a number"),
]


@pytest.mark.parametrize(("raw", "message"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_a_fault_is_refused_with_the_standard_readers_sentence(raw: bytes, message: str) -> None:
    with pytest.raises(BodyError) as refused:
        parse_eviction(raw)
    assert message in str(refused.value)


# What the typed decoder does not decode (odd but harmless Pods) is read leniently, as before.
LENIENT = [
    ("a label not a string", {"metadata": {"labels": {"volcano.sh/task-index": 3}}}, None),
    ("metadata a string", {"metadata": "m"}, None),
    ("labels a list", {"metadata": {"labels": ["a"]}}, None),
    ("the index label", {"metadata": {"labels": {"volcano.sh/task-index": "3"}}}, 3),
    ("the index annotation", {"metadata": {"annotations": {"volcano.sh/task-index": "4"}}}, 4),
]


@pytest.mark.parametrize(
    ("pod", "task_index"), [c[1:] for c in LENIENT], ids=[c[0] for c in LENIENT]
)
def test_an_odd_pod_is_read_leniently(pod: dict[str, Any], task_index: int | None) -> None:
    (task,) = parse_eviction(_body(Pod=pod)).evictees
    assert (task.uid, task.task_index) == ("u-1", task_index)


SCHEMA_FAULTS = [
    ("not JSON", b"{", msgspec.DecodeError),
    ("a list", b"[]", msgspec.ValidationError),
    ("UID a number", b'{"UID": 1}', msgspec.ValidationError),
    ("Preemptable a string", b'{"Preemptable": "no"}', msgspec.ValidationError),
    (
        "GPUs a string",
        b'{"Resreq": {"ScalarResources": {"nvidia.com/gpu": "1"}}}',
        msgspec.ValidationError,
    ),
    (
        "a read label a number",
        b'{"Pod": {"metadata": {"labels": {"volcano.sh/task-index": 1}}}}',
        msgspec.ValidationError,
    ),
]


@pytest.mark.parametrize(
    ("raw", "error"), [c[1:] for c in SCHEMA_FAULTS], ids=[c[0] for c in SCHEMA_FAULTS]
)
def test_the_taskinfo_schema_refuses_what_volcano_never_sends(
    raw: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        task_info(raw)


def test_the_taskinfo_schema_reads_only_the_named_fields_and_defaults_the_rest() -> None:
    info = task_info(b'{"UID": "u", "Status": 3, "Pod": {"status": {"phase": "Running"}}}')
    assert (info.uid, info.podgroup, info.preemptable, info.resreq) == ("u", None, True, None)
    assert info.pod is not None and info.pod.metadata is None


def test_the_taskinfo_schema_skips_the_labels_and_resources_it_does_not_read() -> None:
    info = task_info(
        b'{"Resreq": {"ScalarResources": {"pods": "x", "nvidia.com/gpu": 2000}},'
        b' "Pod": {"metadata": {"labels": {"a": 1, "volcano.sh/job-name": "j"},'
        b' "annotations": {"b": [2], "volcano.sh/task-index": "5"}}}}'
    )
    assert info.resreq is not None and info.resreq.scalars is not None
    assert info.resreq.scalars.gpu_milli == 2000.0
    assert info.pod is not None and info.pod.metadata is not None
    labels, annotations = info.pod.metadata.labels, info.pod.metadata.annotations
    assert labels is not None and (labels.job_name, labels.task_index) == ("j", None)
    assert annotations is not None and (annotations.job_name, annotations.task_index) == (
        None,
        "5",
    )


def test_the_decoded_views_are_not_tracked_by_the_cyclic_collector() -> None:
    # A 1,000-evictee body decodes ~5,000 of them; untracked, no collection walks them.
    info = task_info(
        b'{"UID": "u", "Resreq": {"ScalarResources": {}}, "Pod": {"metadata": {"labels": {},'
        b' "annotations": {}}, "spec": {}}}'
    )
    assert info.pod is not None and info.pod.metadata is not None and info.resreq is not None
    views = [info, info.resreq, info.resreq.scalars, info.pod, info.pod.metadata,
             info.pod.metadata.labels, info.pod.metadata.annotations, info.pod.spec,
             split_body(b'{"evictees": []}')]  # fmt: skip
    assert [gc.is_tracked(view) for view in views] == [False] * len(views)


def test_split_body_keeps_each_evictee_text_and_a_null_evictor() -> None:
    view = split_body(b'{"evictor": null, "evictees": [ {"UID": "a"} , {"UID":"b"} ], "x": 1}')
    assert bytes(view.evictor) == NULL
    assert [bytes(item) for item in view.evictees or ()] == [b'{"UID": "a"}', b'{"UID":"b"}']


def test_one_odd_taskinfo_among_many_is_the_only_one_read_by_the_standard_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The whole-body decode refuses the body (a read label that is a number); each TaskInfo is
    # then decoded alone, and only the odd one goes to the standard reader, which reads it
    # leniently.
    odd = _evictee(UID="u-odd", Pod={"metadata": {"labels": {"volcano.sh/task-index": 7}}})
    body = {"evictor": None, "evictees": [_evictee(UID="u-0"), odd, _evictee(UID="u-2")]}
    raw = json.dumps(body).encode()
    with pytest.raises(msgspec.ValidationError):
        typed_body(raw)
    expected = _standard(raw)
    read_alone: list[str] = []
    standard_task = bodies_module._standard_task

    def spy(text: Any, path: str) -> Any:
        read_alone.append(path)
        return standard_task(text, path)

    monkeypatch.setattr(bodies_module, "_standard_task", spy)
    request = parse_eviction(raw)
    assert request == expected
    assert [t.text for t in request.evictees] == [t.text for t in expected.evictees]
    assert read_alone == ["evictees[1]"]


def test_the_whole_body_decode_gives_every_taskinfo_and_a_missing_evictor() -> None:
    view = typed_body(b'{"evictees": [{"UID": "a"}, {"UID": "b", "NodeName": "n"}]}')
    assert view.evictor is None
    assert [(info.uid, info.node) for info in view.evictees or ()] == [("a", None), ("b", "n")]
    assert typed_body(b'{"evictor": null, "evictees": null}').evictees is None
