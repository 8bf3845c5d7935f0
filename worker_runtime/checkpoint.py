"""Saving without stopping training: snapshot in the caller, write in a background thread.

Blocked time. A save blocks the training thread only for the copy of the state into host buffers
(memory bandwidth: about 0.2 s per GB here). The buffers are allocated and their pages touched
ahead of time by :meth:`AsyncCheckpointer.prepare`, in the background, so the first save costs no
more than the later ones. A save that comes due while the previous write is still in flight
waits for it (``SaveResult.waited_s``): the interval should be longer than one write.

Loss bound. Saves come due every N steps; the write of the save at step kN overlaps the W steps
that follow it, and W <= N because the save at step (k+1)N waits for that write. A SIGKILL (or
crash) therefore loses at most N + W steps: all N steps after the last committed checkpoint plus
the steps run while the next one was being written; 2N in the worst case, when one write takes
as long as an interval. :attr:`AsyncCheckpointer.writing_step` tells the loop whether a write is
in flight, so W can be measured (``tide_worker_checkpoint_write_overlap_steps``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker_runtime.errors import CheckpointError
from worker_runtime.snapshot import BufferSpec, SnapshotBuffers
from worker_runtime.storage import CheckpointManifest, CheckpointStore

logger = logging.getLogger(__name__)

# A save that waits longer than this for the previous write logs a warning: the interval is
# shorter than one write, so saves slow training and the loss bound is at its worst (2N).
_WAIT_WARNING_S = 0.1


@dataclass(frozen=True, slots=True)
class SaveResult:
    """Timings of one save as the training loop saw them.

    Attributes:
        step: Step saved.
        blocked_s: Time the caller was blocked: ``waited_s`` plus ``snapshot_s``, plus the
            write itself when blocking.
        waited_s: Part of ``blocked_s`` spent waiting for the previous write (or preparation).
        snapshot_s: Part of ``blocked_s`` spent copying the state into host buffers.
        write_s: Time the write took when it finished before returning, else ``None``.
    """

    step: int
    blocked_s: float
    waited_s: float
    snapshot_s: float
    write_s: float | None


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """One preparation of the snapshot buffers.

    Attributes:
        call_s: Time the caller spent (listing the buffers the state needs).
        background_s: Time the background thread spent allocating and touching them.
        allocated_bytes: Bytes newly allocated (0 when every buffer existed).
    """

    call_s: float
    background_s: float
    allocated_bytes: int


CommitCallback = Callable[[CheckpointManifest, float], None]


class AsyncCheckpointer:
    """Snapshots state into host buffers and commits it to a store in a background thread.

    Background jobs (preparations and writes) run one after the other. At most one write is in
    flight: a save waits for every earlier job before it reuses the snapshot buffers.

    Args:
        store: Where checkpoints are committed.
        on_commit: Called from the writing thread with the manifest and the write seconds.
    """

    def __init__(self, store: CheckpointStore, *, on_commit: CommitCallback | None = None) -> None:
        self.store = store
        self._on_commit = on_commit
        self._buffers = SnapshotBuffers()
        # Buffers requested so far, path -> spec; read and written by the caller's thread only.
        self._requested: dict[str, BufferSpec] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_write_s: float | None = None
        self._writing_step: int | None = None
        # Every preparation so far (one or two per run), for logs and benchmarks.
        self.prepares: list[PrepareResult] = []

    @property
    def writing_step(self) -> int | None:
        """Step of the write in flight, ``None`` when no write is running or queued."""
        return self._writing_step

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host buffers requested so far (allocated once the jobs before are done)."""
        return sum(spec.size_bytes for spec in self._requested.values())

    def prepare(self, state: dict[str, Any]) -> int:
        """Allocate, in the background, the host buffers a save of ``state`` will need.

        Only buffers not requested before are allocated, so calling it again after the state
        grew (an optimizer creates its state at its first step) costs only the new part.

        Args:
            state: State tree (only shapes and types are read).

        Returns:
            Bytes queued for allocation.
        """
        start = time.perf_counter()
        missing = [
            spec for spec in SnapshotBuffers.specs(state) if self._requested.get(spec.path) != spec
        ]
        if not missing:
            return 0
        for spec in missing:
            self._requested[spec.path] = spec
        call_s = time.perf_counter() - start

        def allocate() -> None:
            began = time.perf_counter()
            allocated = self._buffers.allocate(missing)
            result = PrepareResult(call_s, time.perf_counter() - began, allocated)
            self.prepares.append(result)
            logger.info(
                "prepared checkpoint buffers bytes=%s background_s=%.3f call_s=%.4f",
                allocated,
                result.background_s,
                call_s,
            )

        self._submit(allocate, name="tide-checkpoint-prepare")
        return sum(spec.size_bytes for spec in missing)

    def save(
        self, state: dict[str, Any], *, step: int, epoch: int, world_size: int, blocking: bool
    ) -> SaveResult:
        """Snapshot ``state`` and commit it.

        Args:
            state: State tree; only its snapshot is written, so training may change it as soon
                as this returns.
            step: Optimizer steps completed.
            epoch: Epoch at that step.
            world_size: Current world size.
            blocking: Finish the write before returning.

        Returns:
            The timings.

        Raises:
            CheckpointError: When this or the previous write failed.
        """
        start = time.perf_counter()
        self.wait()
        waited_s = time.perf_counter() - start
        if waited_s > _WAIT_WARNING_S and not blocking:
            logger.warning(
                "save at step %s waited %.3f s for the previous checkpoint write: the interval "
                "is shorter than one write",
                step,
                waited_s,
            )
        snapshot = self._buffers.snapshot(state)
        self._requested = {spec.path: spec for spec in SnapshotBuffers.specs(snapshot)}
        snapshot_s = time.perf_counter() - start - waited_s
        self._writing_step = step
        self._submit(
            lambda: self._write(snapshot, step, epoch, world_size),
            name=f"tide-checkpoint-{step}",
        )
        write_s = None
        if blocking:
            self.wait()
            write_s = self._last_write_s
        return SaveResult(step, time.perf_counter() - start, waited_s, snapshot_s, write_s)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the background jobs (write or preparation), if any.

        Args:
            timeout_s: Longest wait; ``None`` waits for as long as the jobs take.

        Raises:
            CheckpointError: When a job failed or did not finish within ``timeout_s``.
        """
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise CheckpointError(f"checkpoint write still running after {timeout_s} s")
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"background checkpoint job failed: {error}") from error

    def _submit(self, job: Callable[[], None], *, name: str) -> None:
        # One thread per job, each joining the one before: jobs run in order, and wait() only
        # has to join the newest thread.
        previous = self._thread

        def run() -> None:
            if previous is not None:
                previous.join()
            if self._error is not None:  # an earlier job failed; wait() reports it
                self._writing_step = None
                return
            try:
                job()
            except BaseException as e:  # handed to the training thread by wait()
                logger.exception("background checkpoint job %s failed", name)
                self._error = e
                self._writing_step = None

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def _write(self, snapshot: dict[str, Any], step: int, epoch: int, world_size: int) -> None:
        start = time.perf_counter()
        try:
            manifest = self.store.write(snapshot, step=step, epoch=epoch, world_size=world_size)
        finally:
            self._writing_step = None
        self._last_write_s = time.perf_counter() - start
        if self._on_commit is not None:
            self._on_commit(manifest, self._last_write_s)
