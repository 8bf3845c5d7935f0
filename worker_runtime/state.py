"""The state a checkpoint holds, how it is assembled, and how a start restores it.

Model, optimizer and scheduler states are replicated under DDP, so rank 0's copy is saved once and
every rank loads it, whatever the world size. Generator states are per rank: all are saved; on a
start with more ranks than the checkpoint has, the extra ranks seed their generators from
``(seed, step, rank)``. The learning rate saved is the one in effect; when the batch plan's
learning-rate factor differs from the saved one, the optimizer's, and the scheduler's base,
learning rates are multiplied by the ratio.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from worker_runtime import collectives
from worker_runtime.batching import BatchPlan
from worker_runtime.resume import Position, ResumeInfo, read_progress, write_progress
from worker_runtime.snapshot import restore_rng_state, seed_rng
from worker_runtime.storage import CheckpointManifest, CheckpointStore

logger = logging.getLogger(__name__)

STATE_FORMAT = 1


class TrainingState:
    """The objects a checkpoint captures, plus the job's restart accounting.

    Args:
        model: Module (a DDP wrapper is unwrapped).
        optimizer: Optimizer.
        scheduler: Learning-rate scheduler, if any.
        extras: User dict saved and restored in place.
        seed: Seed for generators of ranks the checkpoint lacks.
    """

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        extras: dict[str, Any] | None,
        seed: int,
    ) -> None:
        self.model = model.module if isinstance(model, DistributedDataParallel) else model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extras: dict[str, Any] = {} if extras is None else extras
        self.seed = seed
        self.restarts = 0
        self.rescales = 0
        self.samples_lost = 0

    def to_tree(
        self,
        *,
        position: Position,
        world_size: int,
        plan: BatchPlan,
        rng_states: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """The state to save (live references; the checkpointer snapshots it).

        Args:
            position: Current position.
            world_size: Current world size.
            plan: Current batch plan.
            rng_states: Generator states indexed by rank.

        Returns:
            The state tree.
        """
        return {
            "format": STATE_FORMAT,
            "step": position.step,
            "epoch": position.epoch,
            "consumed_samples": position.consumed_samples,
            "samples_total": position.samples_total,
            "world_size": world_size,
            "global_batch_size": plan.global_batch_size,
            "lr_scale": plan.lr_scale,
            "restarts": self.restarts,
            "rescales": self.rescales,
            "samples_lost": self.samples_lost,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "extras": dict(self.extras),
            "rng": rng_states,
        }

    def load(
        self, store: CheckpointStore, *, rank: int, world_size: int, plan: BatchPlan
    ) -> tuple[Position, ResumeInfo]:
        """Restore the newest valid checkpoint (rank 0 chooses it for everyone).

        Args:
            store: Checkpoint store.
            rank: This worker's rank.
            world_size: Current world size.
            plan: Current batch plan.

        Returns:
            The position to continue from and what the start found.

        Raises:
            CorruptCheckpointError: When a rank other than 0 cannot read the checkpoint rank 0
                verified.
        """
        started_s = time.perf_counter()
        manifest: CheckpointManifest | None = None
        tree: dict[str, Any] | None = None
        progress: tuple[int, int] | None = None
        if rank == 0:
            store.remove_temporaries()
            found = store.load_latest()
            if found is not None:
                manifest, tree = found
            progress = read_progress(store.directory)
        manifest, progress = collectives.broadcast_from_rank0((manifest, progress))
        if manifest is not None and tree is None:
            tree = store.read(manifest)
        if tree is None:
            self._scale_lr(plan.lr_scale)
            info = ResumeInfo(
                resumed=False,
                step=0,
                checkpoint_world_size=None,
                world_size=world_size,
                lost_steps=0,
                lost_samples=0,
                load_s=time.perf_counter() - started_s,
            )
            logger.info("fresh start world_size=%s plan=%s", world_size, plan)
            return Position(), info
        position = Position(
            step=int(tree["step"]),
            epoch=int(tree["epoch"]),
            consumed_samples=int(tree["consumed_samples"]),
            samples_total=int(tree["samples_total"]),
        )
        self._restore(tree, rank=rank, step=position.step)
        lost_steps = lost_samples = 0
        if progress is not None and progress[0] > position.step:
            lost_steps = progress[0] - position.step
            lost_samples = max(0, progress[1] - position.samples_total)
        saved_world_size = int(tree["world_size"])
        self.restarts = int(tree["restarts"]) + 1
        self.rescales = int(tree["rescales"]) + int(saved_world_size != world_size)
        self.samples_lost = int(tree["samples_lost"]) + lost_samples
        self._scale_lr(plan.lr_scale / float(tree["lr_scale"]))
        if rank == 0:
            write_progress(store.directory, position)
        info = ResumeInfo(
            resumed=True,
            step=position.step,
            checkpoint_world_size=saved_world_size,
            world_size=world_size,
            lost_steps=lost_steps,
            lost_samples=lost_samples,
            load_s=time.perf_counter() - started_s,
        )
        logger.info(
            "resumed step=%s epoch=%s consumed_samples=%s checkpoint_world_size=%s world_size=%s "
            "rescaled=%s lost_steps=%s lost_samples=%s accumulation_steps=%s lr_scale=%s",
            position.step,
            position.epoch,
            position.consumed_samples,
            saved_world_size,
            world_size,
            info.rescaled,
            lost_steps,
            lost_samples,
            plan.accumulation_steps,
            plan.lr_scale,
        )
        return position, info

    def _restore(self, tree: dict[str, Any], *, rank: int, step: int) -> None:
        self.model.load_state_dict(tree["model"])
        self.optimizer.load_state_dict(tree["optimizer"])
        if self.scheduler is not None and tree["scheduler"] is not None:
            self.scheduler.load_state_dict(tree["scheduler"])
        self.extras.clear()
        self.extras.update(tree["extras"])
        rng_states = tree["rng"]
        if rank < len(rng_states):
            restore_rng_state(rng_states[rank])
        else:
            # A rank the checkpoint did not have: a fresh, reproducible stream of its own.
            seed_rng(self.seed + 1_000_003 * step + rank)

    def _scale_lr(self, ratio: float) -> None:
        if ratio == 1.0:
            return
        for group in self.optimizer.param_groups:
            group["lr"] *= ratio
            if "initial_lr" in group:
                group["initial_lr"] *= ratio
        if self.scheduler is not None:
            self.scheduler.base_lrs = [lr * ratio for lr in self.scheduler.base_lrs]
        logger.info("scaled learning rates by %s", ratio)
