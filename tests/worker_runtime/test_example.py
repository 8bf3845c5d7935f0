"""The example training script runs under torchrun and resumes from its own checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.worker_runtime.conftest import REPO, free_port

pytestmark = pytest.mark.torchrun

EXAMPLE = REPO / "manifests" / "examples" / "train_elastic.py"


def run_example(ckpt: Path, epochs: int) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:3",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-conf=last_call_timeout=1",
        str(EXAMPLE),
        "--ckpt-dir",
        str(ckpt),
        "--epochs",
        str(epochs),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=120, start_new_session=True
    )


def test_example_trains_and_a_second_launch_continues_where_it_stopped(tmp_path: Path) -> None:
    first = run_example(tmp_path, epochs=1)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "epoch 0 done at step 42" in first.stderr
    second = run_example(tmp_path, epochs=2)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed step=42 epoch=1" in second.stderr
    assert "epoch 1 done at step 84" in second.stderr
