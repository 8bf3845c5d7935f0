"""Scale a torchrun job 2 -> 3 -> 1 nodes by starting and stopping agents on loopback."""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from typing import Any

import pytest

from tests.worker_runtime.conftest import Cluster, wait_for

pytestmark = pytest.mark.torchrun

DATASET, GLOBAL_BATCH, EPOCHS = 240, 12, 2
ARGS = (
    "--epochs",
    str(EPOCHS),
    "--dataset-size",
    str(DATASET),
    "--global-batch",
    str(GLOBAL_BATCH),
    "--micro-batch",
    "2",
    "--every-steps",
    "50",
    "--step-sleep-s",
    "0.15",
)
TOTAL_STEPS = EPOCHS * DATASET // GLOBAL_BATCH


def steps_at_world(events: list[dict[str, Any]], world: int) -> int:
    return sum(e["event"] == "step" and e["rank"] == 0 and e["world"] == world for e in events)


def starts_at_world(events: list[dict[str, Any]], world: int) -> int:
    return sum(e["event"] == "start" and e["world"] == world for e in events)


def test_scale_2_to_3_to_1_sees_every_sample_once_and_loses_no_step(cluster: Cluster) -> None:
    pause = cluster.tmp / "pause"
    args = (*ARGS, "--pause-file", str(pause))
    first = cluster.start_agent(*args, max_restarts=3)  # hosts the rendezvous store
    second = cluster.start_agent(*args, max_restarts=3)
    wait_for(lambda: steps_at_world(cluster.events(), 2) >= 4, timeout_s=60, what="4 steps at 2")
    # Hold the job at a step boundary until the third agent has joined: on a loaded machine
    # its start-up can take longer than the rest of the job.
    pause.touch()
    third = cluster.start_agent(*args, max_restarts=3)
    wait_for(lambda: starts_at_world(cluster.events(), 3) == 3, timeout_s=120, what="3 starts at 3")
    pause.unlink()
    wait_for(lambda: steps_at_world(cluster.events(), 3) >= 4, timeout_s=60, what="4 steps at 3")
    second.send_signal(signal.SIGTERM)
    third.send_signal(signal.SIGTERM)
    cluster.wait_agent(second, timeout_s=60)
    cluster.wait_agent(third, timeout_s=60)
    assert cluster.wait_agent(first, timeout_s=120) == 0, cluster.agent_logs()

    events = cluster.events()
    starts = [e for e in events if e["event"] == "start"]
    worlds = [e["world"] for e in starts if e["rank"] == 0]
    assert worlds == [2, 3, 1], worlds
    # Zero steps lost: each incarnation resumes at the step every rank of the previous one saved.
    exits = [e for e in events if e["event"] == "exit"]
    saved_steps = sorted({e["step"] for e in exits})
    assert len(saved_steps) == 2
    assert sorted((e["world"], e["step"], e["lost_steps"]) for e in starts if e["resumed"]) == [
        (1, saved_steps[1], 0),
        (3, saved_steps[0], 0),
        (3, saved_steps[0], 0),
        (3, saved_steps[0], 0),
    ]
    assert Counter(e["step"] for e in exits) == {saved_steps[0]: 2, saved_steps[1]: 3}
    # Accumulation absorbs the world size: micro 2 x world x accumulation = 12.
    assert {(e["world"], e["accum"]) for e in starts} == {(2, 3), (3, 2), (1, 6)}
    # Global batch constant, every step trained once, every sample once per epoch.
    per_step: dict[int, list[int]] = defaultdict(list)
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e["event"] == "step":
            per_step[e["step"]] += e["indices"]
            per_epoch[e["epoch"]] += e["indices"]
    assert sorted(per_step) == list(range(1, TOTAL_STEPS + 1))
    assert {len(v) for v in per_step.values()} == {GLOBAL_BATCH}
    for epoch in range(EPOCHS):
        assert sorted(per_epoch[epoch]) == list(range(DATASET)), f"epoch {epoch}"
