"""Counters of the requests the Volcano client makes, for tests and the benchmark."""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["RequestCounter", "RequestCounts"]


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """Requests made so far, by what they were.

    Attributes:
        lists: list requests (one per page).
        watches: watch requests opened.
        gets: single-object reads (a Job re-read after a conflict, or in list mode).
        patches: patches sent (retries included).
        retries: patches sent again after a conflict.
        events: Kubernetes Events created.
    """

    lists: int = 0
    watches: int = 0
    gets: int = 0
    patches: int = 0
    retries: int = 0
    events: int = 0


class RequestCounter:
    """Thread-safe counts of requests; ``snapshot`` gives them as ``RequestCounts``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {name: 0 for name in RequestCounts.__slots__}

    def add(self, name: str, n: int = 1) -> None:
        """Count ``n`` more requests of kind ``name`` (a ``RequestCounts`` field)."""
        if name not in self._counts:
            raise ValueError(f"unknown request kind {name!r}, expected one of {list(self._counts)}")
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> RequestCounts:
        """The counts now."""
        with self._lock:
            return RequestCounts(**self._counts)
