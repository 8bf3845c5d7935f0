"""The adaptive batch under real torchrun: two agents, then one (CPU, gloo, loopback)."""

from __future__ import annotations

import math
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.worker_runtime.conftest import Cluster, wait_for
from worker_runtime.adascale import gain

pytestmark = pytest.mark.torchrun

SCRIPT = Path(__file__).with_name("adaptive_script.py")
DATASET, EPOCHS, INITIAL_BATCH, LR = 2048, 3, 16, 1e-5
ENV = {
    "TIDE_ADAPTIVE_BATCH": "true",
    "TIDE_INITIAL_BATCH_SIZE": str(INITIAL_BATCH),
    "TIDE_MAX_BATCH_SIZE": "64",
    "TIDE_LOCAL_BATCH_MIN": "16",
    "TIDE_LOCAL_BATCH_MAX": "32",
    "TIDE_ACCUMULATION": "false",
}
ARGS = ("--epochs", str(EPOCHS), "--dataset-size", str(DATASET), "--lr", str(LR))
ARGS = (*ARGS, "--step-sleep-s", "0.05")
STEPS_AT_TWO = 60


def rank0_steps(events: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "step" and e["rank"] == 0 and e["world"] == world]


@pytest.mark.timeout(720)  # the waits below add up to 720 s on a loaded machine
def test_two_agents_then_one_gradient_noise_batch_and_learning_rate(cluster: Cluster) -> None:
    first = cluster.start_agent(*ARGS, script=SCRIPT, env=ENV, max_restarts=3)
    second = cluster.start_agent(*ARGS, script=SCRIPT, env=ENV, max_restarts=3)
    wait_for(
        lambda: len(rank0_steps(cluster.events(), 2)) >= STEPS_AT_TWO,
        # Generous: on a loaded machine importing torch alone can take half a minute.
        timeout_s=300,
        what=f"{STEPS_AT_TWO} steps at world size 2",
    )
    second.send_signal(signal.SIGTERM)
    cluster.wait_agent(second, timeout_s=120)
    assert cluster.wait_agent(first, timeout_s=300) == 0, cluster.agent_logs()

    events = cluster.events()
    starts = [e for e in events if e["event"] == "start" and e["rank"] == 0]
    # One restart, the membership change's: the batch changes without another.
    assert [e["world"] for e in starts] == [2, 1], starts
    at_two, at_one = rank0_steps(events, 2), rank0_steps(events, 1)
    assert at_two and at_one

    # The batch is re-chosen for the size: at 2 workers at least 2 x 16, at 1 at most 32.
    batches_two = {e["batch"] for e in at_two}
    batches_one = {e["batch"] for e in at_one}
    assert min(batches_two) >= 32 and max(batches_one) <= 32, (batches_two, batches_one)
    assert at_one[0]["batch"] != at_two[-1]["batch"] or at_one[0]["local"] != at_two[-1]["local"]

    # Every sample at most once per epoch, every step's samples once, across the resize.
    per_epoch: dict[int, list[int]] = defaultdict(list)
    per_step: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e["event"] == "step":
            per_epoch[e["epoch"]] += e["indices"]
            per_step[e["step"]] += e["indices"]
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, samples in per_epoch.items():
        assert len(samples) == len(set(samples)), f"epoch {epoch}: a sample seen twice"
        assert DATASET - len(samples) < 64, f"epoch {epoch}: {len(samples)} samples"
    assert sorted(per_step) == list(range(1, len(per_step) + 1))

    # Gradient noise at 2 workers (two micro-batch gradients a step, taken before the
    # all-reduce) against the brute force from every sample's gradient at the same parameters.
    last = at_two[-1]
    brute_sqr = sum(e["brute_sqr"] for e in at_two) / len(at_two)
    brute_var = sum(e["brute_var"] for e in at_two) / len(at_two)
    assert not last["differenced"]
    assert last["grad_var"] == pytest.approx(brute_var, rel=0.2)
    assert last["grad_sqr"] == pytest.approx(brute_sqr, rel=0.2)
    noise_scale = last["grad_var"] / last["grad_sqr"]
    assert noise_scale == pytest.approx(brute_var / brute_sqr, rel=0.2)
    # At one worker and one micro batch the previous step's gradient stands in.
    assert at_one[-1]["differenced"]
    assert any(e["sync_s"] for e in at_two)

    # SGD under AdaScale: lr = base x gain(grad_sqr, grad_var, scale) at every step, and the
    # progress is the sum of the gains, across the restart.
    progress = 0.0
    for e in at_two + at_one:
        assert e["progress"] == pytest.approx(progress, rel=1e-9, abs=1e-9)
        g = (
            1.0
            if math.isnan(e["grad_sqr"])
            else gain(grad_sqr=e["grad_sqr"], grad_var=e["grad_var"], scale=e["scale"])
        )
        assert e["lr"] == pytest.approx(LR * g, rel=1e-9)
        progress += g
    assert any(e["lr"] > LR * 1.05 for e in at_two)
    resumed = starts[1]
    assert resumed["base_lr"] == LR
