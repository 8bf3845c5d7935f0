"""Table tests for each damping step, then the chain and its memory."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_policy.decision.stabilize import (
    apply_windows,
    clamp_to_bounds,
    hold_in_cooldown,
    limit_rate,
    remember,
    stabilize,
    window_extremes,
    within_tolerance,
)
from scheduler_policy.policy.spec import Defaults
from scheduler_policy.vocabulary.state import JobMemory, Reason, Recommendation


def ints(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


@pytest.mark.parametrize(
    ("current", "desired", "gain", "forced", "tolerance", "expected"),
    [
        (2, 4, 0.30, False, 0.05, 4),
        (2, 3, 0.03, False, 0.05, 2),
        (4, 3, -0.02, False, 0.05, 4),
        (4, 3, -0.02, True, 0.05, 3),
        (2, 3, 0.05, False, 0.05, 3),
        (2, 2, 0.0, False, 0.05, 2),
    ],
    ids=["big-gain-moves", "small-gain-holds", "small-loss-holds", "forced-shrink-moves",
         "gain-at-tolerance-moves", "no-move-stays"],
)  # fmt: skip
def test_within_tolerance(current, desired, gain, forced, tolerance, expected):
    out = within_tolerance(
        current=ints(current), desired=ints(desired), gains=np.asarray([gain]),
        forced=np.asarray([forced]), tolerance=tolerance,
    )  # fmt: skip
    assert out.tolist() == [expected]


@pytest.mark.parametrize(
    ("desired", "lo", "hi", "expected"),
    [(5, 1, 8, 5), (9, 1, 8, 8), (0, 1, 8, 1), (3, 3, 3, 3)],
    ids=["inside", "above-max", "below-min", "fixed-size"],
)
def test_clamp_to_bounds(desired, lo, hi, expected):
    out = clamp_to_bounds(desired=ints(desired), min_replicas=ints(lo), max_replicas=ints(hi))
    assert out.tolist() == [expected]


@pytest.mark.parametrize(
    ("current", "desired", "up", "down", "expected"),
    [(2, 10, 4, 2, 6), (8, 1, 4, 2, 6), (2, 3, 4, 2, 3), (5, 4, 4, 2, 4)],
    ids=["up-limited", "down-limited", "small-up-passes", "small-down-passes"],
)
def test_limit_rate(current, desired, up, down, expected):
    out = limit_rate(current=ints(current), desired=ints(desired), max_step_up=up,
                     max_step_down=down)  # fmt: skip
    assert out.tolist() == [expected]


@pytest.mark.parametrize(
    ("last_s", "forced", "expected"),
    [(None, False, 4), (900.0, False, 2), (600.0, False, 4), (900.0, True, 4),
     (1000.0, True, 2), (960.0, True, 2)],
    ids=["never-rescaled", "in-cooldown-holds", "cooldown-over", "forced-skips-cooldown",
         "forced-holds-at-the-same-time", "forced-holds-within-one-interval"],
)  # fmt: skip
def test_hold_in_cooldown(last_s, forced, expected):
    out = hold_in_cooldown(
        current=ints(2), desired=ints(4),
        last_rescale_s=np.asarray([np.nan if last_s is None else last_s]),
        forced=np.asarray([forced]), now_s=1000.0, cooldown_s=300.0, interval_s=60.0,
    )  # fmt: skip
    assert out.tolist() == [expected]


# No job moves twice within one interval, except a forced shrink whose pending need is still
# unmet (pending work needs more than the idle and releasing GPUs): a new gang a second after the
# last shrink. Rescaled 20 s before, interval 60 s, cooldown 300 s; from 6 replicas.
UNMET = [
    ("forced-shrink-for-an-unmet-need-moves-again", 3, True, True, 3),
    ("forced-shrink-for-a-covered-need-holds", 3, True, False, 6),
    ("unforced-shrink-holds-whatever-the-need", 3, False, True, 6),
    ("growth-holds-even-forced-with-an-unmet-need", 8, True, True, 6),
]


@pytest.mark.parametrize(
    ("desired", "forced", "unmet", "expected"), [u[1:] for u in UNMET], ids=[u[0] for u in UNMET]
)
def test_a_forced_shrink_moves_twice_in_an_interval_only_for_an_unmet_need(
    desired, forced, unmet, expected
):
    out = hold_in_cooldown(
        current=ints(6), desired=ints(desired), last_rescale_s=np.asarray([980.0]),
        forced=np.asarray([forced]), now_s=1000.0, cooldown_s=300.0, interval_s=60.0,
        unmet=np.asarray([unmet]),
    )  # fmt: skip
    assert out.tolist() == [expected]


@pytest.mark.parametrize(
    ("current", "desired", "up_min", "down_max", "forced", "expected"),
    [
        (2, 6, 3, 6, False, 3),
        (2, 6, 1, 6, False, 2),
        (6, 2, 2, 5, False, 5),
        (6, 2, 2, 8, False, 6),
        (6, 2, 2, 8, True, 2),
        (4, 4, 1, 9, False, 4),
    ],
    ids=["up-to-window-min", "up-window-holds", "down-to-window-max", "down-window-holds",
         "forced-skips-down-window", "hold-stays"],
)  # fmt: skip
def test_apply_windows(current, desired, up_min, down_max, forced, expected):
    out = apply_windows(
        current=ints(current), desired=ints(desired), window_up_min=ints(up_min),
        window_down_max=ints(down_max), forced=np.asarray([forced]),
    )  # fmt: skip
    assert out.tolist() == [expected]


def chain(*, current, recommended, gain=0.5, forced=False, memory=None, now_s=1000.0,
          rate_limited=True, **defaults):  # fmt: skip
    return stabilize(
        current=ints(current), recommended=ints(recommended), gains=np.asarray([gain]),
        forced=np.asarray([forced]), min_replicas=ints(1), max_replicas=ints(8),
        last_rescale_s=np.asarray([np.nan if memory is None or memory.last_rescale_s is None
                                   else memory.last_rescale_s]),
        recommendations=[() if memory is None else memory.recommendations],
        defaults=Defaults(**defaults), interval_s=60.0, now_s=now_s,
        rate_limited=np.asarray([rate_limited]),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "target", "held_by"),
    [
        (dict(current=2, recommended=4, cooldown_s=0, window_down_s=0), 4, None),
        (dict(current=2, recommended=3, gain=0.01), 2, Reason.WITHIN_TOLERANCE),
        (dict(current=2, recommended=12, cooldown_s=0, max_step_up=4), 6, Reason.LIMITED_BY_RATE),
        (dict(current=2, recommended=12, cooldown_s=0, max_step_up=4, rate_limited=False), 8,
         Reason.LIMITED_BY_BOUNDS),
        (dict(current=2, recommended=4, memory=JobMemory(last_rescale_s=900.0)), 2,
         Reason.COOLDOWN),
        (dict(current=6, recommended=3, cooldown_s=0,
              memory=JobMemory(recommendations=(Recommendation(900.0, 6),))), 6,
         Reason.STABILIZATION_WINDOW),
        (dict(current=6, recommended=3, forced=True, cooldown_s=0, max_step_down=2,
              memory=JobMemory(last_rescale_s=930.0,
                               recommendations=(Recommendation(900.0, 6),))), 3, None),
        (dict(current=6, recommended=8, forced=True, cooldown_s=0, max_step_up=1), 7,
         Reason.LIMITED_BY_RATE),
    ],
    ids=["passes", "tolerance", "rate", "measured-job-not-rate-limited", "cooldown", "down-window",
         "forced-shrink-skips-every-damping-step", "growth-stays-rate-limited"],
)  # fmt: skip
def test_chain_reports_the_step_that_held(kwargs, target, held_by):
    result = chain(**kwargs)
    assert result.targets.tolist() == [target]
    assert result.held_by == (held_by,)


def test_memory_records_recommendation_and_rescale():
    result = chain(current=2, recommended=4, cooldown_s=0, window_down_s=300.0)
    assert result.memory(0) == JobMemory(
        last_rescale_s=1000.0, recommendations=(Recommendation(1000.0, 4),)
    )
    assert result.memory_changed.tolist() == [True]


def test_memory_drops_recommendations_older_than_the_longest_window():
    old = (Recommendation(100.0, 3), Recommendation(650.0, 5))
    (kept,), changed = remember([old], ints(4), now_s=1000.0, keep_s=300.0)
    # 3 stopped being in force at 650, before the window opened at 700; 5 was in force then.
    assert kept == (Recommendation(650.0, 5), Recommendation(1000.0, 4))
    assert changed.tolist() == [True]


def test_an_unchanged_recommendation_is_not_stored_again():
    old = (Recommendation(900.0, 4),)
    (kept,), changed = remember([old], ints(4), now_s=1000.0, keep_s=300.0)
    assert kept is old
    assert changed.tolist() == [False]


@pytest.mark.parametrize(
    ("recs", "up_min", "down_max"),
    [
        ((), 4, 4),
        (((500.0, 6),), 4, 6),
        (((500.0, 2), (950.0, 6)), 2, 6),
        (((100.0, 9), (600.0, 2)), 2, 4),
    ],
    ids=["none", "in-force-when-window-opens", "changes-inside-window", "superseded-before"],
)
def test_window_extremes_count_the_recommendation_in_force(recs, up_min, down_max):
    recs = tuple(Recommendation(t, r) for t, r in recs)
    lo, hi = window_extremes([recs], ints(4), now_s=1000.0, window_up_s=300.0,
                             window_down_s=300.0)  # fmt: skip
    assert (lo.tolist(), hi.tolist()) == ([up_min], [down_max])


def test_remembering_twice_at_one_time_is_a_no_op():
    (first,), _ = remember([()], ints(4), now_s=1000.0, keep_s=300.0)
    (second,), changed = remember([first], ints(4), now_s=1000.0, keep_s=300.0)
    assert second is first
    assert changed.tolist() == [False]


def test_no_windows_keep_no_recommendations():
    (kept,), changed = remember([()], ints(4), now_s=1000.0, keep_s=0.0)
    assert kept == ()
    assert changed.tolist() == [False]
