"""The informer's list-then-watch loop, on a scripted stand-in for the raw Kubernetes SDK call.

What the real API server cannot be made to do on demand (expire a watch with 410 Gone, drop a
connection, page a list) is scripted here; the rest is covered on the real server in
``tests/cluster/test_volcano_client.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import urllib3

from scheduler_policy.adapters.volcano.counts import RequestCounter
from scheduler_policy.adapters.volcano.informer import Informer, newer


def obj(name: str, version: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "resourceVersion": version}, **extra}  # fmt: skip


class Response:
    """What the SDK returns with ``_preload_content=False``: a body to read or stream."""

    def __init__(self, *, data: bytes = b"", lines: list[bytes] | None = None) -> None:
        self.status = 200
        self.data = data
        self._lines = lines or []
        self.connection = None

    def stream(self, amt: object = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self._lines
        time.sleep(0.01)  # a watch that the server ends, after a moment

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


@dataclass
class ScriptedApi:
    """A list function: pages for lists, scripted watches (events, or an exception to raise)."""

    pages: list[list[list[dict[str, Any]]]]  # per list call: its pages
    watches: list[list[dict[str, Any]] | Exception]
    list_calls: list[dict[str, Any]] = field(default_factory=list)
    watch_calls: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, *args: str, watch: bool = False, **kwargs: Any) -> Response:
        with self.lock:
            if watch:
                self.watch_calls.append(kwargs)
                script = self.watches.pop(0) if self.watches else []
                if isinstance(script, Exception):
                    raise script
                return Response(lines=[json.dumps(e).encode() + b"\n" for e in script])
            self.list_calls.append(kwargs)
            pages = self.pages[0] if len(self.pages) == 1 else self.pages.pop(0)
            page = int(kwargs.get("_continue") or 0)
            more = page + 1 < len(pages)
            version = str(100 * len(self.list_calls) + page)
            body = {"items": pages[page],
                    "metadata": {"resourceVersion": version,
                                 "continue": str(page + 1) if more else ""}}  # fmt: skip
            return Response(data=json.dumps(body).encode())


def names(item: dict[str, Any]) -> str | None:
    return str(item["metadata"]["name"]) if not item.get("bad") else None


def informer(api: ScriptedApi, **kwargs: Any) -> tuple[Informer[str], RequestCounter]:
    counter = RequestCounter()
    made: Informer[str] = Informer(
        kind="Thing", call=api, args=("g", "v", "things"), read=names, counter=counter,
        key=lambda name: name, backoff_max_s=0.2, **kwargs,
    )  # fmt: skip
    return made, counter


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, f"{what}: not within {timeout_s} s"
        time.sleep(0.01)


def test_a_list_reads_every_page_and_skips_what_the_reader_refuses():
    api = ScriptedApi(pages=[[[obj("a", "1"), obj("b", "2", bad=True)], [obj("c", "3")]]],
                      watches=[])  # fmt: skip
    made, counter = informer(api)
    made.relist()
    assert sorted(made.items()) == ["a", "c"] and made.synced
    assert counter.snapshot().lists == 2
    assert [c.get("_continue") for c in api.list_calls] == [None, "1"]


def test_a_watch_resumes_from_the_list_and_follows_adds_changes_and_deletes():
    api = ScriptedApi(pages=[[[obj("a", "1")]]], watches=[[
        {"type": "ADDED", "object": obj("b", "5")},
        {"type": "DELETED", "object": obj("a", "6")},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
    ]])  # fmt: skip
    made, counter = informer(api)
    made.start()
    try:
        wait_for("the second watch", lambda: len(api.watch_calls) >= 2)
        assert made.items() == ["b"] and made.get("b") == "b" and made.get("a") is None
        versions = [c["resource_version"] for c in api.watch_calls[:2]]
        assert versions == ["100", "9"]  # the list's version, then the bookmark's
        assert counter.snapshot().lists == 1
    finally:
        assert made.stop(2.0)


def test_a_watch_gone_410_lists_again():
    expired = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                           "message": "too old resource version"}}  # fmt: skip
    api = ScriptedApi(pages=[[[obj("a", "1")]], [[obj("z", "40")]]], watches=[[expired]])
    made, counter = informer(api)
    made.start()
    try:
        wait_for("the list after 410",
                 lambda: len(api.list_calls) == 2 and len(api.watch_calls) >= 2)  # fmt: skip
        assert made.items() == ["z"] and counter.snapshot().lists == 2
        assert api.watch_calls[1]["resource_version"] == "200"
    finally:
        assert made.stop(2.0)


def test_a_dropped_connection_reconnects_after_a_backoff_without_listing_again(caplog):
    api = ScriptedApi(pages=[[[obj("a", "1")]]], watches=[
        urllib3.exceptions.ProtocolError("connection reset"),
        [{"type": "MODIFIED", "object": obj("a", "7")}],
    ])  # fmt: skip
    made, counter = informer(api)
    began = time.monotonic()
    made.start()
    try:
        wait_for("the reconnect", lambda: len(api.watch_calls) >= 3)
        assert time.monotonic() - began >= 0.2  # it waited before the second watch
        assert counter.snapshot().lists == 1
        assert [c["resource_version"] for c in api.watch_calls[:3]] == ["100", "100", "7"]
        assert "connection reset" in caplog.text
    finally:
        assert made.stop(2.0)


def test_an_event_older_than_a_written_object_is_ignored():
    api = ScriptedApi(pages=[[[]]], watches=[])
    seen: list[tuple[str | None, str | None]] = []
    made, _ = informer(api, on_event=lambda before, after: seen.append((before, after)))
    made.relist()
    made.put(obj("a", "20"))
    made._apply("MODIFIED", obj("a", "15"))  # as the watch delivers it
    assert made.items() == ["a"] and seen == [(None, "a")]


@pytest.mark.parametrize(
    ("version", "than", "expected"),
    [("20", "15", True), ("15", "20", False), ("20", "20", True), ("x", "20", True),
     (None, "3", True)],
    ids=["later", "earlier", "same", "not-an-integer", "unknown"],
)  # fmt: skip
def test_resource_versions_compare_as_etcd_revisions(version, than, expected):
    assert newer(version, than) is expected


def test_stop_ends_the_thread_within_its_bound():
    api = ScriptedApi(pages=[[[obj("a", "1")]]], watches=[])
    made, _ = informer(api)
    made.start()
    assert made.wait_synced(2.0)
    began = time.monotonic()
    assert made.stop(2.0) and not made.running
    assert time.monotonic() - began < 2.0


def test_a_reader_that_fails_on_one_object_skips_it_and_keeps_the_rest(caplog):
    def fragile(item: dict[str, Any]) -> str | None:
        if item["metadata"]["name"] == "poison":
            raise KeyError("spec")
        return names(item)

    api = ScriptedApi(pages=[[[obj("a", "1"), obj("poison", "2")]]],
                      watches=[[{"type": "ADDED", "object": obj("poison", "3")},
                                {"type": "ADDED", "object": obj("b", "4")}]])  # fmt: skip
    made: Informer[str] = Informer(kind="Thing", call=api, args=(), read=fragile,
                                   counter=RequestCounter(), backoff_max_s=0.2)  # fmt: skip
    made.start()
    try:
        wait_for("the watch", lambda: sorted(made.items()) == ["a", "b"])
        assert "Thing ns/poison: skipped" in caplog.text
        assert len(api.list_calls) == 1  # the watch went on; nothing was listed again
    finally:
        assert made.stop(2.0)
