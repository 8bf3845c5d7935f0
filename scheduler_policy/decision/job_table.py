"""The running elastic jobs as columns, built once per decision for the vectorised phases."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, is_
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from scheduler_policy.models.curve import CurveColumns, JobCurve
from scheduler_policy.models.goodput import GoodputColumns
from scheduler_policy.models.node_scaling import packed_nodes, sync_throughput
from scheduler_policy.models.scaling import usl_throughput
from scheduler_policy.vocabulary.state import JobKey, JobPhase, JobState, QueueName

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_T = TypeVar("_T", bound=np.generic)


def _floats(values: Sequence[float | None]) -> FloatArray:
    """``values`` as a float column, None as NaN.

    Where none or all are None (a column most jobs set, or none does), without numpy's
    conversion of a list that mixes numbers and None (0.6 ms at 10,000 jobs, against 0.15).
    """
    count = len(values)
    unset = values.count(None)
    if unset == count:
        return np.full(count, np.nan)
    if unset == 0:
        return np.fromiter(values, dtype=np.float64, count=count)
    return np.array(values, dtype=np.float64)


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
        rows: where each job is in the ``JobColumns`` it was built from (``from_columns``).
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
    rows: IntArray | None = None

    def throughput(self, n: FloatArray) -> FloatArray:
        """Each job's throughput at replica counts ``n`` (one row per job), on the nodes each
        count spans when packed (k × GPUs per replica on the job's node size)."""
        if self.sync is None or self.placed is None:
            return self._unplaced(n)
        assert self.gpus_per_node is not None
        m = packed_nodes(n, self.gpus_per_replica[:, None], self.gpus_per_node[:, None])
        crosses = (m > 1.0).any(axis=1)  # the jobs some count of which spans several nodes
        if crosses.all() or not crosses.any():
            placed = self._synced(np.arange(len(m)), n, m)
        else:
            # Apart, so that the inter-node terms are computed for those jobs only (the same
            # arithmetic on each entry): 4.1 ms against 3.3 for engine_latency.py's 10,000
            # jobs, 30% of them crossing (best of 40, side by side).
            n = np.broadcast_to(n, m.shape)
            placed = np.empty(m.shape)
            for rows in (np.flatnonzero(crosses), np.flatnonzero(~crosses)):
                placed[rows] = self._synced(rows, n[rows], m[rows])
        if self.placed.all():  # every curve has sync terms: no job reads the USL form
            return placed
        result: FloatArray = np.where(self.placed[:, None], placed, self._unplaced(n))
        return result

    def _synced(self, rows: IntArray, n: FloatArray, m: FloatArray) -> FloatArray:
        """The throughput of jobs ``rows`` at counts ``n`` (one row each) on ``m`` nodes, under
        their sync terms."""
        assert self.sync is not None and self.cross_node_max is not None
        sync = self.sync[rows]
        return sync_throughput(
            lam=self.lam[rows, None],
            terms=[sync[:, j, None] for j in range(sync.shape[1])],
            cross_node_max=self.cross_node_max[rows, None],
            k=n,
            m=m,
        )

    def _unplaced(self, n: FloatArray) -> FloatArray:
        """Each job's throughput at ``n`` under its USL form, goodput jobs' rows read from
        their goodput tables (a goodput curve has no sync terms)."""
        usl = usl_throughput(self.lam[:, None], self.sigma[:, None], self.kappa[:, None], n)
        if self.goodput is not None:
            usl = self.goodput.throughput(n, usl)
        return usl

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
        columns = JobColumns.read(jobs, queue_names=queue_names)
        return cls.from_columns(
            columns,
            np.arange(len(jobs), dtype=np.int64),
            CurveColumns.of(curves),
            default_restart_cost_s=default_restart_cost_s,
        )

    @classmethod
    def from_columns(
        cls,
        columns: JobColumns,
        rows: IntArray,
        curves: CurveColumns,
        *,
        default_restart_cost_s: float,
    ) -> JobTable:
        """The table of the jobs at ``rows`` of ``columns``, with their ``curves`` (aligned with
        ``rows``), each job in one of ``columns.queue_names``.

        Args:
            columns: every job of the observation, as columns.
            rows: the jobs to plan for, indices into ``columns.jobs``, in order.
            curves: each of those jobs' scaling curve.
            default_restart_cost_s: the restart cost of jobs that set none.
        """
        # Every job (rows, sorted and distinct, is then 0, 1, ..., n-1): no copy of a column.
        everything = len(rows) == len(columns.jobs)
        if everything:
            jobs, keys = columns.jobs, columns.keys
        else:
            picked = rows.tolist()
            jobs = tuple(map(columns.jobs.__getitem__, picked))
            keys = tuple(map(columns.keys.__getitem__, picked))

        def column(name: str) -> FloatArray:
            """Attribute ``name`` of every job as floats (None becomes NaN)."""
            return _floats(list(map(attrgetter(name), jobs)))

        def take(values: npt.NDArray[_T]) -> npt.NDArray[_T]:
            return values if everything else values[rows]

        lo = np.maximum(take(columns.min_replicas), 0)
        current = take(columns.current)
        measured = curves.measured
        goodput = curves.goodput
        remaining = np.where(measured, column("remaining_samples"), np.nan)
        restart = take(columns.restart_cost_s)
        hi = np.maximum(take(columns.max_replicas), lo)
        asked = column("requested_replicas")
        requested = np.clip(np.where(np.isnan(asked), lo, asked), lo, hi).astype(np.int64)
        placed = curves.placed
        sync = curves.sync if placed.any() else None
        return cls(
            jobs=jobs,
            keys=keys,
            queue_names=columns.queue_names,
            queue_index=take(columns.queue_index),
            min_replicas=lo,
            max_replicas=hi,
            current=current,
            held=_held(current.astype(np.float64), column("scheduled_replicas")),
            gpus_per_replica=take(columns.gpus_per_replica),
            nonelastic_gpus=column("nonelastic_gpus"),
            restart_cost_s=np.where(np.isnan(restart), default_restart_cost_s, restart),
            remaining_samples=remaining if goodput is None else goodput.remaining(remaining),
            running_since_s=column("running_since_s"),
            requested=requested,
            last_rescale_s=column("last_rescale_s"),
            lam=curves.lam,
            sigma=curves.sigma,
            kappa=curves.kappa,
            measured=measured,
            shaped=curves.sizes >= 2,
            sync=sync,
            placed=placed if sync is not None else None,
            cross_node_max=curves.cross_node_max,
            gpus_per_node=curves.gpus_per_node,
            rows=rows,
            goodput=goodput,
        )


# A job's phase as a small integer, for the columns: its index here. Looked up by identity
# (hashing a JobPhase is a Python-level call, hashing its id is not).
PHASE_CODES = tuple(JobPhase)
_PHASE_BY_ID = {id(phase): code for code, phase in enumerate(PHASE_CODES)}


@dataclass(frozen=True, slots=True)
class JobColumns:
    """Every job of an observation as columns, read once per decision: what triage, the job
    table and the budgets read of every job.

    Attributes:
        jobs: the jobs.
        keys: each job's key.
        queue_names: the queues the policy manages that the observation has, sorted.
        queue_index: each job's queue in ``queue_names``; ``OTHER_QUEUE`` for a queue the
            observation has that the policy does not manage, ``UNKNOWN_QUEUE`` for one it
            does not have (with ``queue_names`` given alone: any queue not in it).
        elastic: whether tide may change each job's replicas.
        phase: each job's phase, as its index in ``PHASE_CODES``.
        gpus_per_replica: GPUs per replica.
        min_replicas: each job's minimum, as given.
        max_replicas: each job's maximum, as given.
        current: replicas now (the spec).
        restart_cost_s: seconds a restart costs, NaN where the job sets none.
        valid: True only where ``JobState.spec_problems`` is empty (a False may still be valid:
            triage asks the job itself then).
    """

    jobs: tuple[JobState, ...]
    keys: tuple[JobKey, ...]
    queue_names: tuple[QueueName, ...]
    queue_index: IntArray
    elastic: BoolArray
    phase: npt.NDArray[np.int8]
    gpus_per_replica: FloatArray
    min_replicas: IntArray
    max_replicas: IntArray
    current: IntArray
    restart_cost_s: FloatArray
    valid: BoolArray

    @classmethod
    def read(
        cls,
        jobs: Sequence[JobState],
        *,
        queue_names: Sequence[QueueName],
        other_queues: Collection[QueueName] = (),
    ) -> JobColumns:
        """The columns of ``jobs``: one pass over them per attribute.

        Args:
            jobs: the jobs, in the observation's order.
            queue_names: the queues the policy manages that the observation has.
            other_queues: the observation's other queues.

        Returns:
            One entry per job in every column.
        """
        jobs = tuple(jobs)
        count = len(jobs)
        names = tuple(sorted(queue_names))
        codes = dict.fromkeys(other_queues, OTHER_QUEUE)
        codes.update((name, i) for i, name in enumerate(names))

        def integers(name: str) -> IntArray:
            return np.fromiter(map(attrgetter(name), jobs), dtype=np.int64, count=count)

        phase = np.fromiter(
            map(_PHASE_BY_ID.__getitem__, map(id, map(attrgetter("phase"), jobs))),
            dtype=np.int8,
            count=count,
        )
        gpr = np.fromiter(map(attrgetter("gpus_per_replica"), jobs), dtype=np.float64, count=count)
        lo, hi = integers("min_replicas"), integers("max_replicas")
        current = integers("current_replicas")
        restarts = list(map(attrgetter("restart_cost_s"), jobs))
        restart = _floats(restarts)
        unset = np.isnan(restart)
        if restarts.count(None) != int(unset.sum()):  # a NaN cost, not None: not valid
            unset = np.fromiter(map(is_, restarts, repeat(None)), dtype=bool, count=count)
        problems = np.fromiter(
            map(bool, map(attrgetter("read_problems"), jobs)), dtype=bool, count=count
        )
        # ``JobState.spec_problems``' first test, on every job at once.
        valid = (
            ~problems
            & (gpr >= 0)
            & (gpr < np.inf)
            & (lo >= 0)
            & (lo <= hi)
            & (current >= 0)
            & (unset | (restart >= 0))
        )
        return cls(
            jobs=jobs,
            keys=tuple(map(attrgetter("key"), jobs)),
            queue_names=names,
            queue_index=np.fromiter(
                map(codes.get, map(attrgetter("queue"), jobs), repeat(UNKNOWN_QUEUE)),
                dtype=np.int64,
                count=count,
            ),
            elastic=np.fromiter(map(attrgetter("elastic"), jobs), dtype=bool, count=count),
            phase=phase,
            gpus_per_replica=gpr,
            min_replicas=lo,
            max_replicas=hi,
            current=current,
            restart_cost_s=restart,
            valid=valid,
        )


OTHER_QUEUE = -1
"""``JobColumns.queue_index`` of a queue the observation has and the policy does not manage."""
UNKNOWN_QUEUE = -2
"""``JobColumns.queue_index`` of a queue the observation does not have."""
