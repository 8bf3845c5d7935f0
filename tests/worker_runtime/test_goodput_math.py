"""Hand-computed cases of the adaptive batch: AdaScale, gradient statistics, goodput."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker_runtime.adascale import OptimizerKind, efficiency, gain, lr_factor
from worker_runtime.goodput import (
    SWITCH_SPEEDUP,
    BatchChoice,
    StepSample,
    StepTimeModel,
    candidates,
    choose,
    first_choice,
    geometric_sizes,
    goodput,
)
from worker_runtime.gradient_stats import SmoothedStats, StepEstimate, estimate

# ---------------------------------------------------------------- AdaScale


@pytest.mark.parametrize(
    ("grad_sqr", "grad_var", "scale", "expected"),
    [
        (1.0, 1.0, 1.0, 1.0),  # the initial batch is worth itself
        (1.0, 1.0, 4.0, 2.0 / 1.25),  # (1 + 1) / (1/4 + 1) = 1.6
        (1.0, 3.0, 2.0, 4.0 / 2.5),  # (3 + 1) / (3/2 + 1) = 1.6
        (0.0, 2.0, 8.0, 8.0),  # all noise: linear scaling
        (5.0, 1e-9, 8.0, (1e-6 + 5.0) / (1e-6 / 8 + 5.0)),  # no noise: var floored, gain ~1
        (-1.0, 2.0, 4.0, 4.0),  # a negative norm estimate counts as 0
    ],
    ids=["scale-1", "equal-parts-x4", "noisy-x2", "pure-noise", "noise-free", "negative-sqr"],
)
def test_gain_matches_hand_computation(
    grad_sqr: float, grad_var: float, scale: float, expected: float
) -> None:
    assert gain(grad_sqr=grad_sqr, grad_var=grad_var, scale=scale) == pytest.approx(expected)


def test_efficiency_is_gain_over_scale() -> None:
    assert efficiency(grad_sqr=1.0, grad_var=1.0, scale=4.0) == pytest.approx(1.6 / 4)


@pytest.mark.parametrize(
    ("kind", "gain_value", "scale", "expected"),
    [
        (OptimizerKind.SGD, 1.6, 4.0, 1.6),
        (OptimizerKind.SGD, 1.0, 1.0, 1.0),
        (OptimizerKind.ADAM, 1.6, 4.0, 2.0),
        (OptimizerKind.ADAM, 3.0, 9.0, 3.0),
        (OptimizerKind.ADAM, 1.0, 1.0, 1.0),
    ],
    ids=["sgd-gain", "sgd-initial", "adam-sqrt-4", "adam-sqrt-9", "adam-initial"],
)
def test_lr_factor_sgd_takes_the_gain_adam_the_root_of_the_scale(
    kind: OptimizerKind, gain_value: float, scale: float, expected: float
) -> None:
    assert lr_factor(kind=kind, gain_value=gain_value, scale=scale) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grad_sqr": 1.0, "grad_var": 1.0, "scale": 0.0}, "scale: must be > 0, got 0.0"),
        ({"grad_sqr": math.nan, "grad_var": 1.0, "scale": 1.0}, "must be finite"),
    ],
    ids=["zero-scale", "nan-stat"],
)
def test_gain_rejects_bad_input(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gain(**kwargs)


@given(
    sqr=st.floats(0, 1e6),
    var=st.floats(0, 1e6),
    scale=st.floats(1.0, 1e4),
)
def test_gain_lies_between_one_and_the_scale(sqr: float, var: float, scale: float) -> None:
    g = gain(grad_sqr=sqr, grad_var=var, scale=scale)
    assert 1.0 - 1e-9 <= g <= scale * (1 + 1e-9)


# ---------------------------------------------------------------- gradient statistics


def test_estimate_recovers_norm_and_variance_from_two_gradients() -> None:
    # Two micro batches of b = 4 samples each, initial batch 4 (scale = 8 / 4 = 2):
    # g1 = (3, 0), g2 = (1, 0): local = (9 + 1) / 2 = 5, total = |(2, 0)|^2 = 4.
    # grad_sqr = (2*4 - 5) / 1 = 3; grad_var = (5 - 4) * 2 / 1 = 2.
    est = estimate(local_sqr=5.0, total_sqr=4.0, count=2, scale=2.0)
    assert est == StepEstimate(grad_sqr=3.0, grad_var=2.0)


def test_estimate_with_four_gradients() -> None:
    # local = 10, total = 4, count 4, scale 4: sqr = (16 - 10) / 3 = 2, var = 6 * 4 / 3 = 8.
    est = estimate(local_sqr=10.0, total_sqr=4.0, count=4, scale=4.0)
    assert est.grad_sqr == pytest.approx(2.0)
    assert est.grad_var == pytest.approx(8.0)


def test_estimate_needs_two_gradients() -> None:
    with pytest.raises(ValueError, match="count: must be >= 2 gradients, got 1"):
        estimate(local_sqr=1.0, total_sqr=1.0, count=1, scale=1.0)


def test_smoothing_is_bias_corrected() -> None:
    # One step: the average is the step itself, not (1 - theta) of it.
    first = SmoothedStats().update(StepEstimate(4.0, 2.0), scale=1.0, differenced=False)
    assert (first.grad_sqr, first.grad_var) == pytest.approx((4.0, 2.0))
    # Two steps with smoothing 0.5 and scale 1: weights 0.5 (old) and 1 (new) over 1.5 in
    # total after correction: (0.5 * 0.5 * 4 + 0.5 * 1) / 0.75 = 2.
    two = (
        SmoothedStats()
        .update(StepEstimate(4.0, 0.0), scale=1.0, differenced=False, smoothing=0.5)
        .update(StepEstimate(1.0, 0.0), scale=1.0, differenced=False, smoothing=0.5)
    )
    assert two.grad_sqr == pytest.approx(2.0)


def test_a_change_of_estimator_restarts_the_averages() -> None:
    stats = SmoothedStats().update(StepEstimate(4.0, 2.0), scale=1.0, differenced=True)
    after = stats.update(StepEstimate(1.0, 1.0), scale=1.0, differenced=False)
    assert (after.grad_sqr, after.grad_var, after.differenced) == (1.0, 1.0, False)


def test_stats_round_trip_through_a_checkpoint_dict() -> None:
    stats = SmoothedStats().update(StepEstimate(4.0, 2.0), scale=2.0, differenced=True)
    assert SmoothedStats.from_dict(stats.to_dict()) == stats


# ---------------------------------------------------------------- candidates and choice


@pytest.mark.parametrize(
    ("low", "high", "count", "expected"),
    [
        (4, 32, 4, (4, 8, 16, 32)),
        (8, 8, 5, (8,)),
        (1, 2, 8, (1, 2)),
        (16, 256, 5, (16, 32, 64, 128, 256)),
    ],
    ids=["doubling", "single", "merged-by-rounding", "wide"],
)
def test_geometric_sizes(low: int, high: int, count: int, expected: tuple[int, ...]) -> None:
    assert geometric_sizes(low=low, high=high, count=count) == expected


def test_candidates_without_accumulation_are_replicas_times_local_within_bounds() -> None:
    found = candidates(
        replicas=2,
        initial_batch_size=16,
        max_batch_size=48,
        local_batch_min=4,
        local_batch_max=32,
        accumulation=False,
    )
    # Local 4, 5, 7, 10, 13, 18, 24, 32 times 2, kept within [16, 48].
    assert [c.global_batch_size for c in found] == [20, 26, 36, 48]
    assert all(c.accumulation_steps == 1 for c in found)


def test_candidates_with_accumulation_reach_batches_one_step_of_micro_batches_cannot() -> None:
    found = candidates(
        replicas=1,
        initial_batch_size=64,
        max_batch_size=64,
        local_batch_min=8,
        local_batch_max=16,
        accumulation=True,
    )
    assert set(found) == {BatchChoice(64, 8, 8), BatchChoice(64, 16, 4)}


def test_candidates_stay_within_twice_the_largest_measured_local_batch() -> None:
    found = candidates(
        replicas=1,
        initial_batch_size=4,
        max_batch_size=256,
        local_batch_min=4,
        local_batch_max=256,
        accumulation=False,
        largest_measured_local=8,
    )
    assert max(c.local_batch_size for c in found) == 16


def test_first_choice_is_closest_to_the_initial_batch_with_least_accumulation() -> None:
    options = (BatchChoice(16, 4, 2), BatchChoice(16, 8, 1), BatchChoice(32, 16, 1))
    assert first_choice(options, initial_batch_size=16) == BatchChoice(16, 8, 1)


def test_step_time_model_fits_compute_and_sync_exactly() -> None:
    # t = k (0.1 + 0.01 b) + 0.05
    samples = [StepSample(b, k, k * (0.1 + 0.01 * b) + 0.05) for b, k in [(8, 1), (16, 1), (8, 2)]]
    model = StepTimeModel().fit(samples)
    assert (model.alpha_s_, model.beta_s_, model.sync_s_) == pytest.approx((0.1, 0.01, 0.05))
    assert model.predict(local_batch_size=32, accumulation_steps=3) == pytest.approx(1.31)


def test_step_time_model_with_one_measured_batch_splits_it_half_and_half() -> None:
    model = StepTimeModel().fit([StepSample(8, 1, 0.4), StepSample(8, 1, 0.6)])
    # c0 = 0.5 s at b0 = 8: alpha = 0.25, beta = 0.25 / 8, sync 0.
    assert model.predict(local_batch_size=8, accumulation_steps=1) == pytest.approx(0.5)
    assert model.predict(local_batch_size=16, accumulation_steps=1) == pytest.approx(0.75)
    assert model.sync_s_ == 0.0


def test_step_time_model_takes_the_timed_sync_where_steps_cannot_tell_it() -> None:
    # One micro batch per step at 8 and at 16 samples, each step's all-reduce timed at 0.3 s:
    # compute 0.2 + 0.0125 b (0.3 and 0.4 s), sync 0.3 s.
    model = StepTimeModel().fit(
        [StepSample(8, 1, 0.6, 0.3), StepSample(16, 1, 0.7, 0.28), StepSample(16, 1, 0.7, 0.32)]
    )
    assert (model.alpha_s_, model.beta_s_, model.sync_s_) == pytest.approx((0.2, 0.0125, 0.3))
    # Four micro batches of 16 pay the sync once: 4 x 0.4 + 0.3.
    assert model.predict(local_batch_size=16, accumulation_steps=4) == pytest.approx(1.9)


def test_step_time_model_fits_the_sync_itself_once_accumulation_was_measured() -> None:
    # t = k (0.1 + 0.01 b) + 0.05; the timed all-reduce (0.5 s, overlapped with the backward)
    # is ignored: two micro-batch counts tell the sync apart from the compute.
    samples = [
        StepSample(b, k, k * (0.1 + 0.01 * b) + 0.05, 0.5) for b, k in [(8, 1), (16, 1), (8, 2)]
    ]
    model = StepTimeModel().fit(samples)
    assert (model.alpha_s_, model.beta_s_, model.sync_s_) == pytest.approx((0.1, 0.01, 0.05))


def test_step_time_model_caps_the_timed_sync_at_the_shortest_step() -> None:
    model = StepTimeModel().fit([StepSample(8, 1, 0.4, 0.9)])
    assert model.sync_s_ == pytest.approx(0.4)
    assert model.predict(local_batch_size=8, accumulation_steps=3) == pytest.approx(0.4)


def test_a_worker_whose_sync_dominates_accumulates() -> None:
    # Two nodes, micro batch at its bound (8): a step of 8 samples per worker takes 1.0 s, 0.8 s
    # of it the all-reduce. All noise (efficiency 1): the most samples per second win, so the
    # worker takes 8 micro batches (8 x 0.2 + 0.8 = 2.4 s for 8 times the samples: 3.3x).
    # Without the timed sync, accumulation looks like k whole steps: no gain, no switch.
    options = tuple(BatchChoice(8 * 8 * k, 8, k) for k in range(1, 9))
    chosen = {
        sync: choose(
            current=options[0],
            options=options,
            model=StepTimeModel().fit([StepSample(8, 1, 1.0, sync)]),
            grad_sqr=0.0,
            grad_var=1.0,
            initial_batch_size=64,
        )
        for sync in (0.8, None)
    }
    assert chosen == {0.8: BatchChoice(512, 8, 8), None: options[0]}


def test_step_time_model_clamps_a_negative_parameter_to_zero() -> None:
    # Times fall with the batch: beta would be negative; it is 0 and alpha takes the mean.
    model = StepTimeModel().fit([StepSample(8, 1, 0.5), StepSample(16, 1, 0.3)])
    assert model.beta_s_ == 0.0
    assert model.alpha_s_ + model.sync_s_ == pytest.approx(0.4)


def test_predict_before_fit_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="call fit"):
        StepTimeModel().predict(local_batch_size=1, accumulation_steps=1)


def _model_fixed_overhead() -> StepTimeModel:
    # 0.1 s per micro batch + 0.001 s per sample, no sync: bigger micro batches are faster.
    return StepTimeModel().fit(
        [StepSample(b, k, k * (0.1 + 0.001 * b)) for b, k in [(8, 1), (16, 1), (8, 2)]]
    )


OPTIONS = (BatchChoice(8, 8, 1), BatchChoice(16, 16, 1), BatchChoice(32, 32, 1))


@pytest.mark.parametrize(
    ("grad_sqr", "grad_var", "current", "expected"),
    [
        # All noise: efficiency 1 everywhere, throughput decides: the largest batch.
        (0.0, 100.0, BatchChoice(8, 8, 1), BatchChoice(32, 32, 1)),
        # Noise-free: efficiency 1/scale, the smallest batch wins.
        (100.0, 0.0, BatchChoice(32, 32, 1), BatchChoice(8, 8, 1)),
        # var = sqr = 1 at B0 = 8: goodput 8/0.108 = 74.1, 16/0.116 * 2/1.5/2 = 91.95,
        # 32/0.132 * 2/1.25/4 = 96.97: 32 beats 16 by 5.5 %, above the 5 % threshold.
        (1.0, 1.0, BatchChoice(16, 16, 1), BatchChoice(32, 32, 1)),
        # A current batch that is no longer a candidate is replaced by the best.
        (0.0, 100.0, BatchChoice(12, 12, 1), BatchChoice(32, 32, 1)),
    ],
    ids=["noise-grows", "noise-free-shrinks", "just-above-threshold", "current-gone"],
)
def test_choose_takes_the_best_goodput(
    grad_sqr: float, grad_var: float, current: BatchChoice, expected: BatchChoice
) -> None:
    chosen = choose(
        current=current,
        options=OPTIONS,
        model=_model_fixed_overhead(),
        grad_sqr=grad_sqr,
        grad_var=grad_var,
        initial_batch_size=8,
    )
    assert chosen == expected


def test_choose_keeps_the_current_batch_below_the_switch_speedup() -> None:
    model = _model_fixed_overhead()
    best, current = BatchChoice(32, 32, 1), BatchChoice(16, 16, 1)

    def pick(threshold: float) -> BatchChoice:
        return choose(
            current=current,
            options=OPTIONS,
            model=model,
            grad_sqr=1.0,
            grad_var=1.0,
            initial_batch_size=8,
            switch_speedup=threshold,
        )

    ratio = goodput(best, model=model, grad_sqr=1.0, grad_var=1.0, initial_batch_size=8) / goodput(
        current, model=model, grad_sqr=1.0, grad_var=1.0, initial_batch_size=8
    )
    assert 1.0 < ratio < 1.06  # the case of the threshold test above
    assert (pick(ratio + 1e-6), pick(ratio - 1e-6)) == (current, best)
    assert SWITCH_SPEEDUP == 1.05
