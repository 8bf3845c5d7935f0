"""A torchrun target for the adaptive-batch test: linear regression that logs its statistics.

The job opts in through the environment (``TIDE_ADAPTIVE_BATCH`` and its bounds, set by the test).
Every worker appends JSON lines to ``<log-dir>/events-<pid>.jsonl``: ``start``, one ``step`` per
optimizer step (the sample indices, the batch; rank 0 adds the learning rate and the run's
statistics before the update, and the brute-force statistics from every sample's own gradient at
the same parameters), ``exit`` on SIGTERM and ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from worker_runtime import ElasticRun


class Regression(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """Linear targets far from the initial model, so the true gradient is large."""

    def __init__(self, size: int) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, 8, generator=gen)
        self.y = 3.0 * self.x @ torch.randn(8, 1, generator=gen) + 0.5 * torch.randn(
            size, 1, generator=gen
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def brute_force(model: nn.Linear, data: Regression, initial_batch: int) -> tuple[float, float]:
    """``|G|^2`` and ``V / B0`` from every sample's gradient of ``(w x + b - y)^2``."""
    with torch.no_grad():
        residual = model(data.x) - data.y  # (N, 1)
        per_sample = torch.cat([2 * residual * data.x, 2 * residual], dim=1).double()
        mean = per_sample.mean(dim=0)
        variance = (per_sample - mean).pow(2).sum(dim=1).mean()
    return float(mean.pow(2).sum()), float(variance) / initial_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dataset-size", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    args = parser.parse_args()
    (Path(args.log_dir) / f"pid-{os.getpid()}").touch()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = Regression(args.dataset_size)
    log = Path(args.log_dir) / f"events-{os.getpid()}.jsonl"

    def emit(event: dict[str, Any]) -> None:
        with open(log, "a") as f:
            f.write(json.dumps(event | {"time_s": time.time()}) + "\n")

    run = ElasticRun(
        checkpoint_dir=args.ckpt_dir,
        model=model,
        optimizer=optimizer,
        micro_batch_size=1,  # ignored: the adaptive batch chooses
        checkpoint_every_steps=50,
        keep_checkpoints=2,
        seed=7,
        rechoose_every_steps=10,
    )
    try:
        with run:
            adaptive = run.adaptive
            assert adaptive is not None, "the test sets TIDE_ADAPTIVE_BATCH=true"
            initial = adaptive.settings.initial_batch_size
            start = {"event": "start", "pid": os.getpid(), "rank": run.rank, "step": run.step}
            emit(start | {"world": run.world_size, "base_lr": adaptive.base_lrs[0]})
            ddp = DistributedDataParallel(model) if dist.is_initialized() else model
            loader = DataLoader(data, batch_sampler=run.make_batch_sampler(data))
            for epoch in run.epochs(args.epochs):
                for batches in run.steps(loader):
                    indices: list[int] = []
                    for i, (idx, x, y) in enumerate(batches):
                        with run.sync_gradients(ddp, last=i == len(batches) - 1):
                            loss = nn.functional.mse_loss(ddp(x), y) * run.loss_scale
                            loss.backward()
                        indices += idx.tolist()
                    event = {
                        "event": "step",
                        "step": run.step + 1,
                        "epoch": epoch,
                        "rank": run.rank,
                        "world": run.world_size,
                        "indices": indices,
                        "batch": run.plan.global_batch_size,
                        "local": run.plan.micro_batch_size,
                        "accum": run.plan.accumulation_steps,
                        "pid": os.getpid(),
                    }
                    if run.rank == 0:
                        sqr, var = brute_force(model, data, initial)
                        event |= {
                            "lr": optimizer.param_groups[0]["lr"],
                            "scale": adaptive.scale,
                            "grad_sqr": adaptive.stats.grad_sqr,
                            "grad_var": adaptive.stats.grad_var,
                            "differenced": adaptive.stats.differenced,
                            "progress": adaptive.progress,
                            "sync_s": adaptive.sync_timer.sync_s,
                            "brute_sqr": sqr,
                            "brute_var": var,
                        }
                    optimizer.step()
                    optimizer.zero_grad()
                    emit(event)
                    time.sleep(args.step_sleep_s)
    except SystemExit as e:
        emit({"event": "exit", "code": e.code, "step": run.step, "rank": run.rank})
        raise
    emit({"event": "done", "step": run.step, "rank": run.rank, "progress": run.progress})


if __name__ == "__main__":
    main()
