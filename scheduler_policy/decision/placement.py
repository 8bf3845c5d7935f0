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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_policy.decision.gang_placement import place_gang, place_gangs
from scheduler_policy.decision.placement_search import PodIndex, all_fit, extra_gpus, search
from scheduler_policy.vocabulary.state import (
    GPU_EPSILON,
    JobKey,
    NodeState,
    PendingGang,
    PodPlacement,
)

__all__ = ["GangFit", "ShapeJob", "ShapePlan", "place_gang", "place_gangs", "plan_gang_shape"]

# The most moves the search makes for one gang before it gives up: each move gives the gang one
# more pod's room, so a gang of k pods takes about k.
MAX_MOVES = 256


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
    (``placement_search``), until it fits, then gives back what the fit does not need. A gang that
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
    pods = PodIndex(jobs, base)
    settled = {job.key: job.target_replicas for job in jobs}
    targets = dict(settled)
    floors = {job.key: min(job.floor_replicas, job.target_replicas) for job in jobs}
    served: list[PendingGang] = []
    problems: dict[str, str] = {}
    made_for: dict[str, dict[JobKey, float]] = {}
    for gang in gangs:
        trial = [*served, gang]
        free = pods.free(base, targets)
        if all_fit(free, trial):
            served.append(gang)
            continue
        if not all_fit(pods.free(base, floors), trial):
            problems[gang.key] = (
                "it does not fit the nodes even with every elastic job that may shrink at its floor"
            )
            continue
        found = search(pods, base, targets, served=served, gang=gang, max_moves=max_moves)
        if found is None:
            problems[gang.key] = f"no shrink within {max_moves} moves makes it fit"
            continue
        made_for[gang.key] = extra_gpus(pods, targets, found)
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
        extra_gpus=extra_gpus(pods, settled, targets),
        gangs=tuple(fits),
        free_gpus=free_final,
    )
