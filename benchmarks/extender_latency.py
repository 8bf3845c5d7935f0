"""How long the engine's extender takes to answer Volcano's ``reclaimable`` for 1,000 evictees.

Volcano's extender plugin waits at most ``httpTimeout`` (1 s) for an answer. This builds one body
of the recorded shape (``../shared/volcano-wire/v1.15.1/extender-reclaimable-request.json``) with
``--evictees`` copies of its first TaskInfo (varied UID, name and task index, the whole Pod
kept), posts it ``--requests`` times to the real server (``tide.engine.http.EngineHttp``) on
127.0.0.1 over one kept-alive connection, as Volcano's Go client does, and times the round trip;
then it times the server's own steps alone: ``parse_eviction``, ``Extender.answer`` and the
encoding of the reply. The view shrinks the job to half its evictees, so the answer withholds
half and echoes the other half back (the clock is pinned so no grace window runs out).

    python benchmarks/extender_latency.py --json benchmarks/out/extender_latency.json
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

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


def percentile_ms(values_s: list[float], q: float) -> float:
    ordered = sorted(values_s)
    rank = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[rank] * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evictees", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200, help="round trips timed")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args()
    if not RECORDED.exists():
        sys.exit(f"the recorded reclaimable body is absent at {RECORDED} (../shared absent)")

    body = build_body(args.evictees)
    raw = json.dumps(body).encode()
    target = args.evictees // 2
    view = ExtenderView(
        jobs={JOB: ShrinkingJob(key=JOB, task="worker", target_replicas=target, min_replicas=1)},
        leader=True,
        made_s=MADE_S,
    )
    extender = Extender(stale_after_s=90.0)
    extender.update(view)
    server = EngineHttp(
        alive=lambda: True,
        ready=lambda: (True, ""),
        registry=CollectorRegistry(),
        extender=extender,
        on_withheld=lambda: None,
        now_s=lambda: MADE_S,
    )
    port = server.start("127.0.0.1", 0)
    round_trips: list[float] = []
    reply_bytes = 0
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        headers = {"Content-Type": "application/json"}
        for k in range(args.requests + 5):  # the first 5 warm up, untimed
            began = time.perf_counter()
            connection.request("POST", "/extender/reclaimable", body=raw, headers=headers)
            response = connection.getresponse()
            reply = response.read()
            elapsed = time.perf_counter() - began
            assert response.status == 200, (response.status, reply[:200])
            if k >= 5:
                round_trips.append(elapsed)
            reply_bytes = len(reply)
        answer_json = json.loads(reply)
        assert answer_json["status"] == 1 and len(answer_json["victims"]) == target
        connection.close()
    finally:
        server.stop()

    parse_s: list[float] = []
    answer_s: list[float] = []
    encode_s: list[float] = []
    for _ in range(args.requests):
        began = time.perf_counter()
        request = parse_eviction(raw)
        parsed = time.perf_counter()
        answer = extender.answer(request, verb="reclaimable", now_s=MADE_S)
        answered = time.perf_counter()
        answer.body_bytes()
        encode_s.append(time.perf_counter() - answered)
        parse_s.append(parsed - began)
        answer_s.append(answered - parsed)
        assert len(answer.withheld) == args.evictees - target

    print(
        f"extender reclaimable, {args.evictees} evictees ({len(raw) / 1e6:.2f} MB body, "
        f"{reply_bytes / 1e6:.2f} MB reply), {args.requests} requests; "
        f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    )
    print("command: python " + " ".join(sys.argv))
    print(f"{'step':<22} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    rows = [
        ("round trip (HTTP)", "extender_round_trip", round_trips),
        ("parse_eviction", "extender_parse", parse_s),
        ("Extender.answer", "extender_answer", answer_s),
        ("encode reply", "extender_encode", encode_s),
    ]
    records: list[dict[str, object]] = []
    base = {"evictees": args.evictees, "requests": args.requests, "body_bytes": len(raw)}
    for label, metric, values in rows:
        p50, p99 = percentile_ms(values, 0.5), percentile_ms(values, 0.99)
        print(f"{label:<22} {p50:>8.2f} {p99:>8.2f} {max(values) * 1000:>8.2f}")
        for quantile, value in (("p50", p50), ("p99", p99)):
            records.append(
                {"metric": f"{metric}_{quantile}", "value": round(value, 3), "unit": "ms", **base}
            )
    answer_p99 = percentile_ms(answer_s, 0.99)
    verdict = "within" if answer_p99 < TARGET_P99_MS else "OVER"
    print(f"Extender.answer p99 {answer_p99:.2f} ms: {verdict} the {TARGET_P99_MS:g} ms target")
    print(f"median round trip {statistics.median(round_trips) * 1000:.1f} ms of Volcano's 1000 ms")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
