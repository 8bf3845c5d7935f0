"""results_as_done: every result once, errors raised, and no waiting for the rest when stopped."""

from __future__ import annotations

import time

import pytest

from scheduler_policy.errors import PolicyError
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


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        list(results_as_done(square, [(1,)], workers=0))
