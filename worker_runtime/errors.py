"""Exceptions raised by the worker runtime; every one derives from :class:`WorkerRuntimeError`."""

from __future__ import annotations


class WorkerRuntimeError(Exception):
    """Base class of every error the worker runtime raises."""


class ConfigError(WorkerRuntimeError):
    """A setting (argument or environment variable) is invalid; the message names both."""


class BatchConfigError(ConfigError):
    """Batch sizes cannot be reconciled with the world size (e.g. a global batch not divisible)."""


class CheckpointError(WorkerRuntimeError):
    """A checkpoint could not be written or read."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's payload does not match its manifest (size or sha256), or cannot be parsed."""
