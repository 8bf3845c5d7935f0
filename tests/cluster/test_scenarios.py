"""tide's engine on a real apiserver, the stand-in Volcano playing its controller and scheduler.

Each scenario runs ``scheduler_policy.engine.reconcile.reconcile`` with the ``VolcanoClient`` as
its cluster client, on the session's control plane (etcd, kube-apiserver v1.36.3 with Volcano's
CRDs and admission policies, KWOK nodes), in a namespace, queues and nodes of its own, and lets
``tests.cluster.standin`` do what Volcano v1.15.1 was recorded doing. Throughput comes from a
fixed profile (``ProfileMetrics``): the engine's Prometheus source is tested on a real
Prometheus in tests/metrics_collector/, so here only the Kubernetes side is real.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client as k8s

from scheduler_policy.adapters.volcano import VolcanoClient
from scheduler_policy.engine.reconcile import ReconcileResult, reconcile
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import Defaults, ElasticPolicy, QueuePolicy
from scheduler_policy.vocabulary.protocols import ClusterClient, MetricsSample, ReplicaChange
from scheduler_policy.vocabulary.state import JobKey, QueueName, Reason, ThroughputPoint
from tests.cluster.sandbox import Sandbox, job_manifest
from tests.cluster.standin import NodeOrder, StandInVolcano

START_S = 1_800_000_000.0
STEP_S = 60.0


def usl(replicas: int) -> float:
    """The fixed throughput profile: samples/s of a job at ``replicas`` (near-linear, USL)."""
    return 100.0 * replicas / (1 + 0.02 * (replicas - 1))


@dataclass
class ProfileMetrics:
    """A ``MetricsSource`` whose throughput is a fixed profile measured an hour ago at 1, 2, 4
    and 8 replicas on one node and at 12, 16, 24 and 32 across 2 to 4 nodes (the sandbox's
    8-GPU nodes: measured across nodes, so the scaling model predicts cross-node growth without
    its cap, and at a part-filled node, so its fit has no dip where a node is added), and whose
    free GPUs are those the Volcano client reads from the nodes (what
    kube-state-metrics would report).

    Attributes:
        cluster: the Volcano client the engine reads the cluster with.
        jobs: the elastic jobs to report throughput for.
    """

    cluster: VolcanoClient
    jobs: tuple[JobKey, ...]

    def sample(self, *, now_s: float) -> MetricsSample:
        """See base class."""
        history = tuple(
            ThroughputPoint(time_s=now_s - 3600 + i, replicas=n, samples_per_s=usl(n), nodes=k)
            for i, (n, k) in enumerate(
                ((1, 1), (2, 1), (4, 1), (8, 1), (12, 2), (16, 2), (24, 3), (32, 4))
            )
        )
        return MetricsSample(
            fresh=True,
            cluster_free_gpus=sum(n.free_gpus for n in self.cluster.list_nodes()),
            job_throughput={key: history for key in self.jobs},
            releasing_gpus=self.cluster.releasing_gpus(),
        )


def policy(research: str, production: str) -> ElasticPolicy:
    """research elastic and borrowing idle GPUs, production not elastic; no damping, so that
    each scenario shows the decision itself (the damping is tested in tests/scheduler_policy)."""
    return ElasticPolicy(
        name="scenarios",
        defaults=Defaults(
            tolerance=0.0,
            restart_cost_s=0.0,
            cooldown_s=0.0,
            max_step_up=100,
            max_step_down=100,
            window_up_s=0.0,
            window_down_s=0.0,
        ),
        queues=(
            QueuePolicy(name=QueueName(research), elastic=True, borrow=True),
            QueuePolicy(name=QueueName(production), elastic=False),
        ),
    )


@dataclass
class Tide:
    """The engine as a test drives it: one reconcile per call, on a clock of its own."""

    sandbox: Sandbox
    client: ClusterClient
    metrics: ProfileMetrics
    policy: ElasticPolicy
    models: ModelCache = field(default_factory=ModelCache)
    now_s: float = START_S

    def reconcile(self) -> ReconcileResult:
        self.now_s += STEP_S
        return reconcile(
            metrics=self.metrics,
            cluster=self.client,
            policy=self.policy,
            now_s=self.now_s,
            models=self.models,
        )


@dataclass
class World:
    sandbox: Sandbox
    standin: StandInVolcano
    client: VolcanoClient
    research: str
    production: str

    def tide(self, *jobs: str, client: ClusterClient | None = None) -> Tide:
        keys = tuple(JobKey(f"{self.sandbox.namespace}/{j}") for j in jobs)
        return Tide(
            sandbox=self.sandbox,
            client=client or self.client,
            metrics=ProfileMetrics(self.client, keys),
            policy=policy(self.research, self.production),
        )

    def elastic(self, name: str, *, replicas: int, max_replicas: int = 32) -> None:
        self.sandbox.create_job(
            job_manifest(
                name, queue=self.research, replicas=replicas, min_available=1,
                annotations={"tide.io/min-replicas": "1",
                             "tide.io/max-replicas": str(max_replicas)},
            )
        )  # fmt: skip

    def gang(self, name: str = "prod") -> None:
        """The recorded production gang: 3 pods × 8 GPUs, not elastic."""
        self.sandbox.create_job(
            job_manifest(
                name, queue=self.production, replicas=3, min_available=3, gpus_per_pod=8,
                elastic=False,
            )
        )  # fmt: skip

    def settle(self, job: str, running: int, *, timeout_s: float = 90.0) -> None:
        """Step the stand-in until ``job`` has ``running`` pods Running and none terminating."""
        self.standin.run_until(
            lambda: self.sandbox.running(job) == running,
            timeout_s=timeout_s,
            what=f"{running} pods of {job} Running",
        )
        self.standin.step()  # the statuses (Job, PodGroup, Queue) catch up


def world_for(sandbox: Sandbox, *, order: NodeOrder, overcommit: bool) -> World:
    sandbox.add_nodes(4)
    research = sandbox.add_queue("research", weight=1)
    production = sandbox.add_queue("production", weight=3)
    client = VolcanoClient(
        sandbox.api,
        namespace=sandbox.namespace,
        node_selector=sandbox.node_selector,
        watch=False,
        events=False,
    )
    return World(
        sandbox=sandbox,
        standin=sandbox.standin(node_order=order, overcommit=overcommit),
        client=client,
        research=research,
        production=production,
    )


@pytest.fixture
def sandbox(control_plane, namespace) -> Iterator[Sandbox]:
    box = Sandbox(control_plane, namespace)
    try:
        yield box
    finally:
        box.close()


def job_patches(plane: Any, namespace: str, since: float) -> list[Any]:
    """PATCHes of Jobs (not of their status) in ``namespace`` the apiserver answered since
    ``since``. The log is written as responses complete, so a GET made afterwards is waited
    for first: once it is there, every earlier request is too."""
    marker = time.time()
    with plane.api_client() as api:
        k8s.CoreV1Api(api).read_namespace(namespace)
    plane.wait_for_audit(
        lambda r: r.verb == "get" and r.resource == "namespaces" and r.name == namespace,
        since=marker,
    )
    return [
        r
        for r in plane.audit_requests(since)
        if r.verb == "patch" and r.resource == "jobs" and not r.subresource
        and r.namespace == namespace
    ]  # fmt: skip


def replicas(sandbox: Sandbox, job: str) -> int:
    value: int = sandbox.job(job)["spec"]["tasks"][0]["replicas"]
    return value


def changes(result: ReconcileResult) -> dict[str, tuple[int, int, Reason]]:
    return {
        c.job.split("/", 1)[1]: (c.from_replicas, c.to_replicas, c.reason)
        for c in result.applied
        if c.to_replicas != c.from_replicas
    }


# --- 1 ----------------------------------------------------------------------------------------


def test_an_elastic_job_grows_into_idle_gpus_and_the_standin_makes_its_pods(sandbox):
    world = world_for(sandbox, order=NodeOrder.SPREAD, overcommit=False)
    world.elastic("elastic", replicas=2)
    world.settle("elastic", 2)
    before = sandbox.uids("elastic")
    since = time.time()

    result = world.tide("elastic").reconcile()

    assert result.failed == ()
    assert changes(result) == {"elastic": (2, 32, Reason.SCALE_UP_FOR_IDLE_GPUS)}
    # The patch passed the apiserver with Volcano's admission policies in force.
    (patch,) = job_patches(sandbox.plane, sandbox.namespace, since)
    assert (patch.name, patch.code) == ("elastic", 200)
    assert replicas(sandbox, "elastic") == 32
    world.settle("elastic", 32)
    assert sandbox.per_node("elastic") == [8, 8, 8, 8]
    assert {i: sandbox.uids("elastic")[i] for i in before} == before
    assert sandbox.queue_status(world.research)["allocated"]["nvidia.com/gpu"] == "32"


# --- 2 ----------------------------------------------------------------------------------------


def test_a_pending_gang_in_a_full_cluster_is_fitted_by_shrinking_the_borrower(sandbox):
    # README: research at 28 of 32 GPUs, overcommit on: Volcano alone never enqueues the gang.
    world = world_for(sandbox, order=NodeOrder.BINPACK, overcommit=True)
    world.elastic("elastic", replicas=28, max_replicas=28)
    world.settle("elastic", 28)
    before = sandbox.uids("elastic")
    world.gang("prod")
    for _ in range(3):
        world.standin.step()
    assert sandbox.podgroup_phase("prod") == "Pending"
    since = time.time()
    tide = world.tide("elastic")

    result = tide.reconcile()

    gangs = result.observation.pending_gangs
    assert [(g.min_member, g.gpus) for g in gangs] == [(3, 24.0)]
    assert changes(result) == {"elastic": (28, 8, Reason.SHRINK_FOR_PENDING_WORK)}
    world.settle("prod", 3)
    assert sandbox.podgroup_phase("prod") == "Running"
    assert sorted(sandbox.per_node("prod")) == [0, 1, 1, 1]
    # Nobody was evicted: the only pods deleted are the elastic job's highest indices.
    deleted = {
        r.name
        for r in sandbox.plane.audit_requests(since)
        if r.verb == "delete" and r.resource == "pods" and r.namespace == sandbox.namespace
    }
    assert deleted == {f"elastic-worker-{i}" for i in range(8, 28)}
    assert sandbox.uids("elastic") == {i: before[i] for i in range(8)}
    assert sandbox.running("elastic") == 8


# --- 3 ----------------------------------------------------------------------------------------


def grown(world: World, *, settle: bool) -> Tide:
    """An elastic job of 2 grown to 32 by tide; its pods made and Running when ``settle``."""
    world.elastic("elastic", replicas=2)
    world.settle("elastic", 2)
    tide = world.tide("elastic")
    assert changes(tide.reconcile()) == {"elastic": (2, 32, Reason.SCALE_UP_FOR_IDLE_GPUS)}
    if settle:
        world.settle("elastic", 32)
    return tide


def shrunk(world: World, *, settle: bool) -> Tide:
    """A borrower of 28 shrunk to 8 for a Pending gang; the gang Running when ``settle``."""
    world.elastic("elastic", replicas=28, max_replicas=28)
    world.settle("elastic", 28)
    world.gang("prod")
    world.standin.step()
    tide = world.tide("elastic")
    assert changes(tide.reconcile()) == {"elastic": (28, 8, Reason.SHRINK_FOR_PENDING_WORK)}
    if settle:
        world.settle("prod", 3)
    return tide


SAME_STATE = {
    "right-after-a-growth-before-the-pods-exist": (grown, False, NodeOrder.SPREAD),
    "after-a-growth-once-the-pods-run": (grown, True, NodeOrder.SPREAD),
    "right-after-a-shrink-for-a-gang": (shrunk, False, NodeOrder.BINPACK),
    "after-a-shrink-once-the-gang-runs": (shrunk, True, NodeOrder.BINPACK),
}


@pytest.mark.parametrize(("make", "settle", "order"), SAME_STATE.values(), ids=SAME_STATE.keys())
def test_a_second_reconcile_on_the_same_state_writes_nothing(sandbox, make, settle, order):
    world = world_for(sandbox, order=order, overcommit=True)
    tide = make(world, settle=settle)
    patches = world.client.requests().patches
    since = time.time()

    second = tide.reconcile()

    assert second.applied == () and second.failed == ()
    assert world.client.requests().patches == patches
    assert job_patches(sandbox.plane, sandbox.namespace, since) == []


# --- 4 ----------------------------------------------------------------------------------------


@dataclass
class WriterInBetween:
    """A ``ClusterClient`` that lets another writer change each Job once, after tide has read
    it and before tide's patch of it goes out."""

    inner: VolcanoClient
    write: Any
    written: list[str] = field(default_factory=list)

    def list_queues(self):  # type: ignore[no-untyped-def]
        return self.inner.list_queues()

    def list_jobs(self):  # type: ignore[no-untyped-def]
        return self.inner.list_jobs()

    def list_nodes(self):  # type: ignore[no-untyped-def]
        return self.inner.list_nodes()

    def list_pending_gangs(self):  # type: ignore[no-untyped-def]
        return self.inner.list_pending_gangs()

    def releasing_gpus(self) -> float:
        return self.inner.releasing_gpus()

    def apply(self, change: ReplicaChange) -> None:
        if change.job not in self.written:
            self.write(change.job)
            self.written.append(change.job)
        self.inner.apply(change)


def test_a_concurrent_writer_makes_the_patch_fail_its_test_and_the_client_retries(sandbox):
    world = world_for(sandbox, order=NodeOrder.SPREAD, overcommit=False)
    world.elastic("elastic", replicas=2)
    world.settle("elastic", 2)
    # The engine's own loop: watches, so that the Job it patches is the one it observed.
    watching = VolcanoClient(
        sandbox.api, namespace=sandbox.namespace, node_selector=sandbox.node_selector,
        watch=True, events=False,
    )  # fmt: skip
    watching.start()
    try:
        assert watching.wait_synced(30.0)
        deadline = time.monotonic() + 30.0
        while len(watching.list_jobs()) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watching.stop(10.0)  # its cache stays as it was read, as between observe and apply

        def other_controller(key: JobKey) -> None:
            # Another writer labels the Job: its resourceVersion moves, its replicas do not.
            sandbox.custom.patch_namespaced_custom_object(
                "batch.volcano.sh", "v1alpha1", sandbox.namespace, "jobs", key.split("/", 1)[1],
                {"metadata": {"labels": {"team": "vision"}}},
            )  # fmt: skip

        between = WriterInBetween(watching, other_controller)
        since = time.time()
        result = world.tide("elastic", client=between).reconcile()
    finally:
        watching.stop(10.0)

    assert between.written == [f"{sandbox.namespace}/elastic"]
    assert result.failed == ()
    assert changes(result) == {"elastic": (2, 32, Reason.SCALE_UP_FOR_IDLE_GPUS)}
    # The API answers a failed JSON-patch `test` (of the resourceVersion) with 422, not 409;
    # the client read the Job again and its second patch went through.
    codes = [r.code for r in job_patches(sandbox.plane, sandbox.namespace, since)]
    assert codes == [200, 422, 200]  # the other writer's, tide's refused one, tide's retry
    counts = watching.requests()
    assert (counts.patches, counts.retries) == (2, 1)
    job = sandbox.job("elastic")
    assert job["spec"]["tasks"][0]["replicas"] == 32
    assert job["metadata"]["labels"] == {"team": "vision"}  # the other write is kept


# --- 5 ----------------------------------------------------------------------------------------


def test_spread_pods_are_shrunk_so_that_the_gang_gets_whole_nodes(sandbox):
    # README, "Placement": 24 one-GPU pods spread 6 per node; shrunk to 8 by count, 2 stay on
    # every node, no node has 8 free and the 3 × 8 gang never runs.
    world = world_for(sandbox, order=NodeOrder.SPREAD, overcommit=False)
    world.elastic("elastic", replicas=24, max_replicas=24)
    world.settle("elastic", 24)
    assert sandbox.per_node("elastic") == [6, 6, 6, 6]
    world.gang("prod")
    for _ in range(3):
        world.standin.step()
    assert sandbox.podgroup_phase("prod") == "Inqueue"  # no overcommit: enqueued, not placed
    tide = world.tide("elastic")

    first = tide.reconcile()

    assert [(g.min_member, g.gpus) for g in first.observation.pending_gangs] == [(3, 24.0)]
    (shrink,) = [c for c in first.applied if c.job.endswith("/elastic")]
    # Highest indices go first and pod i is on node i % 4: only a shrink to 1 frees 3 nodes.
    assert (shrink.from_replicas, shrink.to_replicas) == (24, 1)
    assert shrink.reason is Reason.SHRINK_FOR_GANG_SHAPE
    gang_key = first.observation.pending_gangs[0].key
    assert f"pending gang {gang_key}" in shrink.message
    assert ", ".join(sandbox.nodes[1:]) in shrink.message  # the nodes it frees, named
    world.standin.run_until(
        lambda: sandbox.running("elastic") == shrink.to_replicas,
        timeout_s=90.0,
        what="the shrink done",
    )
    free_nodes = sum(1 for n in sandbox.per_node("elastic") if n == 0)
    assert free_nodes >= 3, f"pods per node after tide's shrink: {sandbox.per_node('elastic')}"
    world.settle("prod", 3)
    assert sandbox.podgroup_phase("prod") == "Running"
