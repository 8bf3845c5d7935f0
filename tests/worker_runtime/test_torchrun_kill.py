"""kill -9 of the writing worker at seeded random points, including mid-write.

The bound checked: a kill loses at most N + W steps (N the interval, W the steps run while the
uncommitted write was in flight), and W <= N.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest

from tests.worker_runtime.conftest import Cluster, wait_for

pytestmark = pytest.mark.torchrun

EVERY_STEPS = 3
ARGS = (
    "--epochs",
    "40",
    "--dataset-size",
    "96",
    "--global-batch",
    "8",
    "--micro-batch",
    "2",
    "--every-steps",
    str(EVERY_STEPS),
    "--step-sleep-s",
    "0.05",
    "--pad-mb",
    "48",
)
TRIALS = 4


def rank0_starts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "start" and e["rank"] == 0]


def test_kill9_resumes_from_last_valid_checkpoint_and_bounds_lost_work(cluster: Cluster) -> None:
    rng = random.Random(20261130)
    agent = cluster.start_agent(*ARGS, nproc=2, nnodes="1", max_restarts=TRIALS + 1)
    for trial in range(TRIALS + 1):
        starts = trial + 1
        wait_for(
            lambda: len(rank0_starts(cluster.events())) == starts,  # noqa: B023
            timeout_s=90,
            what=f"start {starts}",
        )
        victim = rank0_starts(cluster.events())[-1]["pid"]
        if trial == TRIALS:  # last trial: kill while a payload is being written
            wait_for(
                lambda: any(cluster.ckpt_dir.glob("*.pt.tmp")),
                timeout_s=60,
                what="a checkpoint write in progress",
            )
        else:
            time.sleep(rng.uniform(1.0, 3.0))
        os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: len(rank0_starts(cluster.events())) == TRIALS + 2,
        timeout_s=90,
        what="the start after the last kill",
    )
    os.killpg(agent.pid, signal.SIGKILL)

    events = cluster.events()
    digests: dict[int, set[str]] = {}
    # (pid, save step) -> steps that pid completed while the write of that save was in flight.
    overlap: Counter[tuple[int, int]] = Counter()
    for e in events:
        if e["event"] == "step" and e["rank"] == 0:
            digests.setdefault(e["step"], set()).add(e["digest"])
            if e["writing"]:
                overlap[e["pid"], (e["step"] - 1) // EVERY_STEPS * EVERY_STEPS] += 1
    assert max(overlap.values(), default=0) <= EVERY_STEPS  # a due save waits for the write
    starts = rank0_starts(events)
    assert len(starts) == TRIALS + 2
    for killed, start in itertools.pairwise(starts):
        assert start["resumed"], start
        assert start["step"] % EVERY_STEPS == 0
        # The loaded parameters are exactly those some incarnation had after that step.
        assert start["digest"] in digests[start["step"]], start
        # Lost work: the interval after the checkpoint, plus the steps the killed incarnation ran
        # while the next save was being written (that write never committed), so at most 2N.
        in_flight = overlap[killed["pid"], start["step"] + EVERY_STEPS]
        assert 0 <= start["lost_steps"] <= EVERY_STEPS + in_flight <= 2 * EVERY_STEPS, start
        assert start["lost_samples"] == start["lost_steps"] * 8
