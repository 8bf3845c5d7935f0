"""Pollux's step-time model: fitted from the parts a worker measures, priors where nothing tells."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_policy.models.step_model import (
    GAMMA_PRIOR,
    INTER_NODE_PRIOR_FACTOR,
    SYNC_PRIOR_FRACTION,
    StepModel,
    StepParams,
)
from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import StepTimes
from tests.scheduler_policy.goodput_builders import TRUE, exact_times

EVERY_TIER = [(1, 1, 16), (1, 1, 64), (1, 2, 32), (1, 4, 32), (2, 8, 16), (4, 16, 32)]


def fit(points: tuple[StepTimes, ...]) -> StepParams:
    return StepModel().fit(points).params_


def test_fit_recovers_the_parameters_that_made_the_times() -> None:
    model = StepModel().fit(exact_times(EVERY_TIER))
    assert set(model.free_) == {"t_ref", "f", "intra", "rho_intra", "inter", "rho_inter", "gamma"}
    for name in StepParams.__dataclass_fields__:
        assert getattr(model.params_, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    assert model.relative_error_ < 1e-3


def _t_ref(p: StepParams, b: int) -> float:
    return p.compute_alpha_s + p.compute_beta_s * b


@pytest.mark.parametrize(
    ("points", "check"),
    [
        (
            exact_times([(1, 2, 32), (1, 4, 32)]),
            lambda p: math.isclose(p.compute_alpha_s, p.compute_beta_s * 32, rel_tol=1e-9),
        ),
        (
            exact_times([(1, 1, 16), (1, 2, 32), (1, 4, 32)], sync=False),
            lambda p: p.gamma == GAMMA_PRIOR,
        ),
        (
            exact_times([(1, 1, 16), (1, 2, 32), (1, 4, 32)]),
            lambda p: (
                math.isclose(p.inter_alpha_s, INTER_NODE_PRIOR_FACTOR * p.intra_alpha_s)
                and math.isclose(p.inter_beta_s, INTER_NODE_PRIOR_FACTOR * p.intra_beta_s)
            ),
        ),
        (
            exact_times([(1, 1, 16), (1, 4, 32), (2, 8, 32)]),
            lambda p: p.intra_beta_s == 0.0 and p.inter_beta_s == 0.0,
        ),
        (
            exact_times([(1, 1, 16), (1, 1, 64)]),
            lambda p: (
                math.isclose(p.intra_alpha_s, SYNC_PRIOR_FRACTION * _t_ref(p, 64))
                and p.intra_beta_s == 0.0
                and p.gamma == GAMMA_PRIOR
            ),
        ),
        (
            exact_times([(1, 1, 16), (2, 8, 32), (4, 16, 32)]),
            lambda p: math.isclose(p.intra_alpha_s, p.inter_alpha_s / INTER_NODE_PRIOR_FACTOR),
        ),
    ],
    ids=[
        "one-micro-batch-splits-compute-half-and-half",
        "no-sync-measured-no-overlap",
        "never-across-nodes-twice-the-node",
        "one-worker-count-per-tier-no-retrogression",
        "one-worker-only-sync-a-fifth-of-compute",
        "never-inside-a-node-half-the-network",
    ],
)
def test_a_parameter_no_point_identifies_stays_at_its_prior(points, check) -> None:
    assert check(fit(points))


def test_the_measured_parts_are_still_fitted_where_priors_fill_the_rest() -> None:
    points = exact_times([(1, 2, 32), (1, 4, 32)], sync=False, accumulation=False)
    model = StepModel().fit(points)
    assert model.relative_error_ < 1e-3  # two optim times, two free parameters plus priors


def test_fit_is_deterministic() -> None:
    points = exact_times([(1, 1, 16), (1, 2, 32), (2, 8, 32)])
    assert StepModel().fit(points).params_ == StepModel().fit(points).params_


def test_unusable_values_are_left_out() -> None:
    good = exact_times([(1, 1, 16), (1, 2, 32), (1, 4, 32)])
    spoiled = (
        *good,
        StepTimes(nodes=1, replicas=4, local_batch_size=64, optim_step_s=math.nan),
        StepTimes(nodes=1, replicas=2, local_batch_size=8, optim_step_s=-1.0, sync_s=math.inf),
    )
    assert fit(spoiled) == fit(good)


@pytest.mark.parametrize(
    "points",
    [
        (),
        (StepTimes(nodes=1, replicas=2, local_batch_size=32, optim_step_s=math.nan),),
        (StepTimes(nodes=1, replicas=2, local_batch_size=32, optim_step_s=0.0, sync_s=0.1),),
    ],
    ids=["none", "nan", "zero"],
)
def test_no_usable_time_is_a_fit_error_naming_the_points(points) -> None:
    with pytest.raises(ModelFitError, match=rf"no usable step time among {len(points)} point"):
        StepModel().fit(points)


def test_bad_hyperparameters_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="prior_pull"):
        StepModel(prior_pull=-1.0).fit(exact_times([(1, 1, 16)]))


def test_the_overlap_lies_between_the_sum_and_the_larger_part() -> None:
    p = dataclasses.replace(TRUE, gamma=3.0)
    grad, sync = float(p.grad_s(32)), float(p.sync_s(nodes=1, replicas=4))
    optim = float(p.optim_s(nodes=1, replicas=4, local_batch_size=32))
    assert max(grad, sync) < optim < grad + sync


times = st.floats(1e-4, 1.0)


@given(
    params=st.builds(
        StepParams,
        compute_alpha_s=times,
        compute_beta_s=st.floats(0.0, 0.01),
        intra_alpha_s=times,
        intra_beta_s=st.floats(0.0, 0.1),
        inter_alpha_s=times,
        inter_beta_s=st.floats(0.0, 0.1),
        gamma=st.floats(1.0, 10.0),
    ),
    nodes=st.integers(1, 8),
    replicas=st.integers(1, 64),
    local=st.integers(1, 512),
    steps=st.integers(1, 8),
)
def test_the_shape_predictor_is_the_vectorised_formula(params, nodes, replicas, local, steps):
    vectorised = float(
        params.step_s(
            nodes=nodes, replicas=replicas, local_batch_size=local, accumulation_steps=steps
        )
    )
    model = StepModel()
    model.params_ = params
    shape = model.at(nodes=nodes, replicas=replicas)
    predicted = shape.predict(local_batch_size=local, accumulation_steps=steps)
    assert predicted == pytest.approx(vectorised, rel=1e-9)
    assert predicted >= steps * float(params.grad_s(local)) * (1 - 1e-12)
