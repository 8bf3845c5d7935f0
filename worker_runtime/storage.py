"""Checkpoint files on a local or shared filesystem, committed atomically.

Layout of the checkpoint directory::

    step-0000000120.pt      payload, ``torch.save`` of the state (loaded with weights_only=True)
    step-0000000120.json    manifest: step, epoch, world size, payload size and sha256
    latest.json             tracker naming the latest committed step

Commit order: payload to a temporary file, fsync, rename; manifest the same way; fsync the
directory; then the tracker the same way. A checkpoint exists only once its manifest does, and it
is valid only when the payload's size and sha256 match the manifest. Reading starts from the
tracker's step and falls back, newest first, to every other manifest in the directory, with a
warning for each checkpoint that is missing or corrupt.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch

from worker_runtime.errors import CheckpointError, CorruptCheckpointError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
TRACKER_NAME = "latest.json"
_MANIFEST_RE = re.compile(r"^step-(\d{10})\.json$")
_TMP_SUFFIX = ".tmp"
_READ_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    """What the manifest next to a payload records.

    Attributes:
        step: Optimizer steps completed when the state was taken.
        epoch: Epoch at that step.
        world_size: World size that wrote it.
        payload_name: File name of the payload within the directory.
        payload_bytes: Exact payload size.
        sha256: Hex sha256 of the payload.
        created_unix_s: Commit time, seconds since the epoch.
        format_version: Layout version of the payload.
    """

    step: int
    epoch: int
    world_size: int
    payload_name: str
    payload_bytes: int
    sha256: str
    created_unix_s: float
    format_version: int = FORMAT_VERSION


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.digest = hashlib.sha256()
        self.size_bytes = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size_bytes += len(data)
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()


def payload_name(step: int) -> str:
    """File name of the payload for ``step``."""
    return f"step-{step:010d}.pt"


def manifest_name(step: int) -> str:
    """File name of the manifest for ``step``."""
    return f"step-{step:010d}.json"


class CheckpointStore:
    """Writes, lists, prunes and reads checkpoints in one directory.

    Args:
        directory: Directory (created if missing) on a local or shared filesystem.
        keep: Number of most recent checkpoints kept after each commit.

    Raises:
        CheckpointError: When ``keep`` is below 1.
    """

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3) -> None:
        if keep < 1:
            raise CheckpointError(f"keep: must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    def write(
        self, state: Mapping[str, Any], *, step: int, epoch: int, world_size: int
    ) -> CheckpointManifest:
        """Serialize ``state`` and commit it as the latest checkpoint, then prune old ones.

        Args:
            state: Tree of tensors and plain values (what ``torch.load(weights_only=True)`` reads).
            step: Optimizer steps completed.
            epoch: Epoch at that step.
            world_size: World size of the writer.

        Returns:
            The committed manifest.

        Raises:
            CheckpointError: When the filesystem refuses a write or rename.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        name = payload_name(step)
        try:
            tmp = self.directory / (name + _TMP_SUFFIX)
            with open(tmp, "wb") as f:
                writer = _HashingWriter(f)
                # torch.save only calls write() and flush() on a file object.
                torch.save(dict(state), cast(BinaryIO, writer))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.directory / name)
            manifest = CheckpointManifest(
                step=step,
                epoch=epoch,
                world_size=world_size,
                payload_name=name,
                payload_bytes=writer.size_bytes,
                sha256=writer.digest.hexdigest(),
                created_unix_s=time.time(),
            )
            _atomic_write_text(self.directory / manifest_name(step), json.dumps(asdict(manifest)))
            _fsync_dir(self.directory)
            _atomic_write_text(self.directory / TRACKER_NAME, json.dumps({"step": step}))
            _fsync_dir(self.directory)
        except OSError as e:
            raise CheckpointError(f"checkpoint step {step} in {self.directory}: {e}") from e
        logger.info(
            "committed checkpoint step=%s bytes=%s dir=%s", step, writer.size_bytes, self.directory
        )
        self.prune()
        return manifest

    def manifests(self) -> list[CheckpointManifest]:
        """Every parseable manifest in the directory, newest step first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            if _MANIFEST_RE.match(path.name) is None:
                continue
            try:
                found.append(_read_manifest(path))
            except CorruptCheckpointError as e:
                logger.warning("ignoring unreadable manifest %s: %s", path, e)
        return sorted(found, key=lambda m: m.step, reverse=True)

    def tracked_step(self) -> int | None:
        """Step named by the tracker file, or ``None`` when it is missing or unreadable."""
        try:
            data = json.loads((self.directory / TRACKER_NAME).read_text())
            step = data["step"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return step if isinstance(step, int) else None

    def prune(self) -> None:
        """Delete all but the ``keep`` newest checkpoints and stale temporary files."""
        for manifest in self.manifests()[self.keep :]:
            for name in (manifest_name(manifest.step), manifest.payload_name):
                (self.directory / name).unlink(missing_ok=True)
            logger.debug("pruned checkpoint step=%s", manifest.step)

    def remove_temporaries(self) -> None:
        """Delete temporary files a killed writer left behind; call before any writer starts."""
        if self.directory.is_dir():
            for path in self.directory.glob("*" + _TMP_SUFFIX):
                path.unlink(missing_ok=True)

    def read(self, manifest: CheckpointManifest) -> dict[str, Any]:
        """Read and verify one checkpoint.

        Args:
            manifest: Manifest of the checkpoint.

        Returns:
            The saved state.

        Raises:
            CorruptCheckpointError: When the payload is missing, has the wrong size or sha256,
                or cannot be deserialized.
        """
        path = self.directory / manifest.payload_name
        digest = hashlib.sha256()
        buffer = io.BytesIO()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(_READ_CHUNK_BYTES):
                    digest.update(chunk)
                    buffer.write(chunk)
        except OSError as e:
            raise CorruptCheckpointError(f"{path}: cannot read payload: {e}") from e
        size = buffer.tell()
        if size != manifest.payload_bytes:
            raise CorruptCheckpointError(
                f"{path}: payload has {size} bytes, manifest says {manifest.payload_bytes}"
            )
        if digest.hexdigest() != manifest.sha256:
            raise CorruptCheckpointError(
                f"{path}: sha256 {digest.hexdigest()} does not match manifest {manifest.sha256}"
            )
        buffer.seek(0)
        try:
            state = torch.load(buffer, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for a bad archive
            raise CorruptCheckpointError(f"{path}: cannot deserialize: {e}") from e
        if not isinstance(state, dict):
            raise CorruptCheckpointError(f"{path}: payload is a {type(state).__name__}, not a dict")
        return state

    def load_latest(self) -> tuple[CheckpointManifest, dict[str, Any]] | None:
        """Read the newest valid checkpoint, falling back past corrupt or partial ones.

        Returns:
            The manifest and state of the newest valid checkpoint, or ``None`` when there is none.
        """
        manifests = self.manifests()
        tracked = self.tracked_step()
        if tracked is not None and all(m.step != tracked for m in manifests):
            logger.warning(
                "tracker names step %s but its manifest is missing in %s; falling back",
                tracked,
                self.directory,
            )
        for manifest in manifests:
            if tracked is not None and manifest.step > tracked:
                # Committed after the tracker was last written: the manifest only exists once
                # the payload is complete, so it is usable; the tracker write was cut short.
                logger.info("checkpoint step=%s is newer than the tracker", manifest.step)
            try:
                return manifest, self.read(manifest)
            except CorruptCheckpointError as e:
                logger.warning("skipping corrupt checkpoint step=%s: %s", manifest.step, e)
        return None


def _read_manifest(path: Path) -> CheckpointManifest:
    try:
        data = json.loads(path.read_text())
        manifest = CheckpointManifest(**data)
    except (OSError, ValueError, TypeError) as e:
        raise CorruptCheckpointError(f"{path}: {e}") from e
    if manifest.format_version != FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{path}: format_version {manifest.format_version}, expected {FORMAT_VERSION}"
        )
    return manifest


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + _TMP_SUFFIX)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
