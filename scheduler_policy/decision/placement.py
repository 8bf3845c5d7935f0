"""Placement-aware shrink: free a pending gang's shape on whole nodes, not a count of GPUs.

Volcano deletes the highest task indices on a scale-down, and its default node order spreads
pods, so a shrink that frees enough GPUs in all can leave every node short of one gang pod
(``../shared/volcano-wire/v1.15.1/README.md``, "Placement": 24 one-GPU pods spread 6 per node
over 4 nodes of 8, shrunk to 8, kept 2 on every node, and a gang of 3 × 8 was never placed).

Given the nodes' free GPUs, each elastic job's pods (task index, node, GPUs) and the targets the
pipeline settled on, ``plan_gang_shape`` computes the free GPUs per node after those shrinks (a
job shrunk to t loses its pods of index ≥ t), places the pending gangs on them oldest first as
Volcano's allocate would, and, for a gang that does not fit, searches for the cheapest further
shrink that makes it fit. ``reshape`` is its integration in ``decide``. Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_policy.vocabulary.state import (
    GPU_EPSILON,
    JobKey,
    NodeState,
    PendingGang,
    PodPlacement,
)

# The most moves (further shrinks of one job) the search makes for one gang before it gives up:
# each move gains the gang at least one pod's room or brings a node closer to it, so a gang of
# k pods rarely needs more than a few times k.
MAX_MOVES = 256
_EVERY_INDEX = 2**62


@dataclass(frozen=True, slots=True)
class ShapeJob:
    """An elastic job as the shape problem sees it.

    Attributes:
        key: the job.
        pods: its scaling task's pods (task index, node, GPUs); pods on no node, or on a node
            the problem does not know, free nothing where a gang could use it.
        current_replicas: replicas its spec asks for now; pods of index ≥ this are already on
            their way out, and their GPUs count as free.
        target_replicas: the target the pipeline settled on.
        floor_replicas: the fewest replicas a further shrink may leave it with (its minimum,
            or what the damping allows); at or above ``target_replicas`` it is not shrunk
            further.
        sigma: its scaling curve's contention σ (breaks ties between equally costly shrinks).
        kappa: its scaling curve's coherency κ.
    """

    key: JobKey
    pods: tuple[PodPlacement, ...]
    current_replicas: int
    target_replicas: int
    floor_replicas: int
    sigma: float = 0.0
    kappa: float = 0.0


@dataclass(frozen=True, slots=True)
class GangFit:
    """What the shape problem found for one pending gang.

    Attributes:
        gang: the gang.
        fits: whether its pods fit the free GPUs per node after the plan's targets.
        fits_settled: whether they fit under the settled targets alone (no further shrink).
        nodes: the nodes its pods go to, in order; empty when it does not fit.
        freed_nodes: those of ``nodes`` that the further shrinks freed room on.
        extra_gpus: GPUs the further shrinks made for it give up beyond the settled targets.
        shrunk: the jobs shrunk further for it.
        problem: why it does not fit (a sentence); None when it fits.
    """

    gang: PendingGang
    fits: bool
    fits_settled: bool
    nodes: tuple[str, ...] = ()
    freed_nodes: tuple[str, ...] = ()
    extra_gpus: float = 0.0
    shrunk: tuple[JobKey, ...] = ()
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class ShapePlan:
    """The answer of the shape problem.

    Attributes:
        targets: each job's target after the further shrinks (the settled target where none).
        extra_gpus: per job shrunk further, GPUs it gives up beyond its settled target.
        gangs: one entry per gang, in the order given.
        free_gpus: free GPUs per node after the targets, before any gang is placed.
    """

    targets: Mapping[JobKey, int]
    extra_gpus: Mapping[JobKey, float]
    gangs: tuple[GangFit, ...]
    free_gpus: Mapping[str, float]

    @property
    def shrunk(self) -> dict[JobKey, int]:
        """The jobs shrunk further, and their new targets."""
        return {key: self.targets[key] for key in self.extra_gpus}


def place_gang(
    free_gpus: dict[str, float], gang: PendingGang, *, order: Mapping[str, int]
) -> list[str] | None:
    """Place one gang's pods as Volcano's allocate would with its default (spread) node order.

    Each pod goes to the node with the most free GPUs (ties to the node listed first); a gang
    starts whole or not at all. With pods of one size, whether the gang fits does not depend on
    the order (each node takes ⌊free / size⌋ of them); which nodes it takes does, and that
    matters to the gangs placed after it.

    Args:
        free_gpus: free GPUs per node; the gang's pods are taken from it when it fits.
        gang: the gang.
        order: each node's position, for ties.

    Returns:
        The node of each pod, or None when the gang does not fit (``free_gpus`` unchanged).
    """
    size = gang.gpus_per_pod
    if gang.min_member <= 0 or size <= GPU_EPSILON:
        return []
    heap = [(-free, order[name], name) for name, free in free_gpus.items()]
    heapq.heapify(heap)
    chosen: list[str] = []
    for _ in range(gang.min_member):
        if not heap or -heap[0][0] < size - GPU_EPSILON:
            return None
        free, position, name = heapq.heappop(heap)
        chosen.append(name)
        heapq.heappush(heap, (free + size, position, name))
    for name in chosen:
        free_gpus[name] -= size
    return chosen


def place_gangs(
    free_gpus: Mapping[str, float], gangs: Sequence[PendingGang]
) -> list[list[str] | None]:
    """Place gangs oldest first on ``free_gpus`` (``place_gang``); one that does not fit takes
    nothing and the next is tried.

    Args:
        free_gpus: free GPUs per node (not changed).
        gangs: the gangs, oldest first.

    Returns:
        Per gang, the node of each pod, or None when it does not fit.
    """
    left = dict(free_gpus)
    order = {name: i for i, name in enumerate(free_gpus)}
    return [place_gang(left, gang, order=order) for gang in gangs]


class _Pods:
    """Each job's pods on known nodes, by index, to read what a shrink frees where."""

    def __init__(self, jobs: Sequence[ShapeJob], nodes: Mapping[str, float]) -> None:
        self.jobs = {job.key: job for job in jobs}
        self.indices: dict[JobKey, list[int]] = {}
        self.placed: dict[JobKey, list[tuple[str, float]]] = {}
        for job in jobs:
            pods = sorted(
                (pod.index, pod.node, pod.gpus)
                for pod in job.pods
                if pod.node is not None and pod.node in nodes and pod.gpus > 0
            )
            self.indices[job.key] = [index for index, _, _ in pods]
            self.placed[job.key] = [(node, gpus) for _, node, gpus in pods]

    def cut(self, key: JobKey, target: int) -> int:
        """The index below which a job at ``target`` keeps its pods."""
        return max(0, min(target, self.jobs[key].current_replicas))

    def between(self, key: JobKey, low: int, high: int) -> list[tuple[int, str, float]]:
        """The job's pods with ``low ≤ index < high``, highest index first."""
        indices = self.indices[key]
        start, stop = bisect_left(indices, low), bisect_left(indices, high)
        placed = self.placed[key]
        return [(indices[k], *placed[k]) for k in range(stop - 1, start - 1, -1)]

    def free(self, base: Mapping[str, float], targets: Mapping[JobKey, int]) -> dict[str, float]:
        """Free GPUs per node with every job at its target."""
        out = dict(base)
        for key in self.jobs:
            for _, node, gpus in self.between(key, self.cut(key, targets[key]), _EVERY_INDEX):
                out[node] += gpus
        return out

    def freed(self, key: JobKey, *, high: int, low: int) -> list[tuple[int, str, float]]:
        """Pods a job moving from target ``high`` to ``low`` gives up, highest index first."""
        return self.between(key, self.cut(key, low), self.cut(key, high))


def _fits(free: Mapping[str, float], gangs: Sequence[PendingGang]) -> bool:
    return all(nodes is not None for nodes in place_gangs(free, gangs))


def _residual(free: Mapping[str, float], gangs: Sequence[PendingGang]) -> dict[str, float]:
    """Free GPUs per node once ``gangs`` are placed (those that fit)."""
    left = dict(free)
    order = {name: i for i, name in enumerate(free)}
    for gang in gangs:
        place_gang(left, gang, order=order)
    return left


def _slots(free: float, size: float) -> int:
    return math.floor((free + GPU_EPSILON) / size)


def _lost(job: ShapeJob, *, old: int, new: int) -> float:
    """The share of the job's throughput lost going from ``old`` to ``new`` replicas (USL)."""

    def x(n: int) -> float:
        return n / (1 + job.sigma * (n - 1) + job.kappa * n * (n - 1)) if n > 0 else 0.0

    return 1.0 - x(new) / x(old) if old > 0 and x(old) > 0 else 0.0


def _next_move(
    pods: _Pods,
    residual: Mapping[str, float],
    targets: Mapping[JobKey, int],
    *,
    size: float,
) -> tuple[JobKey, int] | None:
    """The next further shrink for a gang of pods of ``size`` GPUs, as (job, new target).

    The move that gains the gang one more pod's room for the fewest GPUs (a job's pods given up
    highest index first until some node can take one more), then the least throughput lost;
    when no job alone can, the one whose next pod brings a node closest to taking one. None
    when no job can give up a pod on a known node.
    """
    best: tuple[float, float, str, int] | None = None
    nearest: tuple[float, float, float, str, int] | None = None
    for key, job in pods.jobs.items():
        target = targets[key]
        if target <= job.floor_replicas:
            continue
        added: dict[str, float] = {}
        cost = 0.0
        first = True
        for index, node, gpus in pods.freed(key, high=target, low=job.floor_replicas):
            before = residual[node] + added.get(node, 0.0)
            after = before + gpus
            added[node] = added.get(node, 0.0) + gpus
            cost += gpus
            lost = _lost(job, old=target, new=index)
            if first:  # how close the job's next pod brings its node to taking one more
                first = False
                need = size - (after - size * _slots(after, size))
                candidate = (need, cost, lost, key, index)
                nearest = candidate if nearest is None or candidate < nearest else nearest
            if _slots(after, size) > _slots(before, size):
                move = (cost, lost, key, index)
                best = move if best is None or move < best else best
                break
    if best is not None:
        return JobKey(best[2]), best[3]
    if nearest is not None:
        return JobKey(nearest[3]), nearest[4]
    return None


def _extra_gpus(
    pods: _Pods, before: Mapping[JobKey, int], after: Mapping[JobKey, int]
) -> dict[JobKey, float]:
    """Per job shrunk further, the GPUs on known nodes it gives up going from before to after."""
    out = {}
    for key in pods.jobs:
        if after[key] < before[key]:
            out[key] = sum(g for _, _, g in pods.freed(key, high=before[key], low=after[key]))
    return out


def _search(
    pods: _Pods,
    base: Mapping[str, float],
    targets: dict[JobKey, int],
    *,
    served: Sequence[PendingGang],
    gang: PendingGang,
    max_moves: int,
) -> dict[JobKey, int] | None:
    """Further shrinks that make ``gang`` fit after the ``served`` ones, cheapest first
    (``_next_move``), then each job given back what the fit does not need; None when none do
    within ``max_moves``."""
    trial = [*served, gang]
    found = dict(targets)
    free = pods.free(base, found)
    for _ in range(max_moves):
        if _fits(free, trial):
            break
        move = _next_move(pods, _residual(free, served), found, size=gang.gpus_per_pod)
        if move is None:
            return None
        key, target = move
        for _, node, gpus in pods.freed(key, high=found[key], low=target):
            free[node] += gpus
        found[key] = target
    else:
        if not _fits(free, trial):
            return None
    # Give back, job by job, the replicas the fit does not need (a move may overshoot).
    for key in sorted(k for k in found if found[k] < targets[k]):
        for keep in range(targets[key], found[key], -1):
            lost = pods.freed(key, high=keep, low=found[key])
            attempt = dict(free)
            for _, node, gpus in lost:
                attempt[node] -= gpus
            if _fits(attempt, trial):
                free, found[key] = attempt, keep
                break
    return found


def plan_gang_shape(
    *,
    nodes: Sequence[NodeState],
    jobs: Sequence[ShapeJob],
    gangs: Sequence[PendingGang],
    max_moves: int = MAX_MOVES,
) -> ShapePlan:
    """The further shrinks that leave the pending gangs' pods room on whole nodes.

    Gangs are served oldest first. One that fits the free GPUs per node after the settled
    targets (and after the gangs before it) costs nothing. For one that does not, the search
    shrinks the jobs further (never below their floor), cheapest first in GPUs given up
    (``_next_move``), until it fits, then gives back what the fit does not need. A gang that
    cannot fit even with every job at its floor, or within ``max_moves``, changes nothing.

    Args:
        nodes: the GPU nodes with their free GPUs now.
        jobs: the elastic jobs with their pods and settled targets; each key once.
        gangs: the pending gangs, oldest first.
        max_moves: the most moves the search makes for one gang.

    Returns:
        The targets, what each further shrink costs, and each gang's fit.

    Raises:
        ValueError: when a job is listed twice or ``max_moves`` is below 1.
    """
    if max_moves < 1:
        raise ValueError(f"max_moves: must be >= 1, got {max_moves}")
    if len({job.key for job in jobs}) != len(jobs):
        raise ValueError("jobs: a job is listed twice")
    base: dict[str, float] = {}
    for node in nodes:
        base.setdefault(node.name, max(0.0, node.free_gpus))
    pods = _Pods(jobs, base)
    settled = {job.key: job.target_replicas for job in jobs}
    targets = dict(settled)
    floors = {job.key: min(job.floor_replicas, job.target_replicas) for job in jobs}
    served: list[PendingGang] = []
    problems: dict[str, str] = {}
    made_for: dict[str, dict[JobKey, float]] = {}
    for gang in gangs:
        trial = [*served, gang]
        free = pods.free(base, targets)
        if _fits(free, trial):
            served.append(gang)
            continue
        if not _fits(pods.free(base, floors), trial):
            problems[gang.key] = (
                "it does not fit the nodes even with every elastic job that may shrink at its floor"
            )
            continue
        found = _search(pods, base, targets, served=served, gang=gang, max_moves=max_moves)
        if found is None:
            problems[gang.key] = f"no shrink within {max_moves} moves makes it fit"
            continue
        made_for[gang.key] = _extra_gpus(pods, targets, found)
        targets = found
        served.append(gang)
    free_final = pods.free(base, targets)
    free_settled = pods.free(base, settled)
    final = place_gangs(free_final, gangs)
    at_settled = place_gangs(free_settled, gangs)
    fits = []
    for gang, placed, plain in zip(gangs, final, at_settled, strict=True):
        extra = made_for.get(gang.key, {})
        where = tuple(dict.fromkeys(placed or ()))
        freed = tuple(n for n in where if free_final[n] > free_settled[n] + GPU_EPSILON)
        problem = None if placed is not None else problems.get(gang.key, "it no longer fits")
        fits.append(
            GangFit(
                gang=gang,
                fits=placed is not None,
                fits_settled=plain is not None,
                nodes=where,
                freed_nodes=freed if extra else (),
                extra_gpus=sum(extra.values()),
                shrunk=tuple(sorted(extra)),
                problem=problem,
            )
        )
    return ShapePlan(
        targets=targets,
        extra_gpus=_extra_gpus(pods, settled, targets),
        gangs=tuple(fits),
        free_gpus=free_final,
    )
