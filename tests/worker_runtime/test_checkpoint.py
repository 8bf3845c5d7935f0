"""Background checkpointing: buffers prepared before the first save, one write in flight."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.worker_runtime.test_run_local import ENV, train
from worker_runtime import AsyncCheckpointer, CheckpointManifest, CheckpointStore, ElasticRun
from worker_runtime import snapshot as snapshot_module
from worker_runtime.snapshot import SnapshotBuffers


def make_state(*, numel: int = 4096, extra: bool = False) -> dict[str, Any]:
    state: dict[str, Any] = {"model": {"w": torch.randn(numel), "b": torch.zeros(7)}, "step": 3}
    if extra:
        state["optimizer"] = [torch.ones(numel, dtype=torch.float64)]
    return state


def tensor_bytes(state: Any) -> int:
    return sum(spec.size_bytes for spec in SnapshotBuffers.specs(state))


class CountingEmpty:
    """Stands in for ``torch.empty``; records what a snapshot (not a preparation) allocates."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self._empty = torch.empty

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if sys._getframe(1).f_code.co_name == "_copy_tensor":
            self.shapes.append(tuple(args[0]))
        return self._empty(*args, **kwargs)


def test_allocated_buffers_leave_no_allocation_to_the_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = make_state(extra=True)
    buffers = SnapshotBuffers()
    assert buffers.allocate(SnapshotBuffers.specs(state)) == tensor_bytes(state)
    assert buffers.allocate(SnapshotBuffers.specs(state)) == 0
    counting = CountingEmpty()
    monkeypatch.setattr(snapshot_module.torch, "empty", counting)
    copy = buffers.snapshot(state)
    assert counting.shapes == []
    assert torch.equal(copy["model"]["w"], state["model"]["w"])
    assert copy["model"]["w"].data_ptr() != state["model"]["w"].data_ptr()


@pytest.mark.parametrize(
    ("first", "second", "queued_second"),
    [
        (make_state(), make_state(), 0),
        (make_state(), make_state(extra=True), 4096 * 8),
        (make_state(numel=100), make_state(numel=200), 200 * 4),
    ],
    ids=["same-state-queues-nothing", "grown-state-queues-the-new-part", "reshaped-tensor"],
)
def test_prepare_queues_only_buffers_not_requested_before(
    tmp_path: Path, first: dict[str, Any], second: dict[str, Any], queued_second: int
) -> None:
    checkpointer = AsyncCheckpointer(CheckpointStore(tmp_path))
    assert checkpointer.prepare(first) == tensor_bytes(first)
    assert checkpointer.prepare(second) == queued_second
    checkpointer.wait()
    assert checkpointer.buffer_bytes == tensor_bytes(second)
    allocated = sum(p.allocated_bytes for p in checkpointer.prepares)
    assert allocated == tensor_bytes(first) + queued_second
    result = checkpointer.save(second, step=1, epoch=0, world_size=1, blocking=True)
    assert result.write_s is not None
    loaded = checkpointer.store.load_latest()
    assert loaded is not None
    assert torch.equal(loaded[1]["model"]["w"], second["model"]["w"])


class GatedStore(CheckpointStore):
    """A store whose writes wait for a gate and that records how many overlap."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.gate = threading.Event()
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def write(
        self, state: Mapping[str, Any], *, step: int, epoch: int, world_size: int
    ) -> CheckpointManifest:
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            assert self.gate.wait(timeout=30)
            return super().write(state, step=step, epoch=epoch, world_size=world_size)
        finally:
            with self._lock:
                self.running -= 1


def test_a_save_due_during_a_write_waits_for_it(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    checkpointer = AsyncCheckpointer(store)
    state = make_state()
    first = checkpointer.save(state, step=1, epoch=0, world_size=1, blocking=False)
    assert first.write_s is None
    assert checkpointer.writing_step == 1
    threading.Timer(0.3, store.gate.set).start()
    second = checkpointer.save(state, step=2, epoch=0, world_size=1, blocking=False)
    assert second.waited_s >= 0.2
    assert second.blocked_s >= second.waited_s + second.snapshot_s - 1e-6
    checkpointer.wait()
    assert checkpointer.writing_step is None
    assert store.most_running == 1
    assert [m.step for m in store.manifests()] == [2, 1]


def test_elastic_run_prepares_model_and_optimizer_state_before_the_first_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    extras = {"pad": torch.zeros(50_000)}
    run = ElasticRun(
        checkpoint_dir=tmp_path,
        model=model,
        optimizer=optimizer,
        micro_batch_size=2,
        global_batch_size=4,
        checkpoint_every_steps=3,
        extras=extras,
        environ=ENV,
    )
    counting = CountingEmpty()
    with run:
        run.checkpointer.wait()
        prepared_at_enter = run.checkpointer.buffer_bytes
        assert prepared_at_enter >= 50_000 * 4  # the model and extras, before any step
        monkeypatch.setattr(snapshot_module.torch, "empty", counting)
        train(run, [])  # 5 steps; Adam creates its state at step 1, saves at steps 3 and 5
    assert run.checkpointer.buffer_bytes > prepared_at_enter + 2 * 5 * 4  # exp_avg, exp_avg_sq
    # The saves allocated nothing: model, optimizer, extras and rng buffers were all prepared.
    assert counting.shapes == []
    assert run.last_save is not None and run.last_save.step == 5
