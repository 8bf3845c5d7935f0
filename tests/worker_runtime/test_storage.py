"""Checkpoint store: atomic commit, retention, checksum, fallback past corrupt checkpoints."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from worker_runtime import AsyncCheckpointer, CheckpointStore, CorruptCheckpointError


def make_state(step: int) -> dict[str, object]:
    return {"step": step, "w": torch.full((256,), float(step)), "nested": {"k": [step, "x"]}}


def write_steps(store: CheckpointStore, steps: list[int]) -> None:
    for step in steps:
        store.write(make_state(step), step=step, epoch=0, world_size=2)


def test_commit_writes_payload_manifest_and_tracker(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    manifest = store.write(make_state(7), step=7, epoch=1, world_size=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "latest.json",
        "step-0000000007.json",
        "step-0000000007.pt",
    ]
    assert json.loads((tmp_path / "latest.json").read_text()) == {"step": 7}
    assert manifest.payload_bytes == (tmp_path / "step-0000000007.pt").stat().st_size
    loaded = store.load_latest()
    assert loaded is not None
    assert loaded[0] == manifest
    assert torch.equal(loaded[1]["w"], torch.full((256,), 7.0))
    assert loaded[1]["nested"] == {"k": [7, "x"]}


@pytest.mark.parametrize(("keep", "kept"), [(1, [9]), (2, [9, 6]), (5, [9, 6, 3])], ids=str)
def test_retention_keeps_the_newest(tmp_path: Path, keep: int, kept: list[int]) -> None:
    store = CheckpointStore(tmp_path, keep=keep)
    write_steps(store, [3, 6, 9])
    assert [m.step for m in store.manifests()] == kept
    assert len(list(tmp_path.glob("*.pt"))) == len(kept)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def delete(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize(
    ("damage", "message"),
    [(truncate, "bytes, manifest says"), (flip_bit, "sha256"), (delete, "cannot read payload")],
    ids=["truncated", "bit-flipped", "missing-payload"],
)
def test_corrupt_latest_falls_back_to_previous_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, message: str
) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    write_steps(store, [4, 8])
    damage(tmp_path / "step-0000000008.pt")  # type: ignore[operator]
    with caplog.at_level(logging.WARNING, logger="worker_runtime.storage"):
        loaded = store.load_latest()
    assert loaded is not None
    assert loaded[0].step == 4
    assert torch.equal(loaded[1]["w"], torch.full((256,), 4.0))
    assert any("step=8" in r.getMessage() and message in r.getMessage() for r in caplog.records)


def test_read_refuses_a_corrupt_payload(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    manifest = store.write(make_state(1), step=1, epoch=0, world_size=1)
    flip_bit(tmp_path / manifest.payload_name)
    with pytest.raises(CorruptCheckpointError, match=r"step-0000000001\.pt: sha256"):
        store.read(manifest)


def test_partial_write_without_manifest_is_invisible(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_steps(store, [2])
    (tmp_path / "step-0000000005.pt.tmp").write_bytes(b"half a payload")
    (tmp_path / "step-0000000005.pt").write_bytes(b"renamed but no manifest yet")
    loaded = store.load_latest()
    assert loaded is not None and loaded[0].step == 2
    store.remove_temporaries()
    assert not list(tmp_path.glob("*.tmp"))


def test_all_corrupt_means_fresh_start(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_steps(store, [1, 2])
    for payload in tmp_path.glob("*.pt"):
        truncate(payload)
    assert store.load_latest() is None


def test_async_save_snapshots_before_returning(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    checkpointer = AsyncCheckpointer(store)
    weights = torch.zeros(1000)
    result = checkpointer.save({"w": weights}, step=1, epoch=0, world_size=1, blocking=False)
    weights += 5.0  # training continues while the write runs
    checkpointer.wait()
    loaded = store.load_latest()
    assert loaded is not None
    assert torch.equal(loaded[1]["w"], torch.zeros(1000))
    assert result.blocked_s >= 0 and result.write_s is None
