"""Reading Volcano's reclaimable/preemptable bodies: the recorded one, edited copies, bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.extender import BodyError, parse_eviction
from scheduler_policy.extender.bodies import DEFAULT_GRACE_PERIOD_S
from scheduler_policy.extender.scan import decode_body
from tests.scheduler_policy.extender.recorded import (
    ELASTIC,
    RECORDED_INDICES,
    Edit,
    annotate,
    encode,
    evictee_named,
    grace,
    label,
    needs_wire,
    recorded_body,
    set_field,
)

pytestmark = needs_wire


def test_the_recorded_body_reads_as_the_gang_pod_and_five_elastic_workers() -> None:
    body = recorded_body()
    request = parse_eviction(encode(body))

    evictor = request.evictor
    assert evictor is not None
    assert (evictor.name, evictor.job, evictor.gpus, evictor.node) == (
        "prod-worker-0",
        "default/prod",
        8.0,
        None,
    )
    assert evictor.podgroup == "default/prod-7a608bca-bf98-471c-8d92-a562380cfc83"
    assert [t.task_index for t in request.evictees] == list(RECORDED_INDICES)
    for task, info in zip(request.evictees, body["evictees"], strict=True):
        assert task.uid == info["UID"]
        assert task.job == ELASTIC
        assert (task.namespace, task.role, task.node, task.gpus) == (
            "default",
            "worker",
            "gpu-2",
            1.0,
        )
        assert task.preemptable
        assert task.grace_period_s == 30.0
        assert task.raw == info


def _first(*edits: Edit, index: int = 1) -> Any:
    request = parse_eviction(encode(recorded_body(*edits)))
    return next(t for t in request.evictees if t.name == f"elastic-worker-{index}")


def _drop_pod(body: dict[str, Any]) -> None:
    del evictee_named(body, 1)["Pod"]


def _null_resreq(body: dict[str, Any]) -> None:
    evictee_named(body, 1)["Resreq"] = None


def _null_scalars(body: dict[str, Any]) -> None:
    evictee_named(body, 1)["Resreq"]["ScalarResources"] = None


def _fractional(body: dict[str, Any]) -> None:
    evictee_named(body, 1)["Resreq"]["ScalarResources"]["nvidia.com/gpu"] = 500


READS = [
    (
        "annotation preemptable false",
        (annotate(1, "volcano.sh/preemptable", "false"),),
        "preemptable",
        False,
    ),
    (
        "label preemptable False",
        (label(1, "volcano.sh/preemptable", "False"),),
        "preemptable",
        False,
    ),
    (
        "annotation preemptable true",
        (annotate(1, "volcano.sh/preemptable", "true"),),
        "preemptable",
        True,
    ),
    ("TaskInfo not preemptable", (set_field(1, "Preemptable", False),), "preemptable", False),
    (
        "no Preemptable field: Volcano's default",
        (lambda b: evictee_named(b, 1).pop("Preemptable"),),
        "preemptable",
        True,
    ),
    ("task index not a number", (label(1, "volcano.sh/task-index", "one"),), "task_index", None),
    ("task index negative", (label(1, "volcano.sh/task-index", "-1"),), "task_index", None),
    ("task index absent", (label(1, "volcano.sh/task-index", None),), "task_index", None),
    ("job name absent", (label(1, "volcano.sh/job-name", None),), "job", None),
    (
        "job name from another namespace's pod",
        (set_field(1, "Namespace", "team-a"),),
        "job",
        "team-a/elastic",
    ),
    ("no pod", (_drop_pod,), "job", None),
    ("no pod: default grace", (_drop_pod,), "grace_period_s", DEFAULT_GRACE_PERIOD_S),
    ("grace period 120 s", (grace(1, 120),), "grace_period_s", 120.0),
    ("grace period a string: default", (grace(1, "120"),), "grace_period_s", 30.0),
    ("grace period negative: default", (grace(1, -5),), "grace_period_s", 30.0),
    ("grace period huge int: default", (grace(1, 10**400),), "grace_period_s", 30.0),
    ("Resreq null", (_null_resreq,), "gpus", 0.0),
    ("ScalarResources null", (_null_scalars,), "gpus", 0.0),
    ("half a GPU", (_fractional,), "gpus", 0.5),
    ("not bound", (set_field(1, "NodeName", ""),), "node", None),
    ("role from the task-spec label", (set_field(1, "TaskRole", ""),), "role", "worker"),
    ("role from TaskRole", (set_field(1, "TaskRole", "master"),), "role", "master"),
    ("not marked elastic", (), "elastic", False),
    ("labelled elastic", (label(1, "tide.io/elastic", "true"),), "elastic", True),
    ("annotated elastic", (annotate(1, "tide.io/elastic", "true"),), "elastic", True),
    ("labelled elastic false", (label(1, "tide.io/elastic", "false"),), "elastic", False),
    (
        "the label wins over the annotation",
        (label(1, "tide.io/elastic", "false"), annotate(1, "tide.io/elastic", "true")),
        "elastic",
        False,
    ),
]


@pytest.mark.parametrize(
    ("edits", "attribute", "expected"), [r[1:] for r in READS], ids=[r[0] for r in READS]
)
def test_what_is_read_from_an_evictee(
    edits: tuple[Edit, ...], attribute: str, expected: Any
) -> None:
    assert getattr(_first(*edits), attribute) == expected


def test_null_evictees_and_evictor_read_as_none_and_empty() -> None:
    request = parse_eviction(b'{"evictor": null, "evictees": null}')
    assert request.evictor is None
    assert request.evictees == ()


def _body_with(path: tuple[Any, ...], value: Any, *, delete: bool = False) -> bytes:
    body = recorded_body()
    node: Any = body
    for step in path[:-1]:
        node = node[step]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return encode(body)


REFUSALS = [
    ("empty body", b"", "body is not JSON"),
    ("not JSON", b"{evictees: []}", "body is not JSON"),
    ("not UTF-8", b"\xff\xfe\xfa", "body is not JSON"),
    ("nested too deeply", b"[" * 200_000, "body is not JSON"),
    ("a list", b"[]", "body must be a JSON object, got a list"),
    ("a string", b'"evictees"', "body must be a JSON object, got a string"),
    ("evictees an object", b'{"evictees": {}}', "evictees: must be a list, got an object"),
    (
        "evictee a number",
        b'{"evictees": [7]}',
        "evictees[0]: must be a TaskInfo object, got a number",
    ),
    ("evictor a list", b'{"evictor": [], "evictees": []}', "evictor: must be a TaskInfo object"),
    (
        "UID missing",
        _body_with(("evictees", 3, "UID"), None, delete=True),
        "evictees[3].UID: missing",
    ),
    (
        "UID a number",
        _body_with(("evictees", 1, "UID"), 5),
        "evictees[1].UID: must be a string, got a number",
    ),
    ("UID empty", _body_with(("evictees", 0, "UID"), ""), "evictees[0].UID: must not be empty"),
    (
        "Job missing",
        _body_with(("evictees", 2, "Job"), None, delete=True),
        "evictees[2].Job: missing",
    ),
    (
        "evictor Name missing",
        _body_with(("evictor", "Name"), None, delete=True),
        "evictor.Name: missing",
    ),
    (
        "Namespace a list",
        _body_with(("evictees", 4, "Namespace"), []),
        "evictees[4].Namespace: must be a string, got a list",
    ),
    (
        "NodeName a boolean",
        _body_with(("evictees", 0, "NodeName"), True),
        "evictees[0].NodeName: must be a string, got a boolean",
    ),
    (
        "Preemptable a string",
        _body_with(("evictees", 0, "Preemptable"), "yes"),
        "evictees[0].Preemptable: must be true or false",
    ),
    (
        "Resreq a string",
        _body_with(("evictees", 1, "Resreq"), "1 GPU"),
        "evictees[1].Resreq: must be an object",
    ),
    (
        "ScalarResources a list",
        _body_with(("evictees", 1, "Resreq", "ScalarResources"), []),
        "evictees[1].Resreq.ScalarResources: must be an object",
    ),
    (
        "GPUs a string",
        _body_with(("evictees", 1, "Resreq", "ScalarResources", "nvidia.com/gpu"), "1000"),
        'evictees[1].Resreq.ScalarResources["nvidia.com/gpu"]: must be a number, got a string',
    ),
    (
        "GPUs negative",
        _body_with(("evictees", 1, "Resreq", "ScalarResources", "nvidia.com/gpu"), -1000),
        "must be a finite number >= 0, got -1000",
    ),
    (
        "GPUs beyond a float",
        _body_with(("evictees", 1, "Resreq", "ScalarResources", "nvidia.com/gpu"), 10**400),
        "must be a finite number >= 0",
    ),
    (
        "Pod a string",
        _body_with(("evictees", 0, "Pod"), "pod"),
        "evictees[0].Pod: must be a Pod object, got a string",
    ),
]


@pytest.mark.parametrize(
    ("raw", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_a_body_that_is_not_volcanos_is_refused_naming_what_and_where(
    raw: bytes, message: str
) -> None:
    with pytest.raises(BodyError) as refused:
        parse_eviction(raw)
    assert message in str(refused.value)


def test_a_body_larger_than_the_limit_is_refused_with_its_size() -> None:
    raw = encode(recorded_body())
    with pytest.raises(BodyError, match=f"body is {len(raw)} bytes, more than the 1000 accepted"):
        parse_eviction(raw, max_bytes=1000)
    assert parse_eviction(raw, max_bytes=len(raw)).evictees  # the limit itself is accepted


def test_a_body_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_eviction(b"no")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
task_keys = st.sampled_from(
    ["UID", "Job", "Name", "Namespace", "TaskRole", "NodeName", "Preemptable", "Resreq", "Pod"]
)
small_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=2) | st.dictionaries(st.text(max_size=4), children, max_size=2)
    ),
    max_leaves=4,
)
strings = st.text(max_size=6) | small_json
pod_marks = st.dictionaries(
    st.sampled_from(
        [
            "volcano.sh/job-name",
            "volcano.sh/task-index",
            "volcano.sh/preemptable",
            "tide.io/elastic",
            "other",
        ]
    ),
    st.sampled_from(["true", "false"]) | st.text(max_size=4) | small_json,
    max_size=3,
)
pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {}, optional={"labels": pod_marks | small_json, "annotations": pod_marks}
        )
        | small_json,
        "spec": st.fixed_dictionaries(
            {}, optional={"terminationGracePeriodSeconds": st.integers() | small_json}
        )
        | small_json,
    },
)
resreqs = st.fixed_dictionaries(
    {},
    optional={
        "ScalarResources": st.fixed_dictionaries(
            {}, optional={"nvidia.com/gpu": st.integers() | st.floats() | small_json}
        )
        | small_json
    },
)
# Each field most often of the right shape, sometimes anything: the reader is walked deep.
task_infos = st.fixed_dictionaries(
    {},
    optional={
        "UID": strings,
        "Job": strings,
        "Name": strings,
        "Namespace": strings,
        "TaskRole": strings,
        "NodeName": strings,
        "Preemptable": st.booleans() | small_json,
        "Resreq": resreqs | small_json,
        "Pod": pods | small_json,
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "evictor": task_infos | small_json,
        "evictees": st.lists(task_infos | small_json, max_size=3) | small_json,
    },
)


def _parses_or_refuses(raw: bytes) -> None:
    try:
        request = parse_eviction(raw)
    except BodyError as e:
        assert str(e)
    else:
        assert all(t.uid for t in request.evictees)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_are_read_or_refused_with_a_body_error(raw: bytes) -> None:
    _parses_or_refuses(raw)


@settings(max_examples=150)
@given(json_values)
def test_random_json_is_read_or_refused_with_a_body_error(value: Any) -> None:
    _parses_or_refuses(json.dumps(value).encode())


@settings(max_examples=150)
@given(bodies)
def test_random_taskinfo_shapes_are_read_or_refused_with_a_body_error(body: Any) -> None:
    _parses_or_refuses(json.dumps(body).encode())


@settings(max_examples=100)
@given(st.sampled_from(range(5)), task_keys, json_values)
def test_any_field_of_the_recorded_body_replaced_is_read_or_refused(
    position: int, key: str, value: Any
) -> None:
    _parses_or_refuses(_body_with(("evictees", position, key), value))


# The walk that keeps each evictee's text decodes as json.loads does.

finite_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
documents = st.dictionaries(
    st.sampled_from(["evictees", "evictor", "other"]) | st.text(max_size=4),
    finite_json | st.lists(finite_json, max_size=3),
    max_size=4,
)


@settings(max_examples=200)
@given(documents, st.sampled_from([None, 2]), st.sampled_from([(",", ":"), (" , ", " : ")]))
def test_the_walk_decodes_as_json_loads_and_keeps_each_evictee_text(
    document: dict[str, Any], indent: int | None, separators: tuple[str, str]
) -> None:
    text = json.dumps(document, indent=indent, separators=separators)

    decoded, texts = decode_body(text)

    assert decoded == json.loads(text)
    if isinstance(document.get("evictees"), list):
        assert texts is not None
        assert [json.loads(t) for t in texts] == document["evictees"]
    else:
        assert texts is None


WALK_REFUSALS = [
    ("ends after the key", '{"evictees"'),
    ("ends inside the list", '{"evictees": [1, '),
    ("no colon", '{"evictees" []}'),
    ("no comma between keys", '{"a": 1 "b": 2}'),
    ("no comma in the list", '{"evictees": [1 2]}'),
    ("a bare key", "{evictees: []}"),
    ("extra data", '{"evictees": []} []'),
    ("trailing comma", '{"evictees": [],}'),
]


@pytest.mark.parametrize("text", [w[1] for w in WALK_REFUSALS], ids=[w[0] for w in WALK_REFUSALS])
def test_the_walk_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        decode_body(text)
    with pytest.raises(BodyError, match="body is not JSON"):
        parse_eviction(text.encode())


@needs_wire
def test_victims_echo_the_exact_text_volcano_sent() -> None:
    spaced = json.dumps(recorded_body(), indent=1)  # whatever the spacing, it is kept
    request = parse_eviction(spaced.encode())
    assert [t.raw for t in request.evictees] == recorded_body()["evictees"]
    assert all(t.text.startswith(b"{\n") and t.text in spaced.encode() for t in request.evictees)
