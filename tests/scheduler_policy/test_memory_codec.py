"""The memory codec: exact round trips within the bound, corrupt values read as no memory."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_policy.adapters.memory_codec import (
    MAX_BYTES,
    MAX_RECOMMENDATIONS,
    MEMORY_ANNOTATION,
    StoredMemory,
    decode_memory,
    decode_stored,
    encode_memory,
    memory_from_annotations,
)
from scheduler_policy.vocabulary.state import JobMemory, Recommendation

times = st.floats(allow_nan=False, allow_infinity=False)
replicas = st.integers(min_value=0, max_value=2**31 - 1)
memories = st.builds(
    JobMemory,
    last_rescale_s=st.none() | times,
    recommendations=st.lists(st.tuples(times, replicas), max_size=MAX_RECOMMENDATIONS).map(
        lambda pairs: tuple(Recommendation(t, r) for t, r in sorted(pairs))
    ),
)


def same_bits(a: JobMemory, b: JobMemory) -> bool:
    """Equal, and every float the same float (``==`` would let -0.0 pass for 0.0)."""
    return (
        repr(a.last_rescale_s) == repr(b.last_rescale_s)
        and len(a.recommendations) == len(b.recommendations)
        and all(
            repr(x.time_s) == repr(y.time_s) and x.replicas == y.replicas
            for x, y in zip(a.recommendations, b.recommendations, strict=True)
        )
    )


@given(memories, st.none() | replicas)
def test_every_memory_within_the_bound_round_trips_exactly(memory, asked):
    value = encode_memory(memory, job="ns/a", requested_replicas=asked)
    assert len(value.encode()) <= MAX_BYTES
    stored = decode_stored(value, job="ns/a")
    assert same_bits(stored.memory, memory) and stored.requested_replicas == asked
    assert same_bits(decode_memory(value, job="ns/a"), memory)


def test_the_bound_holds_for_the_longest_values():
    worst = JobMemory(
        last_rescale_s=-1.2345678901234567e-300,
        recommendations=tuple(
            Recommendation(-1.2345678901234567e-300, 2**31 - 1) for _ in range(MAX_RECOMMENDATIONS)
        ),
    )
    value = encode_memory(worst, requested_replicas=2**31 - 1)
    assert MAX_BYTES - 1024 < len(value) <= MAX_BYTES  # the bound is tight, not a guess


def test_more_than_the_bound_keeps_the_newest_and_warns(caplog):
    many = JobMemory(
        last_rescale_s=5.0,
        recommendations=tuple(Recommendation(float(t), t % 7) for t in range(300)),
    )
    with caplog.at_level(logging.WARNING):
        value = encode_memory(many, job="ns/busy")
    back = decode_memory(value)
    assert back.recommendations == many.recommendations[-MAX_RECOMMENDATIONS:]
    assert back.last_rescale_s == 5.0
    assert "ns/busy" in caplog.text and "300" in caplog.text


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        (JobMemory(last_rescale_s=float("nan")), "last_rescale_s"),
        (
            JobMemory(recommendations=(Recommendation(float("inf"), 2),)),
            "recommendations[0].time_s",
        ),
        (JobMemory(recommendations=(Recommendation(1.0, -1),)), "recommendations[0].replicas"),
        (JobMemory(recommendations=(Recommendation(1.0, 2**31),)), "recommendations[0].replicas"),
        (JobMemory(recommendations=(Recommendation(1.0, True),)), "recommendations[0].replicas"),  # type: ignore[arg-type]
    ],
    ids=["nan-last-rescale", "infinite-time", "negative-replicas", "beyond-int32", "bool-replicas"],
)
def test_encode_refuses_what_it_cannot_write_naming_the_job(memory, message):
    with pytest.raises(ValueError, match=r"job ns/a: memory\.") as error:
        encode_memory(memory, job="ns/a")
    assert message in str(error.value)


CORRUPT = {
    "not-json": "{v:1",
    "a-list": "[1, 2]",
    "unknown-version": '{"v":3,"recommendations":[]}',
    "version-a-string": '{"v":"2","recommendations":[]}',
    "version-a-bool": '{"v":true,"recommendations":[]}',
    "no-version": '{"recommendations":[]}',
    "unknown-field": '{"v":2,"extra":3}',
    "version-1-with-the-asked-size": '{"v":1,"requestedReplicas":3}',
    "asked-size-negative": '{"v":2,"requestedReplicas":-1}',
    "asked-size-a-float": '{"v":2,"requestedReplicas":2.0}',
    "asked-size-a-string": '{"v":2,"requestedReplicas":"4"}',
    "asked-size-beyond-int32": '{"v":2,"requestedReplicas":2147483648}',
    "last-rescale-a-string": '{"v":1,"lastRescaleS":"soon"}',
    "last-rescale-nan": '{"v":1,"lastRescaleS":NaN}',
    "recommendations-a-dict": '{"v":1,"recommendations":{}}',
    "pair-of-three": '{"v":1,"recommendations":[[1.0,2,3]]}',
    "replicas-a-float": '{"v":1,"recommendations":[[1.0,2.5]]}',
    "replicas-negative": '{"v":1,"recommendations":[[1.0,-2]]}',
    "replicas-a-bool": '{"v":1,"recommendations":[[1.0,true]]}',
    "time-a-string": '{"v":1,"recommendations":[["x",2]]}',
    "out-of-order": '{"v":1,"recommendations":[[2.0,2],[1.0,3]]}',
    "deeply-nested": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("value", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_annotation_is_no_memory_with_a_warning(value, caplog):
    with caplog.at_level(logging.WARNING):
        assert decode_memory(value, job="ns/a") == JobMemory()
    assert "ns/a" in caplog.text and MEMORY_ANNOTATION in caplog.text


class _Warnings(logging.Handler):
    """The codec's warnings, for a property test (caplog is per test, not per example)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def decode_watching(value: str) -> tuple[JobMemory, list[logging.LogRecord]]:
    handler = _Warnings()
    codec_logger = logging.getLogger("scheduler_policy.adapters.memory_codec")
    codec_logger.addHandler(handler)
    try:
        return decode_memory(value, job="ns/a"), handler.records
    finally:
        codec_logger.removeHandler(handler)


@given(
    memories.map(encode_memory).map(lambda v: v[: len(v) // 2])  # cut short
    | memories.map(encode_memory).map(lambda v: v.replace('"v":2', '"v":"2"'))  # foreign
    | memories.map(encode_memory).map(lambda v: v.replace("recommendations", "recs"))
)
def test_a_corrupt_annotation_is_no_memory_and_one_warning_naming_the_job(value):
    decoded, warnings = decode_watching(value)
    assert decoded == JobMemory()
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert "ns/a" in warnings[0].getMessage()


@given(st.text(max_size=200))
def test_any_string_decodes_without_raising_and_warns_only_when_read_as_none(value):
    decoded, warnings = decode_watching(value)
    assert isinstance(decoded, JobMemory)
    if warnings:
        assert decoded == JobMemory() and len(warnings) == 1
    else:
        assert decode_memory(encode_memory(decoded)) == decoded


def test_an_absent_annotation_is_no_memory_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert memory_from_annotations({"other": "x"}, job="ns/a") == JobMemory()
    assert caplog.text == ""


def test_the_value_is_compact_versioned_json():
    memory = JobMemory(1700000000.5, (Recommendation(1699999940.0, 4),))
    value = encode_memory(memory)
    assert value == '{"v":2,"lastRescaleS":1700000000.5,"recommendations":[[1699999940.0,4]]}'
    assert json.loads(value)["v"] == 2
    assert encode_memory(memory, requested_replicas=6) == (
        '{"v":2,"lastRescaleS":1700000000.5,"recommendations":[[1699999940.0,4]],'
        '"requestedReplicas":6}'
    )


STORED_VALUES = {
    "version 2 with the asked size": (
        '{"v":2,"lastRescaleS":5.0,"recommendations":[[4.0,3]],"requestedReplicas":6}',
        StoredMemory(JobMemory(5.0, (Recommendation(4.0, 3),)), 6),
    ),
    "version 2 without it": (
        '{"v":2,"lastRescaleS":null,"recommendations":[]}', StoredMemory(JobMemory(), None),
    ),
    "version 2 with a null asked size": (
        '{"v":2,"requestedReplicas":null}', StoredMemory(JobMemory(), None),
    ),
    "an old version 1 value still decodes, the asked size unknown": (
        '{"v":1,"lastRescaleS":5.0,"recommendations":[[4.0,3]]}',
        StoredMemory(JobMemory(5.0, (Recommendation(4.0, 3),)), None),
    ),
    "no annotation": (None, StoredMemory(JobMemory(), None)),
}  # fmt: skip


@pytest.mark.parametrize(("value", "stored"), STORED_VALUES.values(), ids=STORED_VALUES.keys())
def test_the_stored_memory_and_asked_size_of_each_version(value, stored, caplog):
    with caplog.at_level(logging.WARNING):
        assert decode_stored(value, job="ns/a") == stored
        assert decode_memory(value, job="ns/a") == stored.memory
    assert caplog.text == ""


@pytest.mark.parametrize(
    "asked", [-1, 2**31, 2.0, True], ids=["negative", "beyond-int32", "float", "bool"]
)
def test_encode_refuses_an_asked_size_it_cannot_write_naming_the_job(asked):
    with pytest.raises(ValueError, match=r"job ns/a: requested_replicas must be an integer"):
        encode_memory(JobMemory(), job="ns/a", requested_replicas=asked)
