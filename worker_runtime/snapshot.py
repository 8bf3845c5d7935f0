"""Host-memory snapshots of training state, and the random number generators' states.

A snapshot copies every tensor of a state tree into a host buffer that is kept and reused by the
next snapshot: a fresh allocation page-faults on first touch (about 0.6 GB/s on a small machine),
a copy into warm memory runs at memory bandwidth (about 20 GB/s), so after the first save the
time training is blocked no longer depends on the allocator. To keep the allocator out of the
first save as well, :meth:`SnapshotBuffers.specs` lists the buffers a tree needs (cheap, in the
training thread) and :meth:`SnapshotBuffers.allocate` allocates and touches them (slow, in a
background thread, before the first save comes due).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

try:  # numpy is optional for the runtime; its generator is saved when present
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with the project
    np = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """Shape and type of the host buffer one tensor of a state tree needs.

    Attributes:
        path: Where the tensor sits in the tree, e.g. ``/model/0.weight``.
        shape: Tensor shape.
        dtype: Tensor element type.
    """

    path: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def size_bytes(self) -> int:
        """Bytes the buffer takes."""
        numel = 1
        for n in self.shape:
            numel *= n
        return numel * self.dtype.itemsize


class SnapshotBuffers:
    """Reusable host tensors keyed by their path in the state tree.

    Not thread-safe: :meth:`allocate` and :meth:`snapshot` must not run at the same time (the
    :class:`~worker_runtime.checkpoint.AsyncCheckpointer` runs them one after the other).
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    @property
    def size_bytes(self) -> int:
        """Bytes held by the buffers."""
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    @staticmethod
    def specs(tree: Any) -> list[BufferSpec]:
        """The buffers a snapshot of ``tree`` needs; reads only shapes and types.

        Args:
            tree: State tree, e.g. ``{"model": model.state_dict(), ...}``.

        Returns:
            One spec per tensor, in tree order.
        """
        found: list[BufferSpec] = []
        _walk_specs(tree, "", found)
        return found

    def allocate(self, specs: Iterable[BufferSpec]) -> int:
        """Allocate and touch (zero) every buffer in ``specs`` this object does not hold yet.

        Touching every page now moves the page faults out of the first :meth:`snapshot`.

        Args:
            specs: What :meth:`specs` returned.

        Returns:
            Bytes newly allocated.
        """
        allocated_bytes = 0
        for spec in specs:
            held = self._buffers.get(spec.path)
            if held is not None and (tuple(held.shape), held.dtype) == (spec.shape, spec.dtype):
                continue
            buffer = torch.empty(spec.shape, dtype=spec.dtype, device="cpu")
            buffer.zero_()
            self._buffers[spec.path] = buffer
            allocated_bytes += spec.size_bytes
        return allocated_bytes

    def snapshot(self, tree: Any) -> Any:
        """Copy a tree of dicts, lists, tuples, tensors and immutable leaves into host memory.

        The result shares no tensor storage with ``tree``; its tensors are this object's buffers,
        so it stays valid until the next call.

        Args:
            tree: State tree, e.g. ``{"model": model.state_dict(), ...}``.

        Returns:
            A tree of the same shape whose tensors live on the CPU in reusable buffers.
        """
        seen: set[str] = set()
        result = self._copy(tree, "", seen)
        for stale in set(self._buffers) - seen:
            del self._buffers[stale]
        return result

    def _copy(self, node: Any, path: str, seen: set[str]) -> Any:
        if isinstance(node, torch.Tensor):
            seen.add(path)
            return self._copy_tensor(node, path)
        if isinstance(node, dict):
            return {k: self._copy(v, f"{path}/{k}", seen) for k, v in node.items()}
        if isinstance(node, list):
            return [self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(node)]
        if isinstance(node, tuple):
            return tuple(self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(node))
        return node

    def _copy_tensor(self, tensor: torch.Tensor, path: str) -> torch.Tensor:
        source = tensor.detach()
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu")
            self._buffers[path] = buffer
        buffer.copy_(source)
        return buffer


def _walk_specs(node: Any, path: str, found: list[BufferSpec]) -> None:
    # Same traversal and paths as SnapshotBuffers._copy.
    if isinstance(node, torch.Tensor):
        found.append(BufferSpec(path, tuple(node.shape), node.dtype))
    elif isinstance(node, dict):
        for k, v in node.items():
            _walk_specs(v, f"{path}/{k}", found)
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            _walk_specs(v, f"{path}/{i}", found)


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and current CUDA device) generators."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch_cpu": torch.get_rng_state(),
    }
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = (
            str(kind),
            torch.from_numpy(np.array(keys, dtype=np.uint32)),
            int(pos),
            int(has_gauss),
            float(cached),
        )
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` returned (parts this process lacks are ignored).

    Args:
        state: A captured state.
    """
    python_state = state["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    torch.set_rng_state(state["torch_cpu"])
    if np is not None and "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    if torch.cuda.is_available() and "torch_cuda" in state:
        torch.cuda.set_rng_state(state["torch_cuda"])


def seed_rng(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators with one value.

    Args:
        seed: Seed; NumPy receives it modulo 2**32.
    """
    random.seed(seed)
    torch.manual_seed(seed)
    if np is not None:
        np.random.seed(seed % (2**32))
