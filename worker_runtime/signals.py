"""SIGTERM handling: the handler only records the request; the training loop acts on it."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class StopRequest:
    """A flag set by SIGTERM (torchrun sends it on every membership change).

    The handler does nothing but set the flag, so it is safe whatever the main thread was doing
    when the signal arrived.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._previous: Any = None
        self._signum = signal.SIGTERM
        self._installed = False

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self._event.is_set()

    def request(self) -> None:
        """Request a stop (what the signal handler does)."""
        self._event.set()

    def install(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Install the handler for ``signum``; only possible from the main thread.

        Args:
            signum: Signal to handle.
        """
        self._previous = signal.signal(signum, self._handle)
        self._signum = signum
        self._installed = True

    def uninstall(self) -> None:
        """Restore the handler that was in place before :meth:`install`."""
        if self._installed:
            signal.signal(self._signum, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only set the flag: logging here could deadlock on a lock the interrupted code holds.
        del signum, frame
        self._event.set()
