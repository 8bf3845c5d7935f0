"""Independent simulations in worker processes, stopped at once by an error or an interrupt."""

from __future__ import annotations

import functools
import multiprocessing
import queue
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

R = TypeVar("R")

_POLL_S = 0.1
"""How often the parent passes on the workers' progress while it waits for a result."""

_progress_queue: Any = None
"""In a worker: where its calls' progress goes (a ``multiprocessing.Queue``), or None."""


def _init_worker(progress_queue: Any) -> None:
    """In a worker: ignore Ctrl-C, and keep where progress goes.

    Ctrl-C reaches the whole process group, and it is the parent's to handle (it terminates the
    workers); a worker of its own would print a traceback.
    """
    global _progress_queue
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _progress_queue = progress_queue


def _put(index: int, *values: Any) -> None:
    _progress_queue.put((index, *values))


def _call(job: tuple[int, Callable[..., Any], tuple[Any, ...]]) -> tuple[int, Any]:
    index, fn, args = job
    if _progress_queue is None:
        return index, fn(*args)
    return index, fn(*args, progress=functools.partial(_put, index))


def results_as_done(
    fn: Callable[..., R],
    calls: Sequence[tuple[Any, ...]],
    *,
    workers: int,
    on_progress: Callable[..., None] | None = None,
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
        on_progress: with it, each call gets a keyword argument ``progress``, a function whose
            arguments reach ``on_progress(index in calls, *arguments)`` in this process, while
            it waits for results (every ``_POLL_S``).

    Raises:
        ValueError: ``workers`` < 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    jobs = [(i, fn, tuple(args)) for i, args in enumerate(calls)]
    processes = min(workers, max(1, len(jobs)))
    context = multiprocessing.get_context()
    progress_queue = context.Queue() if on_progress is not None else None

    def pass_on_progress() -> None:
        if progress_queue is None or on_progress is None:
            return
        while True:
            try:
                report = progress_queue.get_nowait()
            except queue.Empty:
                return
            on_progress(*report)

    with context.Pool(processes, initializer=_init_worker, initargs=(progress_queue,)) as pool:
        # Leaving the block terminates the pool, also on an exception or an interrupt.
        results = pool.imap_unordered(_call, jobs)
        for _ in jobs:
            while True:
                try:
                    result = results.next(timeout=_POLL_S)
                except multiprocessing.TimeoutError:
                    pass_on_progress()
                    continue
                break
            pass_on_progress()
            yield result
    if progress_queue is not None:
        progress_queue.close()
