"""Placement-aware shrink: pending gangs get room on whole nodes, given the highest task
indices go first (``decision.placement``, ``decision.reshape``, through ``decide``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.decision.gang_placement import place_gangs
from scheduler_policy.decision.messages import GangShapeWhy, gang_fit_message
from scheduler_policy.decision.pipeline import decide
from scheduler_policy.decision.placement import ShapeJob, plan_gang_shape
from scheduler_policy.engine.reconcile import reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.state import (
    JobKey,
    NodeState,
    PendingGang,
    PodPlacement,
    QueueName,
    Reason,
)
from tests.scheduler_policy.builders import (
    NOW_S,
    make_job,
    make_observation,
    make_policy,
    make_queue,
)

NODE_GPUS = 8.0


def spread(count, *, nodes=4, first=0):
    """Volcano's default node order: index i on node i % nodes."""
    return tuple(PodPlacement(i, f"n{first + i % nodes}", 1.0) for i in range(count))


def binpack(count, *, per_node=8, first=0):
    """The binpack node order: the first ``per_node`` indices on the first node, and so on."""
    return tuple(PodPlacement(i, f"n{first + i // per_node}", 1.0) for i in range(count))


def on(node, *indices, gpus=1.0):
    return tuple(PodPlacement(i, node, gpus) for i in indices)


def nodes_holding(*pod_sets, count=4, size=NODE_GPUS):
    """``count`` nodes of ``size`` GPUs, each with what the pods leave free."""
    used = {f"n{k}": 0.0 for k in range(count)}
    for pods in pod_sets:
        for pod in pods:
            used[pod.node] += pod.gpus
    return tuple(NodeState(name, size, size - u) for name, u in used.items())


def gang(name="g", *, pods=3, gpus_per_pod=8.0, queue="prod"):
    return PendingGang(f"prod/{name}", QueueName(queue), pods, pods * gpus_per_pod)


def shape_job(name, pods, *, target, floor=1, current=None):
    current = len(pods) if current is None else current
    return ShapeJob(JobKey(f"ns/{name}"), pods, current, target, floor)


def free_by_rule(nodes, kept):
    """Free GPUs per node when each job keeps only its pods of index below its target (the
    highest indices go first): ``kept`` maps each job's pods to its target."""
    free = {node.name: node.allocatable_gpus for node in nodes}
    held = {node.name: node.allocatable_gpus - node.free_gpus for node in nodes}
    for pods, target in kept:
        for pod in pods:
            held[pod.node] -= pod.gpus
            if pod.index < target:
                free[pod.node] -= pod.gpus
    return {name: free[name] - held[name] for name in free}


def whole_nodes(free):
    return sum(1 for gpus in free.values() if gpus >= NODE_GPUS)


def fits_by_count(free, g):
    """A gang of identical pods fits iff the nodes hold ⌊free / size⌋ of them in all."""
    return sum(math.floor(f / g.gpus_per_pod + 1e-9) for f in free.values()) >= g.min_member


# The README's case: 24 one-GPU pods, 6 on each of 4 nodes of 8; the budget shrinks to 8.
README_SPREAD = spread(24)
README_BINPACK = binpack(24)


def test_a_plain_budget_shrink_of_spread_pods_leaves_no_whole_node():
    free = free_by_rule(nodes_holding(README_SPREAD), [(README_SPREAD, 8)])
    assert free == {"n0": 6.0, "n1": 6.0, "n2": 6.0, "n3": 6.0}
    assert whole_nodes(free) == 0


SHAPES = {
    # name: (nodes, jobs, gangs, expected targets, expected fits, expected extra GPUs)
    "readme-spread-needs-three-whole-nodes": (
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8)],
        [gang()],
        {"r": 1},
        [True],
        7.0,
    ),
    "readme-binpack-needs-no-further-shrink": (
        nodes_holding(README_BINPACK),
        [shape_job("r", README_BINPACK, target=8)],
        [gang()],
        {"r": 8},
        [True],
        0.0,
    ),
    "a-gang-of-one-gpu-pods-needs-no-further-shrink": (
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8)],
        [gang(pods=24, gpus_per_pod=1.0)],
        {"r": 8},
        [True],
        0.0,
    ),
    "min-replicas-leaves-too-few-whole-nodes-so-nothing-changes": (
        # At its minimum of 4 the job keeps a pod on every node.
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8, floor=4)],
        [gang()],
        {"r": 8},
        [False],
        0.0,
    ),
    "min-replicas-of-two-still-leaves-two-whole-nodes": (
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8, floor=2)],
        [gang(pods=2)],
        {"r": 2},
        [True],
        6.0,
    ),
    "a-gang-larger-than-the-cluster-changes-nothing": (
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8, floor=0)],
        [gang(pods=5)],
        {"r": 8},
        [False],
        0.0,
    ),
    "two-jobs-sharing-nodes-take-the-cheaper-node": (
        # n0: a6 a7 b2..b7; n1: a0..a5 b0 b1. Freeing n0 costs a 2 + b 6 GPUs; freeing n1
        # would cost everything both hold (16).
        nodes_holding(
            on("n0", 6, 7),
            on("n1", 0, 1, 2, 3, 4, 5),
            on("n0", 2, 3, 4, 5, 6, 7),
            on("n1", 0, 1),
            count=2,
        ),
        [
            shape_job("a", on("n1", 0, 1, 2, 3, 4, 5) + on("n0", 6, 7), target=8, floor=0),
            shape_job("b", on("n1", 0, 1) + on("n0", 2, 3, 4, 5, 6, 7), target=8, floor=0),
        ],
        [gang(pods=1)],
        {"a": 6, "b": 2},
        [True],
        8.0,
    ),
    "of-two-jobs-only-the-one-on-the-nearly-free-node-shrinks": (
        # n0 has 5 free and "a"'s last 3 pods; "b" fills n1. Only "a" gives up 3 GPUs.
        nodes_holding(on("n0", 0, 1, 2), on("n1", *range(8)), count=2),
        [
            shape_job("a", on("n0", 0, 1, 2), target=3, floor=0),
            shape_job("b", on("n1", *range(8)), target=8, floor=0),
        ],
        [gang(pods=1)],
        {"a": 0, "b": 8},
        [True],
        3.0,
    ),
    "two-gangs-oldest-first-both-get-whole-nodes": (
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8)],
        [gang("one", pods=1), gang("two", pods=2)],
        {"r": 1},
        [True, True],
        7.0,
    ),
    "the-older-gang-fits-and-the-younger-cannot": (
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8, floor=2)],
        [gang("one", pods=2), gang("two", pods=1)],
        {"r": 2},
        [True, False],
        6.0,
    ),
    "a-job-held-at-its-target-frees-nothing-more": (
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8, floor=8)],
        [gang()],
        {"r": 8},
        [False],
        0.0,
    ),
    "pods-already-on-their-way-out-count-as-free": (
        # The spec says 1 but the 23 pods above are still terminating: they free their nodes,
        # whatever the target (growth starts new pods, not these).
        nodes_holding(README_SPREAD),
        [shape_job("r", README_SPREAD, target=8, current=1)],
        [gang()],
        {"r": 8},
        [True],
        0.0,
    ),
    "a-shrink-the-fit-no-longer-needs-is-given-back": (
        # Nodes of 4, 1 GPU free on each: n0 holds a0 b0 b1, n1 a1 a2 b2; a gang of 2 x 2.
        # The search first takes a2 (room on n1 for 1 GPU), then b2 and b1 (room on n0, and
        # b2 gives n1 its room too): a2 is not needed and is given back.
        nodes_holding(on("n0", 0), on("n1", 1, 2), on("n0", 0, 1), on("n1", 2), count=2, size=4.0),
        [
            shape_job("a", on("n0", 0) + on("n1", 1, 2), target=3, floor=0),
            shape_job("b", on("n0", 0, 1) + on("n1", 2), target=3, floor=0),
        ],
        [gang(pods=2, gpus_per_pod=2.0)],
        {"a": 3, "b": 1},
        [True],
        2.0,
    ),
}


@pytest.mark.parametrize(
    ("nodes", "jobs", "gangs", "targets", "fits", "extra"), SHAPES.values(), ids=SHAPES.keys()
)
def test_plan_gang_shape(nodes, jobs, gangs, targets, fits, extra):
    plan = plan_gang_shape(nodes=nodes, jobs=jobs, gangs=gangs)
    assert {k.removeprefix("ns/"): t for k, t in plan.targets.items()} == targets
    assert [fit.fits for fit in plan.gangs] == fits
    assert sum(plan.extra_gpus.values()) == extra
    kept = [(job.pods, min(plan.targets[job.key], job.current_replicas)) for job in jobs]
    assert plan.free_gpus == free_by_rule(nodes, kept)
    for fit, placed in zip(plan.gangs, place_gangs(plan.free_gpus, gangs), strict=True):
        assert (placed is not None) == fit.fits
        assert fit.problem is None if fit.fits else fit.problem


@pytest.mark.parametrize(
    ("pods", "whole"), [(README_SPREAD, 3), (README_BINPACK, 3)], ids=["spread", "binpack"]
)
def test_readme_case_leaves_three_whole_nodes(pods, whole):
    nodes = nodes_holding(pods)
    plan = plan_gang_shape(nodes=nodes, jobs=[shape_job("r", pods, target=8)], gangs=[gang()])
    free = free_by_rule(nodes, [(pods, plan.targets[JobKey("ns/r")])])
    assert whole_nodes(free) >= whole
    (fit,) = plan.gangs
    assert sorted(fit.nodes) == sorted(n for n, f in free.items() if f >= NODE_GPUS)[:3]


def test_the_fit_says_which_nodes_the_further_shrink_freed():
    plan = plan_gang_shape(
        nodes=nodes_holding(README_SPREAD),
        jobs=[shape_job("r", README_SPREAD, target=8)],
        gangs=[gang()],
    )
    (fit,) = plan.gangs
    assert (fit.fits, fit.fits_settled, fit.freed_nodes, fit.extra_gpus, fit.shrunk) == (
        True, False, ("n1", "n2", "n3"), 7.0, (JobKey("ns/r"),),
    )  # fmt: skip
    assert gang_fit_message(fit) == (
        "pending gang prod/g (3 x 8 GPU(s)) fits on n1, n2, n3 once ns/r shrink further, "
        "7 GPU(s) beyond the budgets"
    )


def test_a_gang_that_cannot_fit_says_why():
    plan = plan_gang_shape(
        nodes=nodes_holding(README_SPREAD),
        jobs=[shape_job("r", README_SPREAD, target=8, floor=4)],
        gangs=[gang()],
    )
    assert gang_fit_message(plan.gangs[0]) == (
        "pending gang prod/g (3 x 8 GPU(s)) cannot be placed: it does not fit the nodes even "
        "with every elastic job that may shrink at its floor; changing nothing for it"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_moves": 0}, "max_moves: must be >= 1, got 0"),
        ({"jobs": [shape_job("r", README_SPREAD, target=8)] * 2}, "jobs: a job is listed twice"),
    ],
    ids=["no-moves", "a-job-twice"],
)
def test_bad_input_is_refused_naming_it(kwargs, message):
    args = {"nodes": nodes_holding(README_SPREAD), "jobs": [], "gangs": [gang()], **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_gang_shape(**args)


# Through ``decide``: research borrows 24 of 32 GPUs; prod's gang of 3 x 8 waits.


def readme_observation(
    pods=README_SPREAD,
    *,
    current=24,
    min_replicas=1,
    nodes=None,
    gangs=None,
    prod=32.0,
    sizes=(8, 16, 24),
    **job,
):
    research = make_job("r", queue="research", current=current, min_replicas=min_replicas,
                        max_replicas=24, sizes=sizes, **job)  # fmt: skip
    observation = make_observation(
        dataclasses.replace(research, pods=pods),
        queues=(
            make_queue("research", capability=32, deserved=8),
            make_queue("prod", capability=prod, deserved=min(24, prod), pending=24),
        ),
        free=8,
    )
    return dataclasses.replace(
        observation,
        nodes=nodes_holding(pods) if nodes is None else nodes,
        pending_gangs=(gang(),) if gangs is None else gangs,
    )


POLICY = make_policy("research", "prod", borrow=True)


def decide_one(observation, policy=POLICY):
    plan = decide(observation, policy, fits=ModelCache().fit(observation, policy))
    (decision,) = plan.decisions
    return plan, decision


DECIDE = {
    "spread-shrinks-further-for-the-gang": (
        readme_observation(),
        (1, Reason.SHRINK_FOR_GANG_SHAPE),
    ),
    "binpack-needs-only-the-budget": (
        readme_observation(README_BINPACK),
        (8, Reason.SHRINK_FOR_PENDING_WORK),
    ),
    "min-replicas-keep-the-budget-shrink": (
        readme_observation(min_replicas=4),
        (8, Reason.SHRINK_FOR_PENDING_WORK),
    ),
    "no-nodes-no-placement": (readme_observation(nodes=()), (8, Reason.SHRINK_FOR_PENDING_WORK)),
    "no-gang-no-placement": (readme_observation(gangs=()), (8, Reason.SHRINK_FOR_PENDING_WORK)),
    "no-pods-no-placement": (
        readme_observation(pods=(), nodes=nodes_holding(README_SPREAD)),
        (8, Reason.SHRINK_FOR_PENDING_WORK),
    ),
    "stale-metrics-shrink-only-to-the-budget": (
        readme_observation(stale="throughput of ns/r is 900 s old"),
        (8, Reason.SHRINK_FOR_PENDING_WORK),
    ),
    # Never measured: no figure to doubt, only none yet; freeing whole nodes asks nothing of
    # its curve (on Volcano's spread order this job kept the gang out until reclaim killed it).
    "never-measured-still-shrinks-for-the-gang": (
        readme_observation(sizes=()),
        (1, Reason.SHRINK_FOR_GANG_SHAPE),
    ),
    # Within an interval of its last rescale, a job still shrinks to its budget while the
    # gang's need is unmet (24 GPUs pending, 8 idle, none releasing), but no further for the
    # gang's shape.
    "rescaled-within-an-interval-shrinks-only-to-the-budget-for-an-unmet-need": (
        readme_observation(last_rescale_s=NOW_S - 10),
        (8, Reason.SHRINK_FOR_PENDING_WORK),
    ),
    "rescaled-before-the-cooldown-ends-still-shrinks-for-the-gang": (
        readme_observation(last_rescale_s=NOW_S - 120),
        (1, Reason.SHRINK_FOR_GANG_SHAPE),
    ),
    "a-gang-its-queue-cannot-admit-frees-nothing": (
        readme_observation(prod=16.0),
        (8, Reason.SHRINK_FOR_PENDING_WORK),
    ),
}


@pytest.mark.parametrize(("observation", "expected"), DECIDE.values(), ids=DECIDE.keys())
def test_decide_with_placement(observation, expected):
    policy = make_policy("research", "prod", borrow=True, cooldown_s=300.0)
    _, decision = decide_one(observation, policy)
    assert (decision.target_replicas, decision.reason) == expected


def test_the_decision_names_the_gang_the_nodes_and_the_cost_beyond_the_budget():
    plan, decision = decide_one(readme_observation())
    assert decision.message == (
        "pending gang prod/g (3 x 8 GPU(s)) needs whole nodes: this frees n1, n2, n3 for it; "
        "Volcano deletes the highest task indices first, so 1 replicas, not the 8 that queue "
        "research's budget leaves: 7 GPU(s) beyond the budget"
    )
    (change,) = plan.changes
    assert (change.to_replicas, change.reason, change.message) == (
        1, Reason.SHRINK_FOR_GANG_SHAPE, decision.message
    )  # fmt: skip
    assert change.memory.last_rescale_s == NOW_S
    assert [fit.gang.key for fit in plan.gangs if fit.fits] == ["prod/g"]


def test_without_pending_gangs_the_plan_is_what_it_was():
    with_nodes = readme_observation(gangs=())
    without = dataclasses.replace(
        with_nodes, nodes=(), jobs=(dataclasses.replace(with_nodes.jobs[0], pods=()),)
    )
    a, _ = decide_one(with_nodes)
    b, _ = decide_one(without)
    assert [(d.target_replicas, d.reason, d.message) for d in a.decisions] == [
        (d.target_replicas, d.reason, d.message) for d in b.decisions
    ]

    def writes(plan):
        return [(c.job, c.to_replicas, c.memory, c.reason, c.message) for c in plan.changes]

    assert writes(a) == writes(b)
    assert a.gangs == b.gangs == ()


def test_a_job_that_the_budget_shrinks_with_unknown_pods_changes_nothing():
    # "u" has no pods: where its shrink frees GPUs cannot be told, so "r" is not shrunk further.
    observation = readme_observation()
    # (Its replicas are worth little, so the round shrinks it: "r" spans nodes, and its
    # cross-node sync makes its own replicas cheaper to give up than a milder "u"'s.)
    unknown = make_job("u", queue="research", current=4, min_replicas=1, max_replicas=4,
                       sizes=(1, 2, 4), sigma=2.0)  # fmt: skip
    observation = dataclasses.replace(observation, jobs=(*observation.jobs, unknown))
    plan = decide(observation, POLICY, fits=ModelCache().fit(observation, POLICY))
    assert all(d.reason is not Reason.SHRINK_FOR_GANG_SHAPE for d in plan.decisions)
    assert plan.gangs == ()


def test_reconciling_twice_writes_nothing_the_second_time():
    cluster = FakeCluster(readme_observation())
    models = ModelCache()

    def run():
        return reconcile(metrics=cluster, cluster=cluster, policy=POLICY, now_s=NOW_S,
                         models=models)  # fmt: skip

    first = run()
    assert [(c.job, c.to_replicas, c.reason) for c in first.applied] == [
        (JobKey("ns/r"), 1, Reason.SHRINK_FOR_GANG_SHAPE)
    ]
    second = run()
    assert second.applied == ()
    assert all(fit.fits and not fit.shrunk for fit in second.plan.gangs)


def test_the_next_round_sees_room_for_the_gang_and_shrinks_no_further():
    # The pods above index 0 have terminated; the gang still waits for the scheduler.
    observation = readme_observation(README_SPREAD[:1], current=1, last_rescale_s=NOW_S - 60)
    observation = dataclasses.replace(
        observation,
        time_s=NOW_S + 60,
        nodes=nodes_holding(README_SPREAD[:1]),
        cluster_free_gpus=31,
    )
    plan, decision = decide_one(observation)
    assert decision.reason is not Reason.SHRINK_FOR_GANG_SHAPE
    assert [(fit.fits, fit.shrunk) for fit in plan.gangs] == [(True, ())]


# Properties over random clusters.


@st.composite
def shape_problems(draw):
    """Nodes of 4 or 8 GPUs, up to 4 jobs of one-GPU pods on them (some waiting for GPUs, some
    indices missing), settled targets and floors, and one or two gangs."""
    size = draw(st.sampled_from([4.0, 8.0]))
    count = draw(st.integers(1, 5))
    free = {f"n{k}": size for k in range(count)}
    # Per pod: its node (-1: none), or absent (-2).
    layouts = draw(st.lists(st.lists(st.integers(-2, count - 1), max_size=16), min_size=1,
                            max_size=4))  # fmt: skip
    numbers = iter(draw(st.lists(st.integers(0, 16), min_size=12, max_size=12)))
    jobs = []
    for j, layout in enumerate(layouts):
        pods = []
        for index, where in enumerate(layout):
            node = f"n{where}" if where >= 0 and free[f"n{where}"] >= 1 else None
            if where == -2:
                continue
            if node is not None:
                free[node] -= 1.0
            pods.append(PodPlacement(index, node, 1.0))
        current = len(layout) - next(numbers) % (len(layout) // 2 + 1)
        target = max(0, current - next(numbers) % 4)
        floor = next(numbers) % (target + 2)
        jobs.append(ShapeJob(JobKey(f"ns/j{j}"), tuple(pods), current, target, floor))
    nodes = tuple(NodeState(n, size, f) for n, f in free.items())
    wanted = draw(st.lists(st.tuples(st.integers(1, 3), st.sampled_from([1.0, 2.0, size, size])),
                           min_size=1, max_size=2))  # fmt: skip
    gangs = [
        PendingGang(f"prod/g{g}", QueueName("prod"), pods, pods * per_pod)
        for g, (pods, per_pod) in enumerate(wanted)
    ]
    return nodes, jobs, gangs


@st.composite
def full_clusters(draw):
    """Nodes full of up to 3 jobs' one-GPU pods (a few GPUs free), indexed in spread or
    binpack order, settled targets a little below the replicas, and one or two gangs."""
    size = draw(st.sampled_from([4, 8]))
    count = draw(st.integers(2, 5))
    jobs_count = draw(st.integers(1, 3))
    owners = draw(st.lists(st.integers(-1, jobs_count - 1), min_size=count * size,
                           max_size=count * size))  # fmt: skip
    slots = [(n, k) for k in range(size) for n in range(count)]  # spread: across nodes first
    if draw(st.booleans()):
        slots.sort()  # binpack: node by node
    pods: list[list[PodPlacement]] = [[] for _ in range(jobs_count)]
    free = {f"n{n}": float(size) for n in range(count)}
    for (n, _), owner in zip(slots, owners, strict=True):
        if owner >= 0:
            pods[owner].append(PodPlacement(len(pods[owner]), f"n{n}", 1.0))
            free[f"n{n}"] -= 1.0
    numbers = iter(draw(st.lists(st.integers(0, 16), min_size=6, max_size=6)))
    jobs = []
    for j, own in enumerate(pods):
        target = max(0, len(own) - next(numbers) % 6)
        floor = next(numbers) % (target + 1)
        jobs.append(ShapeJob(JobKey(f"ns/j{j}"), tuple(own), len(own), target, floor))
    nodes = tuple(NodeState(n, float(size), f) for n, f in free.items())
    wanted = draw(st.lists(st.tuples(st.integers(1, count), st.sampled_from([2.0, size, size])),
                           min_size=1, max_size=2))  # fmt: skip
    gangs = [
        PendingGang(f"prod/g{g}", QueueName("prod"), pods, pods * per_pod)
        for g, (pods, per_pod) in enumerate(wanted)
    ]
    return nodes, jobs, gangs


PROBLEMS = st.one_of(shape_problems(), full_clusters())


def _spread(free, gangs):
    """The gangs placed oldest first, each pod on the node with the most free GPUs."""
    left = dict(free)
    names = list(free)
    out = []
    for g in gangs:
        trial = dict(left)
        ok = True
        for _ in range(g.min_member):
            best = max(names, key=lambda n: (trial[n], -names.index(n)))
            if trial[best] < g.gpus_per_pod - 1e-9:
                ok = False
                break
            trial[best] -= g.gpus_per_pod
        if ok:
            left = trial
        out.append(ok)
    return out


@settings(max_examples=200, deadline=None)
@given(PROBLEMS)
def test_targets_stay_between_the_floor_and_the_settled_target(problem):
    nodes, jobs, gangs = problem
    plan = plan_gang_shape(nodes=nodes, jobs=jobs, gangs=gangs)
    for job in jobs:
        assert min(job.floor_replicas, job.target_replicas) <= plan.targets[job.key]
        assert plan.targets[job.key] <= job.target_replicas


@settings(max_examples=200, deadline=None)
@given(PROBLEMS)
def test_a_gang_said_to_fit_really_fits_the_free_gpus_per_node(problem):
    nodes, jobs, gangs = problem
    plan = plan_gang_shape(nodes=nodes, jobs=jobs, gangs=gangs)
    kept = [(job.pods, min(plan.targets[job.key], job.current_replicas)) for job in jobs]
    free = free_by_rule(nodes, [(tuple(p for p in pods if p.node), t) for pods, t in kept])
    assert plan.free_gpus == pytest.approx(free)
    assert [fit.fits for fit in plan.gangs] == _spread(free, gangs)
    if len(gangs) == 1 and plan.gangs[0].fits:
        assert fits_by_count(free, gangs[0])


@settings(max_examples=200, deadline=None)
@given(PROBLEMS)
def test_no_job_shrunk_further_could_keep_one_more_replica(problem):
    nodes, jobs, gangs = problem
    gangs = gangs[:1]
    plan = plan_gang_shape(nodes=nodes, jobs=jobs, gangs=gangs)
    for key in plan.shrunk:
        more = {k: t + (k == key) for k, t in plan.targets.items()}
        kept = [(tuple(p for p in j.pods if p.node), min(more[j.key], j.current_replicas))
                for j in jobs]  # fmt: skip
        assert not fits_by_count(free_by_rule(nodes, kept), gangs[0])


@settings(max_examples=200, deadline=None)
@given(PROBLEMS)
def test_a_gang_said_not_to_fit_fits_no_shrink_down_to_the_floors(problem):
    nodes, jobs, gangs = problem
    gangs = gangs[:1]
    plan = plan_gang_shape(nodes=nodes, jobs=jobs, gangs=gangs)
    if not plan.gangs[0].fits:
        assert plan.targets == {job.key: job.target_replicas for job in jobs}
        floors = [
            (
                tuple(p for p in j.pods if p.node),
                min(j.floor_replicas, j.target_replicas, j.current_replicas),
            )
            for j in jobs
        ]
        assert not fits_by_count(free_by_rule(nodes, floors), gangs[0])


@st.composite
def gang_observations(draw):
    """Research's elastic jobs fill 4 nodes of 8 in spread or binpack order; prod waits with
    one or two gangs (their GPUs also in prod's pending work)."""
    counts = draw(st.lists(st.integers(4, 16), min_size=1, max_size=3))
    counts = counts[: next(i for i in range(len(counts), 0, -1) if sum(counts[:i]) <= 32)]
    order = draw(st.sampled_from(["spread", "binpack"]))
    slot = 0
    jobs = []
    for j, count in enumerate(counts):
        pods = []
        for index in range(count):
            node = slot % 4 if order == "spread" else slot // 8
            pods.append(PodPlacement(index, f"n{node}", 1.0))
            slot += 1
        lowest = draw(st.integers(0, 2))
        job = make_job(f"r{j}", queue="research", current=count, min_replicas=lowest,
                       max_replicas=max(count, 1), sizes=(1, 2, 4))  # fmt: skip
        jobs.append(dataclasses.replace(job, pods=tuple(pods)))
    shapes = st.tuples(st.integers(1, 3), st.sampled_from([1.0, 4.0, 8.0, 8.0]))
    wanted = draw(st.lists(shapes, min_size=1, max_size=2))
    gangs = tuple(
        gang(f"g{g}", pods=pods, gpus_per_pod=per_pod) for g, (pods, per_pod) in enumerate(wanted)
    )
    pending = sum(g.gpus for g in gangs)
    observation = make_observation(
        *jobs,
        queues=(
            make_queue("research", capability=32, deserved=8),
            make_queue("prod", capability=32, deserved=24, pending=pending),
        ),
        free=32 - slot,
    )
    pods = [job.pods for job in jobs]
    return dataclasses.replace(observation, nodes=nodes_holding(*pods), pending_gangs=gangs)


@settings(max_examples=60, deadline=None)
@given(gang_observations())
def test_placement_only_lowers_settled_targets_and_keeps_the_minimums(observation):
    with_gangs = decide(observation, POLICY, fits=ModelCache().fit(observation, POLICY))
    plain = dataclasses.replace(observation, pending_gangs=())
    without = decide(plain, POLICY, fits=ModelCache().fit(plain, POLICY))
    settled = {d.job: d.target_replicas for d in without.decisions}
    jobs = {job.key: job for job in observation.jobs}
    for decision in with_gangs.decisions:
        assert jobs[decision.job].min_replicas <= decision.target_replicas
        assert decision.target_replicas <= settled[decision.job]
        shrunk = decision.target_replicas < settled[decision.job]
        assert shrunk == (decision.reason is Reason.SHRINK_FOR_GANG_SHAPE)
    kept = [(jobs[d.job].pods, min(d.target_replicas, d.current_replicas))
            for d in with_gangs.decisions]  # fmt: skip
    free = free_by_rule(observation.nodes, kept)
    assert [fit.fits for fit in with_gangs.gangs] == _spread(free, observation.pending_gangs)


def test_a_job_sharing_the_gangs_shrink_says_what_the_gang_costs_in_all():
    a = shape_job("a", on("n1", 0, 1, 2, 3, 4, 5) + on("n0", 6, 7), target=8, floor=0)
    b = shape_job("b", on("n1", 0, 1) + on("n0", 2, 3, 4, 5, 6, 7), target=8, floor=0)
    plan = plan_gang_shape(nodes=nodes_holding(a.pods, b.pods, count=2), jobs=[a, b],
                           gangs=[gang(pods=1)])  # fmt: skip
    why = GangShapeWhy(job=a.key, queue=QueueName("research"), target=plan.targets[a.key],
                       settled=8, extra_gpus=plan.extra_gpus[a.key], gangs=plan.gangs)  # fmt: skip
    assert why.render(a.key) == (
        "pending gang prod/g (1 x 8 GPU(s)) needs whole nodes: this frees n0 for it; its "
        "further shrinks give up 8 GPU(s) in all; Volcano deletes the highest task indices "
        "first, so 6 replicas, not the 8 that queue research's budget leaves: 2 GPU(s) beyond "
        "the budget"
    )
