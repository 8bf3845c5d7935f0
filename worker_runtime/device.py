"""Where a worker computes: NCCL on its own GPU when it has one, gloo on the CPU otherwise.

torchrun starts one worker per GPU (``--nproc-per-node`` = GPUs of the pod) and numbers them by
``LOCAL_RANK``; worker ``i`` of a pod uses ``cuda:i``. The choice itself is a pure function of
what CUDA reports (:func:`choose_placement`); :func:`resolve_placement` asks torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from worker_runtime.errors import ConfigError

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True, slots=True)
class Placement:
    """A worker's process-group backend and the device its model and batches live on.

    Attributes:
        backend: ``"nccl"`` or ``"gloo"``.
        device: ``cuda:<local_rank>`` with NCCL, ``cpu`` with gloo.
    """

    backend: str
    device: torch.device


def choose_placement(
    *, requested: str, local_rank: int, cuda_available: bool, cuda_devices: int
) -> Placement:
    """Choose backend and device from what the worker asked for and what CUDA reports.

    ``"auto"`` is NCCL on ``cuda:<local_rank>`` when CUDA is available and the local rank has a
    device of its own (``local_rank < cuda_devices``), gloo on the CPU otherwise.

    Args:
        requested: ``"auto"``, ``"nccl"`` or ``"gloo"``.
        local_rank: The worker's rank within its pod.
        cuda_available: What ``torch.cuda.is_available()`` says.
        cuda_devices: What ``torch.cuda.device_count()`` says.

    Returns:
        The placement.

    Raises:
        ConfigError: When the backend is unknown, or ``"nccl"`` is asked for without a device
            for this local rank.
    """
    if requested not in BACKENDS:
        raise ConfigError(f"backend: must be one of {', '.join(BACKENDS)}, got {requested!r}")
    has_device = cuda_available and 0 <= local_rank < cuda_devices
    if requested == "nccl" and not has_device:
        raise ConfigError(
            f"backend='nccl': needs a CUDA device for LOCAL_RANK={local_rank}, found "
            f"{cuda_devices if cuda_available else 'no CUDA'}; use backend='auto' or 'gloo'"
        )
    if requested == "gloo" or not has_device:
        return Placement(backend="gloo", device=torch.device("cpu"))
    return Placement(backend="nccl", device=torch.device("cuda", local_rank))


def resolve_placement(requested: str, *, local_rank: int) -> Placement:
    """:func:`choose_placement` with what this machine's CUDA reports.

    Args:
        requested: ``"auto"``, ``"nccl"`` or ``"gloo"``.
        local_rank: The worker's rank within its pod.

    Returns:
        The placement.

    Raises:
        ConfigError: See :func:`choose_placement`.
    """
    available = torch.cuda.is_available()
    devices = torch.cuda.device_count() if available else 0
    placement = choose_placement(
        requested=requested, local_rank=local_rank, cuda_available=available, cuda_devices=devices
    )
    if available and placement.backend == "gloo" and requested == "auto":
        logger.warning(
            "LOCAL_RANK=%s has no CUDA device of its own (%s visible): training on the CPU with "
            "gloo; start at most one worker per GPU (--nproc-per-node)",
            local_rank,
            devices,
        )
    return placement
