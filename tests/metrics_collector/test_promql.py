"""The pure arithmetic of the Prometheus source: templates, chunked ranges, history points."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics_collector.promql import (
    align_down,
    chunk_range,
    grid_points,
    promql_duration,
    render,
)
from metrics_collector.throughput import representative_points
from scheduler_policy.vocabulary.state import ThroughputPoint


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(120.0, "120s"), (1.5, "1500ms"), (0.001, "1ms"), (86400.0, "86400s")],
    ids=["whole-seconds", "fraction", "one-milli", "a-day"],
)
def test_promql_duration(seconds: float, text: str) -> None:
    assert promql_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf, 0.0001], ids=str)
def test_promql_duration_refuses(seconds: float) -> None:
    with pytest.raises(ValueError, match="duration"):
        promql_duration(seconds)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("rate(x[${rateWindow}])", "rate(x[2m])"),
        ('label_replace(x, "q", "$1", "l", "(.+)")', 'label_replace(x, "q", "$1", "l", "(.+)")'),
        ("${rateWindow}${rateWindow}", "2m2m"),
    ],
    ids=["placeholder", "promql-dollar-one-stays", "twice"],
)
def test_render(template: str, expected: str) -> None:
    assert render(template, {"rateWindow": "2m"}, name="q") == expected


def test_render_names_the_query_and_the_placeholder() -> None:
    with pytest.raises(ValueError, match=r"query jobThroughput: unknown placeholder \$\{window\}"):
        render("rate(x[${window}])", {"rateWindow": "2m"}, name="jobThroughput")


@pytest.mark.parametrize(
    ("start", "end", "step", "limit", "chunks"),
    [
        (0, 10, 1, 11_000, [(0, 10)]),
        (0, 10, 1, 4, [(0, 3), (4, 7), (8, 10)]),
        (0, 11, 1, 4, [(0, 3), (4, 7), (8, 11)]),
        (0, 12, 1, 4, [(0, 3), (4, 7), (8, 11), (12, 12)]),
        (0, 9.5, 2, 11_000, [(0, 8)]),
        (5, 4, 1, 10, []),
        (0, 0, 60, 10, [(0, 0)]),
        (0, 7 * 86400, 15, 11_000, [(0, 164985), (165000, 329985), (330000, 494985),
                                    (495000, 604800)]),
    ],
    ids=["fits", "three-chunks", "exact-multiple-plus-one", "one-point-left",
         "end-off-grid", "empty", "single-point", "a-week-at-15s"],
)  # fmt: skip
def test_chunk_range(
    start: float, end: float, step: float, limit: int, chunks: list[tuple[float, float]]
) -> None:
    assert chunk_range(start, end, step, max_points=limit) == chunks


@settings(deadline=None)  # up to 30,000 points listed twice: slow on a busy machine
@given(
    start=st.integers(0, 10**9),
    points=st.integers(0, 30_000),
    step=st.integers(1, 3600),
    limit=st.integers(1, 11_000),
)
def test_chunks_hold_every_point_once_within_the_limit(
    start: int, points: int, step: int, limit: int
) -> None:
    end = start + points * step - 1  # the grid's last point is start + (points - 1) * step
    chunks = chunk_range(start, end, step, max_points=limit)
    every = [c0 + k * step for c0, c1 in chunks for k in range(grid_points(c0, c1, step))]
    assert every == [start + k * step for k in range(points)]
    assert all(grid_points(c0, c1, step) <= limit for c0, c1 in chunks)
    # Contiguous: each chunk starts one step after the one before ends.
    assert all(b[0] - a[1] == step for a, b in itertools.pairwise(chunks))


@given(t=st.floats(0, 2e9), step=st.integers(1, 86400))
def test_align_down_lands_on_the_grid_at_or_before(t: float, step: int) -> None:
    aligned = align_down(t, step)
    assert aligned % step == 0
    assert t - step < aligned <= t + 1e-3


def grid(*runs: tuple[int, float, int]) -> list[tuple[float, float, float]]:
    """(size, rate, points) runs at a 60 s step, from time 0."""
    out: list[tuple[float, float, float]] = []
    for size, rate, count in runs:
        for _ in range(count):
            out.append((60.0 * len(out), float(size), rate))
    return out


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        (grid((2, 100, 5)), [ThroughputPoint(240, 2, 100)]),
        # The first two points at size 4 average across the change (window 120 s).
        (grid((2, 100, 5), (4, 999, 2), (4, 180, 3)),
         [ThroughputPoint(240, 2, 100), ThroughputPoint(540, 4, 180)]),
        # Back to a size run before: the median of its latest settled points, of both runs.
        (grid((2, 100, 3), (4, 180, 4), (2, 90, 6)),
         [ThroughputPoint(360, 4, 180), ThroughputPoint(720, 2, 90)]),
        # NaN, zero and size 0 are no measurement.
        ([(0, 2, math.nan), (60, 2, 0.0), (120, 0, 50.0), (180, 2, 100.0)],
         [ThroughputPoint(180, 2, 100)]),
        # A size seen only inside a window after a change has no point.
        (grid((2, 100, 3), (3, 150, 1), (2, 100, 3)), [ThroughputPoint(360, 2, 100)]),
        # The median of the latest points, robust to one blip.
        (grid((2, 100, 4), (2, 5, 1), (2, 100, 4)), [ThroughputPoint(480, 2, 100)]),
        ([], []),
    ],
    ids=["one-size", "window-after-change-left-out", "size-revisited", "unusable-points",
         "too-short-to-settle", "median-against-a-blip", "nothing"],
)  # fmt: skip
def test_representative_points(
    points: list[tuple[float, float, float]], expected: list[ThroughputPoint]
) -> None:
    assert list(representative_points(points, rate_window_s=120.0)) == expected


NODES = {
    # The node count read beside the size lands in the point.
    "nodes-recorded": (
        [(60.0 * i, 4.0, 200.0, 1.0) for i in range(4)],
        [ThroughputPoint(180, 4, 200, nodes=1)],
    ),
    # Same size on more nodes: a restart, a second point (the first window after it unsettled).
    "same-size-other-nodes": (
        [(60.0 * i, 8.0, 300.0, 1.0) for i in range(3)]
        + [(60.0 * i, 8.0, 120.0, 2.0) for i in range(3, 7)],
        [ThroughputPoint(120, 8, 300, nodes=1), ThroughputPoint(360, 8, 120, nodes=2)],
    ),
    # No node count (NaN): unknown.
    "nodes-unknown": (
        [(60.0 * i, 2.0, 90.0, math.nan) for i in range(3)],
        [ThroughputPoint(120, 2, 90)],
    ),
}


@pytest.mark.parametrize(("points", "expected"), NODES.values(), ids=NODES)
def test_points_carry_the_nodes_spanned(
    points: list[tuple[float, float, float, float]], expected: list[ThroughputPoint]
) -> None:
    assert list(representative_points(points, rate_window_s=120.0)) == expected


def test_a_job_that_began_within_the_grid_skips_its_first_window() -> None:
    points = grid((2, 10, 2), (2, 100, 3))  # the first two rates reach back before it began
    assert representative_points(points, rate_window_s=120.0, grid_start_s=-60.0) == (
        ThroughputPoint(240, 2, 100),
    )


@given(st.lists(st.tuples(st.integers(1, 8), st.floats(1, 1e4)), min_size=1, max_size=200))
def test_one_point_per_size_oldest_first(raw: list[tuple[int, float]]) -> None:
    points = [(60.0 * i, float(size), rate) for i, (size, rate) in enumerate(raw)]
    result = representative_points(points, rate_window_s=120.0)
    assert len({p.replicas for p in result}) == len(result)
    assert [p.time_s for p in result] == sorted(p.time_s for p in result)
    for p in result:
        rates = [r for t, n, r in points if n == p.replicas]
        assert min(rates) <= p.samples_per_s <= max(rates)
