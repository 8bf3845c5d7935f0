"""PromQL templates and the arithmetic of range queries: pure, no network.

A range query asks Prometheus for the points ``start, start + step, ...`` up to ``end``; Prometheus
refuses one of more than 11,000 points per series, so a long range is cut into chunks that each
stay within the limit and together hold every point exactly once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from scheduler_policy.policy.spec import MetricsSettings

MAX_POINTS_PER_SERIES = 11_000
"""Prometheus's limit on the points of one series in one range query."""

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_]\w*)\}")


def promql_duration(seconds: float) -> str:
    """``seconds`` as a PromQL duration: whole seconds as ``120s``, else milliseconds ``1500ms``.

    Raises:
        ValueError: ``seconds`` is not a positive finite number, or rounds to 0 ms.
    """
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"duration: must be a positive number of seconds, got {seconds!r}")
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    millis = round(seconds * 1000)
    if millis < 1:
        raise ValueError(f"duration: must be at least 1 ms, got {seconds!r} s")
    return f"{millis}ms"


def render(template: str, values: Mapping[str, str], *, name: str) -> str:
    """The query ``template`` with each ``${placeholder}`` replaced by its value.

    Args:
        template: the PromQL template (``$1`` and the like are PromQL's own and stay).
        values: each placeholder's value.
        name: the query's name, for the error.

    Returns:
        The query.

    Raises:
        ValueError: the template names a placeholder ``values`` lacks.
    """

    def substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise ValueError(f"query {name}: unknown placeholder ${{{key}}}")
        return values[key]

    return _PLACEHOLDER.sub(substitute, template)


def placeholder_values(settings: MetricsSettings) -> dict[str, str]:
    """What each placeholder stands for under ``settings``: ``${rateWindow}`` the throughput
    rates' window, ``${stepWindow}`` the step-time means' (the throughput lookback: a job's
    step times at every shape it ran at within it feed its step model)."""
    return {
        "rateWindow": promql_duration(settings.rate_window_s),
        "stepWindow": promql_duration(settings.lookback_s),
    }


def grid_points(start_s: float, end_s: float, step_s: float) -> int:
    """How many points a range query from ``start_s`` to ``end_s`` at ``step_s`` returns.

    Raises:
        ValueError: ``step_s`` is not positive and finite.
    """
    if not math.isfinite(step_s) or step_s <= 0:
        raise ValueError(f"step: must be a positive number of seconds, got {step_s!r}")
    if end_s < start_s:
        return 0
    # A hair of slack: (end - start) / step computed in floats can fall just below an integer.
    return math.floor((end_s - start_s) / step_s + 1e-9) + 1


def chunk_range(
    start_s: float, end_s: float, step_s: float, *, max_points: int = MAX_POINTS_PER_SERIES
) -> list[tuple[float, float]]:
    """Cut a range query into ranges of at most ``max_points`` points each.

    The chunks' points are exactly the whole range's, each once: chunk ``i`` starts at point
    ``i * max_points`` of the grid ``start_s + k * step_s``, and the last one ends at the grid's
    last point (which may fall before ``end_s``).

    Args:
        start_s: the first point's time.
        end_s: no point after this time.
        step_s: seconds between two points.
        max_points: the most points one chunk may hold.

    Returns:
        ``(start_s, end_s)`` of each chunk, in time order; empty when ``end_s < start_s``.

    Raises:
        ValueError: ``step_s`` is not positive, or ``max_points`` is below 1.
    """
    if max_points < 1:
        raise ValueError(f"max_points: must be at least 1, got {max_points}")
    total = grid_points(start_s, end_s, step_s)
    chunks: list[tuple[float, float]] = []
    for first in range(0, total, max_points):
        last = min(first + max_points, total) - 1
        chunks.append((start_s + first * step_s, start_s + last * step_s))
    return chunks


def align_down(time_s: float, step_s: float) -> float:
    """The latest multiple of ``step_s`` at or before ``time_s``: range queries read on one grid,
    so points fetched in two rounds fall on the same times."""
    return math.floor(time_s / step_s + 1e-9) * step_s
