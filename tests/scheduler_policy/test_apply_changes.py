"""``apply_changes``: writes in flight at once for a cluster that takes them, each change once,
the result in the plan's order, and one failed write never stopping the others."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.engine.reconcile import apply_changes
from scheduler_policy.vocabulary.errors import ConflictError, PermanentError, TemporaryError
from scheduler_policy.vocabulary.protocols import ReplicaChange
from scheduler_policy.vocabulary.state import JobKey, JobMemory, Reason, Sentence

OK = "ok"
FAILURES: dict[str, type[Exception]] = {
    "conflict": ConflictError,
    "temporary": TemporaryError,
    "permanent": PermanentError,
    "bug": RuntimeError,
}


def make_change(index: int) -> ReplicaChange:
    return ReplicaChange(
        JobKey(f"ns/job-{index:03d}"), "worker", 1, 2, JobMemory(),
        Reason.SCALE_UP_FOR_IDLE_GPUS, Sentence("test"),
    )  # fmt: skip


class Writes:
    """A thread-safe cluster's ``apply``: each write's outcome by job, the peak in flight.

    Args:
        outcomes: each job's outcome (``OK`` or a key of ``FAILURES``); OK when absent.
        max_concurrent_writes: what it declares; None declares nothing.
        barrier: writers that must be in flight together before any goes on, each batch (it
            proves the overlap: fewer in flight, and the wait times out).
        delay_s: each write's duration, seconds, the later jobs' shorter (so they finish out of
            order).
    """

    def __init__(
        self,
        *,
        outcomes: dict[JobKey, str] | None = None,
        max_concurrent_writes: int | None = None,
        barrier: int = 0,
        delay_s: float = 0.0,
    ) -> None:
        self.outcomes = outcomes or {}
        if max_concurrent_writes is not None:
            self.max_concurrent_writes = max_concurrent_writes
        self._barrier = threading.Barrier(barrier, timeout=10) if barrier else None
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self.written: list[JobKey] = []
        self.finished: list[JobKey] = []
        self.in_flight = 0
        self.peak = 0

    def apply(self, change: ReplicaChange) -> None:
        with self._lock:
            self.written.append(change.job)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            if self._barrier is not None:  # broken (timed out) unless enough overlap
                self._barrier.wait()
            if self._delay_s:
                time.sleep(self._delay_s / (1 + int(change.job.rsplit("-", 1)[1])))
            outcome = self.outcomes.get(change.job, OK)
            if outcome != OK:
                raise FAILURES[outcome](f"job {change.job}: {outcome}")
        finally:
            with self._lock:
                self.in_flight -= 1
                self.finished.append(change.job)


def _run(writes: Writes, changes: Sequence[ReplicaChange], **kwargs: int) -> tuple[
    list[JobKey], list[JobKey]
]:  # fmt: skip
    applied, failed = apply_changes(writes, changes, **kwargs)  # type: ignore[arg-type]
    return [c.job for c in applied], [c.job for c, _ in failed]


# Each scenario: how many changes, what the cluster declares, the limit given, the peak in flight.
CONCURRENCY = {
    "a cluster that declares 4 gets 4 at once": (8, 4, None, 4),
    "the limit given overrides the cluster's": (8, 4, 2, 2),
    "a limit of 1 writes one after another": (6, 4, 1, 1),
    "fewer changes than the limit: one thread each": (3, 8, None, 3),
    "a cluster that declares nothing is written one after another": (5, None, None, 1),
}


@pytest.mark.parametrize(
    ("count", "declared", "given", "peak"), CONCURRENCY.values(), ids=CONCURRENCY.keys()
)
def test_writes_in_flight_at_once(
    count: int, declared: int | None, given: int | None, peak: int
) -> None:
    changes = [make_change(i) for i in range(count)]
    # With a barrier of `peak` writers, a peak below it would time out and break the barrier.
    writes = Writes(max_concurrent_writes=declared, barrier=peak if peak > 1 else 0, delay_s=0.02)
    kwargs = {} if given is None else {"max_concurrent_writes": given}

    applied, failed = _run(writes, changes, **kwargs)

    assert applied == [c.job for c in changes] and failed == []
    assert sorted(writes.written) == sorted(c.job for c in changes)  # each exactly once
    assert writes.peak == peak


def test_the_result_keeps_the_plans_order_when_the_writes_finish_in_another() -> None:
    changes = [make_change(i) for i in range(8)]
    writes = Writes(
        outcomes={changes[1].job: "conflict", changes[6].job: "permanent"},
        max_concurrent_writes=8,
        barrier=8,
        delay_s=0.05,
    )

    applied, failed = _run(writes, changes)

    assert writes.finished != [c.job for c in changes]  # the later (shorter) writes ended first
    assert applied == [c.job for i, c in enumerate(changes) if i not in (1, 6)]
    assert failed == [changes[1].job, changes[6].job]


FAILED_WRITES = {
    "a conflict is reported for the next round": ("conflict", "conflict, will retry next round"),
    "a temporary failure is reported": ("temporary", "job ns/job-002: temporary"),
    "a permanent refusal is reported": ("permanent", "job ns/job-002: permanent"),
}


@pytest.mark.parametrize("workers", [1, 4], ids=["one at a time", "four at once"])
@pytest.mark.parametrize(("outcome", "why"), FAILED_WRITES.values(), ids=FAILED_WRITES.keys())
def test_one_failed_write_never_stops_the_others(outcome: str, why: str, workers: int) -> None:
    changes = [make_change(i) for i in range(5)]
    writes = Writes(outcomes={changes[2].job: outcome}, max_concurrent_writes=workers)

    applied, failed = apply_changes(writes, changes)  # type: ignore[arg-type]

    assert [c.job for c in applied] == [c.job for i, c in enumerate(changes) if i != 2]
    assert [(c.job, why in reason) for c, reason in failed] == [(changes[2].job, True)]


@pytest.mark.parametrize("workers", [1, 4], ids=["one at a time", "four at once"])
def test_an_unexpected_error_is_raised_once_every_other_write_ran(workers: int) -> None:
    changes = [make_change(i) for i in range(6)]
    writes = Writes(
        outcomes={changes[1].job: "bug", changes[4].job: "bug"}, max_concurrent_writes=workers
    )

    with pytest.raises(RuntimeError, match="job ns/job-001: bug"):
        apply_changes(writes, changes)  # type: ignore[arg-type]

    assert sorted(writes.written) == [c.job for c in changes]


@pytest.mark.parametrize("limit", [0, -1, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_a_limit_that_is_not_a_positive_integer_is_refused(limit: object) -> None:
    with pytest.raises(ValueError, match=r"max_concurrent_writes: must be an integer >= 1, got"):
        apply_changes(Writes(), [make_change(0)], max_concurrent_writes=limit)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([OK, "conflict", "temporary", "permanent"]), max_size=12),
    st.integers(min_value=1, max_value=6),
)
def test_applied_and_failed_split_the_changes_in_their_order(
    outcomes: list[str], workers: int
) -> None:
    changes = [make_change(i) for i in range(len(outcomes))]
    writes = Writes(
        outcomes={c.job: o for c, o in zip(changes, outcomes, strict=True)},
        max_concurrent_writes=workers,
    )

    applied, failed = _run(writes, changes)

    assert applied == [c.job for c, o in zip(changes, outcomes, strict=True) if o == OK]
    assert failed == [c.job for c, o in zip(changes, outcomes, strict=True) if o != OK]
    assert sorted(writes.written) == [c.job for c in changes]
    assert writes.peak <= workers
