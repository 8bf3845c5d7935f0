"""The allocator's concave envelope: a curve that dips where a node is added and rises again
grows past the dip; a concave curve is left as it is; the envelope is the least concave
majorant (property tests against a brute-force upper hull)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.decision.envelope import bridge_dips, concave_envelope
from scheduler_policy.decision.pipeline import decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.models.scaling import usl_throughput
from scheduler_policy.vocabulary.state import JobState, NodeState, ThroughputPoint
from tests.scheduler_policy.builders import (
    NOW_S,
    make_job,
    make_observation,
    make_policy,
    make_queue,
)


def _usl(n: int) -> float:
    """A near-linear profile, samples/s at ``n`` replicas."""
    return 100.0 * n / (1 + 0.02 * (n - 1))


def _measured(points: tuple[tuple[int, int, float], ...], *, current: int) -> JobState:
    """A job measured at ``(replicas, nodes, samples/s)`` an hour ago, one GPU a replica."""
    history = tuple(
        ThroughputPoint(time_s=NOW_S - 3600 + i, replicas=n, samples_per_s=x, nodes=m)
        for i, (n, m, x) in enumerate(points)
    )
    job = make_job("big", current=current, max_replicas=32)
    return dataclasses.replace(job, throughput_history=history)


FULL_NODES = tuple((n, max(1, n // 8), _usl(n)) for n in (1, 2, 4, 8, 16, 32))
PART_FILLED = tuple((n, -(-n // 8), _usl(n)) for n in (1, 2, 4, 8, 12, 16, 24, 32))
# Across nodes it never beats one full node: 16 and 32 replicas run below 8's speed.
NEVER_BETTER = ((1, 1, 100.0), (2, 1, 196.0), (4, 1, 377.0), (8, 1, 700.0),
                (16, 2, 640.0), (32, 4, 690.0))  # fmt: skip

# (measured points, replicas now, expected target, GPUs the queue may hold) on four 8-GPU nodes
SCENARIOS = {
    # Fitted at full nodes only, X(17) < X(16): the running minimum stopped growth at 16.
    "full-node-fit-grows-past-the-node-boundary-to-32": (FULL_NODES, 8, 32, 32.0),
    "full-node-fit-from-16-grows-to-32": (FULL_NODES, 16, 32, 32.0),
    "part-filled-node-fit-grows-to-32": (PART_FILLED, 8, 32, 32.0),
    "cross-node-never-better-stays-on-one-node": (NEVER_BETTER, 8, 8, 32.0),
    # 17 GPUs fund only the bridge's first replica, and X(17) < X(16): growth stops at 16.
    "part-of-the-bridge-stops-at-16": (FULL_NODES, 8, 16, 17.0),
    "part-of-the-bridge-from-16-stays": (FULL_NODES, 16, 16, 17.0),
    # 20 GPUs fund a part that already runs faster than 16 (X(18) > X(16)): kept.
    "a-faster-part-of-the-bridge-is-kept": (FULL_NODES, 8, 20, 20.0),
}


@pytest.mark.parametrize(
    ("points", "current", "expected", "capability"), SCENARIOS.values(), ids=list(SCENARIOS)
)
def test_growth_across_a_node_boundary(
    points: tuple[tuple[int, int, float], ...], current: int, expected: int, capability: float
) -> None:
    nodes = tuple(
        NodeState(name=f"n{i}", allocatable_gpus=8.0, free_gpus=8.0 if 8 * i >= current else 0.0)
        for i in range(4)
    )
    observation = dataclasses.replace(
        make_observation(
            _measured(points, current=current),
            queues=(make_queue(capability=capability),),
            free=32.0 - current,
        ),
        nodes=nodes,
    )
    policy = make_policy()
    plan = decide(observation, policy, fits=ModelCache().fit(observation, policy))
    assert [d.target_replicas for d in plan.decisions] == [expected]


# (lam, sigma, kappa) of concave USL curves, 1..32 replicas
CONCAVE = {
    "near-linear": (100.0, 0.02, 0.0),
    "retrograde": (100.0, 0.05, 0.002),
    "perfectly-linear": (50.0, 0.0, 0.0),
}


@pytest.mark.parametrize(("lam", "sigma", "kappa"), CONCAVE.values(), ids=list(CONCAVE))
def test_a_concave_curve_is_its_own_envelope(lam: float, sigma: float, kappa: float) -> None:
    n = np.arange(1, 33, dtype=np.float64)[None, :]
    x = usl_throughput(np.array([[lam]]), np.array([[sigma]]), np.array([[kappa]]), n)
    assert np.array_equal(concave_envelope(x, np.array([31])), x)
    assert np.array_equal(bridge_dips(x, np.array([31])), x)


def test_the_priors_curve_is_left_as_it_is() -> None:
    # Inside a node its increments rise a little (0.818, 0.829, ... GPUs a replica), but its
    # relative gains fall: the allocator's ranking was already in order, and stays bit for bit.
    prior = ModelCache().prior_curve(gpus_per_replica=1.0, gpus_per_node=8.0)
    x = np.array([[float(prior.throughput(float(k), gpus_per_replica=1.0)) for k in range(1, 33)]])
    assert np.any(np.diff(x, n=2) > 0), "the prior's increments rise somewhere"
    assert np.array_equal(bridge_dips(x, np.array([31])), x)


def _upper_hull(y: list[float]) -> list[float]:
    """The least concave majorant of ``y`` at unit steps, by the monotone-chain upper hull."""
    hull: list[int] = []
    for i in range(len(y)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or below the chord a → i: not a vertex of the upper hull.
            if (y[b] - y[a]) * (i - a) <= (y[i] - y[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(i)
    return [float(v) for v in np.interp(np.arange(len(y)), hull, [y[i] for i in hull])]


curves = st.lists(
    st.lists(st.floats(1.0, 1000.0), min_size=34, max_size=34).map(sorted),  # rising
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.lists(st.floats(0.5, 1000.0), min_size=24, max_size=24),
            st.integers(0, 23),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_envelope_is_the_least_concave_majorant(rows: list[tuple[list[float], int]]) -> None:
    x = np.array([r for r, _ in rows])
    widths = np.array([w for _, w in rows], dtype=np.int64)
    env = concave_envelope(x, widths)
    for i, w in enumerate(widths.tolist()):
        inc = np.diff(env[i, : w + 1])
        scale = float(np.abs(x[i]).max())
        assert np.all(inc[1:] <= inc[:-1] + 1e-9 * scale), "increments must not rise"
        assert np.all(env[i, : w + 1] >= x[i, : w + 1] - 1e-9 * scale), "envelope under curve"
        np.testing.assert_allclose(env[i, : w + 1], _upper_hull(x[i, : w + 1].tolist()),
                                   rtol=1e-9, atol=1e-9 * scale)  # fmt: skip
        assert np.array_equal(env[i, w + 1 :], x[i, w + 1 :]), "past the maximum: unchanged"


any_curves = st.lists(st.lists(st.floats(1.0, 1000.0), min_size=34, max_size=34), min_size=1,
                      max_size=6)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(rows=st.one_of(curves, any_curves))
def test_the_allocators_relative_gains_never_rise(rows: list[list[float]]) -> None:
    # What the allocator ranks: X(k)/X(k-1) - 1 after bridge_dips, non-increasing in k, and
    # each row either as it was or its envelope (never below the curve).
    x = np.array(rows)
    widths = np.full(len(rows), x.shape[1] - 1, dtype=np.int64)
    out = bridge_dips(x, widths)
    gain = out[:, 1:] / out[:, :-1] - 1.0
    assert np.all(gain[:, 1:] <= gain[:, :-1] + 1e-9)
    env = concave_envelope(x, widths)
    for i in range(len(rows)):
        assert np.array_equal(out[i], x[i]) or np.array_equal(out[i], env[i])
        assert np.all(out[i] >= x[i] - 1e-9 * x[i].max())
