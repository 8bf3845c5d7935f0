"""A torchrun target for the tests: a tiny deterministic model that logs what it does.

Every worker appends JSON lines to ``<log-dir>/events-<pid>.jsonl``: a ``start`` event, one
``step`` event per optimizer step (the sample indices it trained on; rank 0 adds the global mean
loss, a digest of the parameters after the update and whether a checkpoint write was in flight
when the step ended) and an ``exit`` event on SIGTERM. Every event carries ``time_s`` (Unix).
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from worker_runtime import ElasticRun


class IndexedData(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """Synthetic regression samples that also return their own index."""

    def __init__(self, size: int) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, 8, generator=gen)
        self.y = self.x @ torch.randn(8, 1, generator=gen) + 0.1 * torch.randn(
            size, 1, generator=gen
        )

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def param_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--dataset-size", type=int, default=96)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--every-steps", type=int, default=4)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--pad-mb", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.1)
    # While this file exists, every step ends with a wait (cut short by SIGTERM), so that a test
    # can start an agent and have it join before the job runs out of steps, however slowly it
    # starts.
    parser.add_argument("--pause-file", default=None)
    args = parser.parse_args()
    # The test harness kills every pid listed here at teardown; SIGUSR1 dumps the stacks.
    (Path(args.log_dir) / f"pid-{os.getpid()}").touch()
    faulthandler.register(signal.SIGUSR1)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
    extras: dict[str, Any] = {"pad": torch.zeros(args.pad_mb * (1 << 18))}
    data = IndexedData(args.dataset_size)
    log = Path(args.log_dir) / f"events-{os.getpid()}.jsonl"

    def emit(event: dict[str, Any]) -> None:
        with open(log, "a") as f:
            f.write(json.dumps(event | {"time_s": time.time()}) + "\n")

    run = ElasticRun(
        checkpoint_dir=args.ckpt_dir,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        micro_batch_size=args.micro_batch,
        global_batch_size=args.global_batch,
        checkpoint_every_steps=args.every_steps,
        keep_checkpoints=2,
        extras=extras,
        seed=7,
    )
    try:
        with run:
            info = run.resume_info
            assert info is not None
            emit(
                {
                    "event": "start",
                    "pid": os.getpid(),
                    "rank": run.rank,
                    "world": run.world_size,
                    "resumed": info.resumed,
                    "step": run.step,
                    "ckpt_world": info.checkpoint_world_size,
                    "lost_steps": info.lost_steps,
                    "lost_samples": info.lost_samples,
                    "accum": run.accumulation_steps,
                    "digest": param_digest(model),
                    "restart_count": run.env.restart_count,
                }
            )
            ddp = DistributedDataParallel(model) if dist.is_initialized() else model
            loader = DataLoader(data, batch_size=args.micro_batch, sampler=run.make_sampler(data))
            for epoch in run.epochs(args.epochs):
                for batches in run.steps(loader):
                    indices: list[int] = []
                    total = torch.zeros(1)
                    for i, (idx, x, y) in enumerate(batches):
                        with run.sync_gradients(ddp, last=i == len(batches) - 1):
                            loss = nn.functional.mse_loss(ddp(x), y) * run.loss_scale
                            loss.backward()
                        total += loss.detach()
                        indices += idx.tolist()
                    optimizer.step()
                    optimizer.zero_grad()
                    scheduler.step()
                    if dist.is_initialized():
                        dist.all_reduce(total)
                        total /= run.world_size
                    event = {
                        "event": "step",
                        "step": run.step + 1,
                        "epoch": epoch,
                        "rank": run.rank,
                        "world": run.world_size,
                        "indices": indices,
                        "pid": os.getpid(),
                    }
                    if run.rank == 0:
                        event |= {
                            "loss": total.item(),
                            "digest": param_digest(model),
                            "writing": run.checkpoint_write_in_flight,
                        }
                    emit(event)
                    time.sleep(args.step_sleep_s)
                    while (
                        args.pause_file
                        and Path(args.pause_file).exists()
                        and not run.stop_requested
                    ):
                        time.sleep(0.05)
    except SystemExit as e:
        emit(
            {
                "event": "exit",
                "code": e.code,
                "step": run.step,
                "rank": run.rank,
                "pid": os.getpid(),
            }
        )
        raise
    emit({"event": "done", "step": run.step, "rank": run.rank, "pid": os.getpid()})


if __name__ == "__main__":
    main()
