"""The one HTTP server of ``tide engine``: health, readiness, metrics and the scheduler extender.

aiohttp on its own event loop in a background thread, so that it answers while the engine
thread reconciles: Volcano's extender waits at most ``httpTimeout`` (1 s) for an answer.

- ``GET /healthz``: 200 ``ok`` while the process loop is alive, else 503.
- ``GET /readyz``: 200 ``ok`` once the first reconcile succeeded and the policy is valid, else
  503 with the reason.
- ``GET /metrics``: the registry in Prometheus' text format 0.0.4.
- ``POST /extender/{verb}``: ``reclaimable`` and ``preemptable``; another verb is a 404 naming
  the known ones; a malformed or oversized body a 400 with what is wrong. An answer that fails
  for any other reason abstains (``{"status": 0}``): Volcano then proceeds as if tide were absent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from scheduler_policy.extender import (
    MAX_BODY_BYTES,
    VERBS,
    Answer,
    BodyError,
    Extender,
    parse_eviction,
)

__all__ = ["METRICS_CONTENT_TYPE", "EngineHttp"]

logger = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' classic text format, what ``generate_latest`` writes."""

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0


class EngineHttp:
    """The engine's HTTP server, run in a background thread with its own event loop.

    Args:
        alive: whether the engine's process loop is alive (``/healthz``).
        ready: whether the engine is ready, and why not (``/readyz``): ``(True, "")`` once the
            first reconcile succeeded and the policy is valid.
        registry: the registry ``/metrics`` serves.
        extender: answers the extender verbs.
        on_withheld: called (on the server's thread) with the number of pods withheld, after
            an answer that withholds some: the engine should reconcile at once. It must not
            block; what it raises is logged.
        now_s: the clock, seconds since the epoch.
        max_body_bytes: the largest extender body read, bytes; larger ones get a 400.
    """

    def __init__(
        self,
        *,
        alive: Callable[[], bool],
        ready: Callable[[], tuple[bool, str]],
        registry: CollectorRegistry,
        extender: Extender,
        on_withheld: Callable[[int], None],
        now_s: Callable[[], float] = time.time,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._alive = alive
        self._ready = ready
        self._registry = registry
        self._extender = extender
        self._on_withheld = on_withheld
        self._now_s = now_s
        self._max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def port(self) -> int | None:
        """The port it listens on; None when not started."""
        return self._port

    def app(self) -> web.Application:
        """The aiohttp application (routes and body limit), for serving or testing."""
        # aiohttp refuses a larger body with its own 413 when read; the handler answers it 400.
        app = web.Application(client_max_size=self._max_body_bytes)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/extender/{verb}", self._extender_verb)
        return app

    def start(self, host: str, port: int) -> int:
        """Serve on ``host:port`` in a background thread.

        Args:
            host: the address to bind, e.g. ``0.0.0.0`` or ``127.0.0.1``.
            port: the port; 0 picks a free one.

        Returns:
            The bound port.

        Raises:
            RuntimeError: already started, or the server did not start within 10 s.
            OSError: the address could not be bound.
        """
        with self._lock:
            if self._thread is not None:
                raise RuntimeError(f"the engine's HTTP server already serves on port {self._port}")
            started = threading.Event()
            failure: list[BaseException] = []
            self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tide-extender")
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=self._serve,
                args=(loop, host, port, started, failure),
                name="tide-engine-http",
                daemon=True,
            )
            thread.start()
            if not started.wait(_START_TIMEOUT_S) or failure:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
                if not failure:
                    loop.call_soon_threadsafe(loop.stop)  # it may yet bind: stop it there
                    raise RuntimeError(f"the engine's HTTP server did not start on {host}:{port}")
                thread.join(_STOP_TIMEOUT_S)
                raise failure[0]
            self._thread, self._loop = thread, loop
            assert self._port is not None
            logger.info("engine HTTP server listening on %s:%s", host, self._port)
            return self._port

    def stop(self) -> None:
        """Stop serving and join the thread, within about 5 s; does nothing when not serving."""
        with self._lock:
            thread, loop, runner = self._thread, self._loop, self._runner
            executor = self._executor
            self._thread = self._loop = self._runner = self._executor = None
            self._port = None
        if thread is None or loop is None:
            return
        if runner is not None:
            cleanup = asyncio.run_coroutine_threadsafe(runner.cleanup(), loop)
            try:
                cleanup.result(_STOP_TIMEOUT_S)
            except Exception:  # a timeout or a failed cleanup: stop the loop anyway
                logger.warning("engine HTTP server did not shut down cleanly", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_STOP_TIMEOUT_S)
        if executor is not None:  # an answer still being computed is dropped, not awaited
            executor.shutdown(wait=False, cancel_futures=True)

    def _serve(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        started: threading.Event,
        failure: list[BaseException],
    ) -> None:
        asyncio.set_event_loop(loop)
        # read_bufsize: a body up to the limit is buffered as it arrives, without the reads
        # pausing every 128 KB (aiohttp's default) until the handler takes what was buffered.
        runner = web.AppRunner(
            self.app(),
            access_log=None,
            handle_signals=False,
            read_bufsize=self._max_body_bytes,
        )
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, port)
            loop.run_until_complete(site.start())
            self._runner = runner
            self._port = _bound_port(runner)
        except BaseException as e:  # handed to start(), which raises it on the caller's thread
            failure.append(e)
            loop.run_until_complete(runner.cleanup())
            loop.close()
            started.set()
            return
        started.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _healthz(self, request: web.Request) -> web.Response:
        try:
            alive = self._alive()
        except Exception as e:
            logger.warning("healthz: the liveness check failed: %s", e)
            return web.Response(status=503, text=f"liveness check failed: {e}\n")
        if alive:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="the engine loop is not alive\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        try:
            ready, reason = self._ready()
        except Exception as e:
            logger.warning("readyz: the readiness check failed: %s", e)
            return web.Response(status=503, text=f"readiness check failed: {e}\n")
        if ready:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"{reason or 'not ready'}\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _extender_verb(self, request: web.Request) -> web.Response:
        verb = request.match_info["verb"]
        if verb not in VERBS:
            known = ", ".join(VERBS)
            return _json(404, {"error": f"unknown extender verb {verb!r}; tide answers {known}"})
        try:
            raw = await _read_body(request, max_bytes=self._max_body_bytes)
        except web.HTTPRequestEntityTooLarge:
            return _json(400, {"error": f"body is larger than the {self._max_body_bytes} bytes"})
        except _ShortBody as e:
            return _json(400, {"error": str(e)})
        loop = asyncio.get_running_loop()
        try:
            # On a worker thread: a large body takes a while to read, and the probes (and
            # other requests) keep being answered meanwhile.
            work = loop.run_in_executor(self._executor, self._answer, raw, verb)
            answer, body, total = await work
        except BodyError as e:
            logger.warning("extender %s: refused a body: %s", verb, e)
            return _json(400, {"error": str(e)})
        except Exception:  # never a 500: abstaining lets Volcano proceed as without tide
            logger.exception("extender %s: answering failed; abstaining", verb)
            return _json(200, {"status": 0})
        if answer.withheld:
            self._withheld(verb, answer, total=total)
        return web.Response(body=body, content_type="application/json")

    def _answer(self, raw: bytes | bytearray, verb: str) -> tuple[Answer, bytes, int]:
        eviction = parse_eviction(raw, max_bytes=self._max_body_bytes)
        answer = self._extender.answer(eviction, verb=verb, now_s=self._now_s())
        return answer, answer.body_bytes(), len(eviction.evictees)

    def _withheld(self, verb: str, answer: Answer, *, total: int) -> None:
        logger.info(
            "extender %s: %s: withheld %d of %d evictees: %s",
            verb,
            answer.reason.value,
            len(answer.withheld),
            total,
            answer.message,
        )
        try:
            self._on_withheld(len(answer.withheld))
        except Exception:
            logger.exception("extender %s: the reconcile-now callback failed", verb)


class _ShortBody(ValueError):
    """A body that ended before its ``Content-Length``."""


async def _read_body(request: web.Request, *, max_bytes: int) -> bytes | bytearray:
    """The request's body, at most ``max_bytes``.

    With a ``Content-Length`` (what Volcano's Go client sends), the body is copied as it arrives
    into one buffer of that size: ``request.read()`` grows a ``bytearray`` and copies it into
    ``bytes`` at the end, which took 11-12 ms for a 5.3 MB body against 2.6-2.9 ms this way
    (the engine's server, ``benchmarks/extender_latency.py``'s body, the 2-core machine).
    Without one (chunked), the body is read by ``request.read()``, which enforces the server's
    size limit as it reads.

    Raises:
        web.HTTPRequestEntityTooLarge: the body is larger than ``max_bytes``.
        _ShortBody: the body ended before its ``Content-Length``.
    """
    size = request.content_length
    if size is None:
        return await request.read()
    if size > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=size)
    body = bytearray(size)
    view = memoryview(body)
    filled = 0
    while filled < size:
        chunk = await request.content.readany()
        if not chunk:
            break
        view[filled : filled + len(chunk)] = chunk  # the parser stops at Content-Length
        filled += len(chunk)
    if filled != size:
        raise _ShortBody(f"body ended after {filled} of its {size} bytes (Content-Length)")
    return body


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body, separators=(",", ":")).encode(),
        content_type="application/json",
    )


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError(f"the engine's HTTP server has no TCP address: {runner.addresses}")
