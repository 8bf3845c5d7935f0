"""The engine's HTTP server on 127.0.0.1, over real HTTP: health, readiness, metrics, extender."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from scheduler_policy.extender import Answer, EvictionRequest, Extender
from tests.scheduler_policy.extender.recorded import (
    NOW_S,
    encode,
    make_view,
    many_evictees,
    needs_wire,
    recorded_body,
)
from tide.engine.http import METRICS_CONTENT_TYPE, EngineHttp

TIMEOUT_S = 10.0


@dataclass
class Engine:
    """What the server asks of the engine, settable by each test."""

    alive: bool = True
    ready: tuple[bool, str] = (True, "")
    withheld_calls: int = 0
    withheld_pods: int = 0
    extender: Extender = field(default_factory=lambda: Extender(stale_after_s=90.0))
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    on_withheld_error: bool = False

    def on_withheld(self, count: int) -> None:
        self.withheld_calls += 1
        self.withheld_pods += count
        if self.on_withheld_error:
            raise RuntimeError("reconcile queue is closed")


@dataclass
class Served:
    engine: Engine
    server: EngineHttp
    port: int

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> tuple[int, str, str]:
        return self._call(urllib.request.Request(self.url(path)))

    def post(self, path: str, body: bytes) -> tuple[int, str, str]:
        request = urllib.request.Request(self.url(path), data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        return self._call(request)

    def post_json(self, path: str, body: bytes) -> tuple[int, Any]:
        status, text, content_type = self.post(path, body)
        assert content_type.startswith("application/json")
        return status, json.loads(text)

    @staticmethod
    def _call(request: urllib.request.Request) -> tuple[int, str, str]:
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return response.status, response.read().decode(), response.headers["Content-Type"]
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), e.headers["Content-Type"]


def _serve(engine: Engine, **options: Any) -> Served:
    server = EngineHttp(
        alive=lambda: engine.alive,
        ready=lambda: engine.ready,
        registry=engine.registry,
        extender=engine.extender,
        on_withheld=engine.on_withheld,
        now_s=lambda: NOW_S + 1.0,
        **options,
    )
    port = server.start("127.0.0.1", 0)
    return Served(engine=engine, server=server, port=port)


@pytest.fixture
def served() -> Iterator[Served]:
    s = _serve(Engine())
    yield s
    s.server.stop()


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(engine: Engine | None = None, **options: Any) -> Served:
        s = _serve(engine or Engine(), **options)
        started.append(s)
        return s

    yield start
    for s in started:
        s.server.stop()


@needs_wire
def test_the_recorded_body_is_answered_without_the_pods_tide_shrinks(served: Served) -> None:
    served.engine.extender.update(make_view(target=10))
    body = recorded_body()

    status, answer = served.post_json("/extender/reclaimable", encode(body))

    assert status == 200
    # Every pod at or above the minimum (2) is withheld, whatever the target: worker 1 is the
    # only victim, whole.
    assert answer == {"status": 1, "victims": body["evictees"][:1]}
    assert (served.engine.withheld_calls, served.engine.withheld_pods) == (1, 4)


@needs_wire
def test_the_answer_that_withholds_is_logged_once(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    served.engine.extender.update(make_view(target=10))
    with caplog.at_level("INFO", logger="tide.engine.http"):
        served.post_json("/extender/preemptable", encode(recorded_body()))
    lines = [r.getMessage() for r in caplog.records if "withheld" in r.getMessage()]
    assert lines == [
        "extender preemptable: WithholdForShrink: withheld 4 of 5 evictees: tide withholds"
        " elastic-worker-5, elastic-worker-10, elastic-worker-12, elastic-worker-17: its own"
        " shrink frees GPUs gracefully"
    ]


ABSTAINS = [
    ("not the leader", make_view(leader=False)),
    ("a stale plan", make_view(made_s=NOW_S - 1000.0)),
    ("nothing of tide's: every evictee below the minimum", make_view(minimum=20)),
    ("no plan", None),
]


@needs_wire
@pytest.mark.parametrize("view", [a[1] for a in ABSTAINS], ids=[a[0] for a in ABSTAINS])
def test_the_extender_abstains(served: Served, view: Any) -> None:
    if view is not None:
        served.engine.extender.update(view)
    status, answer = served.post_json("/extender/reclaimable", encode(recorded_body()))
    assert (status, answer) == (200, {"status": 0})
    assert served.engine.withheld_calls == 0


REFUSED = [
    ("malformed JSON", b'{"evictees": [', "body is not JSON"),
    ("not an object", b"[1, 2]", "body must be a JSON object, got a list"),
    ("a TaskInfo without UID", b'{"evictees": [{"Job": "a/b"}]}', "evictees[0].UID: missing"),
    ("empty", b"", "body is not JSON"),
]


@pytest.mark.parametrize(("body", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_bad_body_is_a_400_with_the_reason(served: Served, body: bytes, message: str) -> None:
    status, answer = served.post_json("/extender/reclaimable", body)
    assert status == 400
    assert message in answer["error"]


@needs_wire
def test_an_oversized_body_is_a_400_not_a_413(serve: Callable[..., Served]) -> None:
    s = serve(max_body_bytes=4096)
    status, answer = s.post_json("/extender/reclaimable", encode(recorded_body()))
    assert status == 400
    assert answer == {"error": "body is larger than the 4096 bytes"}
    # and the server still answers
    assert s.get("/healthz")[0] == 200


def test_an_unknown_verb_is_a_404_naming_the_known_ones(served: Served) -> None:
    status, answer = served.post_json("/extender/predicate", b"{}")
    assert status == 404
    assert answer == {
        "error": "unknown extender verb 'predicate'; tide answers reclaimable, preemptable"
    }


class FailingExtender(Extender):
    def answer(self, request: EvictionRequest, *, verb: str, now_s: float) -> Answer:
        raise RuntimeError("a bug")


@needs_wire
def test_an_answer_that_fails_abstains_rather_than_a_500(serve: Callable[..., Served]) -> None:
    s = serve(Engine(extender=FailingExtender(stale_after_s=90.0)))
    assert s.post_json("/extender/reclaimable", encode(recorded_body())) == (200, {"status": 0})


@needs_wire
def test_a_failing_reconcile_callback_does_not_change_the_answer(
    serve: Callable[..., Served],
) -> None:
    engine = Engine(on_withheld_error=True)
    engine.extender.update(make_view(target=10))
    s = serve(engine)
    status, answer = s.post_json("/extender/reclaimable", encode(recorded_body()))
    assert (status, answer["status"], len(answer["victims"])) == (200, 1, 1)
    assert engine.withheld_calls == 1


HEALTH = [
    ("alive", "/healthz", dict(alive=True), 200, "ok\n"),
    ("loop dead", "/healthz", dict(alive=False), 503, "the engine loop is not alive\n"),
    ("ready", "/readyz", dict(ready=(True, "")), 200, "ok\n"),
    (
        "no reconcile yet",
        "/readyz",
        dict(ready=(False, "no reconcile has succeeded yet")),
        503,
        "no reconcile has succeeded yet\n",
    ),
    ("not ready, no reason", "/readyz", dict(ready=(False, "")), 503, "not ready\n"),
]


@pytest.mark.parametrize(
    ("path", "state", "code", "text"), [h[1:] for h in HEALTH], ids=[h[0] for h in HEALTH]
)
def test_health_and_readiness(
    serve: Callable[..., Served], path: str, state: dict[str, Any], code: int, text: str
) -> None:
    s = serve(Engine(**state))
    status, body, _ = s.get(path)
    assert (status, body) == (code, text)


def test_a_check_that_raises_is_a_503_naming_it(serve: Callable[..., Served]) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("policy file unreadable")

    server = EngineHttp(
        alive=lambda: True,
        ready=broken,
        registry=CollectorRegistry(),
        extender=Extender(stale_after_s=90.0),
        on_withheld=lambda _count: None,
    )
    port = server.start("127.0.0.1", 0)
    try:
        s = Served(engine=Engine(), server=server, port=port)
        assert s.get("/readyz")[:2] == (503, "readiness check failed: policy file unreadable\n")
    finally:
        server.stop()


def test_metrics_serve_the_given_registry_in_text_format_0_0_4(served: Served) -> None:
    counter = Counter("tide_test_answers", "Answers in the test.", registry=served.engine.registry)
    counter.inc(3)
    status, body, content_type = served.get("/metrics")
    assert status == 200
    assert content_type == METRICS_CONTENT_TYPE
    assert "tide_test_answers_total 3.0" in body.splitlines()


def test_stop_is_idempotent_and_closes_the_port() -> None:
    s = _serve(Engine())
    port = s.port
    assert s.server.port == port
    s.server.stop()
    s.server.stop()
    assert s.server.port is None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_starting_twice_is_refused(served: Served) -> None:
    with pytest.raises(RuntimeError, match=f"already serves on port {served.port}"):
        served.server.start("127.0.0.1", 0)


def test_a_port_in_use_is_an_os_error(served: Served) -> None:
    other = EngineHttp(
        alive=lambda: True,
        ready=lambda: (True, ""),
        registry=CollectorRegistry(),
        extender=Extender(stale_after_s=90.0),
        on_withheld=lambda _count: None,
    )
    with pytest.raises(OSError):
        other.start("127.0.0.1", served.port)
    other.stop()  # never started: nothing to stop


@needs_wire
def test_the_extender_answers_within_volcanos_timeout_while_the_engine_computes(
    served: Served,
) -> None:
    served.engine.extender.update(make_view(target=10))
    raw = encode(recorded_body())
    stop = threading.Event()

    def reconcile() -> None:  # the engine thread, busy in pure Python, updating the view
        while not stop.is_set():
            sum(i * i for i in range(20_000))
            served.engine.extender.update(make_view(target=10))

    engine = threading.Thread(target=reconcile)
    engine.start()
    try:
        round_trips_s = []
        for _ in range(5):
            started = time.perf_counter()
            status, answer = served.post_json("/extender/reclaimable", raw)
            round_trips_s.append(time.perf_counter() - started)
            assert (status, answer["status"]) == (200, 1)
    finally:
        stop.set()
        engine.join(TIMEOUT_S)
    assert max(round_trips_s) < 1.0, round_trips_s


class GatedExtender(Extender):
    """An extender whose answer waits until the test lets it go (``release``), so the test can
    probe the server while an answer is being computed."""

    def __init__(self) -> None:
        super().__init__(stale_after_s=90.0)
        self.answering = threading.Event()
        self.release = threading.Event()

    def answer(self, request: EvictionRequest, *, verb: str, now_s: float) -> Answer:
        self.answering.set()
        self.release.wait(3 * TIMEOUT_S)
        return super().answer(request, verb=verb, now_s=now_s)


@needs_wire
def test_probes_are_answered_while_a_large_body_is_read(
    serve: Callable[..., Served],
) -> None:
    # An order of events, whatever the machine's speed: a probe is answered while the body is
    # half sent (the server reads it without holding its loop), and another while the answer
    # is being computed (off the loop); then the post is answered.
    extender = GatedExtender()
    served = serve(Engine(extender=extender))
    extender.update(make_view(target=500))
    raw = encode(many_evictees(1000))  # 5 MB
    head = (
        "POST /extender/reclaimable HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=TIMEOUT_S) as client:
        client.sendall(head + raw[: len(raw) // 2])
        assert served.get("/healthz")[0] == 200  # the body is half sent
        assert not extender.answering.is_set()
        client.sendall(raw[len(raw) // 2 :])
        assert extender.answering.wait(TIMEOUT_S), "the whole body was never answered"
        assert served.get("/healthz")[0] == 200  # the answer is being computed
        extender.release.set()
        response = b""
        while chunk := client.recv(1 << 16):
            response += chunk
    status_line, _, rest = response.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 200 OK", response[:500]
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["status"] == 1


def _chunked_post(port: int, body: bytes) -> tuple[int, Any]:
    """POST ``body`` with ``Transfer-Encoding: chunked`` (no Content-Length), in 3 chunks."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        third = max(1, len(body) // 3)
        chunks = [body[i : i + third] for i in range(0, len(body), third)]
        connection.request(
            "POST",
            "/extender/reclaimable",
            body=iter(chunks),
            headers={"Content-Type": "application/json"},
            encode_chunked=True,
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@needs_wire
def test_a_chunked_body_is_read_and_answered_as_one_with_a_length(served: Served) -> None:
    served.engine.extender.update(make_view(target=10))
    body = recorded_body()

    status, answer = _chunked_post(served.port, encode(body))

    assert status == 200
    assert answer == {"status": 1, "victims": body["evictees"][:1]}


@needs_wire
def test_an_oversized_chunked_body_is_a_400(serve: Callable[..., Served]) -> None:
    s = serve(max_body_bytes=4096)
    status, answer = _chunked_post(s.port, encode(recorded_body()))
    assert (status, answer) == (400, {"error": "body is larger than the 4096 bytes"})


def test_a_body_shorter_than_its_content_length_is_never_answered_as_read(
    served: Served,
) -> None:
    # The client says 1,000 bytes, sends 12 and stops sending: the server must not answer the
    # 12 bytes (nor the zeros of its buffer) as the body.
    with socket.create_connection(("127.0.0.1", served.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(
            b"POST /extender/reclaimable HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: 1000\r\n\r\n" + b'{"evictees":'
        )
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert not reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert served.engine.withheld_calls == 0
    assert served.get("/healthz")[0] == 200
