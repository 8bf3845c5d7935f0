"""``best_first`` orders as a stable descending argsort does, ties and NaN included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from scheduler_policy.decision.allocate import best_first

# Few distinct values, so that ties are common; infinities and NaN among them.
VALUES = st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e12, -1.0, np.inf, -np.inf, np.nan])


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(0, 300), elements=st.one_of(VALUES, st.floats())))
def test_best_first_is_a_stable_descending_argsort(values: np.ndarray) -> None:
    np.testing.assert_array_equal(best_first(values), np.argsort(-values, kind="stable"))


def test_equal_values_keep_their_order_at_scale() -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 50, 60_000).astype(np.float64)  # ~1,200 copies of each value
    order = best_first(values)
    np.testing.assert_array_equal(order, np.argsort(-values, kind="stable"))
    assert order.dtype == np.int64
