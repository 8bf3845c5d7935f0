"""How a job's throughput grows with its replicas and the nodes they span: compute plus sync.

A data-parallel step is the replica's compute followed by the gradient all-reduce; the
all-reduce costs little inside a node (NVLink or PCIe) and a lot across nodes (the network).
Per sample and replica, with k replicas on m nodes and X(k, m) the job's samples/s:

    k / X(k, m) = a                                              k = 1
                + p_r·(k − 1)/k + q_r·(k − 2)                    k ≥ 2, m = 1
                + (p_n + u_n/(m − 1))·(k − 1)/k + q_n·(k − 2)
                + h_n·(m − 2)                                     k ≥ 2, m ≥ 2
                + c·k·(k − 1)                                    k ≥ 2, any m

a = 1/λ is the compute time of one sample (λ the one-replica throughput). (k − 1)/k is a ring
all-reduce's bandwidth factor (each replica sends and receives 2(k − 1)/k of the gradient), so
p_r and p_n are the gradient's transfer time per sample over the node's and the network's links;
q_r, q_n the latency each further replica adds to the ring; h_n the latency each further node
adds; u_n the extra transfer time when few nodes carry the cross-node traffic (measured: Pollux's
2-node rings are the slowest of all); c the crosstalk of every pair of replicas (the Universal
Scalability Law's coherency, which alone makes throughput fall as replicas are added). All eight
are ≥ 0 and the law is linear in them, so a fit
is one non-negative least squares problem. The same form describes a job that keeps its global
batch fixed (weight then shifts from p to q), which is what tide's worker runtime does.

Parameters the points cannot identify (no point across nodes, or a single size in a tier) are
shrunk to a prior that is a multiple of a (``prior_*``): sync a fifth of the compute at large k,
inside a node as across nodes (Pollux measured 5–23% of a step inside a node and 32–73% across,
but clusters differ, and a prior that forbids crossing a node would never learn what crossing
costs). Until a job has been measured across nodes its predicted throughput on several nodes is
capped at (1 + cross_node_gain_cap) times its fitted throughput at the largest single-node size
measured, so growth across a node is a bounded bet whose first measurement replaces the prior.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import ThroughputPoint

FloatArray = npt.NDArray[np.float64]

SYNC_TERMS = (
    "intra_bandwidth", "intra_latency", "inter_bandwidth", "inter_few_nodes", "inter_latency",
    "inter_hop", "crosstalk",
)  # fmt: skip
"""The seven sync parameters, each as a multiple of a (dimensionless), in the design's order."""

CROSS_NODE_GAIN_CAP = 0.25
"""Default cap: a job not yet measured across nodes is predicted at most 25% faster on several
nodes than at its largest single-node size measured."""


def design(k: npt.ArrayLike, m: npt.ArrayLike) -> FloatArray:
    """The law's design matrix: one row per (k, m), columns [1, p_r, q_r, p_n, u_n, q_n, h_n, c]."""
    k_a = np.asarray(k, dtype=np.float64)
    m_a = np.asarray(m, dtype=np.float64)
    synced = k_a >= 2.0
    intra = synced & (m_a <= 1.0)
    inter = synced & (m_a > 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ring = np.where(synced, (k_a - 1.0) / k_a, 0.0)
        few = np.where(inter, 1.0 / np.maximum(m_a - 1.0, 1.0), 0.0)
    return np.stack(
        [
            np.ones_like(k_a),
            intra * ring,
            intra * (k_a - 2.0),
            inter * ring,
            few * ring,
            inter * (k_a - 2.0),
            inter * (m_a - 2.0),
            intra * k_a * (k_a - 1.0),
        ],
        axis=-1,
    )


def sync_throughput(
    *,
    lam: npt.ArrayLike,
    terms: Sequence[npt.ArrayLike],
    cross_node_max: npt.ArrayLike,
    k: npt.ArrayLike,
    m: npt.ArrayLike,
) -> FloatArray:
    """Throughput under the law, vectorised with numpy broadcasting.

    Args:
        lam: λ, one-replica throughput, samples/s.
        terms: the seven sync parameters (``SYNC_TERMS``), each a multiple of a = 1/λ.
        cross_node_max: the most throughput predicted on two or more nodes, samples/s (inf for
            no cap).
        k: replicas; below 1 the throughput is 0.
        m: nodes the replicas span (≥ 1).

    Returns:
        X(k, m) in samples/s, shaped as the broadcast inputs.
    """
    k_a = np.asarray(k, dtype=np.float64)
    m_a = np.asarray(m, dtype=np.float64)
    # ``design`` row by row, without building its stack (the allocator asks for every job at
    # every size at once): 1 + the intra- or the inter-node terms, per (k, m).
    p_r, q_r, p_n, u_n, q_n, h_n, c = (np.asarray(t, dtype=np.float64) for t in terms)
    k1 = np.maximum(k_a, 1.0)
    ring = (k1 - 1.0) / k1
    intra = p_r * ring + q_r * (k1 - 2.0) + c * k1 * (k1 - 1.0)
    one_node = m_a <= 1.0
    crosses = not one_node.all()  # else the inter-node terms and the cap would select nothing
    sync = intra
    if crosses:
        inter = (p_n + u_n / np.maximum(m_a - 1.0, 1.0)) * ring + q_n * (k1 - 2.0)
        inter = inter + h_n * (m_a - 2.0)
        sync = np.where(one_node, intra, inter)
    x = np.asarray(lam, dtype=np.float64) * k1 / (1.0 + np.where(k1 >= 2.0, sync, 0.0))
    if crosses:
        x = np.where((m_a > 1.0) & (k_a >= 2.0), np.minimum(x, cross_node_max), x)
    result: FloatArray = np.where(k_a >= 1.0, x, 0.0)
    return result


def packed_nodes(
    replicas: npt.ArrayLike, gpus_per_replica: npt.ArrayLike, gpus_per_node: npt.ArrayLike
) -> FloatArray:
    """Nodes that ``replicas`` span when packed: ceil(replicas × GPUs per replica / node size),
    at least 1 (an infinite node size: 1). Vectorised; the three broadcast."""
    gpus = np.asarray(replicas, dtype=np.float64) * np.asarray(gpus_per_replica, dtype=np.float64)
    size = np.asarray(gpus_per_node, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        nodes = np.where(np.isfinite(size) & (size > 0), np.ceil(gpus / size - 1e-9), 1.0)
    result: FloatArray = np.maximum(nodes, 1.0)
    return result


class NodeScalingModel(RegressorMixin, BaseEstimator):  # type: ignore[misc]  # sklearn is untyped
    """Throughput (samples/s) of one job as a function of its replicas and nodes.

    Args:
        prior_intra_bandwidth: p_r/a assumed before the job is measured at two sizes in a node.
        prior_intra_latency: q_r/a likewise.
        prior_inter_bandwidth: p_n/a assumed before the job is measured across nodes.
        prior_inter_few_nodes: u_n/a likewise.
        prior_inter_latency: q_n/a likewise.
        prior_inter_hop: h_n/a likewise.
        prior_crosstalk: c/a assumed before the job is measured at three sizes.
        prior_weight: w, the prior rows' weight, divided by the square of the number of
            distinct (replicas, nodes) measured, so the data take over as they accrue.
        cross_node_gain_cap: the cap's gain (see the module docstring); inf for none.

    Attributes:
        lambda_: λ = 1/a, fitted one-replica throughput, samples/s.
        terms_: the seven sync parameters (``SYNC_TERMS``), each a multiple of a.
        across_nodes_: whether a point with two or more replicas spanned two or more nodes.
        cross_node_max_: the cap on predicted throughput across nodes, samples/s (inf once
            measured across nodes).
        n_configs_: distinct (replicas, nodes) in the training data.
        relative_error_: mean |X̂ − X| / X over the training points.
    """

    def __init__(
        self,
        *,
        prior_intra_bandwidth: float = 0.2,
        prior_intra_latency: float = 0.0,
        prior_inter_bandwidth: float = 0.2,
        prior_inter_few_nodes: float = 0.0,
        prior_inter_latency: float = 0.0,
        prior_inter_hop: float = 0.0,
        prior_crosstalk: float = 0.0,
        prior_weight: float = 1.0,
        cross_node_gain_cap: float = CROSS_NODE_GAIN_CAP,
    ) -> None:
        self.prior_intra_bandwidth = prior_intra_bandwidth
        self.prior_intra_latency = prior_intra_latency
        self.prior_inter_bandwidth = prior_inter_bandwidth
        self.prior_inter_few_nodes = prior_inter_few_nodes
        self.prior_inter_latency = prior_inter_latency
        self.prior_inter_hop = prior_inter_hop
        self.prior_crosstalk = prior_crosstalk
        self.prior_weight = prior_weight
        self.cross_node_gain_cap = cross_node_gain_cap

    def _prior(self) -> FloatArray:
        names = [f"prior_{t}" for t in SYNC_TERMS] + ["prior_weight", "cross_node_gain_cap"]
        for name in names:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not math.isnan(value) and value >= 0
            if not ok or (name != "cross_node_gain_cap" and not math.isfinite(value)):
                raise ValueError(f"NodeScalingModel.{name}: must be a number >= 0, got {value!r}")
        return np.array([float(getattr(self, f"prior_{t}")) for t in SYNC_TERMS])

    def fit(self, X: Any, y: Any) -> NodeScalingModel:
        """Fit a and the seven sync parameters.

        Args:
            X: shape (n_samples, 2): replicas (≥ 1) and nodes spanned (≥ 1) per measurement.
            y: shape (n_samples,), measured throughput, samples/s (finite, > 0).

        Returns:
            self, fitted.

        Raises:
            ValueError: invalid hyperparameters, X or y (the message names the value).
            ModelFitError: the least-squares solve failed or gave an unusable a.
        """
        prior = self._prior()
        X_arr = np.asarray(X, dtype=np.float64)
        y_arr = np.asarray(y, dtype=np.float64).ravel()
        if X_arr.ndim != 2 or X_arr.shape[1] != 2 or X_arr.shape[0] != y_arr.size or not y_arr.size:
            raise ValueError(
                f"NodeScalingModel.fit: X must be (n, 2) replicas and nodes beside y (n,), "
                f"n >= 1; got X {X_arr.shape}, y {y_arr.shape}"
            )
        bad_x = ~np.isfinite(X_arr) | (X_arr < 1.0)
        if np.any(bad_x):
            row, col = (int(v[0]) for v in np.nonzero(bad_x))
            what = ("replicas", "nodes")[col]
            raise ValueError(
                f"NodeScalingModel.fit: {what} must be finite and >= 1, "
                f"got {X_arr[row, col]} (row {row})"
            )
        bad_y = ~np.isfinite(y_arr) | (y_arr <= 0)
        if np.any(bad_y):
            raise ValueError(
                "NodeScalingModel.fit: samples_per_s must be finite and > 0, "
                f"got {float(y_arr[bad_y][0])}"
            )
        # Repeated measurements of one (k, m): their median, robust to a slow or fast outlier.
        groups: dict[tuple[float, float], list[float]] = {}
        for (k, m), x in zip(X_arr.tolist(), y_arr.tolist(), strict=True):
            groups.setdefault((k, m), []).append(x)
        keys = sorted(groups)
        k_g = np.array([c[0] for c in keys])
        m_g = np.array([c[1] for c in keys])
        x_g = np.array([statistics.median(groups[c]) for c in keys])
        coef = self._solve(k_g, m_g, x_g, prior)
        a = float(coef[0])
        self.lambda_ = 1.0 / a
        self.terms_ = tuple(float(c) / a for c in coef[1:])
        self.across_nodes_ = bool(np.any((k_g >= 2) & (m_g >= 2)))
        self.n_configs_ = len(keys)
        self.cross_node_max_ = math.inf
        if not self.across_nodes_:
            # The cap: (1 + cap)·X̂(k1, 1), k1 the largest single-node size measured.
            k1 = float(k_g.max())
            self.cross_node_max_ = (1.0 + float(self.cross_node_gain_cap)) * float(
                self._predict(k1, 1.0)
            )
        pred = self._predict(X_arr[:, 0], X_arr[:, 1])
        self.relative_error_ = float(np.mean(np.abs(pred - y_arr) / y_arr))
        self.n_features_in_ = 2
        return self

    def _solve(self, k: FloatArray, m: FloatArray, x: FloatArray, prior: FloatArray) -> FloatArray:
        """Non-negative least squares on the linearised law plus the prior's rows.

        Returns:
            [a, p_r, q_r, p_n, u_n, q_n, h_n, c] in seconds per sample.

        Raises:
            ModelFitError: nnls failed, or a came out 0 or not finite.
        """
        t = k / x  # k / X(k, m), seconds per sample per replica
        cols = design(k, m)
        # Work in units of the prior's a0 so every row is dimensionless:
        # a0 = median over configurations of t / (1 + Σ prior_j·col_j).
        a0 = float(np.median(t / (cols @ np.concatenate([[1.0], prior]))))
        # Data rows divided by t: each residual is the relative error of k/X, ≈ that of X.
        rows = cols * (a0 / t)[:, None]
        target = np.ones_like(t)
        w = float(self.prior_weight) / k.size**2
        # Crosstalk needs four sizes on one node to be told from a, p_r and q_r (k = 1 among
        # them); below that its prior row is a hundredfold heavier, pinning c to its prior, so a
        # quadratic never extrapolates from a size or two.
        weights = np.ones(prior.size)
        if np.unique(k[m <= 1.0]).size < 4:
            weights[-1] = 100.0
        coef = np.zeros(cols.shape[1])
        for step in range(7):
            # Prior rows w·(c_j − prior_j·c_0) = 0: a term no data row touches equals its prior
            # times a exactly; one the data identify barely moves. The anchor w_a·(c_0 − 1) = 0
            # keeps a near a0 when no point has k = 1 (where a alone is measured); it grows
            # tenfold only while a is still 0: the weakest anchor that identifies a.
            w_a = w * 10.0**step
            prior_rows = np.zeros((prior.size + 1, cols.shape[1]))
            prior_rows[:-1, 0] = -w * weights * prior
            prior_rows[np.arange(prior.size), np.arange(1, prior.size + 1)] = w * weights
            prior_rows[-1, 0] = w_a
            A = np.vstack([rows, prior_rows])
            b = np.concatenate([target, np.zeros(prior.size), [w_a]])
            try:
                solved, _ = nnls(A, b)
            except (RuntimeError, ValueError) as e:
                raise ModelFitError(
                    f"NodeScalingModel.fit: nnls failed on {k.size} configurations: {e}"
                ) from e
            coef = np.asarray(solved, dtype=np.float64) * a0
            if coef[0] > 0 or w <= 0:
                break
        if not (np.all(np.isfinite(coef)) and coef[0] > 0):
            raise ModelFitError(
                f"NodeScalingModel.fit: a = 1/lambda came out {coef[0]} on replicas "
                f"{k.tolist()} and nodes {m.tolist()}; the data do not identify it"
            )
        return coef

    def _predict(self, k: npt.ArrayLike, m: npt.ArrayLike) -> FloatArray:
        return sync_throughput(
            lam=self.lambda_,
            terms=self.terms_,
            cross_node_max=getattr(self, "cross_node_max_", math.inf),
            k=k,
            m=m,
        )

    def predict(self, X: Any) -> FloatArray:
        """Throughput at the given replicas and nodes.

        Args:
            X: shape (n_samples, 2): replicas (≥ 1) and nodes (≥ 1).

        Returns:
            shape (n_samples,), samples/s.

        Raises:
            NotFittedError: before ``fit``.
            ValueError: X is not (n, 2) of finite values ≥ 1.
        """
        check_is_fitted(self)
        X_arr = np.asarray(X, dtype=np.float64)
        if X_arr.ndim != 2 or X_arr.shape[1] != 2 or np.any(~np.isfinite(X_arr) | (X_arr < 1.0)):
            raise ValueError(
                "NodeScalingModel.predict: X must be (n, 2) of finite values >= 1, "
                f"got {X_arr.tolist()[:3]}"
            )
        return self._predict(X_arr[:, 0], X_arr[:, 1])

    def throughput(self, replicas: float, nodes: float) -> float:
        """Predicted samples/s at ``replicas`` on ``nodes``.

        Raises:
            NotFittedError: before ``fit``.
        """
        check_is_fitted(self)
        return float(self._predict(replicas, nodes))

    @classmethod
    def from_points(
        cls,
        points: Sequence[ThroughputPoint],
        *,
        gpus_per_replica: float = 1.0,
        gpus_per_node: float = math.inf,
        **hyper: float,
    ) -> NodeScalingModel:
        """Fit a model to a job's throughput history.

        Args:
            points: the job's measurements; at least one.
            gpus_per_replica: the job's GPUs per replica, for points whose nodes are unknown.
            gpus_per_node: the cluster's node size; a point with unknown nodes is taken as
                packed on it (inf: one node).
            **hyper: ``NodeScalingModel`` hyperparameters.

        Returns:
            The fitted model.

        Raises:
            ValueError, ModelFitError: as ``fit``.
        """
        if not points:
            raise ValueError("NodeScalingModel.from_points: no points")
        replicas = np.array([float(p.replicas) for p in points])
        packed = packed_nodes(replicas, gpus_per_replica, gpus_per_node)
        nodes = np.array(
            [
                float(p.nodes) if p.nodes is not None else float(g)
                for p, g in zip(points, packed, strict=True)
            ]
        )
        y = np.array([p.samples_per_s for p in points], dtype=np.float64)
        return cls(**hyper).fit(np.column_stack([replicas, nodes]), y)
