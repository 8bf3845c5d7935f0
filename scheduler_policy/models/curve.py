"""What fitting a job's scaling model yields for the decision core: its curve's parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_policy.models.goodput import GoodputCurve, tabulated
from scheduler_policy.models.node_scaling import packed_nodes, sync_throughput
from scheduler_policy.models.scaling import usl_throughput

FloatArray = npt.NDArray[np.float64]


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
