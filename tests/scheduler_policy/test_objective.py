"""The completionTime objective where remaining work is unknown (estimated from a job's age), the
ranking of a job's replicas up to its asked size at its remaining time there, and its aging (a job
that has run long below its asked size rises above shorter ones)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scheduler_policy.decision.allocate import _expected_remaining_s
from scheduler_policy.decision.pipeline import decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.vocabulary.state import JobState
from tests.scheduler_policy.builders import NOW_S, make_job, make_observation, make_policy

H = 3600.0


def _job(
    name: str,
    *,
    age_h: float | None,
    requested: int | None = None,
    remaining: float | None = None,
    current: int = 1,
    sigma: float = 0.02,
) -> JobState:
    return dataclasses.replace(
        make_job(name, current=current, remaining_samples=remaining, sigma=sigma),
        running_since_s=None if age_h is None else NOW_S - age_h * H,
        requested_replicas=requested,
    )


def _targets(*jobs: JobState, free: float, **policy: float | None) -> dict[str, int]:
    observation = make_observation(*jobs, free=free)
    chosen = make_policy(**policy)  # type: ignore[arg-type]
    plan = decide(observation, chosen, fits=ModelCache().fit(observation, chosen))
    return {d.job.removeprefix("ns/"): d.target_replicas for d in plan.decisions}


YOUNG_BELOW_ITS_ASKED_SIZE = (
    _job("other", age_h=0.1, remaining=5.4e5),
    _job("young", age_h=0.1, requested=4, remaining=1.44e6),
)

# (jobs, idle GPUs, policy defaults, expected targets)
SCENARIOS = {
    # Neither reports its progress: the younger is likelier to finish sooner.
    "unknown-work-the-younger-job-grows": (
        (_job("old", age_h=10.0), _job("young", age_h=0.1)),
        1.0,
        {"starvation_bound_s": None},
        {"old": 1, "young": 2},
    ),
    "unknown-work-ages-unknown-a-tie-keeps-the-jobs-order": (
        (_job("b", age_h=None), _job("a", age_h=None)),
        1.0,
        {"starvation_bound_s": None},
        {"a": 1, "b": 2},
    ),
    # 1e5 samples at ~100 samples/s: under an hour left, known, beats a young unknown job.
    "known-short-remaining-beats-an-estimate": (
        (_job("young", age_h=0.1), _job("known", age_h=5.0, remaining=1e5)),
        1.0,
        {"starvation_bound_s": None},
        {"known": 2, "young": 1},
    ),
    # "long" has run 5 h and reports nothing (expected 6 h left); "short" has 2e6 samples left
    # at ~100 samples/s (5.6 h). Without aging the shorter one grows first; with a 1 h bound,
    # "long" ranks its replicas up to its asked size as if 6 h / (1 + 4) = 1.2 h were left.
    "no-bound-shortest-first": (
        (_job("long", age_h=5.0, requested=3), _job("short", age_h=0.1, remaining=2e6)),
        1.0,
        {"starvation_bound_s": None},
        {"long": 1, "short": 2},
    ),
    "past-the-bound-the-long-job-rises": (
        (_job("long", age_h=5.0, requested=3), _job("short", age_h=0.1, remaining=2e6)),
        1.0,
        {"starvation_bound_s": H},
        {"long": 2, "short": 1},
    ),
    "past-the-bound-both-gpus-to-its-asked-size": (
        (_job("long", age_h=5.0, requested=3), _job("short", age_h=0.1, remaining=2e6)),
        2.0,
        {"starvation_bound_s": H},
        {"long": 3, "short": 1},
    ),
    "past-the-bound-aged-only-up-to-the-asked-size": (
        (_job("long", age_h=5.0, requested=2), _job("short", age_h=0.1, remaining=2e6)),
        2.0,
        {"starvation_bound_s": H},
        {"long": 2, "short": 2},
    ),
    "within-the-bound-shortest-first": (
        (_job("long", age_h=5.0, requested=3), _job("short", age_h=0.1, remaining=2e6)),
        1.0,
        {"starvation_bound_s": 6 * H},
        {"long": 1, "short": 2},
    ),
    "asked-size-unknown-no-aging": (
        (_job("long", age_h=5.0), _job("short", age_h=0.1, remaining=2e6)),
        1.0,
        {"starvation_bound_s": H},
        {"long": 1, "short": 2},
    ),
    # "starved" holds 1 of the 4 replicas it asked for, with 2.88e6 samples left: 8 h at its
    # held size, 2.1 h at its asked size (~377 samples/s); "other" has 1.5 h left at 1 replica.
    # Aged 3 h against a 1 h bound, "starved" ranks at 2.1 h / 3 = 0.7 h, not 8 h / 3 = 2.7 h.
    "past-the-bound-ranked-at-the-asked-size": (
        (
            _job("other", age_h=0.1, remaining=5.4e5),
            _job("starved", age_h=3.0, requested=4, remaining=2.88e6),
        ),
        1.0,
        {"starvation_bound_s": H},
        {"other": 1, "starved": 2},
    ),
    # Within the bound the asked size's 2.1 h is not divided: "other" (1.5 h) grows.
    "within-the-bound-the-asked-size-undivided": (
        (
            _job("other", age_h=0.1, remaining=5.4e5),
            _job("starved", age_h=3.0, requested=4, remaining=2.88e6),
        ),
        1.0,
        {"starvation_bound_s": 6 * H},
        {"other": 2, "starved": 1},
    ),
    # "young" has just started at 1 of the 4 replicas it asked for, with 1.44e6 samples left:
    # 4 h at its held size, 1.06 h at its asked size, shorter than "other"'s 1.5 h. Ranked at
    # its asked size it grows first; without aging, at its held size, it waits.
    "below-its-asked-size-ranked-there-from-the-start": (
        YOUNG_BELOW_ITS_ASKED_SIZE,
        1.0,
        {"starvation_bound_s": H},
        {"other": 1, "young": 2},
    ),
    "no-bound-ranked-at-the-held-size": (
        YOUNG_BELOW_ITS_ASKED_SIZE,
        1.0,
        {"starvation_bound_s": None},
        {"other": 2, "young": 1},
    ),
    # Ranked by the square root of the remaining time: "short" (3 replicas, 0.5 h left) would
    # gain 12% from a 4th replica, "long" (1 replica, 16 h left, linear) 100% from a 2nd:
    # 0.12 / sqrt(0.5) = 0.17 against 1.0 / sqrt(16) = 0.25, so "long" grows. Divided by the
    # time itself (0.25 against 0.06), "short" would take it.
    "a-long-linear-job-before-a-short-poor-one": (
        (
            _job("short", age_h=0.1, current=3, sigma=0.3, remaining=0.5 * H * 100 * 3 / 1.6),
            _job("long", age_h=0.1, current=1, sigma=0.0, remaining=16 * H * 100),
        ),
        1.0,
        {"starvation_bound_s": None},
        {"long": 2, "short": 3},
    ),
    # Both aged, one idle GPU: 6 h / 5 = 1.2 h for "a" against 4 h / 3 = 1.33 h for "b".
    "two-aged-the-longest-running-first": (
        (_job("b", age_h=3.0, requested=2), _job("a", age_h=5.0, requested=2)),
        1.0,
        {"starvation_bound_s": H},
        {"a": 2, "b": 1},
    ),
}


@pytest.mark.parametrize(
    ("jobs", "free", "defaults", "expected"), SCENARIOS.values(), ids=SCENARIOS
)
def test_objective_scenario(
    jobs: tuple[JobState, ...],
    free: float,
    defaults: dict[str, float | None],
    expected: dict[str, int],
) -> None:
    assert _targets(*jobs, free=free, **defaults) == expected


@pytest.mark.parametrize(
    ("age_s", "assumed_s", "expected"),
    [(0.0, 3600.0, 3600.0), (7200.0, 3600.0, 10800.0), (np.nan, 1800.0, 1800.0)],
    ids=["at-start-the-assumed-time", "grows-with-age", "unknown-age-the-assumed-time"],
)
def test_expected_remaining_grows_with_age(age_s: float, assumed_s: float, expected: float) -> None:
    assert _expected_remaining_s(np.array([age_s]), assumed_s)[0] == pytest.approx(expected)
