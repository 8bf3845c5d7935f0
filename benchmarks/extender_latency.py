"""How long the engine's extender takes to answer Volcano's ``reclaimable`` (110, 1,000 evictees).

Volcano's extender plugin waits at most ``httpTimeout`` (1 s) for an answer. For each size in
``--evictees`` this builds one body of the recorded shape
(``../shared/volcano-wire/v1.15.1/extender-reclaimable-request.json``) with that many copies of
its first TaskInfo (varied UID, name and task index, the whole Pod
kept), posts it ``--requests`` times to the real server (``tide.engine.http.EngineHttp``) on
127.0.0.1 from another process over one kept-alive connection, as Volcano's Go client does, and
times the round trip;
then it times the server's own steps alone: ``parse_eviction`` (the typed msgspec decoder,
``scheduler_policy/extender/typed.py``), ``Extender.answer`` and the encoding of the reply; and,
to compare, decoding the same body whole with ``json.loads`` and ``orjson.loads`` (when
installed; not a dependency), each with the collector paused as ``parse_eviction`` pauses it.
What the round trip adds to the three steps is aiohttp's reading of the body and the HTTP
exchange; the server's own timings (``TimedServer``: its handler, and the work on its thread)
split that into the time inside the handler and outside it. The view shrinks the job to half
its evictees, so the answer withholds half and echoes the other half back (the clock is pinned
so no grace window runs out).

    python benchmarks/extender_latency.py --json benchmarks/out/extender_latency.json
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from scheduler_policy.extender import Extender, ExtenderView, ShrinkingJob, parse_eviction
from scheduler_policy.vocabulary.state import JobKey
from tide.engine.http import EngineHttp

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / ".." / "shared" / "volcano-wire" / "v1.15.1" / "extender-reclaimable-request.json"
JOB = JobKey("default/elastic")
MADE_S = 1_000_000.0
TARGET_P99_MS = 50.0


def build_body(evictees: int) -> dict[str, Any]:
    """The recorded body with ``evictees`` copies of its first evictee, indices 0..evictees-1."""
    body: dict[str, Any] = json.loads(RECORDED.read_text())
    template = body["evictees"][0]
    out = []
    for i in range(evictees):
        info = copy.deepcopy(template)
        info["UID"] = f"00000000-0000-4000-8000-{i:012d}"
        info["Name"] = f"elastic-worker-{i}"
        metadata = info["Pod"]["metadata"]
        metadata["name"], metadata["uid"] = info["Name"], info["UID"]
        for where in ("labels", "annotations"):
            metadata[where]["volcano.sh/task-index"] = str(i)
        out.append(info)
    body["evictees"] = out
    return body


_CLIENT = """
import http.client, json, sys, time
port, body_file, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
raw = open(body_file, "rb").read()
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
headers = {"Content-Type": "application/json"}
timings = []
for _ in range(count):
    began = time.perf_counter()
    connection.request("POST", "/extender/reclaimable", body=raw, headers=headers)
    response = connection.getresponse()
    reply = response.read()
    timings.append(time.perf_counter() - began)
    assert response.status == 200, (response.status, reply[:200])
connection.close()
print(json.dumps([timings, reply.decode()]))
"""
"""One kept-alive connection posting the body ``count`` times, as Volcano's Go client does;
prints each round trip's seconds and the last reply."""


class TimedServer(EngineHttp):
    """The engine's server, timing on its side what each extender request takes.

    ``handler``: aiohttp's call of the route (the body's read included, from the headers' end);
    ``work``: the answer on the worker thread (``parse_eviction``, ``Extender.answer``, the
    reply's encoding). What the round trip adds to ``handler`` is the exchange outside it: the
    client sending the headers, aiohttp writing the reply, the client reading it.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timings: dict[str, list[float]] = {"handler": [], "work": []}

    def app(self) -> web.Application:
        app = super().app()

        @web.middleware
        async def timed(request: web.Request, handler: Any) -> web.StreamResponse:
            began = time.perf_counter()
            try:
                response: web.StreamResponse = await handler(request)
                return response
            finally:
                self.timings["handler"].append(time.perf_counter() - began)

        app.middlewares.append(timed)
        return app

    def _answer(self, raw: bytes, verb: str) -> Any:
        began = time.perf_counter()
        try:
            return super()._answer(raw, verb)
        finally:
            self.timings["work"].append(time.perf_counter() - began)


def percentile_ms(values_s: list[float], q: float) -> float:
    ordered = sorted(values_s)
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank] * 1000.0


def measure(evictees: int, requests: int) -> tuple[dict[str, list[float]], int, int]:
    """Time ``requests`` answers to a body of ``evictees``: each step's durations, seconds."""
    body = build_body(evictees)
    raw = json.dumps(body).encode()
    target = evictees // 2
    view = ExtenderView(
        # The extender withholds every pod at or above the job's minimum: half the evictees.
        jobs={
            JOB: ShrinkingJob(key=JOB, task="worker", target_replicas=target, min_replicas=target)
        },
        leader=True,
        made_s=MADE_S,
    )
    extender = Extender(stale_after_s=90.0)
    extender.update(view)
    server = TimedServer(
        alive=lambda: True,
        ready=lambda: (True, ""),
        registry=CollectorRegistry(),
        extender=extender,
        on_withheld=lambda withheld: None,
        now_s=lambda: MADE_S,
    )
    port = server.start("127.0.0.1", 0)
    steps: dict[str, list[float]] = {
        "round_trip": [], "server_handler": [], "server_work": [],
        "parse": [], "answer": [], "encode": [],
    }  # fmt: skip
    steps.update({name: [] for name in _WHOLE_DECODERS})
    try:
        # The client is another process, as Volcano's scheduler is: in this process it would
        # hold the interpreter lock against the server's thread while it sends 5 MB and reads
        # the reply, and the figure would be Python's contention, not the extender's.
        with tempfile.TemporaryDirectory() as folder:
            body_file = Path(folder) / "body.json"
            body_file.write_bytes(raw)
            out = subprocess.run(
                [sys.executable, "-c", _CLIENT, str(port), str(body_file), str(requests + 5)],
                capture_output=True, check=True, text=True, timeout=600,
            )  # fmt: skip
        timings, reply = json.loads(out.stdout)
        steps["round_trip"] = timings[5:]  # the first 5 warm up, untimed
        steps["server_handler"] = server.timings["handler"][5:]
        steps["server_work"] = server.timings["work"][5:]
        answered = json.loads(reply)
        assert answered["status"] == 1 and len(answered["victims"]) == target
    finally:
        server.stop()
    for _ in range(requests):
        began = time.perf_counter()
        request = parse_eviction(raw)
        parsed = time.perf_counter()
        answer = extender.answer(request, verb="reclaimable", now_s=MADE_S)
        done = time.perf_counter()
        answer.body_bytes()
        steps["encode"].append(time.perf_counter() - done)
        steps["parse"].append(parsed - began)
        steps["answer"].append(done - parsed)
        assert len(answer.withheld) == evictees - target
    for name, decode in _WHOLE_DECODERS.items():
        for _ in range(requests):
            gc.disable()
            try:
                began = time.perf_counter()
                decoded = decode(raw)
                steps[name].append(time.perf_counter() - began)
                del decoded
            finally:
                gc.enable()
    return steps, len(raw), len(reply.encode())


def _whole_decoders() -> dict[str, Any]:
    decoders: dict[str, Any] = {"json_loads": json.loads}
    try:
        decoders["orjson_loads"] = importlib.import_module("orjson").loads
    except ImportError:
        print("orjson is not installed: its row is left out")
    return decoders


_WHOLE_DECODERS = _whole_decoders()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--evictees",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[110, 1000],
        help="body sizes, comma-separated (110: a full node's pods, Kubernetes' default limit)",
    )
    parser.add_argument("--requests", type=int, default=200, help="round trips timed per size")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args()
    if not RECORDED.exists():
        sys.exit(f"the recorded reclaimable body is absent at {RECORDED} (../shared absent)")

    print(
        f"extender reclaimable, {args.requests} requests per size; {os.cpu_count()} cores, "
        f"{platform.machine()}, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    print("command: python " + " ".join(sys.argv))
    print(f"{'evictees':>8} {'MB in':>6} {'MB out':>6} {'step':<18} {'p50 ms':>8} {'p99 ms':>8}")
    labels = {
        "round_trip": "round trip (HTTP)",
        "server_handler": "server: handler",
        "server_work": "server: work",
        "parse": "parse_eviction",
        "answer": "Extender.answer",
        "encode": "encode reply",
        "json_loads": "json.loads, no gc",
        "orjson_loads": "orjson.loads, no gc",
    }
    records: list[dict[str, object]] = []
    for evictees in args.evictees:
        steps, body_bytes, reply_bytes = measure(evictees, args.requests)
        base = {"evictees": evictees, "requests": args.requests, "body_bytes": body_bytes}
        for step, values in steps.items():
            p50, p99 = percentile_ms(values, 0.5), percentile_ms(values, 0.99)
            print(
                f"{evictees:>8} {body_bytes / 1e6:>6.2f} {reply_bytes / 1e6:>6.2f} "
                f"{labels[step]:<18} {p50:>8.2f} {p99:>8.2f}"
            )
            for quantile, value in (("p50", p50), ("p99", p99)):
                records.append(
                    {"metric": f"extender_{step}_{quantile}", "value": round(value, 3),
                     "unit": "ms", **base}
                )  # fmt: skip
        served = sum(percentile_ms(steps[step], 0.5) for step in ("parse", "answer", "encode"))
        http_ms = percentile_ms(steps["round_trip"], 0.5) - served
        print(f"{'':>8} the HTTP exchange and aiohttp's read add {http_ms:.2f} ms to the p50 of "
              "the three steps")  # fmt: skip
        handler, work = (percentile_ms(steps[k], 0.5) for k in ("server_handler", "server_work"))
        print(f"{'':>8} p50s: the handler spends {handler - work:.2f} ms outside the work "
              "(reading the body, the hop to the worker thread); the round trip "
              f"{percentile_ms(steps['round_trip'], 0.5) - handler:.2f} ms outside the handler "
              "(headers in, the reply out and read)")  # fmt: skip
        records.append({"metric": "extender_http_overhead_p50", "value": round(http_ms, 3),
                        "unit": "ms", **base})  # fmt: skip
        trip_p99 = percentile_ms(steps["round_trip"], 0.99)
        verdict = "within" if trip_p99 < TARGET_P99_MS else "OVER"
        print(f"{'':>8} round trip p99 {trip_p99:.2f} ms: {verdict} the "
              f"{TARGET_P99_MS:g} ms target; Volcano waits 1000 ms")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
