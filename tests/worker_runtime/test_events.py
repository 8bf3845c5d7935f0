"""The torchrun tests' event log, read back in the order it was written."""

from __future__ import annotations

import json
from pathlib import Path

from tests.worker_runtime.conftest import read_events


def test_events_come_back_in_time_order_whatever_the_pids(tmp_path: Path) -> None:
    # A worker restarted after the pids wrapped or grew a digit gets a file that sorts by name
    # before its predecessor's: "events-10001" < "events-9998".
    logged = [
        (9998, {"event": "start", "rank": 0, "time_s": 100.0}),
        (9998, {"event": "step", "rank": 0, "time_s": 101.0}),
        (9998, {"event": "step", "rank": 0, "time_s": 101.0}),  # same time: file order kept
        (10001, {"event": "start", "rank": 0, "time_s": 102.5}),
        (301, {"event": "start", "rank": 0, "time_s": 103.0}),  # after the wrap
    ]
    for pid, event in logged:
        with open(tmp_path / f"events-{pid}.jsonl", "a") as f:
            f.write(json.dumps(event | {"pid": pid}) + "\n")
    events = read_events(tmp_path)
    assert [(e["pid"], e["event"]) for e in events] == [
        (9998, "start"),
        (9998, "step"),
        (9998, "step"),
        (10001, "start"),
        (301, "start"),
    ]
