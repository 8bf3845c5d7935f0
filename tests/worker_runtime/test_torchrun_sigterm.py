"""A SIGTERM to one worker of a 2-worker torchrun job: coordinated save, exact resume."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tests.worker_runtime.conftest import Cluster, wait_for

pytestmark = pytest.mark.torchrun

ARGS = (
    "--epochs",
    "3",
    "--dataset-size",
    "96",
    "--global-batch",
    "8",
    "--micro-batch",
    "2",
    "--every-steps",
    "5",
    "--step-sleep-s",
    "0.05",
)
TOTAL_STEPS = 3 * 96 // 8


def rank0_losses(events: list[dict[str, Any]]) -> dict[int, float]:
    """Step -> loss as logged by rank 0; fails when a step was trained twice."""
    losses: dict[int, float] = {}
    for e in events:
        if e["event"] == "step" and e["rank"] == 0:
            assert e["step"] not in losses, f"step {e['step']} trained twice"
            losses[e["step"]] = e["loss"]
    return losses


def test_sigterm_to_one_worker_saves_all_at_one_step_and_resumes_exactly(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = Cluster(tmp_path_factory.mktemp("reference"))
    try:
        ref_agent = reference.start_agent(*ARGS, nproc=2, max_restarts=0)
        agent = cluster.start_agent(*ARGS, nproc=2, max_restarts=1)
        wait_for(
            lambda: sum(e["event"] == "step" and e["rank"] == 0 for e in cluster.events()) >= 6,
            timeout_s=60,
            what="6 steps before SIGTERM",
        )
        rank1 = next(e for e in cluster.events() if e["event"] == "start" and e["rank"] == 1)
        os.kill(rank1["pid"], signal.SIGTERM)
        assert cluster.wait_agent(agent, timeout_s=90) == 0, cluster.agent_logs()
        assert reference.wait_agent(ref_agent, timeout_s=90) == 0, reference.agent_logs()
    finally:
        reference.kill_all()

    events = cluster.events()
    exits = [e for e in events if e["event"] == "exit"]
    assert sorted(e["rank"] for e in exits) == [0, 1]
    assert {e["code"] for e in exits} == {143}
    saved_step = exits[0]["step"]
    assert {e["step"] for e in exits} == {saved_step}
    assert 6 <= saved_step < TOTAL_STEPS
    resumed = [e for e in events if e["event"] == "start" and e["resumed"]]
    assert sorted(e["rank"] for e in resumed) == [0, 1]
    assert {(e["step"], e["lost_steps"], e["world"], e["ckpt_world"]) for e in resumed} == {
        (saved_step, 0, 2, 2)
    }
    losses = rank0_losses(events)
    expected = rank0_losses(reference.events())
    assert sorted(losses) == list(range(1, TOTAL_STEPS + 1))
    assert losses == pytest.approx(expected, rel=1e-6, abs=1e-9)
