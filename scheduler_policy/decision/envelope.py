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

# Cells of the (row, a, b) cube computed at once: bounds memory at ~16 MB a chunk.
_CHUNK_CELLS = 2_000_000


def concave_envelope(x: FloatArray, widths: IntArray) -> FloatArray:
    """The least concave majorant of each row of ``x`` over its first ``widths + 1`` points.

    Row i is a curve sampled at unit steps, ``x[i, 0..widths[i]]``; the rest of the row is
    past the job's maximum and is returned unchanged. The majorant's slopes are the
    non-increasing (antitonic) regression of the curve's increments ``d`` with equal weights
    (Grenander's construction), given by the min-max formula
    ``slope(j) = min over a ≤ j of max over b ≥ j of mean(d[a..b])``. Only rows whose
    increments rise somewhere are computed (O(width²) each); a concave row is returned as it
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
    if len(rows) == 0:
        return out
    # Rows in chunks of at most ~2M cells of the (row, a, b) cube, so memory stays bounded.
    chunk = max(1, _CHUNK_CELLS // (d.shape[1] * d.shape[1]))
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        out[part] = _envelope_rows(x[part], d[part], valid[part])
    return out


def _envelope_rows(x: FloatArray, d: FloatArray, valid: BoolArray) -> FloatArray:
    """``concave_envelope`` of rows ``x`` with increments ``d``, valid where ``valid``."""
    cols = np.arange(d.shape[1])
    csum = np.cumsum(np.where(valid, d, 0.0), axis=1)
    csum = np.concatenate((np.zeros((len(x), 1)), csum), axis=1)
    a, b = cols[:, None], cols[None, :]
    # mean[r, a, b] = mean of d[a..b] for a ≤ b ≤ the row's last valid increment, else -inf.
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (csum[:, None, 1:] - csum[:, :-1, None]) / (b - a + 1.0)
    mean = np.where((b >= a)[None] & valid[:, None, :], mean, -np.inf)
    # Max over b ≥ j (a reverse running max along b), then min over a ≤ j.
    upper = np.maximum.accumulate(mean[:, :, ::-1], axis=2)[:, :, ::-1]
    slope = np.where((a <= b)[None], upper, np.inf).min(axis=1)
    env = x.copy()
    # Past the maximum the row keeps its own points (they are never valid increments).
    env[:, 1:] = np.where(
        valid, x[:, :1] + np.cumsum(np.where(valid, slope, 0.0), axis=1), x[:, 1:]
    )
    return env
