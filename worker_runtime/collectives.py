"""The few collectives the runtime needs; each degrades to a local no-op without a process group.

A gloo worker thread releases a finished collective's work object a moment after the caller's
``wait`` returns, and releasing the work's tensors takes the GIL. If the process group is
destroyed before that (its destructor runs with the GIL held and joins the worker threads), the
two threads deadlock and a worker that finished training hangs at exit: seen under CPU
contention, with ``~ProcessGroupGloo`` joining a thread stuck in ``~AsyncAllgatherWork``.
``settle`` gives the worker threads that moment.
"""

from __future__ import annotations

import io
import time
from typing import Any

import torch
import torch.distributed as dist

from worker_runtime.snapshot import capture_rng_state


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_max(value: int) -> int:
    """The maximum of ``value`` over all ranks (one one-element all-reduce).

    Args:
        value: This rank's value.

    Returns:
        The maximum over ranks.
    """
    if not _active():
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_sum(values: list[float]) -> list[float]:
    """The sums of ``values`` over all ranks (one all-reduce of ``len(values)`` doubles).

    Args:
        values: This rank's values.

    Returns:
        The sums, in the same order.
    """
    if not _active():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.tolist()]


def barrier() -> None:
    """Wait for every rank."""
    if _active():
        dist.barrier()


def settle(seconds: float = 0.2) -> None:
    """Let the backend's threads release finished collectives before the group is destroyed.

    Sleeping releases the GIL, which those releases need (see the module docstring).
    """
    if _active():
        time.sleep(seconds)


def broadcast_from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects only).

    Args:
        obj: The object (ignored on ranks other than 0).

    Returns:
        Rank 0's object.
    """
    if not _active():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's generator states, indexed by rank (complete on rank 0; on all ranks here).

    Returns:
        One :func:`~worker_runtime.snapshot.capture_rng_state` result per rank.
    """
    local = capture_rng_state()
    if not _active():
        return [local]
    # Tensors are sent as torch.save bytes: all_gather_object cannot pickle the uint32 tensor
    # that holds NumPy's generator state.
    buffer = io.BytesIO()
    torch.save(local, buffer)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, buffer.getvalue())
    return [torch.load(io.BytesIO(data), weights_only=True) for data in gathered]
