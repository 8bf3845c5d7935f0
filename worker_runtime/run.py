"""``ElasticRun``: training state, checkpoints, SIGTERM and data position in one object."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

from worker_runtime import collectives
from worker_runtime.adaptive import AdaptiveBatch, Clock, plan_of
from worker_runtime.batching import BatchPlan, ScalingMode, plan_batch
from worker_runtime.checkpoint import AsyncCheckpointer, SaveResult
from worker_runtime.device import Placement, resolve_placement
from worker_runtime.env import WorkerEnv
from worker_runtime.errors import ConfigError
from worker_runtime.goodput import BatchChoice
from worker_runtime.metrics import AdaptiveMetrics, WorkerMetrics
from worker_runtime.resume import Position, ResumeInfo, write_progress
from worker_runtime.sampler import ElasticBatchSampler, ElasticSampler
from worker_runtime.signals import StopRequest
from worker_runtime.snapshot import capture_rng_state
from worker_runtime.state import TrainingState
from worker_runtime.storage import CheckpointManifest, CheckpointStore

logger = logging.getLogger(__name__)

T = TypeVar("T")

EXIT_CODE_TERMINATED = 143
_NOTHING, _SAVE, _SAVE_AND_EXIT = 0, 1, 2


class ElasticRun:
    """Wraps a training loop so that restarts lose nothing.

    Use as a context manager: entering joins the process group (if the script has not), installs
    the SIGTERM handler, starts the metrics server, loads the latest valid checkpoint and starts
    allocating the host buffers of the first save in the background; the :meth:`epochs` and
    :meth:`steps` iterators do the bookkeeping at every step boundary.

    Device: with ``backend="auto"`` a worker whose local rank has a GPU uses NCCL and
    ``cuda:<local_rank>``, any other worker gloo and the CPU; move the model to :attr:`device`
    before entering (so the checkpoint loads onto it) and each micro batch before the forward.

    Batches: the global batch is exact at every world size. When the world size does not divide
    the micro batches of a step, ranks take different numbers of them (uneven accumulation: at
    world size 5, 96 samples in micro batches of 8 are 3, 3, 2, 2, 2 micro batches); multiply
    each micro batch's mean loss by :attr:`loss_scale` (not ``1 / len(batches)``) so that the
    gradient is the global batch's mean whatever the split (see :mod:`worker_runtime.batching`).

    What a restart loses: a SIGTERM (every torchrun membership change) loses no step when the
    blocking save fits the grace period. A SIGKILL or crash loses at most N + W steps, N the
    checkpoint interval and W the steps run while the newest write was in flight; W <= N since a
    save that comes due while the previous write runs waits for it (see
    :mod:`worker_runtime.checkpoint`).

    Adaptive batch (opt-in, ``TIDE_ADAPTIVE_BATCH=true`` from the Job annotation
    ``tide.io/adaptive-batch``; see :mod:`worker_runtime.adaptive`): the run chooses the global
    batch, the micro batch and the accumulation within the job's bounds, ignoring
    ``micro_batch_size``, ``global_batch_size``, ``scaling`` and ``accumulation_steps``; it sets
    the learning rate at every step (AdaScale on the optimizer's initial rates, times
    ``lr_schedule(progress)``), so a ``scheduler`` is refused. Build the loader with
    :meth:`make_batch_sampler` so that the micro batch can change, and watch the model through
    :meth:`sync_gradients`. A job that does not opt in runs exactly as without this feature.

    Args:
        checkpoint_dir: Checkpoint directory on a filesystem every worker sees (a PVC).
        model: Module whose ``state_dict`` is saved (a DDP wrapper is unwrapped).
        optimizer: Optimizer whose ``state_dict`` is saved.
        micro_batch_size: Samples per forward/backward pass on one worker.
        global_batch_size: Samples per optimizer step (mode ``FIXED_GLOBAL_BATCH``).
        scheduler: Learning-rate scheduler to save, if any.
        scaling: How batch and learning rate follow the world size.
        accumulation_steps: Micro batches per step in the learning-rate modes.
        base_world_size: World size the learning rate was tuned for (learning-rate modes).
        checkpoint_every_steps: Save every this many steps; ``None`` disables it.
        checkpoint_every_s: Save when this many seconds passed since the last save; ``None``
            disables it.
        keep_checkpoints: Checkpoints kept on storage.
        extras: A dict of the user's own state, saved and restored in place.
        seed: Seed of the data order and of the generators of ranks a checkpoint lacks.
        registry: Prometheus registry (a fresh one when ``None``).
        environ: Environment to read (``os.environ`` when ``None``).
        metrics_addr: Address the metrics server binds (when ``TIDE_METRICS_PORT`` is set).
        backend: Process-group backend used when the script has not initialized one:
            ``"auto"`` (NCCL when this worker's local rank has a CUDA device, else gloo),
            ``"nccl"`` or ``"gloo"``.
        lr_schedule: Adaptive batch only: factor on the initial learning rates as a function
            of progress in scale-invariant iterations (steps at the initial batch); constant 1
            when ``None``.
        rechoose_every_steps: Adaptive batch only: steps between two choices of the batch
            (it is also chosen at the start of every pass over the data).
        clock: What step times (and the adaptive batch's micro-batch and all-reduce times, from
            which it chooses the batch) are measured with; ``time.perf_counter`` by default.

    Raises:
        ConfigError: When a setting or environment variable is invalid, or ``backend="nccl"``
            without a CUDA device for this worker.
        BatchConfigError: When the global batch is not whole micro batches, or the world size
            exceeds the micro batches of a step.
    """

    def __init__(
        self,
        *,
        checkpoint_dir: str | Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        micro_batch_size: int,
        global_batch_size: int | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        scaling: ScalingMode = ScalingMode.FIXED_GLOBAL_BATCH,
        accumulation_steps: int = 1,
        base_world_size: int | None = None,
        checkpoint_every_steps: int | None = 100,
        checkpoint_every_s: float | None = None,
        keep_checkpoints: int = 3,
        extras: dict[str, Any] | None = None,
        seed: int = 0,
        registry: CollectorRegistry | None = None,
        environ: Mapping[str, str] | None = None,
        metrics_addr: str = "0.0.0.0",
        backend: str = "auto",
        lr_schedule: Callable[[float], float] | None = None,
        rechoose_every_steps: int = 50,
        clock: Clock = time.perf_counter,
    ) -> None:
        if checkpoint_every_steps is not None and checkpoint_every_steps < 1:
            raise ConfigError(f"checkpoint_every_steps: must be >= 1, got {checkpoint_every_steps}")
        if checkpoint_every_s is not None and checkpoint_every_s <= 0:
            raise ConfigError(f"checkpoint_every_s: must be > 0, got {checkpoint_every_s}")
        self.env = WorkerEnv.from_environ(environ)
        self.adaptive: AdaptiveBatch | None = None
        if self.env.adaptive is None:
            self.plan: BatchPlan = plan_batch(
                mode=scaling,
                world_size=self.env.world_size,
                micro_batch_size=micro_batch_size,
                global_batch_size=global_batch_size,
                accumulation_steps=accumulation_steps,
                base_world_size=base_world_size,
            )
        else:
            if scheduler is not None:
                raise ConfigError(
                    "scheduler: the adaptive batch (TIDE_ADAPTIVE_BATCH=true) sets the learning "
                    "rate at every step; pass lr_schedule (a function of progress) instead"
                )
            self.adaptive = AdaptiveBatch(
                settings=self.env.adaptive,
                optimizer=optimizer,
                world_size=self.env.world_size,
                nodes=max(1, self.env.world_size // self.env.local_world_size),
                rank=self.env.rank,
                lr_schedule=lr_schedule,
                rechoose_every_steps=rechoose_every_steps,
                clock=clock,
            )
            self.plan = plan_of(self.adaptive.choice, world_size=self.env.world_size)
        self.checkpoint_every_steps = checkpoint_every_steps
        self.checkpoint_every_s = checkpoint_every_s
        self.seed = seed
        self.directory = Path(checkpoint_dir)
        self.state = TrainingState(
            model=model, optimizer=optimizer, scheduler=scheduler, extras=extras, seed=seed
        )
        self.metrics = WorkerMetrics(
            registry=registry,
            job_name=self.env.job_name,
            namespace=self.env.namespace,
            pod=self.env.pod_name,
        )
        self.adaptive_metrics: AdaptiveMetrics | None = None
        if self.adaptive is not None:
            self.adaptive_metrics = AdaptiveMetrics(
                registry=self.metrics.registry,
                job_name=self.env.job_name,
                namespace=self.env.namespace,
                pod=self.env.pod_name,
            )
        self.store = CheckpointStore(self.directory, keep=keep_checkpoints)
        self.checkpointer = AsyncCheckpointer(self.store, on_commit=self._on_commit)
        self.placement: Placement = resolve_placement(backend, local_rank=self.env.local_rank)
        self._metrics_addr = metrics_addr
        self._clock = clock
        self._start_step = 0
        self._pod_samples_per_step = self._pod_samples()
        self._write_overlap_steps = 0
        self._stop = StopRequest()
        self._owns_group = False
        self._sampler: ElasticSampler | None = None
        self._planned_epochs: int | None = None
        self._last_save_s = time.monotonic()
        self.position = Position()
        self.resume_info: ResumeInfo | None = None
        self.last_save: SaveResult | None = None

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> ElasticRun:
        if self.placement.device.type == "cuda":
            torch.cuda.set_device(self.placement.device)
        if self.env.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(backend=self.placement.backend)
            self._owns_group = True
        self._stop.install()
        if self.env.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)  # for the progress marker
        if self.env.local_rank == 0 and self.env.metrics_port is not None:
            self.metrics.serve(self.env.metrics_port, addr=self._metrics_addr)
        self.position, self.resume_info = self.state.load(
            self.store, rank=self.env.rank, world_size=self.env.world_size, plan=self.plan
        )
        self._start_step = self.position.step
        if self.adaptive is not None:
            self.adaptive.load()
            self._export_adaptive()
        self._prepare_snapshot()
        self.metrics.world_size.set(self.env.world_size)
        self.metrics.nodes.set(self.env.group_world_size)
        self.metrics.steps.inc(self.position.step)
        self.metrics.checkpoint_load_seconds.set(self.resume_info.load_s)
        self.metrics.restarts.inc(self.state.restarts)
        self.metrics.rescales.inc(self.state.rescales)
        self.metrics.samples_lost.inc(self.state.samples_lost)
        self.metrics.consumed_samples.set(self.position.samples_total)
        self._last_save_s = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is None:
                self.checkpointer.wait()
            else:
                with contextlib.suppress(Exception):
                    self.checkpointer.wait()
        finally:
            # The group dies below or, held by DDP, when the script's locals go: either way not
            # before gloo's threads have released the last collectives (collectives.settle).
            # Settled while the SIGTERM handler is still in place: torchrun may signal again.
            collectives.settle()
            if self.adaptive is not None:
                self.adaptive.close()
            self._stop.uninstall()
            self.metrics.close()
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()

    # ---------------------------------------------------------------- properties

    @property
    def rank(self) -> int:
        """Global rank of this worker."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """Workers in the current membership."""
        return self.env.world_size

    @property
    def step(self) -> int:
        """Optimizer steps completed since the job began."""
        return self.position.step

    @property
    def epoch(self) -> int:
        """Current epoch."""
        return self.position.epoch

    @property
    def device(self) -> torch.device:
        """Where this worker's model and batches belong: ``cuda:<local_rank>`` or ``cpu``."""
        return self.placement.device

    @property
    def accumulation_steps(self) -> int:
        """Micro batches of this worker per optimizer step at the current world size."""
        return self.plan.accumulation_steps_of(self.env.rank)

    @property
    def loss_scale(self) -> float:
        """Factor for each micro batch's mean loss before ``backward`` (see the class docstring).

        ``world_size / micro_batches_per_step``; ``1 / accumulation_steps`` when the ranks'
        shares are even.
        """
        return self.plan.loss_scale

    @property
    def progress(self) -> float | None:
        """Scale-invariant iterations done (adaptive batch); ``None`` without the opt-in."""
        return None if self.adaptive is None else self.adaptive.progress

    @property
    def checkpoint_write_in_flight(self) -> bool:
        """Whether a background checkpoint write is running (always ``False`` off rank 0)."""
        return self.checkpointer.writing_step is not None

    @property
    def stop_requested(self) -> bool:
        """Whether this worker received SIGTERM (acted on at the next step boundary)."""
        return self._stop.requested

    # ---------------------------------------------------------------- data

    def make_sampler(self, dataset: Any, *, shuffle: bool = True) -> ElasticSampler:
        """The sampler to give the ``DataLoader`` (with ``batch_size=micro_batch_size``).

        Args:
            dataset: The dataset (only its length is used).
            shuffle: Permute the order each epoch.

        Returns:
            A sampler positioned by the run before every epoch.
        """
        self._sampler = ElasticSampler(
            dataset,
            rank=self.env.rank,
            world_size=self.env.world_size,
            seed=self.seed,
            shuffle=shuffle,
            global_batch_size=self.plan.global_batch_size,
            micro_batch_size=self.plan.micro_batch_size,
            drop_last=True,
        )
        self._export_plan()
        return self._sampler

    def make_batch_sampler(self, dataset: Any, *, shuffle: bool = True) -> ElasticBatchSampler:
        """The batch sampler to give the ``DataLoader`` (``batch_sampler=``, no ``batch_size``).

        Unlike :meth:`make_sampler` with a fixed ``batch_size``, it follows the micro batch the
        run takes, which the adaptive batch may change between two passes of the loader.

        Args:
            dataset: The dataset (only its length is used).
            shuffle: Permute the order each epoch.

        Returns:
            A batch sampler over :meth:`make_sampler`'s sampler.
        """
        return ElasticBatchSampler(self.make_sampler(dataset, shuffle=shuffle))

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """Epoch numbers from the resumed one up to ``num_epochs``; saves once all are done.

        Args:
            num_epochs: Total epochs of the job.

        Yields:
            The current epoch.
        """
        self._planned_epochs = num_epochs
        self._export_plan()
        while self.position.epoch < num_epochs:
            yield self.position.epoch
            if self._sampler is not None and self._steps_left() == 0:
                self.position = replace(
                    self.position, epoch=self.position.epoch + 1, consumed_samples=0
                )
        if self.resume_info is None or self.position.step > self.resume_info.step:
            self.save(blocking=True)

    def steps(self, loader: Iterable[T]) -> Iterator[list[T]]:
        """The micro batches of each remaining optimizer step of the current epoch.

        After the loop body of a step returns, the run counts the step, agrees with the other
        ranks on whether to save or stop, saves, and on SIGTERM exits with code 143.

        Args:
            loader: Iterable over micro batches drawn with the run's sampler.

        Yields:
            A list of this worker's :attr:`accumulation_steps` micro batches (ranks may differ
            by one).

        Raises:
            ConfigError: When :meth:`make_sampler` was not called, or with the adaptive batch
                when the loader's micro batch is fixed (not :meth:`make_batch_sampler`'s).
            SystemExit: With code 143 after the coordinated save when a stop was requested.
        """
        if self._sampler is None:
            raise ConfigError("steps(): call make_sampler() and use its sampler in the loader")
        adaptive = self.adaptive
        if adaptive is not None:
            # The batch is chosen at the start of the pass and every rechoose_every_steps steps.
            adaptive.check_loader(loader)
            self._apply_choice(adaptive.rechoose())
        while True:
            steps_left = self._steps_left()
            if steps_left == 0:
                return
            # DataLoader.__iter__ draws a seed from the global generator. Drawing it in a fork
            # keeps the generator's stream the same whether the epoch starts fresh or mid-way on
            # resume.
            with torch.random.fork_rng(devices=[]):
                batches_iter = iter(loader)
            accumulation_steps = self.accumulation_steps
            for _ in range(steps_left):
                started_s = self._clock()
                if adaptive is not None:
                    adaptive.begin_step(loss_scale=self.loss_scale)
                batches = [next(batches_iter) for _ in range(accumulation_steps)]
                yield batches
                self._end_step(started_s)
                choice = None if adaptive is None else adaptive.after_step(self.step)
                if choice is not None:
                    # A new batch ends the loader's pass; the next pass draws micro batches of
                    # the new size from the same position (in samples).
                    self._apply_choice(choice)
                    break
            else:
                return

    def sync_gradients(
        self, model: torch.nn.Module, *, last: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """Context for one micro batch's backward: DDP all-reduces only on the last one.

        Args:
            model: The (possibly DDP-wrapped) model.
            last: Whether this is the step's last micro batch.

        Returns:
            ``model.no_sync()`` for a DDP model and not ``last``, else a null context.
        """
        if self.adaptive is not None:
            self.adaptive.watch(model)
        no_sync = getattr(model, "no_sync", None)
        if last or no_sync is None:
            return contextlib.nullcontext()
        context: contextlib.AbstractContextManager[Any] = no_sync()
        return context

    # ---------------------------------------------------------------- saving

    def save(self, *, blocking: bool) -> SaveResult | None:
        """Save at the current step; every rank must call it at the same step.

        Args:
            blocking: Finish writing (on every rank's behalf) before returning.

        Returns:
            Rank 0's timings; ``None`` on other ranks.
        """
        rng_states = collectives.gather_rng_states()
        result = None
        if self.env.rank == 0:
            tree = self.state.to_tree(
                position=self.position,
                world_size=self.env.world_size,
                plan=self.plan,
                rng_states=rng_states,
            )
            result = self.checkpointer.save(
                tree,
                step=self.position.step,
                epoch=self.position.epoch,
                world_size=self.env.world_size,
                blocking=blocking,
            )
            self.metrics.checkpoint_blocked_seconds.observe(result.blocked_s)
            self.last_save = result
            self._write_overlap_steps = 0
        if blocking:
            collectives.barrier()
        self._last_save_s = time.monotonic()
        return result

    # ---------------------------------------------------------------- internals

    def _export_plan(self) -> None:
        # Known once both the epochs and the dataset are: each epoch consumes its whole steps
        # (drop_last), from its first sample.
        if self._planned_epochs is None or self._sampler is None:
            return
        g = self.plan.global_batch_size
        per_epoch = self._sampler.num_samples_total // g * g
        self.metrics.set_planned_samples(self._planned_epochs * per_epoch)
        if self.adaptive is not None and self.adaptive_metrics is not None:
            # The run's length in steps at the initial batch: the target of Pollux's model.
            self.adaptive_metrics.set_planned_progress(
                self.adaptive.planned_progress(self._planned_epochs * per_epoch)
            )

    def _pod_samples(self) -> int:
        # torchrun numbers a pod's workers consecutively: its local rank 0, which serves the
        # pod's metrics, counts the samples of all of them.
        first = max(0, self.env.rank - self.env.local_rank)
        pod_ranks = range(first, min(first + self.env.local_world_size, self.env.world_size))
        return sum(self.plan.samples_of(r) for r in pod_ranks)

    def _apply_choice(self, choice: BatchChoice) -> None:
        plan = plan_of(choice, world_size=self.env.world_size)
        if plan != self.plan:
            self.plan = plan
            self._pod_samples_per_step = self._pod_samples()
            if self._sampler is not None:
                self._sampler.set_batch(
                    global_batch_size=plan.global_batch_size,
                    micro_batch_size=plan.micro_batch_size,
                )
            self._export_plan()
        self._export_adaptive()

    def _export_adaptive(self) -> None:
        if self.adaptive is not None and self.adaptive_metrics is not None:
            self.adaptive_metrics.export(self.adaptive)

    def _steps_left(self) -> int:
        assert self._sampler is not None
        self._sampler.set_position(
            epoch=self.position.epoch, consumed_samples=self.position.consumed_samples
        )
        return self._sampler.remaining_samples() // self.plan.global_batch_size

    def _prepare_snapshot(self) -> None:
        # Rank 0 alone snapshots. Called once after loading and once after the first step, when
        # optimizers such as Adam have created their state; only new buffers are allocated.
        if self.env.rank != 0:
            return
        tree = self.state.to_tree(
            position=self.position,
            world_size=self.env.world_size,
            plan=self.plan,
            rng_states=[capture_rng_state()],
        )
        queued_bytes = self.checkpointer.prepare(tree)
        logger.debug("queued %s bytes of checkpoint buffers at step %s", queued_bytes, self.step)

    def _end_step(self, started_s: float) -> None:
        g = self.plan.global_batch_size
        p = self.position
        self.position = Position(
            step=p.step + 1,
            epoch=p.epoch,
            consumed_samples=p.consumed_samples + g,
            samples_total=p.samples_total + g,
        )
        self.metrics.steps.inc()
        self.metrics.consumed_samples.set(self.position.samples_total)
        self.metrics.samples.inc(self._pod_samples_per_step)
        ended_s = self._clock()
        self.metrics.step_seconds.observe(ended_s - started_s)
        if self.adaptive is not None and self.adaptive_metrics is not None:
            times = self.adaptive.end_step(started_s=started_s, ended_s=ended_s)
            self.adaptive_metrics.observe_step(self.adaptive, times)
            self._export_adaptive()
        if self.env.rank == 0:
            write_progress(self.directory, self.position)
            if self.checkpointer.writing_step is not None:
                self._write_overlap_steps += 1
                self.metrics.checkpoint_write_overlap_steps.set(self._write_overlap_steps)
        local = _NOTHING
        if self._stop.requested:
            local = _SAVE_AND_EXIT
        elif self.checkpoint_every_s is not None and (
            time.monotonic() - self._last_save_s >= self.checkpoint_every_s
        ):
            local = _SAVE
        agreed = collectives.all_reduce_max(local)
        if agreed == _SAVE_AND_EXIT:
            logger.info(
                "stop requested: saving step=%s epoch=%s consumed_samples=%s world_size=%s",
                self.position.step,
                self.position.epoch,
                self.position.consumed_samples,
                self.env.world_size,
            )
            self.save(blocking=True)
            raise SystemExit(EXIT_CODE_TERMINATED)
        every = self.checkpoint_every_steps
        if agreed == _SAVE or (every is not None and self.position.step % every == 0):
            self.save(blocking=False)
        if self.position.step == self._start_step + 1:
            self._prepare_snapshot()

    def _on_commit(self, manifest: CheckpointManifest, write_s: float) -> None:
        del manifest
        self.metrics.checkpoint_save_seconds.observe(write_s)
