"""The placement phase of ``decide``: further shrinks so that pending gangs fit whole nodes.

It runs after ``settle`` and before the changes are built, only when the observation has nodes,
pending gangs and pods (otherwise ``decide`` is what it was: one check). A job shrunk further
obeys the damping rules a shrink for pending work obeys (``stabilize``): it skips tolerance,
cooldown and the down window, keeps to its bounds and, while it is on the prior's curve, to the
rate limit (``Budgets.floor``), and does not move within one interval of its last rescale. A
job whose own metrics are stale is not shrunk beyond its budget, nor is a job whose pods'
placement is unknown; and when a job the budgets shrink has pods of unknown placement, what its
shrink frees cannot be told, so nothing is changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scheduler_policy.decision.job_table import BoolArray, IntArray, JobTable
from scheduler_policy.decision.messages import GangShapeWhy
from scheduler_policy.decision.placement import GangFit, ShapeJob, plan_gang_shape
from scheduler_policy.decision.stabilize import Stabilized, remember
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.state import GPU_EPSILON, Observation, PendingGang


@dataclass(frozen=True, slots=True)
class Reshaped:
    """The damped targets after the placement phase.

    Attributes:
        stabilized: the damped targets with the further shrinks, and the memories they imply.
        explanations: per row of the job table shrunk further, why.
        gangs: what was found for each pending gang, oldest first.
    """

    stabilized: Stabilized
    explanations: Mapping[int, GangShapeWhy]
    gangs: tuple[GangFit, ...]


def _admitted(observation: Observation) -> tuple[list[PendingGang], dict[str, GangFit]]:
    """The gangs their queue can admit, and a fit saying why for each of the others: freeing
    nodes for a gang its queue's capability keeps out would leave them idle."""
    queues = {queue.name: queue for queue in observation.queues}
    admitted, refused = [], {}
    for gang in observation.pending_gangs:
        queue = queues.get(gang.queue)
        cap = None if queue is None else queue.capability_gpus
        if (
            queue is not None
            and cap is not None
            and queue.allocated_gpus + gang.gpus > cap + GPU_EPSILON
        ):
            refused[gang.key] = GangFit(
                gang=gang,
                fits=False,
                fits_settled=False,
                problem=(
                    f"queue {gang.queue} holds {queue.allocated_gpus:g} of its capability of "
                    f"{cap:g} GPU(s), too few for it"
                ),
            )
        else:
            admitted.append(gang)
    return admitted, refused


def reshape(
    observation: Observation,
    table: JobTable,
    stabilized: Stabilized,
    *,
    floor: IntArray,
    stale: BoolArray | None,
    policy: ElasticPolicy,
) -> Reshaped | None:
    """Shrink further where the settled targets leave a pending gang no room on whole nodes.

    Args:
        observation: the cluster now (its nodes, pending gangs and ``time_s``).
        table: the jobs planned for.
        stabilized: the settled, damped targets.
        floor: per job, the fewest replicas the damping allows this round (``Budgets.floor``).
        stale: per job, whether its own metrics are stale; None for none.
        policy: the policy in force.

    Returns:
        The targets with the further shrinks; None when placement is unknown or no gang waits
        (the targets stand as they are).
    """
    if not observation.pending_gangs or not observation.nodes:
        return None
    if not any(job.pods for job in table.jobs):
        return None
    now_s = observation.time_s
    targets = stabilized.targets.tolist()
    recent = ((now_s - table.last_rescale_s) < policy.interval_s).tolist()  # NaN: never
    no_move = recent if stale is None else (np.asarray(recent) | stale).tolist()
    jobs = []
    for i, job in enumerate(table.jobs):
        if not job.pods:
            if targets[i] < table.held[i] and job.gpus_per_replica > 0:
                return None  # what its shrink frees, and where, is unknown
            continue
        jobs.append(
            ShapeJob(
                key=job.key,
                pods=job.pods,
                current_replicas=job.current_replicas,
                target_replicas=targets[i],
                floor_replicas=targets[i] if no_move[i] else int(floor[i]),
                sigma=float(table.sigma[i]),
                kappa=float(table.kappa[i]),
            )
        )
    admitted, refused = _admitted(observation)
    plan = plan_gang_shape(nodes=observation.nodes, jobs=jobs, gangs=admitted)
    found = {fit.gang.key: fit for fit in plan.gangs}
    gangs = tuple(found.get(g.key) or refused[g.key] for g in observation.pending_gangs)
    if not plan.extra_gpus:
        return Reshaped(stabilized, {}, gangs)
    rows = {job.key: i for i, job in enumerate(table.jobs)}
    new_targets = stabilized.targets.copy()
    last_rescale_s = stabilized.last_rescale_s.copy()
    memory_changed = stabilized.memory_changed.copy()
    recommendations = list(stabilized.recommendations)
    held_step = stabilized.held_step.copy()
    keep_s = max(policy.defaults.window_up_s, policy.defaults.window_down_s)
    explanations = {}
    for key, target in plan.shrunk.items():
        i = rows[key]
        job = table.jobs[i]
        new_targets[i] = target
        moved = target != job.current_replicas
        last_rescale_s[i] = now_s if moved else table.last_rescale_s[i]
        # This round recommends the further shrink: the up window then keeps the job from
        # growing back into the gang's nodes at once.
        kept, changed = remember(
            (job.recommendations,), np.array([target], dtype=np.int64), now_s=now_s, keep_s=keep_s
        )
        recommendations[i] = kept[0]
        memory_changed[i] = bool(changed[0]) or moved
        held_step[i] = -1
        explanations[i] = GangShapeWhy(
            job=key,
            queue=job.queue,
            target=target,
            settled=targets[i],
            extra_gpus=plan.extra_gpus[key],
            gangs=tuple(fit for fit in plan.gangs if key in fit.shrunk),
        )
    return Reshaped(
        Stabilized(
            targets=new_targets,
            held_step=held_step,
            last_rescale_s=last_rescale_s,
            recommendations=tuple(recommendations),
            memory_changed=memory_changed,
        ),
        explanations,
        gangs,
    )
