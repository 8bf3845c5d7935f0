"""The search behind ``placement.plan_gang_shape``: further shrinks that give a gang room.

A move gives one node room for one more of the gang's pods, for the fewest GPUs given up in
all: over the nodes lacking the fewest GPUs first, the cheapest choice of per-job shrinks (each
job gives up its pods highest index first, wherever they are). Moves repeat until the gang fits;
then each job gets back what the fit does not need. Pure.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler_policy.decision.gang_placement import place_gang, place_gangs
from scheduler_policy.vocabulary.state import GPU_EPSILON, JobKey, PendingGang

if TYPE_CHECKING:
    from scheduler_policy.decision.placement import ShapeJob

_EVERY_INDEX = 2**62


class PodIndex:
    """Each job's pods on known nodes, by index, to read what a shrink frees where.

    Args:
        jobs: the jobs of the shape problem, each key once.
        nodes: the known nodes (free GPUs by name); pods elsewhere, on no node, or asking no
            GPUs are left out.
    """

    def __init__(self, jobs: Sequence[ShapeJob], nodes: Mapping[str, float]) -> None:
        self.jobs = {job.key: job for job in jobs}
        self.indices: dict[JobKey, list[int]] = {}
        self.placed: dict[JobKey, list[tuple[str, float]]] = {}
        self.on_node: dict[str, list[JobKey]] = {}
        self.sums: dict[JobKey, list[float]] = {}
        self.here: dict[tuple[JobKey, str], list[tuple[int, float]]] = {}
        for job in jobs:
            pods = sorted(
                (pod.index, pod.node, pod.gpus)
                for pod in job.pods
                if pod.node is not None and pod.node in nodes and pod.gpus > 0
            )
            self.indices[job.key] = [index for index, _, _ in pods]
            self.placed[job.key] = [(node, gpus) for _, node, gpus in pods]
            sums = [0.0]
            for index, node, gpus in pods:
                sums.append(sums[-1] + gpus)
                self.here.setdefault((job.key, node), []).append((index, gpus))
            self.sums[job.key] = sums
            for node in dict.fromkeys(node for _, node, _ in pods):
                self.on_node.setdefault(node, []).append(job.key)

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

    def given_up(self, key: JobKey, *, high: int, low: int) -> float:
        """GPUs a job moving from target ``high`` to ``low`` gives up on known nodes."""
        indices, sums = self.indices[key], self.sums[key]
        start = bisect_left(indices, self.cut(key, low))
        return sums[bisect_left(indices, self.cut(key, high))] - sums[start]

    def freed(self, key: JobKey, *, high: int, low: int) -> list[tuple[int, str, float]]:
        """Pods a job moving from target ``high`` to ``low`` gives up, highest index first."""
        return self.between(key, self.cut(key, low), self.cut(key, high))


def all_fit(free: Mapping[str, float], gangs: Sequence[PendingGang]) -> bool:
    """Whether every one of ``gangs``, placed oldest first, fits ``free`` (GPUs per node)."""
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


# A choice of further shrinks: (GPUs given up, throughput lost, the (job, new target) pairs).
_Choice = tuple[float, float, tuple[tuple[JobKey, int], ...]]


def _room(free: float, size: float) -> float:
    """GPUs a node with ``free`` GPUs lacks to take one more pod of ``size``."""
    return size * (_slots(free, size) + 1) - free


def _node_options(
    pods: PodIndex, targets: Mapping[JobKey, int], *, node: str, need: float
) -> list[list[tuple[float, float, float, JobKey, int]]]:
    """Per job with pods on ``node`` above its floor, the shrinks that free GPUs there: each
    (GPUs freed on the node, GPUs given up in all, throughput lost, job, new target), further
    and further down, until the node has ``need``."""
    out = []
    for key in pods.on_node.get(node, ()):
        job = pods.jobs[key]
        target = targets[key]
        if target <= job.floor_replicas:
            continue
        low, high = pods.cut(key, job.floor_replicas), pods.cut(key, target)
        gained = 0.0
        options = []
        for index, gpus in reversed(pods.here[key, node]):
            if index >= high:
                continue
            if index < low:
                break
            gained += gpus
            cost = pods.given_up(key, high=target, low=index)
            options.append((gained, cost, _lost(job, old=target, new=index), key, index))
            if gained >= need - GPU_EPSILON:
                break
        if options:
            out.append(options)
    return out


def _cheapest_on(
    options: list[list[tuple[float, float, float, JobKey, int]]], *, need: float
) -> _Choice | None:
    """The cheapest choice of at most one shrink per job that frees ``need`` GPUs on a node
    (a knapsack over the few jobs a node holds, the GPUs freed capped at ``need``)."""
    best: dict[float, _Choice] = {0.0: (0.0, 0.0, ())}
    for job_options in options:
        grown = dict(best)
        for gained, (cost, lost, chosen) in best.items():
            for more, more_cost, more_lost, key, index in job_options:
                state = round(min(need, gained + more), 9)
                value = (cost + more_cost, lost + more_lost, (*chosen, (key, index)))
                if state not in grown or value[:2] < grown[state][:2]:
                    grown[state] = value
        best = grown
    done = [value for state, value in best.items() if state >= need - GPU_EPSILON]
    return min(done, key=lambda v: v[:2]) if done else None


def _next_move(
    pods: PodIndex,
    residual: Mapping[str, float],
    targets: Mapping[JobKey, int],
    *,
    size: float,
    seen: dict[tuple[str, float, tuple[int, ...]], _Choice | None],
) -> tuple[tuple[JobKey, int], ...] | None:
    """The next further shrinks for a gang of pods of ``size`` GPUs, as (job, new target) pairs.

    The choice that gives one node room for one more of the gang's pods for the fewest GPUs
    given up in all (each job gives up its pods highest index first, wherever they are), then
    the least throughput lost. Nodes are tried from the one that lacks the fewest GPUs: no
    choice on a node costs less than what it lacks, so the search stops there. None when no
    node can get room. ``seen`` keeps each node's answer while its jobs' targets stay the same
    (a move changes a few jobs: most nodes' answers carry over to the next move).
    """
    best: _Choice | None = None
    for need, node in sorted((_room(free, size), node) for node, free in residual.items()):
        if best is not None and best[0] <= need + GPU_EPSILON:
            break
        state = (node, round(need, 9), tuple(targets[k] for k in pods.on_node.get(node, ())))
        if state in seen:
            choice = seen[state]
        else:
            options = _node_options(pods, targets, node=node, need=need)
            choice = seen[state] = _cheapest_on(options, need=need)
        if choice is not None and (best is None or choice[:2] < best[:2]):
            best = choice
    return best[2] if best is not None else None


def extra_gpus(
    pods: PodIndex, before: Mapping[JobKey, int], after: Mapping[JobKey, int]
) -> dict[JobKey, float]:
    """Per job shrunk further, the GPUs on known nodes it gives up going from before to after."""
    out = {}
    for key in pods.jobs:
        if after[key] < before[key]:
            out[key] = sum(g for _, _, g in pods.freed(key, high=before[key], low=after[key]))
    return out


def search(
    pods: PodIndex,
    base: Mapping[str, float],
    targets: Mapping[JobKey, int],
    *,
    served: Sequence[PendingGang],
    gang: PendingGang,
    max_moves: int,
) -> dict[JobKey, int] | None:
    """Further shrinks that make ``gang`` fit after the ``served`` gangs.

    Moves (``_next_move``) until it fits, then each job shrunk gets back, from its target
    down, the most replicas with which the gangs still fit (a move may overshoot).

    Args:
        pods: the jobs' pods.
        base: free GPUs per node now.
        targets: each job's target before this gang (never exceeded).
        served: the gangs already given room, oldest first.
        gang: the gang to give room.
        max_moves: the most moves to make.

    Returns:
        Each job's target with the further shrinks; None when none make it fit within
        ``max_moves`` moves.
    """
    trial = [*served, gang]
    found = dict(targets)
    free = pods.free(base, found)
    seen: dict[tuple[str, float, tuple[int, ...]], _Choice | None] = {}
    for _ in range(max_moves):
        if all_fit(free, trial):
            break
        residual = _residual(free, served)
        moves = _next_move(pods, residual, found, size=gang.gpus_per_pod, seen=seen)
        if moves is None:
            return None
        for key, target in moves:
            for _, node, gpus in pods.freed(key, high=found[key], low=target):
                free[node] += gpus
            found[key] = target
    else:
        if not all_fit(free, trial):
            return None
    # Give back, job by job, the replicas the fit does not need (a move may overshoot).
    for key in sorted(k for k in found if found[k] < targets[k]):
        for keep in range(targets[key], found[key], -1):
            lost = pods.freed(key, high=keep, low=found[key])
            attempt = dict(free)
            for _, node, gpus in lost:
                attempt[node] -= gpus
            if all_fit(attempt, trial):
                free, found[key] = attempt, keep
                break
    return found
