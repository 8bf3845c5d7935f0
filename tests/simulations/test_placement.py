"""Where the simulated scheduler puts pods: the node order, task indices, and what the engine
sees of them (nodes, pods, pending gangs)."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.vocabulary.state import (
    JobKey,
    NodeState,
    PendingGang,
    PodPlacement,
    QueueName,
)
from simulations.api import with_node_order
from simulations.cluster import SimulatedCluster
from simulations.cluster_config import (
    ClusterSpec,
    NodeOrder,
    QueueSpec,
    cluster_document,
    load_cluster,
    parse_cluster,
)
from simulations.errors import ClusterFileError, SimulationError
from simulations.state import Nodes, Status
from simulations.volcano import run_session
from simulations.workload import Workload, WorkloadJob
from tests.simulations.helpers import make_job, make_sim

SPREAD, BINPACK = NodeOrder.SPREAD, NodeOrder.BINPACK
RESEARCH, PRODUCTION = QueueName("research"), QueueName("production")


def per_node(sim: SimulatedCluster, name: str) -> list[int]:
    """Pods of job ``ns/name`` on each node."""
    counts = Counter(sim.jobs[JobKey(f"ns/{name}")].pods)
    return [counts[i] for i in range(len(sim.nodes.free))]


def four_by_eight(
    order: NodeOrder, jobs: list[WorkloadJob], *, submit: bool = True
) -> SimulatedCluster:
    """The recorded cluster (shared/volcano-wire/v1.15.1/README.md, "Placement"): 4 nodes of 8
    GPUs, an elastic research queue and a production queue at weights 1 : 3; ``jobs``
    submitted at once unless ``submit`` is False. A shrink frees its GPUs at once (save time 0):
    these tests are about where pods go; the save time's hold is test_graceful's."""
    spec = ClusterSpec(
        name="wire",
        nodes=4,
        gpus_per_node=8,
        queues=(
            QueueSpec(RESEARCH, weight=1.0),
            QueueSpec(PRODUCTION, weight=3.0, reclaimable=False, elastic=False),
        ),
        node_order=order,
        save_exit_s=0.0,
    )
    sim = SimulatedCluster(spec=spec, workload=Workload("t", tuple(jobs)))
    for job in sim.order if submit else ():
        sim.submit(job)
    return sim


def gang(name: str, *, pods: int, gpus_per_pod: int, submit_s: float = 0.0) -> WorkloadJob:
    """A non-elastic production job of ``pods`` pods of ``gpus_per_pod`` GPUs each."""
    return dataclasses.replace(
        make_job(name, queue="production", replicas=pods, work=1e6, submit_s=submit_s),
        gpus_per_replica=gpus_per_pod,
    )


@pytest.mark.parametrize(
    ("order", "expected"),
    [(SPREAD, [6, 6, 6, 6]), (BINPACK, [8, 8, 8, 0])],
    ids=["spread-6-per-node", "binpack-fills-node-0-first"],
)
def test_24_one_gpu_pods_on_4_nodes_of_8(order: NodeOrder, expected: list[int]) -> None:
    sim = four_by_eight(order, [make_job("x", queue="research", replicas=24, min_r=1, max_r=24)])
    run_session(sim)
    assert per_node(sim, "x") == expected
    assert sim.jobs[JobKey("ns/x")].pod_indices == list(range(24))


@pytest.mark.parametrize(
    ("order", "pods", "expected"),
    [
        (SPREAD, [2, 1, 2], [[0], [1], [2]]),
        (BINPACK, [2, 1, 2], [[0], [0], [1]]),
        (BINPACK, [3, 2, 1], [[0], [1], [0]]),
        (SPREAD, [3, 2, 1], [[0], [1], [2]]),
        (SPREAD, [4, 4, 4, 1], [[0], [1], [2], None]),
    ],
    ids=[
        "spread-most-free-ties-to-first",
        "binpack-fullest",
        "binpack-fullest-that-fits",
        "spread-emptiest",
        "full-cluster-fits-nothing",
    ],
)
def test_each_pod_goes_where_the_node_order_says(
    order: NodeOrder, pods: list[int], expected: list[list[int] | None]
) -> None:
    # 3 nodes of 4 GPUs; pods of the given GPUs placed one after another.
    nodes = Nodes(count=3, gpus_per_node=4, order=order)
    assert [nodes.place(gpus, 1) for gpus in pods] == expected
    placed = sum(g for g, got in zip(pods, expected, strict=True) if got is not None)
    assert nodes.total_free == 12 - placed == sum(nodes.free)


@pytest.mark.parametrize("order", list(NodeOrder), ids=[o.value for o in NodeOrder])
def test_a_gang_is_placed_all_or_none(order: NodeOrder) -> None:
    nodes = Nodes(count=2, gpus_per_node=4, order=order)
    assert nodes.place(3, 3) is None  # 8 GPUs free, but only 2 nodes hold a 3-GPU pod
    assert nodes.free == [4, 4] and nodes.total_free == 8
    assert sorted(nodes.place(3, 2) or []) == [0, 1]


@pytest.mark.parametrize(
    ("order", "kept_per_node", "free_after"),
    [(SPREAD, [2, 2, 2, 2], [6, 6, 6, 6]), (BINPACK, [8, 0, 0, 0], [0, 8, 8, 8])],
    ids=["spread", "binpack"],
)
def test_a_scale_down_removes_the_highest_indices_and_frees_their_nodes(
    order: NodeOrder, kept_per_node: list[int], free_after: list[int]
) -> None:
    sim = four_by_eight(order, [make_job("x", queue="research", replicas=24, min_r=1, max_r=24)])
    run_session(sim)
    job = sim.jobs[JobKey("ns/x")]
    nodes_of_first_8 = job.pods[:8]
    sim.resize(job, 8)
    assert job.pod_indices == list(range(8))
    assert job.pods == nodes_of_first_8  # the pods that stay keep their nodes
    assert per_node(sim, "x") == kept_per_node
    assert sim.nodes.free == free_after
    view = sim.job_state(job)
    assert [p.index for p in view.pods] == list(range(8))
    assert [p.node for p in view.pods] == [f"node-{n}" for n in nodes_of_first_8]


@pytest.mark.parametrize(
    ("order", "gang_runs"),
    [(SPREAD, False), (BINPACK, True)],
    ids=["spread-leaves-the-gang-unplaceable", "binpack-places-it"],
)
def test_the_recorded_shrink_then_a_3_by_8_gang(order: NodeOrder, gang_runs: bool) -> None:
    # README "Placement": 24 one-GPU research pods, shrunk by count to 8; then production
    # submits a gang of 3 pods of 8 GPUs. 24 GPUs are free either way; only binpack left 3
    # whole nodes. Reclaim does not act: the free GPUs cover the gang.
    research = make_job("r", queue="research", replicas=24, min_r=1, max_r=24)
    sim = four_by_eight(order, [research, gang("g", pods=3, gpus_per_pod=8)], submit=False)
    sim.submit(sim.jobs[research.key])
    run_session(sim)
    sim.resize(sim.jobs[research.key], 8)
    prod = sim.jobs[JobKey("ns/g")]
    sim.submit(prod)
    run_session(sim)
    assert sim.nodes.total_free == (0 if gang_runs else 24)
    assert (prod.status is Status.RUNNING) is gang_runs
    assert len(sim.jobs[research.key].pods) == 8  # nothing was reclaimed
    if gang_runs:
        assert sorted(prod.pods) == [1, 2, 3] and sim.list_pending_gangs() == []
    else:
        assert prod.pods == []
        assert sim.list_pending_gangs() == [
            PendingGang(
                key="ns/g", queue=PRODUCTION, min_member=3, gpus=24.0, phase="Inqueue", since_s=0.0
            )
        ]


def test_a_node_failure_leaves_gaps_that_the_replacements_fill_lowest_first() -> None:
    sim = four_by_eight(SPREAD, [make_job("x", queue="research", replicas=8, min_r=2, max_r=8)])
    run_session(sim)
    job = sim.jobs[JobKey("ns/x")]
    assert job.pods == [0, 1, 2, 3, 0, 1, 2, 3]
    sim.fail_node(1)
    assert job.pod_indices == [0, 2, 3, 4, 6, 7] and job.pods == [0, 2, 3, 0, 2, 3]
    view = sim.job_state(job)
    assert [(p.index, p.node) for p in view.pods if p.node is None] == [(1, None), (5, None)]
    assert view.scheduled_replicas == 6 and view.current_replicas == 8
    sim.repair_node(1)
    run_session(sim)
    assert job.pod_indices == list(range(8))
    assert job.pods == [0, 1, 2, 3, 0, 1, 2, 3]  # node 1, the emptiest, takes both back


def test_a_scale_down_after_a_failure_deletes_the_indices_at_and_above_the_new_size() -> None:
    sim = four_by_eight(SPREAD, [make_job("x", queue="research", replicas=8, min_r=2, max_r=8)])
    run_session(sim)
    job = sim.jobs[JobKey("ns/x")]
    sim.fail_node(1)  # indices 1 and 5 gone
    sim.resize(job, 5)
    assert job.pod_indices == [0, 2, 3, 4]  # 6 and 7 deleted; 1 waits to be placed again
    assert [p.node is None for p in sim.job_state(job).pods] == [False, True, False, False, False]


def test_list_nodes_gives_every_node_that_is_up_with_its_free_gpus() -> None:
    sim = four_by_eight(SPREAD, [make_job("x", queue="research", replicas=6, min_r=1, max_r=8)])
    run_session(sim)
    first = sim.list_nodes()
    assert list(first) == [
        NodeState("node-0", 8.0, 6.0),
        NodeState("node-1", 8.0, 6.0),
        NodeState("node-2", 8.0, 7.0),
        NodeState("node-3", 8.0, 7.0),
    ]
    assert sim.list_nodes() is first  # nothing changed: the same view
    sim.fail_node(2)
    assert [n.name for n in sim.list_nodes()] == ["node-0", "node-1", "node-3"]
    assert sum(n.free_gpus for n in sim.list_nodes()) == sim.nodes.total_free


def test_a_running_job_lists_its_pods_and_a_waiting_one_none() -> None:
    sim = make_sim([make_job("x", replicas=2, min_r=1, max_r=6), make_job("y", replicas=4)])
    run_session(sim)  # one node of 4 GPUs: x takes 2, y's gang of 4 waits
    x, y = sim.jobs[JobKey("ns/x")], sim.jobs[JobKey("ns/y")]
    sim.resize(x, 3)
    run_session(sim)
    assert sim.job_state(x).pods == tuple(PodPlacement(i, "node-0", 1.0) for i in range(3))
    sim.resize(x, 5)  # two more than fit
    assert sim.job_state(x).pods[3:] == (PodPlacement(3, None, 1.0), PodPlacement(4, None, 1.0))
    assert y.status is not Status.RUNNING and sim.job_state(y).pods == ()


def test_pending_gangs_are_the_waiting_nonelastic_jobs_with_their_submit_time() -> None:
    jobs = [
        make_job("e", queue="research", replicas=40, min_r=40, max_r=48),
        gang("big", pods=5, gpus_per_pod=8, submit_s=30.0),
        gang("fits", pods=1, gpus_per_pod=8, submit_s=60.0),
    ]
    spec = dataclasses.replace(four_by_eight(SPREAD, []).spec, overcommit_factor=10.0)
    sim = SimulatedCluster(spec=spec, workload=Workload("t", tuple(jobs)))
    for job in sim.order:
        sim.submit(job)
    assert sim.list_pending_gangs() == [
        PendingGang("ns/big", PRODUCTION, 5, 40.0, phase="Pending", since_s=30.0),
        PendingGang("ns/fits", PRODUCTION, 1, 8.0, phase="Pending", since_s=60.0),
    ]  # the elastic one waits too, but is no gang to serve
    run_session(sim)
    assert sim.jobs[JobKey("ns/fits")].status is Status.RUNNING
    assert [(g.key, g.phase) for g in sim.list_pending_gangs()] == [("ns/big", "Pending")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", SPREAD),
        ("nodeOrder: spread\n", SPREAD),
        ("nodeOrder: binpack\n", BINPACK),
    ],
    ids=["default-spread", "spread", "binpack"],
)
def test_the_cluster_file_sets_the_node_order(
    tmp_path: Path, text: str, expected: NodeOrder
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"nodes: 2\ngpusPerNode: 4\n{text}queues: [{{name: a}}]\n")
    cluster = load_cluster(path)
    assert cluster.node_order is expected
    assert parse_cluster(cluster_document(cluster), source="report") == cluster


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("packed", "nodeOrder: must be one of spread, binpack, got 'packed'"),
        ("bin-pack", "nodeOrder: must be one of spread, binpack, got 'bin-pack'; did you mean"),
        ("3", "nodeOrder: must be one of spread, binpack, got 3"),
    ],
    ids=["unknown", "misspelt", "not-a-name"],
)
def test_a_bad_node_order_names_the_file_and_the_value(
    tmp_path: Path, value: str, problem: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"nodes: 2\ngpusPerNode: 4\nnodeOrder: {value}\nqueues: [{{name: a}}]\n")
    with pytest.raises(ClusterFileError, match=re.escape(problem)) as caught:
        load_cluster(path)
    assert str(caught.value).startswith(f"{path}: 1 problem(s)")


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, SPREAD), ("binpack", BINPACK), (BINPACK, BINPACK), ("spread", SPREAD)],
    ids=["left-out", "name", "enum", "back-to-spread"],
)
def test_with_node_order(given: NodeOrder | str | None, expected: NodeOrder) -> None:
    base = four_by_eight(SPREAD, []).spec
    assert with_node_order(base, given) == dataclasses.replace(base, node_order=expected)


def test_with_node_order_refuses_an_unknown_name_naming_it() -> None:
    with pytest.raises(SimulationError, match=r"--node-order: must be one of .*got 'fill'"):
        with_node_order(four_by_eight(SPREAD, []).spec, "fill")


@settings(max_examples=40, deadline=None)
@given(
    order=st.sampled_from(NodeOrder),
    steps=st.lists(
        st.tuples(st.sampled_from(["resize", "fail", "repair"]), st.integers(0, 7)), max_size=15
    ),
)
def test_pods_keep_distinct_ordered_indices_below_the_spec_and_the_nodes_add_up(
    order: NodeOrder, steps: list[tuple[str, int]]
) -> None:
    jobs = [
        dataclasses.replace(
            make_job(f"j{i}", queue="research", replicas=2 + i, min_r=1, max_r=8, work=1e6),
            gpus_per_replica=1 + i % 3,
        )
        for i in range(4)
    ]
    sim = four_by_eight(order, jobs)
    for op, arg in steps:
        run_session(sim)
        if op == "resize":
            job = sim.order[arg % len(sim.order)]
            if job.status is Status.RUNNING:
                sim.resize(job, 1 + arg)
        elif op == "fail":
            sim.fail_node(arg % 4)
        else:
            sim.repair_node(arg % 4)
        held = [0] * 4
        for job in sim.running.values():
            idx = job.pod_indices
            assert idx == sorted(set(idx)) and len(idx) == len(job.pods)
            assert not idx or idx[-1] < job.spec_replicas
            view = sim.job_state(job)
            assert [p.index for p in view.pods] == list(range(job.spec_replicas))
            assert sum(p.node is not None for p in view.pods) == view.scheduled_replicas
            for node in job.pods:
                assert sim.nodes.up[node]
                held[node] += job.spec.gpus_per_replica
        for state in sim.list_nodes():
            i = int(state.name.removeprefix("node-"))
            assert state.free_gpus == 8 - held[i]


def wire_run(order: NodeOrder) -> dict[str, tuple[float | None, int]]:
    """tide's engine on the recorded case, whole: research trains 24 one-GPU pods for 4 h;
    half an hour in, production submits its 3 x 8 gang. Per job: its queueing delay (hours)
    and the fewest replicas it ran at."""
    from simulations.api import PolicyRun, default_policy_for, run_one
    from simulations.run import RunOptions

    research = make_job(
        "bert", queue="research", replicas=24, min_r=1, max_r=24, work=24 * 4 * 3600.0
    )
    prod = dataclasses.replace(
        gang("gang", pods=3, gpus_per_pod=8, submit_s=1800.0), work_units=3 * 3600.0
    )
    cluster = dataclasses.replace(four_by_eight(order, []).spec, overcommit_factor=10.0)
    result = run_one(
        PolicyRun("tide", "tide", default_policy_for(cluster)),
        workload=Workload("wire", (research, prod)),
        cluster=cluster,
        options=RunOptions(),
    )
    return {
        j.key: (
            None if j.start_s is None else (j.start_s - j.submit_s) / 3600,
            min(n for _, n in j.replica_log),
        )
        for j in result.jobs
    }


@pytest.mark.parametrize(
    ("order", "research_fewest"),
    [(SPREAD, 1), (BINPACK, 8)],
    ids=["spread-a-shrink-to-whole-nodes", "binpack-a-shrink-by-count"],
)
def test_tide_shrinks_research_until_the_gang_fits_on_nodes(
    order: NodeOrder, research_fewest: int
) -> None:
    # The budget shrinks research by count to 8 for the gang's 24 GPUs, in the reconcile at the
    # gang's arrival: research, measured at one size only, would be held to its rate limit (2
    # replicas a round), but its floors alone would hold more than its budget while Volcano's
    # reclaim waits, so the budget takes what it must (budget.py, ``_without_infeasible_floors``;
    # before, the shrink took two reconciles, 1 s apart binpacked and 61 s spread). Binpacked,
    # the 8 left share node 0 and the gang starts at once, nothing killed. Spread, 2 stay on
    # every node: the placement-aware shrink (decision/reshape.py) takes research down to its
    # pod 0, on node 0, in the same reconcile, and the gang starts on nodes 1-3. Without it the
    # gang waited until research finished, 10.5 h.
    waits = wire_run(order)
    assert waits["ns/bert"] == (0.0, research_fewest)
    assert waits["ns/gang"] == (0.0, 3)


@pytest.mark.parametrize(
    ("order", "nodes"), [(SPREAD, 4), (BINPACK, 3)], ids=["spread-spans-4", "binpack-spans-3"]
)
def test_a_throughput_point_records_the_nodes_the_pods_span(order: NodeOrder, nodes: int) -> None:
    sim = four_by_eight(order, [make_job("x", queue="research", replicas=24, min_r=1, max_r=24)])
    run_session(sim)
    job = sim.jobs[JobKey("ns/x")]
    sim._measure(job, job.restart_until_s + 1.0)
    assert (job.points[-1].replicas, job.points[-1].nodes) == (24, nodes)
