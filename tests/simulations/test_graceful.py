"""Graceful shrink that really happens: workers take time to leave, reclaim asks tide's extender,
and tide reconciles at once (issue 17)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scheduler_policy.engine.trigger import reconcile_trigger
from scheduler_policy.extender import Extender, ExtenderView, ShrinkingJob
from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations.api import default_policy_for, load_workload
from simulations.cluster import SimulatedCluster
from simulations.cluster_config import ClusterSpec, QueueSpec, cluster_document, parse_cluster
from simulations.controllers import make_controller
from simulations.errors import ClusterFileError, SimulationError
from simulations.run import RunOptions, simulate
from simulations.state import SimJob, Status
from simulations.volcano import JobOrder, fifo_order, run_session
from simulations.workload import Workload, WorkloadJob
from tests.simulations.helpers import make_cluster, make_job

A, B = QueueName("a"), QueueName("b")
QUEUES = (QueueSpec(A, reclaimable=True), QueueSpec(B, reclaimable=False, elastic=False))
X = JobKey("ns/x")


def _sim(jobs: list[WorkloadJob], *, save_exit_s: float = 6.0, **kw: object) -> SimulatedCluster:
    spec = dataclasses.replace(make_cluster(**kw), save_exit_s=save_exit_s)  # type: ignore[arg-type]
    return SimulatedCluster(spec=spec, workload=Workload("t", tuple(jobs)))


def _start(sim: SimulatedCluster, key: JobKey) -> SimJob:
    job = sim.jobs[key]
    sim.submit(job)
    run_session(sim)
    return job


# --- workers take time to leave -------------------------------------------------------------


@dataclass(frozen=True)
class Hold:
    name: str
    save_exit_s: float | None  # the job's own figure; None: the cluster's (6 s here)
    graceful: bool = True
    fail_node: bool = False
    releasing: int = 2  # GPUs releasing just after the shrink
    free_at_s: float = 6.0  # when they come free


HOLDS = [
    Hold("the cluster default holds the GPUs for 6 s", None),
    Hold("a job's own save time", 2.5, free_at_s=2.5),
    Hold("a zero save time frees them at once", 0.0, releasing=0, free_at_s=0.0),
    Hold("an abrupt kill frees them at once", None, graceful=False, releasing=0, free_at_s=0.0),
    Hold("a node failure ends the hold", None, fail_node=True, releasing=0, free_at_s=0.0),
]


@pytest.mark.parametrize("case", HOLDS, ids=[h.name for h in HOLDS])
def test_a_graceful_shrink_holds_the_departing_gpus_for_the_save_time(case: Hold) -> None:
    x = dataclasses.replace(
        make_job("x", replicas=4, min_r=1, max_r=4), save_exit_s=case.save_exit_s
    )
    sim = _sim([x])
    job = _start(sim, X)
    assert (len(job.pods), sim.nodes.total_free) == (4, 0)

    if case.graceful:
        sim.resize(job, 2)
    else:
        sim.kill_pods(job, [2, 3])
    if case.fail_node:
        sim.fail_node(0)
        sim.repair_node(0)

    assert sim.releasing_gpus() == case.releasing
    assert sim.sample(now_s=0.0).releasing_gpus == case.releasing
    if case.releasing:
        assert sim.nodes.total_free == 0  # not free: nothing is placed on them
        assert sim.next_release_s() == case.free_at_s
        sim.advance(case.free_at_s - 0.1)
        assert not sim.free_released()
        sim.advance(case.free_at_s)
        assert sim.free_released()
    assert sim.releasing_gpus() == 0
    assert sim.next_release_s() == float("inf")
    assert sim.nodes.total_free == (4 if case.fail_node else 2)


def test_held_gpus_count_as_allocated_until_they_free() -> None:
    sim = _sim([make_job("x", replicas=4, min_r=1, max_r=4)])
    job = _start(sim, X)
    sim.resize(job, 2)
    sim.advance(6.0)
    assert sim.alloc_gpu_s == pytest.approx(2 * 6.0 + 2 * 6.0)  # 2 running + 2 saving


def test_a_gang_waits_for_the_held_gpus_then_starts_when_they_free() -> None:
    x = make_job("x", replicas=4, min_r=1, max_r=4)
    y = make_job("y", replicas=2, queue="b", submit_s=10.0)
    sim = _sim([x, y], queues=QUEUES, overcommit=2.0)
    job = _start(sim, X)
    sim.resize(job, 2)
    gang = sim.jobs[JobKey("ns/y")]
    sim.submit(gang)
    run_session(sim)
    assert gang.status is not Status.RUNNING
    sim.advance(6.0)
    sim.free_released()
    run_session(sim)
    assert gang.status is Status.RUNNING


# --- reclaim asks tide's extender -----------------------------------------------------------

MARGIN_S = 3.0


def _managed(leader: bool = True, made_s: float = 0.0) -> ExtenderView:
    job = ShrinkingJob(key=X, task="worker", target_replicas=4, min_replicas=1)
    return ExtenderView(jobs={X: job}, leader=leader, made_s=made_s)


@dataclass(frozen=True)
class Ask:
    name: str
    view: ExtenderView | None = field(default_factory=_managed)
    extender: bool = True
    asked_at_s: tuple[float, ...] = (0.0,)  # sessions while y is blocked
    x_pods: int = 4  # after the last session
    kills: int = 0
    withheld_until_s: float | None = 0.0 + 6.0 + MARGIN_S


ASKS = [
    Ask("withheld within the window"),
    Ask("still withheld just before the window ends", asked_at_s=(0.0, 8.9)),
    Ask(
        "after the window Volcano proceeds",
        asked_at_s=(0.0, 9.0),
        x_pods=2,
        kills=1,
        withheld_until_s=None,
    ),
    Ask("a baseline still kills", extender=False, x_pods=2, kills=1, withheld_until_s=None),
    Ask("no plan yet: plain reclaim", view=None, x_pods=2, kills=1, withheld_until_s=None),
    Ask(
        "not the leader: plain reclaim",
        view=_managed(leader=False),
        x_pods=2,
        kills=1,
        withheld_until_s=None,
    ),
]


@pytest.mark.parametrize("case", ASKS, ids=[a.name for a in ASKS])
def test_reclaim_is_withheld_within_the_grace_window_then_proceeds(case: Ask) -> None:
    x = make_job("x", replicas=4, min_r=1, max_r=4)
    y = make_job("y", replicas=2, queue="b")
    sim = _sim([x, y], queues=QUEUES, overcommit=2.0)
    job = _start(sim, X)
    extender = Extender(stale_after_s=180.0, grace_margin_s=MARGIN_S)
    if case.view is not None:
        extender.update(case.view)
    sim.submit(sim.jobs[JobKey("ns/y")])

    for t in case.asked_at_s:
        sim.advance(t)
        sim.withheld_pods, sim.withheld_until_s = 0, None
        run_session(sim, extender=extender if case.extender else None)

    assert (len(job.pods), job.kills) == (case.x_pods, case.kills)
    assert sim.withheld_until_s == case.withheld_until_s
    assert sim.withheld_pods == (2 if case.withheld_until_s is not None else 0)
    assert (sim.jobs[JobKey("ns/y")].status is Status.RUNNING) == (case.kills > 0)


# x's pods are withheld for gang y (window 6 + 3 s); tide frees w's GPUs instead and y starts
# on them. Gang z then asks for x's pod after y's window ended: z gets a window of its own (the
# overloaded built-in seed 2 kill, where the reclaim killed at z's first ask), and Volcano
# proceeds once z's own window ends.
NEXT_GANG = {
    "the next gang gets a window of its own": ((12.0,), 0),
    "and Volcano proceeds after that window": ((12.0, 21.0), 1),
}


@pytest.mark.parametrize(("asked_at_s", "kills"), NEXT_GANG.values(), ids=NEXT_GANG.keys())
def test_a_pod_withheld_for_one_gang_is_not_killed_at_the_next_gangs_first_ask(
    asked_at_s: tuple[float, ...], kills: int
) -> None:
    w = make_job("w", replicas=4, min_r=1, max_r=4)
    x = make_job("x", replicas=4, min_r=1, max_r=4, submit_s=1.0)  # reclaim's first victim
    y = make_job("y", replicas=2, queue="b", submit_s=2.0)
    z = make_job("z", replicas=1, queue="b", submit_s=10.0)
    sim = _sim([w, x, y, z], queues=QUEUES, nodes=2, overcommit=2.0)
    for key in (JobKey("ns/w"), X):
        _start(sim, key)
    extender = Extender(stale_after_s=180.0, grace_margin_s=MARGIN_S)
    view = _managed()
    extender.update(dataclasses.replace(view, jobs={**view.jobs, JobKey("ns/w"): ShrinkingJob(
        key=JobKey("ns/w"), task="worker", target_replicas=2, min_replicas=1)}))  # fmt: skip
    sim.submit(sim.jobs[JobKey("ns/y")])
    run_session(sim, extender=extender)
    assert sim.withheld_pods == 2
    sim.resize(sim.jobs[JobKey("ns/w")], 2)  # tide's shrink, of another job
    sim.advance(6.0)
    sim.free_released()
    run_session(sim, extender=extender)
    assert sim.jobs[JobKey("ns/y")].status is Status.RUNNING
    sim.submit(sim.jobs[JobKey("ns/z")])

    for t in asked_at_s:
        sim.advance(t)
        run_session(sim, extender=extender)

    assert sim.jobs[X].kills == kills
    assert (sim.jobs[JobKey("ns/z")].status is Status.RUNNING) == (kills > 0)


# --- the event-triggered reconcile -----------------------------------------------------------


@dataclass
class Recording:
    """A controller that shrinks ``ns/x`` to its minimum at its first reconcile after a gang
    appears, and records when it reconciles; tide's trigger rule and extender."""

    name: str = "recording"
    rigid: bool = False
    extender: Extender | None = None
    times: list[float] = field(default_factory=list)
    _seen: frozenset[str] = frozenset()

    def control(self, cluster: SimulatedCluster, *, now_s: float) -> int:
        self.times.append(now_s)
        observation_gangs = tuple(cluster.list_pending_gangs())
        self._seen = frozenset(g.key for g in observation_gangs)
        assert self.extender is not None
        self.extender.update(_managed(made_s=now_s))
        job = cluster.jobs[X]
        if observation_gangs and job.status is Status.RUNNING and job.spec_replicas > 1:
            cluster.resize(job, 1)
            return 1
        return 0

    def order(self) -> JobOrder:
        return fifo_order

    def trigger(self, cluster: SimulatedCluster, *, withheld_pods: int) -> str | None:
        return reconcile_trigger(
            seen=self._seen,
            pending_gangs=cluster.list_pending_gangs(),
            withheld_pods=withheld_pods,
        )


def test_a_pending_gang_triggers_a_reconcile_at_its_arrival_not_the_next_tick() -> None:
    x = make_job("x", replicas=4, min_r=1, max_r=4, work=1e6)
    y = make_job("y", replicas=2, queue="b", submit_s=100.0, work=10.0)
    spec = dataclasses.replace(make_cluster(queues=QUEUES, overcommit=2.0), save_exit_s=6.0)
    controller = Recording(extender=Extender(stale_after_s=180.0, grace_margin_s=MARGIN_S))

    result = simulate(
        workload=Workload("t", (x, y)),
        cluster=spec,
        controller=controller,
        options=RunOptions(interval_s=60.0, horizon_s=150.0),
    )

    assert controller.times == [0.0, 60.0, 100.0]  # at the arrival; the next tick is 160
    records = {r.key: r for r in result.jobs}
    assert records[X].kills == 0
    assert records[JobKey("ns/y")].start_s == 106.0  # the shrink's GPUs free after the save


def _reclaim_workload() -> tuple[Workload, ClusterSpec]:
    """Elastic jobs fill the cluster; non-elastic gangs arrive off the reconcile grid."""
    jobs = [
        make_job("x", replicas=4, min_r=1, max_r=4, work=4 * 3000.0, restart_s=10.0),
        make_job("w", replicas=4, min_r=1, max_r=4, work=4 * 3000.0, restart_s=10.0),
        make_job("y", replicas=3, queue="b", submit_s=130.0, work=3 * 600.0),
        make_job("z", replicas=2, queue="b", submit_s=1234.5, work=2 * 600.0),
    ]
    queues = (
        QueueSpec(A, weight=1.0, reclaimable=True),
        QueueSpec(B, weight=1.0, reclaimable=False, elastic=False),
    )
    cluster = make_cluster(nodes=2, gpus=4, queues=queues, overcommit=2.0)
    return Workload("reclaim", tuple(jobs)), cluster


@pytest.mark.parametrize(
    ("policy", "killed"),
    [("tide", False), ("static", True)],
    ids=["tide shrinks gracefully: no kill", "static is reclaimed: kills"],
)
def test_simulate_tide_suffers_no_kill_where_reclaim_would_kill(policy: str, killed: bool) -> None:
    workload, cluster = _reclaim_workload()
    controller = make_controller(policy, workload=workload, policy=default_policy_for(cluster))

    result = simulate(workload=workload, cluster=cluster, controller=controller)

    kills = sum(r.kills for r in result.jobs)
    assert (kills > 0) == killed
    assert all(r.end_s is not None for r in result.jobs)


# --- where the save time comes from ---------------------------------------------------------

HEADER = "job_id,submit_s,replicas,duration_s,elastic,min_replicas,max_replicas,save_exit_s\n"

SAVE_TIMES = [
    ("the trace's column", "ns/a,0,2,60,true,1,4,12.5\n", 12.5),
    ("an empty cell: the cluster's default", "ns/a,0,2,60,true,1,4,\n", 6.1),
]


@pytest.mark.parametrize(
    ("row", "expected"), [s[1:] for s in SAVE_TIMES], ids=[s[0] for s in SAVE_TIMES]
)
def test_a_jobs_save_time_comes_from_its_trace_row_or_the_cluster(
    tmp_path: Path, row: str, expected: float
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + row)
    workload = load_workload(trace=path)
    sim = SimulatedCluster(spec=make_cluster(), workload=workload)
    assert sim.jobs[JobKey("ns/a")].save_exit_s == expected


@pytest.mark.parametrize(
    ("cell", "problem"),
    [("-1", "save_exit_s must be a finite number >= 0 (seconds), got -1.0"),
     ("soon", "save_exit_s: 'soon' is not a number")],
    ids=["negative", "not a number"],
)  # fmt: skip
def test_a_bad_save_time_names_the_file_and_line(tmp_path: Path, cell: str, problem: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "ns/a,0,2,60,true,1,4,1\n" + f"ns/b,0,2,60,true,1,4,{cell}\n")
    with pytest.raises(SimulationError) as raised:
        load_workload(trace=path)
    assert f"{path}:3" in str(raised.value)
    assert problem in str(raised.value)


def test_the_cluster_files_save_exit_is_read_and_written_back() -> None:
    data = {"nodes": 1, "gpusPerNode": 4, "queues": [{"name": "a"}], "saveExit": "20s"}
    cluster = parse_cluster(data, source="c.yaml")
    assert cluster.save_exit_s == 20.0
    assert parse_cluster(cluster_document(cluster), source="report") == cluster
    with pytest.raises(ClusterFileError, match="saveExit"):
        parse_cluster(data | {"saveExit": "-3s"}, source="c.yaml")
