"""results_as_done: every result once, errors raised, and no waiting for the rest when stopped."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from scheduler_policy.vocabulary.errors import PolicyError
from simulations.errors import ClusterFileError, TraceError
from simulations.parallel import results_as_done

# A worker error that cannot be rebuilt in the parent hangs multiprocessing's pool: fail fast.
pytestmark = pytest.mark.timeout(60)


def square(x: int) -> int:
    return x * x


def nap_or_fail(seconds: float) -> float:
    if seconds < 0:
        raise RuntimeError("failed on purpose")
    time.sleep(seconds)
    return seconds


def raise_(kind: str) -> None:
    if kind == "trace":
        raise TraceError("w.csv", 7, "bad duration")
    if kind == "cluster":
        raise ClusterFileError("c.yaml", ["nodes: must be an integer"])
    raise PolicyError("p.yaml", ["spec.interval: must be > 0"])


@pytest.mark.parametrize("kind", ["trace", "cluster", "policy"])
def test_an_error_with_fields_comes_back_from_a_worker_whole(kind: str) -> None:
    with pytest.raises((TraceError, ClusterFileError, PolicyError)) as caught:
        list(results_as_done(raise_, [(kind,)], workers=1))
    error = caught.value
    assert {"trace": "w.csv:7: bad duration", "cluster": "c.yaml: 1 problem(s)",
            "policy": "p.yaml: 1 problem(s)"}[kind] in str(error)  # fmt: skip
    assert (error.line == 7) if isinstance(error, TraceError) else error.problems


def test_every_call_once_with_its_index() -> None:
    got = dict(results_as_done(square, [(i,) for i in range(7)], workers=2))
    assert got == {i: i * i for i in range(7)}


def test_an_error_is_raised_without_waiting_for_the_other_calls() -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failed on purpose"):
        list(results_as_done(nap_or_fail, [(60.0,), (-1.0,)], workers=2))
    assert time.monotonic() - started < 20  # the 60 s call was terminated


def test_stopping_early_terminates_the_calls_still_running() -> None:
    started = time.monotonic()
    results = results_as_done(nap_or_fail, [(0.0,), (60.0,)], workers=2)
    assert next(results) == (0, 0.0)
    results.close()  # what an interrupt in the consumer does
    assert time.monotonic() - started < 20


def count_to(n: int, *, progress: Callable[[int], None]) -> int:
    for i in range(1, n + 1):
        progress(i)
        time.sleep(0.05)
    return n


def test_progress_reported_in_a_worker_reaches_the_parent_while_it_waits() -> None:
    seen: list[tuple[int, int, float]] = []
    finished: dict[int, float] = {}
    calls = [(4,), (6,)]
    for index, result in results_as_done(
        count_to,
        calls,
        workers=2,
        on_progress=lambda i, k: seen.append((i, k, time.monotonic())),
    ):
        finished[index] = time.monotonic()
        assert result == calls[index][0]
    for index, (n,) in enumerate(calls):
        mine = [k for i, k, _ in seen if i == index]
        assert mine == sorted(mine) and set(mine) <= set(range(1, n + 1))
    # Passed on while the calls went on, not only once they were done.
    assert any(at < finished[i] for i, _, at in seen)


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        list(results_as_done(square, [(1,)], workers=0))
