"""The running elastic jobs as columns, built once per decision for the vectorised phases."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from scheduler_policy.models.curve import JobCurve
from scheduler_policy.models.goodput import GoodputColumns
from scheduler_policy.models.node_scaling import SYNC_TERMS, packed_nodes, sync_throughput
from scheduler_policy.models.scaling import usl_throughput
from scheduler_policy.vocabulary.state import JobKey, JobState, QueueName

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _held(current: FloatArray, scheduled: FloatArray) -> IntArray:
    """``JobState.held_replicas`` for every job at once (NaN scheduled: unknown, all held)."""
    held = np.where(np.isnan(scheduled), current, np.clip(scheduled, 0.0, current))
    return held.astype(np.int64)


@dataclass(frozen=True, slots=True)
class JobTable:
    """One entry per job in every column, aligned with ``jobs``.

    Attributes:
        jobs: the jobs.
        keys: each job's key.
        queue_names: the queues, sorted; ``queue_index`` points into it.
        queue_index: each job's queue.
        min_replicas: each job's minimum (never below 0).
        max_replicas: each job's maximum (never below its minimum).
        current: replicas now (the spec).
        held: replicas that hold GPUs (``JobState.held_replicas``), at most ``current``.
        gpus_per_replica: GPUs per replica.
        nonelastic_gpus: GPUs the job holds outside its scaling task.
        restart_cost_s: seconds a restart costs (the policy default where the job sets none).
        remaining_samples: samples left, NaN where unknown or the curve is not measured.
        running_since_s: when each job first ran, NaN where unknown.
        requested: the replicas each job's owner asked for, within [min, max]; its minimum
            where unknown.
        last_rescale_s: when the job was last rescaled, NaN for never.
        lam, sigma, kappa: each job's scaling curve.
        measured: whether the curve comes from the job's own measurements.
        shaped: whether it was measured at two or more sizes (its shape is the job's own).
        sync: each job's sync parameters (``JobCurve.sync``), one row per job; None when no
            curve has them (every job on the USL form).
        placed: whether each job's curve has them.
        cross_node_max: each job's cap across nodes, samples/s.
        gpus_per_node: the node size each job's sizes are packed on.
        goodput: the jobs whose curve is their goodput (progress per second, remaining work
            in progress: ``scheduler_policy.models.goodput``); None when no job adapts.
    """

    jobs: tuple[JobState, ...]
    keys: tuple[JobKey, ...]
    queue_names: tuple[QueueName, ...]
    queue_index: IntArray
    min_replicas: IntArray
    max_replicas: IntArray
    current: IntArray
    held: IntArray
    gpus_per_replica: FloatArray
    nonelastic_gpus: FloatArray
    restart_cost_s: FloatArray
    remaining_samples: FloatArray
    running_since_s: FloatArray
    requested: IntArray
    last_rescale_s: FloatArray
    lam: FloatArray
    sigma: FloatArray
    kappa: FloatArray
    measured: BoolArray
    shaped: BoolArray
    sync: FloatArray | None = None
    placed: BoolArray | None = None
    cross_node_max: FloatArray | None = None
    gpus_per_node: FloatArray | None = None
    goodput: GoodputColumns | None = None

    def throughput(self, n: FloatArray) -> FloatArray:
        """Each job's throughput at replica counts ``n`` (one row per job), on the nodes each
        count spans when packed (k × GPUs per replica on the job's node size)."""
        usl = usl_throughput(self.lam[:, None], self.sigma[:, None], self.kappa[:, None], n)
        if self.goodput is not None:
            usl = self.goodput.throughput(n, usl)
        if self.sync is None or self.placed is None:
            return usl
        assert self.cross_node_max is not None and self.gpus_per_node is not None
        m = packed_nodes(n, self.gpus_per_replica[:, None], self.gpus_per_node[:, None])
        placed = sync_throughput(
            lam=self.lam[:, None],
            terms=[self.sync[:, j, None] for j in range(self.sync.shape[1])],
            cross_node_max=self.cross_node_max[:, None],
            k=n,
            m=m,
        )
        result: FloatArray = np.where(self.placed[:, None], placed, usl)
        return result

    @classmethod
    def build(
        cls,
        jobs: Sequence[JobState],
        curves: Sequence[JobCurve],
        *,
        queue_names: Sequence[QueueName],
        default_restart_cost_s: float,
    ) -> JobTable:
        """Columns for ``jobs`` and their ``curves`` (aligned).

        Args:
            jobs: the jobs, each in one of ``queue_names``.
            curves: each job's scaling curve.
            queue_names: every queue a job may be in.
            default_restart_cost_s: the restart cost of jobs that set none.
        """

        count = len(jobs)

        def column(name: str, items: Sequence[object] = jobs) -> FloatArray:
            """Attribute ``name`` of every item as floats (None becomes NaN)."""
            return np.array(list(map(attrgetter(name), items)), dtype=np.float64)

        def integers(name: str, items: Sequence[object] = jobs) -> IntArray:
            """Attribute ``name`` of every item, never None, as integers."""
            return np.fromiter(map(attrgetter(name), items), dtype=np.int64, count=count)

        names = tuple(sorted(queue_names))
        index = {name: i for i, name in enumerate(names)}
        lo = np.maximum(integers("min_replicas"), 0)
        current = integers("current_replicas")
        measured = np.fromiter(map(attrgetter("measured"), curves), dtype=bool, count=count)
        goodput = GoodputColumns.of(list(map(attrgetter("goodput"), curves)))
        remaining = np.where(measured, column("remaining_samples"), np.nan)
        restart = column("restart_cost_s")
        hi = np.maximum(integers("max_replicas"), lo)
        asked = column("requested_replicas")
        requested = np.clip(np.where(np.isnan(asked), lo, asked), lo, hi).astype(np.int64)
        placed = np.array([bool(c.sync) for c in curves], dtype=bool)
        sync = None
        if placed.any():
            zeros = (0.0,) * len(SYNC_TERMS)
            sync = np.array([c.sync or zeros for c in curves], dtype=np.float64)
        return cls(
            jobs=tuple(jobs),
            keys=tuple(map(attrgetter("key"), jobs)),
            queue_names=names,
            queue_index=np.fromiter(
                map(index.__getitem__, map(attrgetter("queue"), jobs)), dtype=np.int64, count=count
            ),
            min_replicas=lo,
            max_replicas=hi,
            current=current,
            held=_held(current.astype(np.float64), column("scheduled_replicas")),
            gpus_per_replica=column("gpus_per_replica"),
            nonelastic_gpus=column("nonelastic_gpus"),
            restart_cost_s=np.where(np.isnan(restart), default_restart_cost_s, restart),
            remaining_samples=remaining if goodput is None else goodput.remaining(remaining),
            running_since_s=column("running_since_s"),
            requested=requested,
            last_rescale_s=column("last_rescale_s"),
            lam=column("lambda_samples_per_s", curves),
            sigma=column("sigma", curves),
            kappa=column("kappa", curves),
            measured=measured,
            shaped=integers("sizes", curves) >= 2,
            sync=sync,
            placed=placed if sync is not None else None,
            cross_node_max=column("cross_node_max_samples_per_s", curves),
            gpus_per_node=column("gpus_per_node", curves),
            goodput=goodput,
        )
