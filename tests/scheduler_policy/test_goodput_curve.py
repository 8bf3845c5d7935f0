"""G(n): the goodput an adaptive-batch job would reach at each size, at the worker's own batch."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduler_policy.models.batch_choice import (
    MAX_ACCUMULATION,
    SWITCH_SPEEDUP,
    BatchChoice,
    StepSample,
    StepTimeModel,
    candidates,
    choose,
    goodput,
)
from scheduler_policy.models.efficiency import gain
from scheduler_policy.models.goodput import (
    GROWTH_CAP_FACTOR,
    goodput_curve,
    missing_input,
    predict_choice,
)
from scheduler_policy.models.step_model import StepModel, StepParams
from scheduler_policy.vocabulary.state import BatchBounds, StepTimes
from tests.scheduler_policy.goodput_builders import BOUNDS, statistics


def curve(stats=None, *, bounds=BOUNDS, max_replicas=32, current=4, gpus_per_node=8.0):
    return goodput_curve(
        bounds=bounds,
        statistics=stats if stats is not None else statistics(),
        max_replicas=max_replicas,
        current_replicas=current,
        gpus_per_node=gpus_per_node,
    )


@pytest.mark.parametrize(
    ("bounds", "stats", "missing"),
    [
        (None, statistics(), "no adaptive-batch bounds"),
        (BOUNDS, None, "no batch statistics reported"),
        (BOUNDS, statistics(grad_sqr=None), "no finite grad_sqr and grad_var"),
        (BOUNDS, statistics(grad_var=math.nan), "no finite grad_sqr and grad_var"),
        (
            BOUNDS,
            dataclasses.replace(
                statistics(),
                step_times=(StepTimes(nodes=1, replicas=2, local_batch_size=8, optim_step_s=0.0),),
            ),
            "no usable step time",
        ),
    ],
    ids=["no-bounds", "no-statistics", "no-grad-sqr", "nan-grad-var", "no-usable-time"],
)
def test_a_job_missing_an_input_gets_no_goodput_curve(bounds, stats, missing) -> None:
    assert missing_input(bounds, stats) == missing
    if bounds is not None and stats is not None:
        assert curve(stats, bounds=bounds) is None


def test_hand_computed_goodput_at_a_fixed_batch() -> None:
    # One global batch (32, no accumulation): 32 per worker at 1, 16 at 2. No overlap
    # (gamma = 1), no retrogression: step = alpha_c + beta_c b + sync; gain 1 (scale 1).
    params = StepParams(0.01, 0.001, 0.02, 0.0, 0.08, 0.0, 1.0)
    bounds = BatchBounds(
        initial_batch_size=32, max_batch_size=32, local_batch_min=16, local_batch_max=32
    )
    stats = statistics((1, 1, 32), (1, 2, 16), batch_size=32, params=params)
    g = curve(stats, bounds=bounds, current=2, max_replicas=8)
    assert g is not None
    assert g.at(1) == pytest.approx(1 / (0.01 + 0.032), rel=1e-3)
    assert g.at(2) == pytest.approx(1 / (0.01 + 0.016 + 0.02), rel=1e-3)
    assert g.batch_sizes == (0, 32, 32, 0, 0)
    assert g.at(3) == 0.0  # 32 does not split evenly over 3 workers: the worker would refuse
    assert g.at(4) == 0.0  # 8 samples per worker is below the smallest micro batch


def test_goodput_is_flat_beyond_twice_the_largest_measured_size() -> None:
    g = curve(statistics((1, 2, 32), (1, 4, 32)), max_replicas=64)
    assert g is not None and g.cap_replicas == GROWTH_CAP_FACTOR * 4
    assert len(g.progress_per_s) == 9
    assert g.at(8) > g.at(4) > 0
    assert g.at(9) == g.at(64) == g.at(8)


def test_goodput_is_gain_per_step_at_the_predicted_batch() -> None:
    g = curve()
    assert g is not None
    model = StepModel().fit(statistics().step_times)
    for n in range(1, len(g.progress_per_s)):
        b = g.batch_at(n)
        chosen = predict_choice(
            model=model.at(nodes=1, replicas=n),
            bounds=BOUNDS,
            replicas=n,
            grad_sqr=1.0,
            grad_var=50.0,
            current=BatchChoice(128, 32, 1) if n == 4 else None,
            measured_local=[32] if n in (2, 4) else [],
        )
        assert chosen is not None and chosen.global_batch_size == b
        step_s = model.at(nodes=1, replicas=n).predict(
            local_batch_size=chosen.local_batch_size, accumulation_steps=chosen.accumulation_steps
        )
        expected = gain(grad_sqr=1.0, grad_var=50.0, scale=b / 64) / step_s
        assert g.at(n) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("progress", "planned", "remaining"),
    [(100.0, 10_000.0, 9_900.0), (None, 10_000.0, None), (100.0, None, None), (500.0, 400.0, 0.0)],
    ids=["planned-minus-done", "no-progress", "no-plan", "past-the-plan"],
)
def test_remaining_work_is_progress_left(progress, planned, remaining) -> None:
    g = curve(statistics(progress=progress, planned_progress=planned))
    assert g is not None and g.remaining_progress == remaining


@pytest.mark.parametrize(
    ("grad_var", "at_four", "at_three"),
    [(50.0, 128, 96), (100.0, 384, 288)],
    ids=["best-within-5%-keeps-the-current", "best-beyond-5%-switches"],
)
def test_the_workers_current_batch_is_kept_within_the_switch_margin(
    grad_var, at_four, at_three
) -> None:
    # One micro batch (32), so only the accumulation moves. At grad_var 50, 256 samples are
    # ~3 % better than the 128 the workers run at 4 replicas: they keep 128; at 100, 384 is
    # ~6 % better and they switch. At 3 replicas (not running there) the worker would start
    # nearest the initial 64, at 96, and move from there only by the same rule.
    bounds = dataclasses.replace(BOUNDS, local_batch_min=32, local_batch_max=32)
    stats = statistics(batch_size=128, grad_var=grad_var)
    model = StepModel().fit(stats.step_times).at(nodes=1, replicas=4)

    def score(c: BatchChoice) -> float:
        return goodput(c, model=model, grad_sqr=1.0, grad_var=grad_var, initial_batch_size=64)

    ratio = score(BatchChoice(at_four, 32, at_four // 128)) / score(BatchChoice(128, 32, 1))
    assert ratio == 1.0 or ratio >= SWITCH_SPEEDUP
    assert score(BatchChoice(256, 32, 2)) > score(BatchChoice(128, 32, 1))
    g = curve(stats, bounds=bounds, current=4, max_replicas=8)
    assert g is not None
    assert (g.batch_at(4), g.batch_at(3)) == (at_four, at_three)


params_strategy = st.builds(
    StepParams,
    compute_alpha_s=st.floats(1e-3, 0.1),
    compute_beta_s=st.floats(1e-5, 1e-2),
    intra_alpha_s=st.floats(1e-4, 0.2),
    intra_beta_s=st.floats(0.0, 0.05),
    inter_alpha_s=st.floats(1e-4, 0.5),
    inter_beta_s=st.floats(0.0, 0.05),
    gamma=st.floats(1.0, 10.0),
)
bounds_strategy = st.builds(
    lambda init, extra, lo, span, acc: BatchBounds(
        initial_batch_size=init,
        max_batch_size=init * extra,
        local_batch_min=lo,
        local_batch_max=lo * span,
        accumulation=acc,
    ),
    st.integers(1, 512),
    st.integers(1, 64),
    st.integers(1, 64),
    st.integers(1, 32),
    st.booleans(),
)
noise = st.tuples(st.floats(0.0, 1e3), st.floats(0.0, 1e4))


@settings(max_examples=60, deadline=None)
@given(
    params=params_strategy,
    bounds=bounds_strategy,
    stats=noise,
    shapes=st.lists(
        st.tuples(st.integers(1, 2), st.integers(1, 8), st.sampled_from([1, 4, 16, 64])),
        min_size=1,
        max_size=4,
    ),
    current=st.integers(1, 16),
)
def test_goodput_is_never_negative(params, bounds, stats, shapes, current) -> None:
    s = statistics(*shapes, grad_sqr=stats[0], grad_var=stats[1], params=params)
    g = goodput_curve(
        bounds=bounds, statistics=s, max_replicas=16, current_replicas=current, gpus_per_node=4
    )
    assert g is not None
    assert all(math.isfinite(v) and v >= 0 for v in g.progress_per_s)
    assert g.progress_per_s[0] == 0.0


def _model_of_worker(params: StepParams, *, replicas: int, locals_: tuple[int, ...]):
    """The worker's own step-time model, fitted on the exact steps it would measure."""
    shape = StepModel()
    shape.params_ = params
    at = shape.at(nodes=1, replicas=replicas)
    samples = [
        StepSample(b, k, at.predict(local_batch_size=b, accumulation_steps=k))
        for b in locals_
        for k in (1, 2)
    ]
    return at, StepTimeModel().fit(samples)


@settings(max_examples=80, deadline=None)
@given(
    params=params_strategy.map(lambda p: dataclasses.replace(p, gamma=1.0)),
    bounds=bounds_strategy,
    stats=noise,
    replicas=st.integers(2, 8),
    locals_=st.lists(st.integers(1, 128), min_size=2, max_size=3, unique=True).map(tuple),
    pick=st.integers(0, 1000),
)
def test_the_engine_predicts_the_workers_own_choice(params, bounds, stats, replicas, locals_, pick):
    # With no overlap (gamma = 1) Pollux's step at one size is the worker's own model,
    # k (alpha + beta b) + sync; fitted on the same steps, the worker chooses what the engine
    # predicts (one definition of candidates and choice), up to exact ties in goodput.
    engine_model, worker_model = _model_of_worker(params, replicas=replicas, locals_=locals_)
    options = candidates(
        replicas=replicas,
        initial_batch_size=bounds.initial_batch_size,
        max_batch_size=bounds.max_batch_size,
        local_batch_min=bounds.local_batch_min,
        local_batch_max=bounds.local_batch_max,
        accumulation=bounds.accumulation,
        largest_measured_local=max(locals_),
    )
    assume(options)
    current = options[pick % len(options)]
    common = {
        "current": current,
        "options": options,
        "grad_sqr": stats[0],
        "grad_var": stats[1],
        "initial_batch_size": bounds.initial_batch_size,
    }
    by_worker = choose(model=worker_model, **common)
    by_engine = choose(model=engine_model, **common)
    if by_worker != by_engine:

        def score(c: BatchChoice) -> float:
            return goodput(
                c,
                model=engine_model,
                grad_sqr=stats[0],
                grad_var=stats[1],
                initial_batch_size=bounds.initial_batch_size,
            )

        tie = math.isclose(score(by_worker), score(by_engine), rel_tol=1e-9)
        at_margin = math.isclose(
            max(score(by_worker), score(by_engine)) / score(current), SWITCH_SPEEDUP, rel_tol=1e-9
        )
        assert tie or at_margin


@settings(max_examples=60, deadline=None)
@given(
    params=params_strategy,
    bounds=bounds_strategy,
    stats=noise,
    replicas=st.integers(1, 16),
    pick=st.integers(0, 1000),
)
def test_the_predicted_choice_is_a_batch_the_worker_may_take(params, bounds, stats, replicas, pick):
    model = StepModel()
    model.params_ = params
    shape = model.at(nodes=1 + (replicas > 8), replicas=replicas)
    every = candidates(
        replicas=replicas,
        initial_batch_size=bounds.initial_batch_size,
        max_batch_size=bounds.max_batch_size,
        local_batch_min=bounds.local_batch_min,
        local_batch_max=bounds.local_batch_max,
        accumulation=bounds.accumulation,
    )
    current = every[pick % len(every)] if every else None
    chosen = predict_choice(
        model=shape,
        bounds=bounds,
        replicas=replicas,
        grad_sqr=stats[0],
        grad_var=stats[1],
        current=current,
    )
    assert (chosen is None) == (not every)
    if chosen is None:
        return
    b, k = chosen.local_batch_size, chosen.accumulation_steps
    assert chosen.global_batch_size == replicas * b * k
    assert bounds.initial_batch_size <= chosen.global_batch_size <= bounds.max_batch_size
    assert bounds.local_batch_min <= b <= bounds.local_batch_max
    assert 1 <= k <= (MAX_ACCUMULATION if bounds.accumulation else 1)


def test_a_size_that_crosses_a_node_pays_the_cross_node_prior() -> None:
    # Measured on one node only: across nodes the all-reduce is the prior's, twice the node's,
    # so 9 workers on two 8-GPU nodes do less than 8 on one; on one large node, more.
    stats = statistics((1, 2, 32), (1, 4, 32), (1, 8, 32))
    split = curve(stats, max_replicas=16, current=8, gpus_per_node=8.0)
    one_node = curve(stats, max_replicas=16, current=8, gpus_per_node=math.inf)
    assert split is not None and one_node is not None
    assert split.at(9) < split.at(8) < one_node.at(9)
    assert split.at(8) == one_node.at(8)
