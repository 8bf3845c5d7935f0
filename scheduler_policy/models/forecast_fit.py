"""Where a queue's forecaster is fitted: inline (the simulator: deterministic) or on a background
worker (``tide engine``: a fit takes 2-3.5 s per queue on 30 days of minute data, and the
reconcile must not wait for it).

``ModelCache`` asks a ``ForecastFitter`` for a fit when a queue's forecaster is due, then, at each
reconcile, takes what has finished. ``InlineFitter`` fits at once, in the caller's thread, so the
new fit serves in the same reconcile (what the cache always did). ``BackgroundFitter`` fits on one
worker thread, at most one fit per queue in flight and at most ``max_queued`` queues waiting: the
cache keeps serving the previous fit (or the recent peak before the first) until it is ready.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass
from typing import Protocol

from scheduler_policy.models.peak_forecast import PeakForecaster
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import DemandPoint, QueueName

logger = logging.getLogger(__name__)

# How a forecaster is fitted to a queue's demand history; injectable so tests can hold a fit.
FitFunction = Callable[[PeakForecaster, Sequence[DemandPoint]], PeakForecaster]


def fit_points(forecaster: PeakForecaster, points: Sequence[DemandPoint]) -> PeakForecaster:
    """The production fit: ``PeakForecaster.fit_points``."""
    return forecaster.fit_points(points)


@dataclass(frozen=True, slots=True)
class FitRequest:
    """A forecaster fit asked for one queue.

    Attributes:
        queue: the queue.
        quantile: the headroom's quantile.
        horizon_s: the headroom's horizon, seconds.
        asked_s: the reconcile time it was asked at (the fit's time once it serves).
        points: the queue's demand history at that time, oldest first.
    """

    queue: QueueName
    quantile: float
    horizon_s: float
    asked_s: float
    points: tuple[DemandPoint, ...]


@dataclass(frozen=True, slots=True)
class FitOutcome:
    """A finished fit.

    Attributes:
        request: what was asked.
        forecaster: the fitted forecaster; None when the fit failed.
        error: why the fit failed, a sentence naming the queue; None when it succeeded.
        duration_s: how long the fit took, seconds.
    """

    request: FitRequest
    forecaster: PeakForecaster | None
    error: str | None
    duration_s: float


def run_fit(request: FitRequest, *, fit: FitFunction = fit_points) -> FitOutcome:
    """Fit ``request``'s forecaster; a failure becomes an outcome, never an exception.

    Args:
        request: the queue, its settings and history.
        fit: how to fit.

    Returns:
        The fitted forecaster, or the error that stopped it.
    """
    started = time.monotonic()
    forecaster = PeakForecaster(quantile=request.quantile, horizon_s=request.horizon_s)
    try:
        fitted = fit(forecaster, request.points)
    except (ModelFitError, ValueError) as e:
        error = f"queue {request.queue}: demand forecast fit failed: {e}"
        return FitOutcome(request, None, error, time.monotonic() - started)
    except Exception as e:  # a worker must report every failure: nobody else would see it
        error = f"queue {request.queue}: demand forecast fit failed ({type(e).__name__}): {e}"
        return FitOutcome(request, None, error, time.monotonic() - started)
    return FitOutcome(request, fitted, None, time.monotonic() - started)


class ForecastFitter(Protocol):
    """Fits forecasters for ``ModelCache``: asked with ``submit``, collected with ``take``."""

    def submit(self, request: FitRequest) -> bool:
        """Ask for a fit.

        Returns:
            True when accepted; False when one for the queue is in flight or the worker is
            full (ask again later).
        """
        ...

    def in_flight(self, queue: QueueName) -> bool:
        """True while a fit for ``queue`` is asked and not yet taken."""
        ...

    def take(self, queue: QueueName) -> FitOutcome | None:
        """The queue's finished fit, handed out once; None while none has finished."""
        ...


class InlineFitter:
    """Fits at once in the caller's thread: the next ``take`` has the outcome (deterministic).

    Args:
        fit: how to fit.
    """

    def __init__(self, *, fit: FitFunction = fit_points) -> None:
        self._fit = fit
        self._done: dict[QueueName, FitOutcome] = {}

    def submit(self, request: FitRequest) -> bool:
        """See base class."""
        self._done[request.queue] = run_fit(request, fit=self._fit)
        return True

    def in_flight(self, queue: QueueName) -> bool:
        """See base class."""
        return queue in self._done

    def take(self, queue: QueueName) -> FitOutcome | None:
        """See base class."""
        return self._done.pop(queue, None)


class BackgroundFitter:
    """Fits on one worker thread, so a reconcile never waits for a fit.

    At most one fit per queue is in flight, and at most ``max_queued`` queues' fits wait or run
    at once (memory is bounded: each holds a copy of its queue's history). Call ``close`` when
    the engine stops.

    Args:
        fit: how to fit.
        max_queued: the most fits waiting or running together.
    """

    def __init__(self, *, fit: FitFunction = fit_points, max_queued: int = 64) -> None:
        if max_queued < 1:
            raise ValueError(f"BackgroundFitter.max_queued: must be >= 1, got {max_queued}")
        self._fit = fit
        self._max_queued = max_queued
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tide-forecast-fit")
        self._lock = threading.Lock()
        self._futures: dict[QueueName, Future[FitOutcome]] = {}

    def submit(self, request: FitRequest) -> bool:
        """See base class."""
        with self._lock:
            if request.queue in self._futures or len(self._futures) >= self._max_queued:
                return False
            try:
                future = self._pool.submit(run_fit, request, fit=self._fit)
            except RuntimeError:  # closed: the engine is stopping
                return False
            self._futures[request.queue] = future
            return True

    def in_flight(self, queue: QueueName) -> bool:
        """See base class."""
        with self._lock:
            return queue in self._futures

    def take(self, queue: QueueName) -> FitOutcome | None:
        """See base class."""
        with self._lock:
            future = self._futures.get(queue)
            if future is None or not future.done():
                return None
            del self._futures[queue]
        if future.cancelled():  # dropped by ``close``
            return None
        return future.result()  # run_fit never raises

    def wait_idle(self, *, timeout_s: float) -> bool:
        """Wait until every fit asked so far has finished (for tests and a clean stop).

        Args:
            timeout_s: the most time to wait, seconds.

        Returns:
            True when none is left running or waiting.
        """
        with self._lock:
            futures = list(self._futures.values())
        _, not_done = wait_for_futures(futures, timeout=timeout_s)
        return not not_done

    def close(self, *, wait: bool = False) -> None:
        """Stop taking fits; fits not started are dropped, a running one finishes unwatched.

        Args:
            wait: wait for the running fit to end.
        """
        self._pool.shutdown(wait=wait, cancel_futures=True)
