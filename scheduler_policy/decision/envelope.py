"""The least concave majorant of scaling curves, for the allocator's increments.

A job's throughput curve X(k) may dip and rise again: a curve fitted at full nodes only (1, 2, 4,
8, 16, 32 replicas on 8-GPU nodes) falls where the 17th replica adds a node and its sync, and
rises again as the next replicas amortise it. The allocator ranks a job's increments by their
value and needs them non-increasing in k; the least concave majorant bridges the dip (the
replicas from 16 to 32 share the gain of reaching 32), where a running minimum of the values
would stop growth at 16.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def bridge_dips(x: FloatArray, widths: IntArray) -> FloatArray:
    """Each row of ``x`` whose relative gains ``x[k] / x[k − 1] − 1`` rise somewhere (what the
    allocator ranks, so a running minimum of them would stop at the dip) replaced by its least
    concave majorant; every other row as it is, bit for bit.

    A row left as it is may still have slightly rising increments (the prior's curve inside a
    node): its relative gains fall, and the allocator's ranking needs no more. On a replaced row
    the relative gains fall too: the majorant's increments do not rise and its values do.

    Args:
        x: curves, one row per job, at replica counts min, min + 1, ...; > 0 where finite.
        widths: how many increments of each row are valid (max − min).

    Returns:
        The curves, the shape of ``x``; ``x`` itself when no row is bridged.
    """
    if x.shape[1] < 3:
        return x
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = x[:, 1:] / x[:, :-1] - 1.0
    cols = np.arange(gain.shape[1])
    valid = (cols[None, :] < widths[:, None]) & np.isfinite(gain)
    both = valid[:, 1:] & valid[:, :-1]
    rises = both & (gain[:, 1:] > gain[:, :-1] + 1e-12 * np.abs(gain[:, :-1]))
    rows = np.flatnonzero(rises.any(axis=1) & (x[:, 0] > 0))
    if len(rows) == 0:
        return x  # the same array: nothing was bridged
    out = x.copy()
    out[rows] = concave_envelope(x[rows], widths[rows])
    return out


def stop_outside_dips(
    targets: FloatArray,
    *,
    lo: FloatArray,
    held: FloatArray,
    curve: FloatArray,
    envelope: FloatArray,
) -> FloatArray:
    """Targets that grew into a bridged dip, lowered to the fastest size on the way there.

    The allocator ranks a bridge's replicas at the envelope's gains, which only the whole
    bridge earns: a target inside it (X below the envelope) may run slower than a smaller
    size. Such a growth stops at the size in [held, target] with the most throughput (the
    smallest of equals), never below the replicas held.

    Args:
        targets: replicas per job.
        lo: each job's minimum (column 0 of ``curve``).
        held: replicas each job holds now.
        curve: each job's throughput at min, min + 1, ...
        envelope: ``bridge_dips`` of ``curve``.

    Returns:
        The targets, lowered where they ended inside a dip.
    """
    col = (targets - lo).astype(np.int64)
    row = np.arange(len(targets))
    inside = envelope > curve + 1e-9 * np.abs(curve)
    stuck = np.flatnonzero(inside[row, col] & (targets > held))
    if len(stuck) == 0:
        return targets
    cols = np.arange(curve.shape[1])[None, :]
    start = np.clip(held[stuck] - lo[stuck], 0, None)[:, None]
    span = (cols >= start) & (cols <= col[stuck][:, None])
    best = np.argmax(np.where(span, curve[stuck], -np.inf), axis=1)
    lowered = targets.copy()
    lowered[stuck] = np.maximum(lo[stuck] + best, held[stuck])
    return lowered


def concave_envelope(x: FloatArray, widths: IntArray) -> FloatArray:
    """The least concave majorant of each row of ``x`` over its first ``widths + 1`` points.

    Row i is a curve sampled at unit steps, ``x[i, 0..widths[i]]``; the rest of the row is
    past the job's maximum and is returned unchanged. The majorant is the upper convex hull of
    the points, interpolated linearly between its vertices (its slopes are the non-increasing
    regression of the curve's increments). The hull is Andrew's monotone chain, run on all
    rows at once, one column at a time: O(width) vectorised steps plus one per point popped.
    Only rows whose increments rise somewhere are computed; a concave row is returned as it
    is, bit for bit.

    Args:
        x: curves, one row per job, at replica counts min, min + 1, ...
        widths: how many increments of each row are valid (max − min), each ≤ ``x.shape[1] − 1``.

    Returns:
        The envelope, the shape of ``x``: ≥ ``x`` on the valid points, equal at both ends,
        with non-increasing increments.
    """
    out = x.copy()
    if x.shape[1] < 3:
        return out
    d = np.diff(x, axis=1)
    cols = np.arange(d.shape[1])
    valid = cols[None, :] < widths[:, None]
    rises = valid[:, 1:] & valid[:, :-1] & (d[:, 1:] > d[:, :-1] + 1e-12 * np.abs(d[:, :-1]))
    rows = np.flatnonzero(rises.any(axis=1))
    if len(rows) > 0:
        out[rows] = _hull_rows(x[rows], widths[rows])
    return out


def _hull_rows(y: FloatArray, widths: IntArray) -> FloatArray:
    """``concave_envelope`` of rows ``y`` (every one computed)."""
    count, size = y.shape
    row = np.arange(count)
    stack = np.zeros((count, size), dtype=np.int64)  # each row's hull vertices so far
    length = np.zeros(count, dtype=np.int64)
    for j in range(size):
        active = np.flatnonzero(j <= widths)
        cand = active[length[active] >= 2]  # rows that may pop, fewer each pass
        while len(cand):
            a, b = stack[cand, length[cand] - 2], stack[cand, length[cand] - 1]
            ya, yb = y[cand, a], y[cand, b]
            # b on or below the chord a → j: not a vertex of the upper hull.
            pop = (yb - ya) * (j - a) <= (y[cand, j] - ya) * (b - a)
            cand = cand[pop]
            length[cand] -= 1
            cand = cand[length[cand] >= 2]
        stack[active, length[active]] = j
        length[active] += 1
    vertex = np.zeros((count, size), dtype=bool)
    held = np.arange(size)[None, :] < length[:, None]
    vertex[np.repeat(row, length), stack[held]] = True
    col = np.arange(size)
    left = np.maximum.accumulate(np.where(vertex, col, 0), axis=1)
    right = np.minimum.accumulate(np.where(vertex, col, size - 1)[:, ::-1], axis=1)[:, ::-1]
    yl, yr = np.take_along_axis(y, left, axis=1), np.take_along_axis(y, right, axis=1)
    span = np.maximum(right - left, 1)
    env = yl + (yr - yl) * (col[None, :] - left) / span
    env = np.where(vertex, y, env)
    # Past the maximum the row keeps its own points (they are never valid increments).
    result: FloatArray = np.where(col[None, :] <= widths[:, None], env, y)
    return result
