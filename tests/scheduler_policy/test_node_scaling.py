"""NodeScalingModel: compute plus sync inside and across nodes, on hand-computed cases."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.decision.pipeline import decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.models.node_scaling import (
    NodeScalingModel,
    design,
    packed_nodes,
    sync_throughput,
)
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import NodeState, Observation, ThroughputPoint
from tests.scheduler_policy.builders import NOW_S, make_job, make_observation, make_policy


def law(k: int, m: int, *, a: float, p_r: float = 0.0, q_r: float = 0.0, p_n: float = 0.0) -> float:
    """X(k, m) of the law with u_n = q_n = h_n = 0, samples/s."""
    if k == 1:
        t = a
    elif m == 1:
        t = a + p_r * (k - 1) / k + q_r * (k - 2)
    else:
        t = a + p_n * (k - 1) / k
    return k / t


A, P_R, Q_R, P_N = 0.01, 0.002, 0.0005, 0.01
INSIDE = [(1, 1), (2, 1), (3, 1), (4, 1)]

# (points as (replicas, nodes), model settings, (replicas, nodes) asked, expected samples/s)
CASES = {
    # Exact points on one node, no prior: a, p_r, q_r recovered; X(4, 1) = 4 / 0.0125 = 320.
    "inside-a-node-recovered": (INSIDE, {"prior_weight": 0.0}, (4, 1), 320.0),
    # No cross-node term measured, and none assumed: 8 / a = 800 across nodes, but the cap
    # holds it to 1.25 × X̂(4, 1) = 400.
    "inside-a-node-only-capped-across-nodes": (INSIDE, {"prior_weight": 0.0}, (8, 2), 400.0),
    # The cap is a setting: 1.5 × 320 = 480.
    "cap-is-a-setting": (INSIDE, {"prior_weight": 0.0, "cross_node_gain_cap": 0.5}, (8, 2), 480.0),
    # Measured across nodes at 2 and 4 replicas on 2 nodes: p_n (+ u_n) = 0.01 is used and the
    # cap is gone: t(8, 2) = 0.01 + 0.01 × 7/8 = 0.01875, X = 426.67 (above the cap's 400).
    "measured-across-nodes-uses-it": (
        [*INSIDE, (2, 2), (4, 2)],
        {"prior_weight": 0.0},
        (8, 2),
        8 / 0.01875,
    ),
    # One size: λ from the point, every sync term at its prior (p_r = 0.2a): X(2, 1) =
    # 2 / (0.01 × (1 + 0.2/2)) = 181.82.
    "one-size-takes-the-prior": ([(1, 1)], {}, (2, 1), 2 / 0.011),
    # ...and across nodes the prior (p_n = 0.2a: t = 0.01175, 680.9) is capped at 1.25 × 100.
    "one-size-capped-across-nodes": ([(1, 1)], {}, (8, 2), 125.0),
}


@pytest.mark.parametrize(("configs", "hyper", "asked", "expected"), CASES.values(), ids=CASES)
def test_hand_computed(
    configs: list[tuple[int, int]],
    hyper: dict[str, float],
    asked: tuple[int, int],
    expected: float,
) -> None:
    y = [law(k, m, a=A, p_r=P_R, q_r=Q_R, p_n=P_N) for k, m in configs]
    model = NodeScalingModel(**hyper).fit(configs, y)
    assert model.predict([list(asked)])[0] == pytest.approx(expected, rel=1e-6)


def test_terms_are_multiples_of_the_compute_time() -> None:
    y = [law(k, m, a=A, p_r=P_R, q_r=Q_R) for k, m in INSIDE]
    model = NodeScalingModel(prior_weight=0.0).fit(INSIDE, y)
    assert model.lambda_ == pytest.approx(100.0)
    assert model.terms_[:2] == pytest.approx((P_R / A, Q_R / A))
    assert not model.across_nodes_ and model.cross_node_max_ == pytest.approx(400.0)
    assert model.relative_error_ == pytest.approx(0.0, abs=1e-9)


BAD = {
    "nodes-below-one": ([[2, 0]], [10.0], "nodes must be finite and >= 1"),
    "replicas-nan": ([[math.nan, 1]], [10.0], "replicas must be finite and >= 1"),
    "throughput-zero": ([[1, 1]], [0.0], "samples_per_s must be finite and > 0"),
    "one-column": ([[1]], [1.0], "X must be (n, 2)"),
}


@pytest.mark.parametrize(("X", "y", "message"), BAD.values(), ids=BAD)
def test_bad_input_names_it(X: list[list[float]], y: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        NodeScalingModel().fit(X, y)


def test_bad_hyperparameter_names_it() -> None:
    with pytest.raises(ValueError, match="prior_inter_bandwidth: must be a number >= 0"):
        NodeScalingModel(prior_inter_bandwidth=-1.0).fit([[1, 1]], [1.0])


PACKED = {
    "one-node": (4, 1.0, 8.0, 1.0),
    "just-over": (9, 1.0, 8.0, 2.0),
    "two-gpus-a-replica": (5, 2.0, 8.0, 2.0),
    "replica-wider-than-a-node": (2, 16.0, 8.0, 4.0),
    "unknown-node-size": (64, 1.0, math.inf, 1.0),
}


@pytest.mark.parametrize(("k", "gpr", "gpn", "nodes"), PACKED.values(), ids=PACKED)
def test_packed_nodes(k: int, gpr: float, gpn: float, nodes: float) -> None:
    assert float(packed_nodes(k, gpr, gpn)) == nodes


config = st.tuples(st.integers(1, 64), st.integers(1, 16))


@settings(max_examples=150, deadline=None)
@given(
    points=st.lists(
        st.tuples(config, st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False)),
        min_size=1,
        max_size=12,
    )
)
def test_predictions_are_positive_and_finite(
    points: list[tuple[tuple[int, int], float]],
) -> None:
    X = [[k, min(m, k)] for (k, m), _ in points]
    y = [x for _, x in points]
    try:
        model = NodeScalingModel().fit(X, y)
    except ModelFitError:
        return  # said so, never garbage
    grid = [[k, m] for k in (1, 2, 3, 8, 33, 128) for m in (1, 2, 5, 40)]
    pred = model.predict(grid)
    assert np.all(np.isfinite(pred)) and np.all(pred > 0)


def _observation(gpus_per_node: float) -> Observation:
    node = NodeState(name="n0", allocatable_gpus=gpus_per_node, free_gpus=0.0)
    return Observation(time_s=NOW_S, jobs=(), queues=(), cluster_free_gpus=0.0, nodes=(node,))


def test_cache_packs_on_the_observed_node_size_and_caps_across_nodes() -> None:
    job = make_job("a", sizes=(1, 2, 4))  # measured on one node only (nodes unknown: packed)
    cache = ModelCache()
    gpn = cache.gpus_per_node(_observation(4.0))
    assert gpn == 4.0
    curve = cache.curve(job, now_s=NOW_S, gpus_per_node=gpn)
    x = curve.throughput(np.arange(1.0, 9.0), gpus_per_replica=1.0)
    assert np.all(x[4:] <= 1.25 * x[3] + 1e-9)  # 5..8 replicas span two 4-GPU nodes
    assert curve.cross_node_max_samples_per_s == pytest.approx(1.25 * x[3])
    # Without listed nodes, the default node size (8) keeps 8 replicas on one node: uncapped.
    bare = Observation(time_s=NOW_S, jobs=(), queues=(), cluster_free_gpus=0.0)
    assert cache.gpus_per_node(bare) == 8.0


def test_cache_scores_the_previous_fit_on_the_newest_point() -> None:
    cache = ModelCache()
    first = make_job("a", sizes=(1,))  # 100 samples/s at 1 replica
    cache.curve(first, now_s=NOW_S, gpus_per_node=8.0)
    assert cache.accuracy().scaling_prediction_error == {}
    newest = ThroughputPoint(time_s=NOW_S, replicas=2, samples_per_s=150.0, nodes=1)
    grown = dataclasses.replace(first, throughput_history=(*first.throughput_history, newest))
    cache.curve(grown, now_s=NOW_S + 1, gpus_per_node=8.0)
    # The one-size fit predicted X(2, 1) = 2 / (0.01 × 1.1) = 181.82: |181.82 − 150| / 150.
    error = cache.accuracy().scaling_prediction_error[grown.key]
    assert error == pytest.approx((2 / 0.011 - 150.0) / 150.0)


def _grown(job_nodes: tuple[int, ...], gpus_per_node: float) -> int:
    """The target of a 4-replica job measured at 1, 2, 4 replicas (on the nodes given) with a
    cheap network (p_n = a/10), 8 idle GPUs, on two nodes of ``gpus_per_node``."""
    points = tuple(
        ThroughputPoint(NOW_S - 60 + i, k, law(k, m, a=A, p_r=P_R, p_n=A / 10), nodes=m)
        for i, (k, m) in enumerate(zip((1, 2, 4), job_nodes, strict=True))
    )
    job = dataclasses.replace(make_job("a", current=4, max_replicas=8), throughput_history=points)
    nodes = tuple(NodeState(f"n{i}", gpus_per_node, gpus_per_node) for i in range(2))
    observation = dataclasses.replace(make_observation(job, free=8.0), nodes=nodes)
    policy = make_policy()
    plan = decide(observation, policy, fits=ModelCache().fit(observation, policy))
    (decision,) = plan.decisions
    return decision.target_replicas


ALLOCATE = {
    # 8-GPU nodes: 8 replicas stay on one node, and the job grows to its maximum.
    "one-node-grows-to-max": ((1, 1, 1), 8.0, 8),
    # 4-GPU nodes, never measured across nodes: the prior charges sync across nodes as inside
    # one (p_n = 0.2a), but the cap holds X(5..8 on two nodes) to 1.25 × X̂(4, 1) = 434.8:
    # 5 → 431, 6 → 434.8 (capped), 7 and 8 add nothing: it stops at 6.
    "not-measured-across-capped": ((1, 1, 1), 4.0, 6),
    # Measured across nodes on a cheap network: 5/(0.01 + 0.001 × 4/5) > 4/0.0115, and every
    # further replica adds more: it grows across to its maximum.
    "measured-across-grows-across": ((1, 1, 2), 4.0, 8),
}


@pytest.mark.parametrize(("nodes", "gpn", "target"), ALLOCATE.values(), ids=ALLOCATE)
def test_the_allocator_packs_each_size_on_the_observed_nodes(
    nodes: tuple[int, ...], gpn: float, target: int
) -> None:
    assert _grown(nodes, gpn) == target


@settings(max_examples=100, deadline=None)
@given(
    k=st.integers(0, 200),
    m=st.integers(1, 50),
    terms=st.lists(st.floats(0, 100, allow_nan=False), min_size=7, max_size=7),
)
def test_the_vectorised_law_is_the_fitted_design(k: int, m: int, terms: list[float]) -> None:
    # What the allocator evaluates is what the fit solved for: 1 + design · terms, per λ.
    expected = 0.0 if k < 1 else k / float(design(k, m) @ np.array([1.0, *terms]))
    got = float(sync_throughput(lam=1.0, terms=terms, cross_node_max=math.inf, k=k, m=m))
    assert got == pytest.approx(expected, rel=1e-12)
