"""An elastic training script for torchrun: a small model on synthetic data.

On a GPU it trains with NCCL on ``cuda:<LOCAL_RANK>``, elsewhere with gloo on the CPU
(``--backend auto``, ``ElasticRun``'s default). Run it on one machine as README.md's "Run it on
one machine" shows: two torchrun agents with ``--max-restarts=100`` (a rescale restarts the
workers of the agent that stays, which torchrun counts as a restart: without it the survivor
exits with ``ChildFailedError``), c10d rendezvous on 127.0.0.1, ``--backend=gloo``, and
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (see the comment on it in
``elastic-pytorch-job.yaml``). The lines marked ``# tide`` are all it takes on top of a plain DDP
script.

Adaptive batch: run from ``adaptive-pytorch-job.yaml`` (whose env passes ``TIDE_ADAPTIVE_BATCH``
and the bounds), the run chooses the batch within the bounds and sets the learning rate itself:
the cosine schedule is then a function of progress (steps at the initial batch) instead of a
scheduler, and ``--global-batch`` and ``--micro-batch`` are ignored.
"""

from __future__ import annotations

import argparse
import logging
import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from worker_runtime import AdaptiveBatchSettings, ElasticRun  # tide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt-dir", required=True, help="checkpoint directory (a PVC)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=96, help="samples per step")
    parser.add_argument("--micro-batch", type=int, default=8, help="samples per worker pass")
    parser.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="auto: NCCL on the worker's own GPU when it has one, else gloo on the CPU",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    torch.manual_seed(0)
    inputs = torch.randn(4096, 32)
    data = TensorDataset(inputs, inputs @ torch.randn(32, 1))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # tide: a Job annotated tide.io/adaptive-batch: "true" passes TIDE_ADAPTIVE_BATCH to its pods
    adaptive = AdaptiveBatchSettings.from_environ(os.environ) is not None  # tide
    scheduler = (
        None if adaptive else torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
    )

    run = ElasticRun(  # tide
        checkpoint_dir=args.ckpt_dir,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        micro_batch_size=args.micro_batch,
        global_batch_size=args.global_batch,
        checkpoint_every_steps=50,
        checkpoint_every_s=300,
        backend=args.backend,
        # tide: adaptive batch only: the same cosine, keyed on progress
        lr_schedule=lambda progress: 0.5 * (1 + math.cos(math.pi * progress / 1000)),
    )
    model.to(run.device)  # tide: cuda:<LOCAL_RANK> on a GPU, else cpu; before the load below
    with run:  # tide: joins the group, loads the latest checkpoint, handles SIGTERM
        ddp = DistributedDataParallel(model) if dist.is_initialized() else model
        # tide: its micro batches follow the run's, which the adaptive batch may change
        loader = DataLoader(data, batch_sampler=run.make_batch_sampler(data))
        for epoch in run.epochs(args.epochs):  # tide
            for batches in run.steps(loader):  # tide: one optimizer step
                for i, (x, y) in enumerate(batches):
                    x, y = x.to(run.device), y.to(run.device)  # tide
                    with run.sync_gradients(ddp, last=i == len(batches) - 1):  # tide
                        # tide: loss_scale weights every micro batch alike when ranks take
                        # different numbers of them (a world size that does not divide 12)
                        loss = nn.functional.mse_loss(ddp(x), y) * run.loss_scale
                        loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if scheduler is not None:
                    scheduler.step()
            if run.rank == 0:
                logging.info(
                    "epoch %s done at step %s, loss %.4f, micro batch %s",
                    epoch,
                    run.step,
                    loss.item(),
                    run.plan.micro_batch_size,  # the adaptive batch's choice, if it opted in
                )


if __name__ == "__main__":
    main()
