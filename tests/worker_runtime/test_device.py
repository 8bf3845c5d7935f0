"""Backend and device: NCCL on the worker's own GPU when it has one, gloo on the CPU otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker_runtime import ConfigError, ElasticRun
from worker_runtime.device import Placement, choose_placement, resolve_placement

CPU = Placement(backend="gloo", device=torch.device("cpu"))


@pytest.mark.parametrize(
    ("requested", "local_rank", "cuda_available", "cuda_devices", "expected"),
    [
        ("auto", 0, True, 1, Placement(backend="nccl", device=torch.device("cuda", 0))),
        ("auto", 3, True, 4, Placement(backend="nccl", device=torch.device("cuda", 3))),
        ("auto", 0, False, 0, CPU),
        ("auto", 1, True, 1, CPU),
        ("nccl", 1, True, 2, Placement(backend="nccl", device=torch.device("cuda", 1))),
        ("gloo", 0, True, 8, CPU),
        ("gloo", 0, False, 0, CPU),
    ],
    ids=[
        "auto-gpu",
        "auto-fourth-gpu",
        "auto-no-cuda",
        "auto-more-workers-than-gpus",
        "nccl-gpu",
        "gloo-forced-on-a-gpu",
        "gloo-cpu",
    ],
)
def test_choice(
    requested: str, local_rank: int, cuda_available: bool, cuda_devices: int, expected: Placement
) -> None:
    got = choose_placement(
        requested=requested,
        local_rank=local_rank,
        cuda_available=cuda_available,
        cuda_devices=cuda_devices,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("requested", "local_rank", "cuda_available", "cuda_devices", "message"),
    [
        ("nccl", 0, False, 0, "backend='nccl': needs a CUDA device for LOCAL_RANK=0, found no"),
        ("nccl", 2, True, 2, "backend='nccl': needs a CUDA device for LOCAL_RANK=2, found 2"),
        ("mpi", 0, False, 0, "backend: must be one of auto, nccl, gloo, got 'mpi'"),
    ],
    ids=["nccl-without-cuda", "nccl-beyond-the-gpus", "unknown-backend"],
)
def test_impossible_choices_are_named(
    requested: str, local_rank: int, cuda_available: bool, cuda_devices: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        choose_placement(
            requested=requested,
            local_rank=local_rank,
            cuda_available=cuda_available,
            cuda_devices=cuda_devices,
        )


def fake_cuda(monkeypatch: pytest.MonkeyPatch, devices: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)


@pytest.mark.parametrize(
    ("devices", "local_rank", "expected"),
    [
        (2, 1, Placement(backend="nccl", device=torch.device("cuda", 1))),
        (0, 1, CPU),
        (1, 1, CPU),
    ],
    ids=["gpu-per-worker", "no-gpu", "too-few-gpus"],
)
def test_auto_asks_torch(
    monkeypatch: pytest.MonkeyPatch, devices: int, local_rank: int, expected: Placement
) -> None:
    fake_cuda(monkeypatch, devices)
    assert resolve_placement("auto", local_rank=local_rank) == expected


@pytest.mark.parametrize(
    ("devices", "backend", "device"),
    [(2, "nccl", "cuda:1"), (0, "gloo", "cpu")],
    ids=["gpu", "cpu"],
)
def test_the_run_defaults_to_auto_and_reports_its_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, devices: int, backend: str, device: str
) -> None:
    fake_cuda(monkeypatch, devices)
    model = torch.nn.Linear(2, 1)
    run = ElasticRun(
        checkpoint_dir=tmp_path,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=2,
        global_batch_size=4,
        environ={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
    )
    assert (run.placement.backend, str(run.device)) == (backend, device)
