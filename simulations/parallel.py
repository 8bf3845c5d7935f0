"""Independent simulations in worker processes, stopped at once by an error or an interrupt."""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

R = TypeVar("R")


def _ignore_interrupts() -> None:
    """In a worker: Ctrl-C reaches the whole process group, and it is the parent's to handle
    (it terminates the workers); a worker of its own would print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call(job: tuple[int, Callable[..., Any], tuple[Any, ...]]) -> tuple[int, Any]:
    index, fn, args = job
    return index, fn(*args)


def results_as_done(
    fn: Callable[..., R], calls: Sequence[tuple[Any, ...]], *, workers: int
) -> Iterator[tuple[int, R]]:
    """``fn(*args)`` for each ``args`` of ``calls``, in ``workers`` processes.

    Yields ``(index in calls, result)`` as each call finishes. An exception raised by a call, or
    an interrupt (Ctrl-C) while waiting, is raised here; the worker processes are then
    terminated, not waited for: a simulation of a long trace would otherwise run on for
    minutes. (``concurrent.futures`` can only cancel calls that have not reached a worker.)

    Args:
        fn: a module-level function (it is pickled to the workers).
        calls: the arguments of each call.
        workers: processes, at least 1.

    Raises:
        ValueError: ``workers`` < 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    jobs = [(i, fn, tuple(args)) for i, args in enumerate(calls)]
    processes = min(workers, max(1, len(jobs)))
    with multiprocessing.get_context().Pool(processes, initializer=_ignore_interrupts) as pool:
        # Leaving the block terminates the pool, also on an exception or an interrupt.
        yield from pool.imap_unordered(_call, jobs)
