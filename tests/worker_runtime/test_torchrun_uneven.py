"""World size 3 with 8 micro batches a step: uneven accumulation, exact batch and gradient."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.worker_runtime.conftest import Cluster

pytestmark = pytest.mark.torchrun

DATASET, GLOBAL_BATCH, MICRO, EPOCHS = 288, 96, 12, 2
ARGS = (
    "--epochs",
    str(EPOCHS),
    "--dataset-size",
    str(DATASET),
    "--global-batch",
    str(GLOBAL_BATCH),
    "--micro-batch",
    str(MICRO),
    "--every-steps",
    "100",
    "--dropout",
    "0",  # no per-rank randomness: the world-1 run is then the exact reference
)
TOTAL_STEPS = EPOCHS * DATASET // GLOBAL_BATCH


def rank0_losses(events: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if e["event"] == "step" and e["rank"] == 0}


def test_world_size_3_takes_3_3_2_micro_batches_and_trains_as_one_worker_would(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = Cluster(tmp_path_factory.mktemp("reference"))
    try:
        ref_agent = reference.start_agent(*ARGS, nproc=1, max_restarts=0)
        agent = cluster.start_agent(*ARGS, nproc=3, max_restarts=0)
        assert cluster.wait_agent(agent, timeout_s=120) == 0, cluster.agent_logs()
        assert reference.wait_agent(ref_agent, timeout_s=120) == 0, reference.agent_logs()
    finally:
        reference.kill_all()

    events = cluster.events()
    starts = sorted((e["rank"], e["world"], e["accum"]) for e in events if e["event"] == "start")
    assert starts == [(0, 3, 3), (1, 3, 3), (2, 3, 2)]
    per_step: dict[int, list[int]] = defaultdict(list)
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e["event"] == "step":
            assert len(e["indices"]) == MICRO * (3 if e["rank"] < 2 else 2)
            per_step[e["step"]] += e["indices"]
            per_epoch[e["epoch"]] += e["indices"]
    assert sorted(per_step) == list(range(1, TOTAL_STEPS + 1))
    assert {len(set(v)) for v in per_step.values()} == {GLOBAL_BATCH}
    for epoch in range(EPOCHS):
        assert sorted(per_epoch[epoch]) == list(range(DATASET)), f"epoch {epoch}"
    # The same samples per step and an exactly averaged gradient: the same losses as one worker
    # taking all 8 micro batches (up to the order of floating-point sums).
    losses, expected = rank0_losses(events), rank0_losses(reference.events())
    assert sorted(losses) == sorted(expected) == list(range(1, TOTAL_STEPS + 1))
    assert losses == pytest.approx(expected, rel=1e-4)
