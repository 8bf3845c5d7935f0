"""What fitting a job's scaling model yields for the decision core: its curve's parameters."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from scheduler_policy.models.goodput import GoodputColumns, GoodputCurve, tabulated
from scheduler_policy.models.node_scaling import SYNC_TERMS, packed_nodes, sync_throughput
from scheduler_policy.models.scaling import usl_throughput

FloatArray = npt.NDArray[np.float64]

# A curve's figures as one row of doubles (``JobCurve.packed``): λ, σ, κ, measured, sizes, the
# cross-node cap, the node size, whether it has sync terms, whether it is a goodput curve, then
# the sync terms (zeros if none).
_ROW = struct.Struct(f"<{9 + len(SYNC_TERMS)}d")
_NO_SYNC = (0.0,) * len(SYNC_TERMS)


@dataclass(frozen=True, slots=True)
class JobCurve:
    """A job's fitted scaling curve.

    With ``sync`` set, X(k) is ``NodeScalingModel``'s law at k replicas on the nodes they span
    when packed (k × GPUs per replica on ``gpus_per_node``); without, the Universal Scalability
    Law X(n) = λn / (1 + σ(n−1) + κn(n−1)).

    Attributes:
        lambda_samples_per_s: λ, throughput of one replica (1.0 when ``measured`` is False).
        sigma: σ, contention (with ``sync``: the single-node curve's, matched at two replicas,
            for the placement code that ranks shrinks by it).
        kappa: κ, coherency delay.
        measured: whether λ comes from the job's own measurements.
        sizes: distinct replica counts the curve was fitted on (0 for the prior); from two on,
            its shape is the job's own too.
        sync: the seven sync parameters of ``NodeScalingModel`` (``SYNC_TERMS``), each a multiple
            of 1/λ; empty for the USL form.
        cross_node_max_samples_per_s: the cap on predicted throughput on two or more nodes
            (inf once the job was measured across nodes).
        gpus_per_node: the cluster's node size the sizes are packed on (inf: one node).
        goodput: set when the curve is an adaptive-batch job's goodput
            (``scheduler_policy.models.goodput``): X(k) is then G(k), progress per second at
            the batch the worker would take, and its table serves every size.
    """

    lambda_samples_per_s: float
    sigma: float
    kappa: float
    measured: bool
    sizes: int = 0
    sync: tuple[float, ...] = ()
    cross_node_max_samples_per_s: float = math.inf
    gpus_per_node: float = math.inf
    goodput: GoodputCurve | None = None
    packed: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The curve's figures packed once, when it is fitted: a decision reads the curves of all
        # its jobs as columns (``CurveColumns.of``) by joining these rows, 0.2 ms at 10,000 jobs
        # against 15-20 ms for nine attribute passes and a 10,000 × 7 array of the sync terms.
        if self.sync and len(self.sync) != len(SYNC_TERMS):
            raise ValueError(
                f"sync: expected the {len(SYNC_TERMS)} terms {SYNC_TERMS}, got {self.sync!r}"
            )
        sync = self.sync if self.sync else _NO_SYNC
        row = (
            self.lambda_samples_per_s,
            self.sigma,
            self.kappa,
            float(self.measured),
            float(self.sizes),
            self.cross_node_max_samples_per_s,
            self.gpus_per_node,
            float(bool(self.sync)),
            float(self.goodput is not None),
            *sync,
        )
        object.__setattr__(self, "packed", _ROW.pack(*row))

    def throughput(
        self,
        replicas: npt.ArrayLike,
        *,
        gpus_per_replica: npt.ArrayLike,
        nodes: npt.ArrayLike | None = None,
    ) -> FloatArray:
        """X at ``replicas``, samples/s (curve units when not measured).

        Args:
            replicas: replica counts.
            gpus_per_replica: the job's GPUs per replica (for the packed node count).
            nodes: the nodes spanned; None for the packed count on ``gpus_per_node``.
        """
        if self.goodput is not None:
            return tabulated(self.goodput.progress_per_s, replicas)
        if not self.sync:
            return usl_throughput(self.lambda_samples_per_s, self.sigma, self.kappa, replicas)
        m = packed_nodes(replicas, gpus_per_replica, self.gpus_per_node) if nodes is None else nodes
        return sync_throughput(
            lam=self.lambda_samples_per_s,
            terms=self.sync,
            cross_node_max=self.cross_node_max_samples_per_s,
            k=replicas,
            m=m,
        )


@dataclass(frozen=True, slots=True)
class CurveColumns:
    """The curves of many jobs as columns, one entry per job (``JobTable`` reads them).

    Attributes:
        lam: λ of each curve.
        sigma: σ of each curve.
        kappa: κ of each curve.
        measured: whether each curve comes from its job's own measurements.
        sizes: the distinct replica counts each curve was fitted on.
        cross_node_max: each curve's cap across nodes, samples/s.
        gpus_per_node: the node size each curve packs its sizes on.
        placed: whether each curve has sync terms (``JobCurve.sync``).
        sync: each curve's sync terms, one row per curve (zeros where it has none).
        goodput: the goodput curves among them (``scheduler_policy.models.goodput``); None when
            no job adapts its batch.
    """

    lam: FloatArray
    sigma: FloatArray
    kappa: FloatArray
    measured: npt.NDArray[np.bool_]
    sizes: npt.NDArray[np.int64]
    cross_node_max: FloatArray
    gpus_per_node: FloatArray
    placed: npt.NDArray[np.bool_]
    sync: FloatArray
    goodput: GoodputColumns | None = None

    @classmethod
    def of(cls, curves: Sequence[JobCurve]) -> CurveColumns:
        """The columns of ``curves``, in their order.

        Args:
            curves: the curves.

        Returns:
            One entry per curve in every column.
        """
        rows = np.frombuffer(b"".join(map(attrgetter("packed"), curves)), dtype="<f8")
        # Column-major, so that each column is contiguous (the allocator's arithmetic on the
        # columns runs ~10% faster than on strided views of the rows).
        table = rows.reshape(len(curves), _ROW.size // 8).astype(np.float64, order="F")
        return cls(
            lam=table[:, 0],
            sigma=table[:, 1],
            kappa=table[:, 2],
            measured=table[:, 3] != 0.0,
            sizes=table[:, 4].astype(np.int64),
            cross_node_max=table[:, 5],
            gpus_per_node=table[:, 6],
            placed=table[:, 7] != 0.0,
            sync=table[:, 9:],
            # Read from the curves only where one adapts its batch (most rounds, none does).
            goodput=(
                GoodputColumns.of(list(map(attrgetter("goodput"), curves)))
                if table[:, 8].any()
                else None
            ),
        )
