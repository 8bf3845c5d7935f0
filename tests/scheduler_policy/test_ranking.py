"""The allocator's orders of increments equal the numpy calls they stand for, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from scheduler_policy.decision.ranking import best_first, by_group_best_first

# Few distinct values, so that ties are the rule: signed zeros, infinities and NaN among them.
_VALUES = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, 1e12, np.inf, -np.inf, np.nan])
_ARRAYS = hnp.arrays(np.float64, st.integers(0, 200), elements=_VALUES)
# No two values equal (as fitted curves' values usually are): the orders skip the tie-breaking.
_DISTINCT = hnp.arrays(
    np.float64,
    st.integers(0, 200),
    elements=st.floats(allow_nan=False, allow_subnormal=False),
    unique=True,
)


@given(st.one_of(_ARRAYS, _DISTINCT))
def test_best_first_is_a_stable_descending_argsort(values: np.ndarray) -> None:
    assert best_first(values).tolist() == np.argsort(-values, kind="stable").tolist()


@given(st.one_of(_ARRAYS, _DISTINCT), st.integers(1, 40))
def test_by_group_best_first_is_lexsort_by_group_then_descending_value(
    values: np.ndarray, groups: int
) -> None:
    rng = np.random.default_rng(len(values) * groups)
    group = rng.integers(0, groups, len(values))
    expected = np.lexsort((-values, group)).tolist()
    assert by_group_best_first(group, values).tolist() == expected


@pytest.mark.parametrize(
    ("groups", "values", "expected"),
    [
        ([], [], []),
        ([0], [3.0], [0]),
        ([1, 0, 1, 0], [1.0, 1.0, 2.0, 2.0], [3, 1, 2, 0]),
        ([0, 0, 0], [np.nan, 1.0, np.nan], [1, 0, 2]),
        ([40_000, 0], [1.0, 1.0], [1, 0]),  # a group beyond 16 bits
        ([40_000, 0, 40_000], [1.0, 2.0, 3.0], [1, 2, 0]),  # the same, no values tied
    ],
    ids=[
        "empty",
        "one",
        "groups-then-values",
        "nan-last-in-index-order",
        "large-group",
        "large-group-distinct-values",
    ],
)
def test_by_group_best_first_scenarios(groups, values, expected) -> None:
    got = by_group_best_first(np.array(groups, dtype=np.int64), np.array(values, dtype=float))
    assert got.tolist() == expected
