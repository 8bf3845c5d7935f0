"""Saving without stopping training: snapshot in the caller, write in a background thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker_runtime.errors import CheckpointError
from worker_runtime.snapshot import SnapshotBuffers
from worker_runtime.storage import CheckpointManifest, CheckpointStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SaveResult:
    """Timings of one save as the training loop saw them.

    Attributes:
        step: Step saved.
        blocked_s: Time the caller was blocked (waiting for the previous write, plus the
            snapshot, plus the write itself when blocking).
        write_s: Time the write took when it finished before returning, else ``None``.
    """

    step: int
    blocked_s: float
    write_s: float | None


CommitCallback = Callable[[CheckpointManifest, float], None]


class AsyncCheckpointer:
    """Snapshots state into host buffers and commits it to a store in a background thread.

    At most one write is in flight: a save waits for the previous write to finish before it
    reuses the snapshot buffers.

    Args:
        store: Where checkpoints are committed.
        on_commit: Called from the writing thread with the manifest and the write seconds.
    """

    def __init__(self, store: CheckpointStore, *, on_commit: CommitCallback | None = None) -> None:
        self.store = store
        self._on_commit = on_commit
        self._buffers = SnapshotBuffers()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_write_s: float | None = None

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
        snapshot = self._buffers.snapshot(state)
        self._thread = threading.Thread(
            target=self._write,
            args=(snapshot, step, epoch, world_size),
            name=f"tide-checkpoint-{step}",
            daemon=True,
        )
        self._thread.start()
        if blocking:
            self.wait()
            return SaveResult(step, time.perf_counter() - start, self._last_write_s)
        return SaveResult(step, time.perf_counter() - start, None)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the write in flight, if any.

        Args:
            timeout_s: Longest wait; ``None`` waits for as long as the write takes.

        Raises:
            CheckpointError: When the write failed or did not finish within ``timeout_s``.
        """
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise CheckpointError(f"checkpoint write still running after {timeout_s} s")
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"background checkpoint write failed: {error}") from error

    def _write(self, snapshot: dict[str, Any], step: int, epoch: int, world_size: int) -> None:
        start = time.perf_counter()
        try:
            manifest = self.store.write(snapshot, step=step, epoch=epoch, world_size=world_size)
        except BaseException as e:  # handed to the training thread by wait()
            logger.exception("checkpoint write for step %s failed", step)
            self._error = e
            return
        self._last_write_s = time.perf_counter() - start
        if self._on_commit is not None:
            self._on_commit(manifest, self._last_write_s)
