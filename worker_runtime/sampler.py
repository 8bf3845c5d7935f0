"""A sampler whose position survives any change of world size.

The data position is ``(epoch, consumed_samples)``: ``consumed_samples`` counts the samples of the
epoch's order that all workers together have trained on. The order is a permutation seeded by
``seed + epoch`` (or the identity without shuffling); a worker skips the consumed prefix and takes
its share of the rest. One optimizer step consumes the next ``global_batch_size`` samples of the
order: with ``micro_batch_size`` given (as :class:`~worker_runtime.run.ElasticRun` does), they are
cut into micro batches and micro batch ``j`` of the step goes to rank ``j % world_size`` (see
:func:`~worker_runtime.batching.step_micro_batches`; the ranks' shares may then differ by one
micro batch); without it, every ``world_size``-th sample goes to a rank, starting at its rank.
Either way the prefix consumed after ``k`` steps is exactly the first ``k * global_batch_size``
samples, whatever the world size was at each step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

from worker_runtime.batching import check_global_batch, step_micro_batches
from worker_runtime.errors import ConfigError


class ElasticSampler(Sampler[int]):
    """Per-rank indices of the rest of the current epoch.

    Args:
        dataset: Anything with ``len``; only its length is used.
        rank: This worker's rank.
        world_size: Current number of workers.
        seed: Base seed of the per-epoch permutations (identical on every rank).
        shuffle: Permute each epoch when true; the identity order otherwise.
        global_batch_size: Samples per optimizer step; with ``drop_last`` only whole steps of
            the remaining order are yielded.
        micro_batch_size: Samples per forward/backward pass; when given (with
            ``global_batch_size``), a rank takes whole micro batches of each step, its own share
            (``j % world_size == rank``), and the world size need not divide the global batch.
        drop_last: Leave out the ``(len - consumed) % global_batch_size`` samples at the end of
            the epoch's order, so that only whole steps are yielded.

    Raises:
        ConfigError: When a size or rank is out of range, or the batch sizes do not split
            (:class:`~worker_runtime.errors.BatchConfigError`).
    """

    def __init__(
        self,
        dataset: Sized,
        *,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size: must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank: must be in [0, world_size={world_size}), got {rank}")
        if drop_last and global_batch_size is None:
            raise ConfigError("global_batch_size: required with drop_last=True")
        if micro_batch_size is not None:
            if global_batch_size is None:
                raise ConfigError("global_batch_size: required with micro_batch_size")
            check_global_batch(
                global_batch_size=global_batch_size,
                micro_batch_size=micro_batch_size,
                world_size=world_size,
            )
        elif global_batch_size is not None and global_batch_size % world_size != 0:
            raise ConfigError(
                f"global_batch_size={global_batch_size}: must be divisible by "
                f"world_size={world_size}"
            )
        self.num_samples_total = len(dataset)
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.drop_last = drop_last
        self.epoch = 0
        self.consumed_samples = 0

    def set_position(self, *, epoch: int, consumed_samples: int) -> None:
        """Move to ``consumed_samples`` into ``epoch``; the next iteration starts there.

        Args:
            epoch: Epoch number (selects the permutation).
            consumed_samples: Samples of the epoch already trained on by all workers.

        Raises:
            ConfigError: When a value is negative or beyond the dataset.
        """
        if epoch < 0:
            raise ConfigError(f"epoch: must be >= 0, got {epoch}")
        if not 0 <= consumed_samples <= self.num_samples_total:
            raise ConfigError(
                f"consumed_samples: must be in [0, {self.num_samples_total}], "
                f"got {consumed_samples}"
            )
        self.epoch = epoch
        self.consumed_samples = consumed_samples

    def set_batch(self, *, global_batch_size: int, micro_batch_size: int) -> None:
        """Take another batch from the next iteration on; the position (in samples) is kept.

        Args:
            global_batch_size: Samples per optimizer step.
            micro_batch_size: Samples per forward/backward pass.

        Raises:
            ConfigError: When the sizes do not split over the world size
                (:class:`~worker_runtime.errors.BatchConfigError`).
        """
        check_global_batch(
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            world_size=self.world_size,
        )
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size

    def order(self) -> list[int]:
        """The epoch's full order of sample indices (identical on every rank)."""
        if not self.shuffle:
            return list(range(self.num_samples_total))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        perm: list[int] = torch.randperm(self.num_samples_total, generator=generator).tolist()
        return perm

    def remaining_samples(self) -> int:
        """Samples all workers together will still yield this epoch."""
        remaining = self.num_samples_total - self.consumed_samples
        if self.drop_last and self.global_batch_size is not None:
            remaining -= remaining % self.global_batch_size
        return remaining

    def __iter__(self) -> Iterator[int]:
        start = self.consumed_samples
        rest = self.order()[start : start + self.remaining_samples()]
        if self.micro_batch_size is None:
            return iter(rest[self.rank :: self.world_size])
        return (i for begin, end in self._micro_slices() for i in rest[begin:end])

    def __len__(self) -> int:
        remaining = self.remaining_samples()
        if self.micro_batch_size is None:
            return max(0, (remaining - self.rank + self.world_size - 1) // self.world_size)
        return sum(end - begin for begin, end in self._micro_slices())

    def _micro_slices(self) -> Iterator[tuple[int, int]]:
        """This rank's micro batches as ``[begin, end)`` positions in the rest of the epoch."""
        assert self.global_batch_size is not None and self.micro_batch_size is not None
        remaining = self.remaining_samples()
        size, micro = self.global_batch_size, self.micro_batch_size
        for step_begin in range(0, remaining, size):
            step_len = min(size, remaining - step_begin)  # short only without drop_last
            mine = step_micro_batches(
                rank=self.rank,
                world_size=self.world_size,
                micro_batches_per_step=-(-step_len // micro),
            )
            for j in mine:
                begin = step_begin + j * micro
                yield begin, min(begin + micro, step_begin + step_len)


class ElasticBatchSampler(Sampler[list[int]]):
    """This rank's micro batches (lists of indices) from an :class:`ElasticSampler`.

    Give it to the ``DataLoader`` as ``batch_sampler``: the micro batch size is read from the
    sampler at every iteration, so a batch changed with :meth:`ElasticSampler.set_batch` takes
    effect at the loader's next pass without building another loader.

    Args:
        sampler: The elastic sampler, with ``micro_batch_size`` set.

    Raises:
        ConfigError: When the sampler has no micro batch size.
    """

    def __init__(self, sampler: ElasticSampler) -> None:
        if sampler.micro_batch_size is None:
            raise ConfigError("sampler: an ElasticSampler with micro_batch_size is required")
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        size = self.sampler.micro_batch_size
        assert size is not None
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch

    def __len__(self) -> int:
        size = self.sampler.micro_batch_size
        assert size is not None
        return -(-len(self.sampler) // size)
