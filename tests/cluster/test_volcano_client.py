"""The Volcano client against a real kube-apiserver with Volcano's CRDs and admission policies.

No Volcano controller runs: the tests create the pods and PodGroups it would create (shaped as
the recordings in ``../shared/volcano-wire/v1.15.1/`` show), and set a Job's status themselves.
Each test has its own namespace, queue and node; the client is scoped to them (``namespace``,
``node_selector``), since the plane is shared by the session.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from scheduler_policy.adapters.memory_codec import MEMORY_ANNOTATION, decode_memory
from scheduler_policy.adapters.volcano import (
    JobNotFound,
    NotElastic,
    PatchRefused,
    VolcanoClient,
    from_kubeconfig,
)
from scheduler_policy.engine.reconcile import apply_changes, observe
from scheduler_policy.vocabulary.errors import ConflictError
from scheduler_policy.vocabulary.protocols import MetricsSample, ReplicaChange
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobMemory,
    NodeState,
    PendingGang,
    PodPlacement,
    QueueName,
    Reason,
    Recommendation,
    Sentence,
)
from tests.cluster.controlplane import ControlPlane

BATCH = ("batch.volcano.sh", "v1alpha1")
SCHEDULING = ("scheduling.volcano.sh", "v1beta1")
WAIT_S = 15.0
MEMORY = JobMemory(
    last_rescale_s=1796029737.125, recommendations=(Recommendation(1796029700.5, 3),)
)


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


class World:
    """One test's objects on the shared plane: its namespace, queue and GPU node."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane = plane
        self.ns = namespace
        self.api = plane.api_client()
        self.custom = k8s.CustomObjectsApi(self.api)
        self.core = k8s.CoreV1Api(self.api)
        self.queue = f"q-{namespace}"
        self.node = f"n-{namespace}"
        plane.create_queue(self.queue, weight=1, capability_gpus=16)
        plane.add_gpu_node(self.node, gpus=8)

    def client(self, **kwargs: Any) -> VolcanoClient:
        return VolcanoClient(
            self.plane.api_client(), namespace=self.ns,
            node_selector=f"kubernetes.io/hostname={self.node}", **kwargs,
        )  # fmt: skip

    def job(self, name: str, *, replicas: int = 2, elastic: bool = True, job_least: int = 1,
            gpus: int = 1) -> dict[str, Any]:  # fmt: skip
        annotations = {"tide.io/elastic": "true", "tide.io/max-replicas": "8"} if elastic else {}
        container = {
            "name": "worker",
            "image": "x",
            "resources": {
                "requests": {"nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)},
            },
        }
        body = {
            "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "schedulerName": "volcano", "queue": self.queue, "minAvailable": job_least,
                "tasks": [{"name": "worker", "replicas": replicas, "minAvailable": 1,
                           "template": {"spec": {"restartPolicy": "OnFailure",
                                                 "containers": [container]}}}],
            },
        }  # fmt: skip
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            *BATCH, self.ns, "jobs", body
        )
        return created

    def running(self, name: str) -> None:
        """Set the Job's status as Volcano's controller would (Running)."""
        self.custom.patch_namespaced_custom_object_status(
            *BATCH, self.ns, "jobs", name,
            {"status": {"state": {"phase": "Running"}, "running": 1}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip

    def get(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            *BATCH, self.ns, "jobs", name
        )
        return got

    def pod(self, job: str, index: int, *, node: str | None, gpus: int = 1,
            finalizer: bool = False) -> str:  # fmt: skip
        """A pod as Volcano's job controller makes it (pod-of-vcjob.json)."""
        labels = {"volcano.sh/job-name": job, "volcano.sh/job-namespace": self.ns,
                  "volcano.sh/queue-name": self.queue, "volcano.sh/task-index": str(index),
                  "volcano.sh/task-spec": "worker"}  # fmt: skip
        name = f"{job}-worker-{index}"
        spec: dict[str, Any] = {"containers": [{"name": "t", "image": "x", "resources": {
            "requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}}],
            "schedulerName": "volcano"}  # fmt: skip
        if node is not None:
            spec["nodeName"] = node
        metadata: dict[str, Any] = {"name": name, "labels": labels,
                                    "annotations": {"scheduling.k8s.io/group-name": f"{job}-pg",
                                                    **labels}}  # fmt: skip
        if finalizer:
            metadata["finalizers"] = ["tide.io/test-holds-it"]
        self.core.create_namespaced_pod(self.ns, {"metadata": metadata, "spec": spec})
        return name

    def podgroup(self, name: str, *, gpus: int, members: int, phase: str = "Inqueue",
                 owner: str | None = None) -> None:  # fmt: skip
        """A PodGroup as Volcano's controller makes it (podgroups-with-pending-gang.json)."""
        metadata: dict[str, Any] = {"name": name}
        if owner is not None:
            metadata["ownerReferences"] = [{
                "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": owner,
                "uid": self.get(owner)["metadata"]["uid"], "controller": True,
            }]  # fmt: skip
        self.custom.create_namespaced_custom_object(*SCHEDULING, self.ns, "podgroups", {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": metadata,
            "spec": {"minMember": members, "queue": self.queue,
                     "minResources": {"nvidia.com/gpu": str(gpus), "cpu": str(members)}},
            "status": {"phase": phase},
        })  # fmt: skip

    def change(self, job: str, *, frm: int, to: int, memory: JobMemory = MEMORY,
               reason: Reason = Reason.SCALE_UP_FOR_IDLE_GPUS) -> ReplicaChange:  # fmt: skip
        return ReplicaChange(JobKey(f"{self.ns}/{job}"), "worker", frm, to, memory, reason,
                             Sentence(f"test: {frm} -> {to} replicas"))  # fmt: skip


@pytest.fixture
def world(control_plane: ControlPlane, namespace: str) -> World:
    return World(control_plane, namespace)


@pytest.fixture
def started(world: World) -> Iterator[VolcanoClient]:
    client = world.client()
    client.start()
    assert client.wait_synced(WAIT_S)
    yield client
    client.stop()


def populate(world: World) -> None:
    """An elastic job on 2 GPUs (and a third replica waiting), a non-elastic job on 2, a pod
    on its way out, a pending gang of 3 × 8 GPUs, and the elastic job's own pending PodGroup."""
    world.job("a", replicas=3)
    world.running("a")
    world.pod("a", 1, node=world.node)
    world.pod("a", 0, node=world.node)
    world.pod("a", 2, node=None)
    world.job("b", elastic=False, replicas=1, gpus=2)
    world.pod("b", 0, node=world.node, gpus=2)
    leaving = world.pod("old", 0, node=f"{world.node}-gone", gpus=4, finalizer=True)
    world.core.delete_namespaced_pod(leaving, world.ns)
    world.podgroup("prod", gpus=24, members=3)
    world.podgroup("a-pg", gpus=1, members=1, phase="Pending", owner="a")


@pytest.mark.parametrize("watch", [True, False], ids=["watching", "listing"])
def test_lists_read_what_was_created(world, watch):
    populate(world)
    client = world.client(watch=watch)
    client.start()
    assert client.wait_synced(WAIT_S)
    try:
        if watch:  # the watches may still be catching up with the pods and PodGroups
            wait_for("the caches", lambda: len(client.list_pending_gangs()) == 1
                     and client.releasing_gpus() == 4.0)  # fmt: skip
        jobs = {j.key: j for j in client.list_jobs()}
        a, b = jobs[JobKey(f"{world.ns}/a")], jobs[JobKey(f"{world.ns}/b")]
        assert (a.elastic, a.current_replicas, a.scheduled_replicas) == (True, 3, 2)
        assert a.pods == (PodPlacement(0, world.node, 1.0), PodPlacement(1, world.node, 1.0),
                          PodPlacement(2, None, 1.0))  # fmt: skip
        assert (b.elastic, b.gpus_per_replica) == (False, 2.0)
        (queue,) = [q for q in client.list_queues() if q.name == world.queue]
        assert (queue.capability_gpus, queue.pending_nonelastic_gpus) == (16.0, 24.0)
        (gang,) = client.list_pending_gangs()
        assert gang == PendingGang(key=f"{world.ns}/prod", queue=QueueName(world.queue),
                                   min_member=3, gpus=24.0, phase="Inqueue",
                                   since_s=gang.since_s)  # fmt: skip
        assert gang.since_s is not None and abs(gang.since_s - time.time()) < 120
        assert client.list_nodes() == [NodeState(world.node, 8.0, 4.0)]
        assert client.releasing_gpus() == 4.0
    finally:
        client.stop()


class NoClusterFigures:
    """The metrics ``tide engine`` reads (``PrometheusSource(cluster_figures=False)``): no free
    GPUs and no releasing GPUs of its own."""

    def sample(self, *, now_s: float) -> MetricsSample:
        return MetricsSample(fresh=True, cluster_free_gpus=math.nan)


@pytest.mark.parametrize("watch", [True, False], ids=["watching", "listing"])
def test_observe_counts_a_terminating_pods_gpus_as_releasing(world, watch):
    world.job("a", replicas=2)
    world.running("a")
    world.pod("a", 0, node=world.node)
    # On a node KWOK does not manage (it would finish the deletion) nor the client lists.
    leaving = world.pod("a", 1, node=f"{world.node}-gone", gpus=2, finalizer=True)
    client = world.client(watch=watch)
    client.start()
    assert client.wait_synced(WAIT_S)
    try:
        before = observe(metrics=NoClusterFigures(), cluster=client, now_s=time.time())
        assert (before.cluster_free_gpus, before.releasing_gpus) == (7.0, 0.0)
        # The finalizer keeps the pod, now with a deletionTimestamp, on its node: terminating.
        world.core.delete_namespaced_pod(leaving, world.ns)
        wait_for("the deletion", lambda: client.releasing_gpus() == 2.0)
        after = observe(metrics=NoClusterFigures(), cluster=client, now_s=time.time())
        assert (after.cluster_free_gpus, after.releasing_gpus) == (7.0, 2.0)
    finally:
        client.stop()


def test_watching_lists_once_however_often_it_is_read(world, started):
    world.job("a")
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    before = started.requests()
    for _ in range(20):
        started.list_jobs(), started.list_queues(), started.list_nodes()
        started.list_pending_gangs()
    assert started.requests().lists == before.lists == 5  # one page of each kind


# Fields a patch of replicas may change; everything else in the Job must stay as it was.
MAY_CHANGE = ("resourceVersion", "generation", "managedFields", "annotations")


def without_what_may_change(job: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(job)
    for key in MAY_CHANGE:
        job["metadata"].pop(key, None)
    for task in job["spec"]["tasks"]:
        task.pop("replicas")
    return job


def test_a_patch_of_replicas_passes_the_policies_and_changes_nothing_else(world, started):
    world.job("a", replicas=2)
    world.running("a")
    before = world.get("a")
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    started.apply(world.change("a", frm=2, to=5))
    after = world.get("a")
    assert after["spec"]["tasks"][0]["replicas"] == 5
    assert without_what_may_change(after) == without_what_may_change(before)
    assert {k: v for k, v in after["metadata"]["annotations"].items() if k != MEMORY_ANNOTATION} \
        == before["metadata"]["annotations"]  # fmt: skip
    assert started.requests().patches == 1 and started.requests().retries == 0


@pytest.mark.parametrize("watch", [True, False], ids=["watching", "listing"])
def test_the_memory_round_trips_exactly(world, watch):
    world.job("a", replicas=2)
    client = world.client(watch=watch)
    client.start()
    assert client.wait_synced(WAIT_S)
    try:
        client.apply(world.change("a", frm=2, to=2))  # memory only
        stored = world.get("a")["metadata"]["annotations"][MEMORY_ANNOTATION]
        assert decode_memory(stored) == MEMORY
        (job,) = client.list_jobs()  # read-your-write: the cache holds the patched Job
        assert (job.last_rescale_s, job.recommendations, job.current_replicas) == (
            MEMORY.last_rescale_s, MEMORY.recommendations, 2,
        )  # fmt: skip
        assert [repr(r.time_s) for r in job.recommendations] == ["1796029700.5"]
    finally:
        client.stop()


def test_a_patch_the_policies_refuse_is_a_typed_error_naming_the_job_and_patch(world, started):
    # The reader never goes below the Job's own minAvailable (2); a change made by hand does,
    # and Volcano's job-validation-policy refuses it.
    world.job("a", replicas=3, job_least=2)
    before = world.get("a")
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    (job,) = started.list_jobs()
    assert job.min_replicas == 2
    with pytest.raises(PatchRefused) as refused:
        started.apply(world.change("a", frm=3, to=1, reason=Reason.SHRINK_FOR_PENDING_WORK))
    error = refused.value
    assert (error.job, error.status) == (f"{world.ns}/a", 422)
    assert "job-validation-policy" in error.api_message and "minAvailable" in error.api_message
    assert {"op": "replace", "path": "/spec/tasks/0/replicas", "value": 1} in error.patch
    assert f"Job {world.ns}/a" in str(error) and "HTTP 422" in str(error)
    assert '"/spec/tasks/0/replicas"' in str(error)
    assert world.get("a")["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def frozen(client: VolcanoClient) -> VolcanoClient:
    """The client with its watches stopped: its cache stays as a list saw it, as between the
    engine's observation and its write."""
    assert client.stop(5.0)
    return client


def test_a_writer_that_left_the_replicas_alone_is_retried_over(world, started):
    world.job("a", replicas=2)
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    client = frozen(started)
    world.running("a")  # the controller writes the status: a new resourceVersion
    client.apply(world.change("a", frm=2, to=4))
    assert world.get("a")["spec"]["tasks"][0]["replicas"] == 4
    counts = client.requests()
    assert (counts.patches, counts.retries, counts.gets) == (2, 1, 1)


def test_a_writer_that_changed_the_replicas_is_a_conflict(world, started):
    world.job("a", replicas=2)
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    client = frozen(started)
    world.custom.patch_namespaced_custom_object(
        *BATCH, world.ns, "jobs", "a",
        [{"op": "replace", "path": "/spec/tasks/0/replicas", "value": 6}],
        _content_type="application/json-patch+json",
    )  # fmt: skip
    with pytest.raises(ConflictError, match="6 replicas now"):
        client.apply(world.change("a", frm=2, to=3))
    job = world.get("a")
    assert job["spec"]["tasks"][0]["replicas"] == 6
    assert MEMORY_ANNOTATION not in job["metadata"]["annotations"]


def test_changes_are_written_at_once_and_a_conflict_among_them_stops_no_other(world, started):
    names = [f"c{i:02d}" for i in range(12)]
    for name in names:
        world.job(name, replicas=2)
    wait_for("the jobs", lambda: len(started.list_jobs()) == len(names))
    # Another writer moves one job under the engine.
    world.custom.patch_namespaced_custom_object(
        *BATCH, world.ns, "jobs", "c05",
        [{"op": "replace", "path": "/spec/tasks/0/replicas", "value": 6}],
        _content_type="application/json-patch+json",
    )  # fmt: skip
    changes = [world.change(name, frm=2, to=3) for name in names]
    assert started.max_concurrent_writes > 1

    applied, failed = apply_changes(started, changes)

    assert [c.job for c in applied] == [c.job for c in changes if not c.job.endswith("c05")]
    assert [(c.job, "conflict" in why) for c, why in failed] == [(JobKey(f"{world.ns}/c05"), True)]
    for name in names:
        job = world.get(name)
        replicas = job["spec"]["tasks"][0]["replicas"]
        stored = job["metadata"]["annotations"].get(MEMORY_ANNOTATION)
        if name == "c05":
            assert (replicas, stored) == (6, None)
        else:
            assert (replicas, decode_memory(stored)) == (3, MEMORY)


def test_a_job_tide_shrank_still_reports_its_asked_size_after_a_restart(world, started):
    world.job("a", replicas=4)
    world.running("a")
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    (before,) = started.list_jobs()
    assert (before.current_replicas, before.requested_replicas) == (4, 4)
    started.apply(world.change("a", frm=4, to=2, reason=Reason.SHRINK_FOR_PENDING_WORK))
    started.stop()

    restarted = world.client(watch=False)  # a new engine: all it knows is on the Job
    (job,) = restarted.list_jobs()

    assert (job.current_replicas, job.requested_replicas) == (2, 4)
    assert (job.last_rescale_s, job.recommendations) == (
        MEMORY.last_rescale_s,
        MEMORY.recommendations,
    )


def test_a_job_without_the_elastic_annotation_is_never_written(world, started):
    world.job("b", elastic=False)
    before = world.get("b")
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    with pytest.raises(NotElastic, match=r"tide\.io/elastic"):
        started.apply(world.change("b", frm=2, to=3))
    assert world.get("b") == before
    assert started.requests().patches == 0


def test_a_write_to_a_job_that_does_not_exist_is_job_not_found(world, started):
    with pytest.raises(JobNotFound) as missing:
        started.apply(world.change("ghost", frm=1, to=2))
    assert missing.value.status == 404 and f"{world.ns}/ghost" in str(missing.value)


def test_an_event_names_the_job_the_reason_and_why(world, started):
    world.job("a", replicas=2)
    uid = world.get("a")["metadata"]["uid"]
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    started.apply(world.change("a", frm=2, to=3))
    started.apply(world.change("a", frm=3, to=3))  # memory only: no Event
    assert started.flush_events(WAIT_S)
    (event,) = world.core.list_namespaced_event(world.ns).items
    assert (event.involved_object.kind, event.involved_object.name, event.involved_object.uid) \
        == ("Job", "a", uid)  # fmt: skip
    assert (event.reason, event.message, event.type) == (
        "ScaleUpForIdleGpus", "test: 2 -> 3 replicas", "Normal",
    )  # fmt: skip
    assert event.source.component == "tide-engine" and started.requests().events == 1


def test_watches_see_a_new_pending_gang_and_an_elastic_job_and_say_so(world, started):
    heard: list[str] = []
    started.on_change(heard.append)
    world.podgroup("prod", gpus=16, members=2)
    wait_for("the gang", lambda: [g.key for g in started.list_pending_gangs()]
             == [f"{world.ns}/prod"])  # fmt: skip
    wait_for("the notice", lambda: any("prod" in h for h in heard))
    world.job("a")
    wait_for("the job's notice", lambda: any("Job" in h and "/a" in h for h in heard))
    world.job("b", elastic=False)
    wait_for("the other job", lambda: len(started.list_jobs()) == 2)
    assert not any("/b" in h for h in heard)


def test_stop_leaves_no_thread_running(world):
    client = world.client()
    client.start()
    assert client.wait_synced(WAIT_S)
    assert client.running_threads == 5
    began = time.monotonic()
    assert client.stop(5.0)
    assert time.monotonic() - began < 5.0
    assert client.running_threads == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("tide-watch-")]


def test_an_event_that_cannot_be_created_never_fails_the_write(world, started, caplog):
    world.job("a", replicas=2)
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    # A namespace being deleted refuses new objects (the Event) but not a patch of the Job;
    # with no controller manager it stays Terminating.
    world.core.delete_namespace(world.ns)
    with caplog.at_level(logging.WARNING):
        started.apply(world.change("a", frm=2, to=3))
        assert started.flush_events(WAIT_S)
    assert world.get("a")["spec"]["tasks"][0]["replicas"] == 3
    assert "Event" in caplog.text and f"{world.ns}/a" in caplog.text
    assert world.core.list_namespaced_event(world.ns).items == []


def test_one_malformed_pod_is_skipped_with_its_name_and_the_rest_are_read(world, caplog):
    world.job("a", replicas=2)
    world.pod("a", 0, node=world.node)
    bad = world.pod("a", 1, node=world.node)
    world.core.patch_namespaced_pod(bad, world.ns, {"metadata": {
        "labels": {"volcano.sh/task-index": "first"},
        "annotations": {"volcano.sh/task-index": "first"}}})  # fmt: skip
    client = world.client(watch=False)
    with caplog.at_level(logging.WARNING):
        (job,) = client.list_jobs()
    assert job.pods == (PodPlacement(0, world.node, 1.0),)
    assert f"Pod {world.ns}/{bad}" in caplog.text and "volcano.sh/task-index" in caplog.text


# The RBAC the package docstring lists (and the chart grants), leader election's leases aside.
RULES = [
    {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["scheduling.volcano.sh"], "resources": ["queues", "podgroups"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]  # fmt: skip


def test_the_documented_rbac_is_all_the_client_needs(world, control_plane):
    rbac = k8s.RbacAuthorizationV1Api(world.api)
    account, role = "tide", f"tide-engine-{world.ns}"
    world.core.create_namespaced_service_account(world.ns, {"metadata": {"name": account}})
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": RULES})
    rbac.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": world.ns}],
    })  # fmt: skip
    token = world.core.create_namespaced_service_account_token(
        account, world.ns, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    user = f"system:serviceaccount:{world.ns}:{account}"
    populate(world)
    since = time.time() - 1.0

    def authorized() -> bool:  # RBAC bindings take effect shortly after they are created
        try:
            k8s.CoreV1Api(control_plane.api_client_for_token(token)).list_node()
        except k8s.ApiException:
            return False
        return True

    wait_for("the role binding", authorized)
    client = VolcanoClient(control_plane.api_client_for_token(token), namespace=world.ns,
                           node_selector=f"kubernetes.io/hostname={world.node}")  # fmt: skip
    client.start()
    try:
        assert client.wait_synced(WAIT_S)
        wait_for("the caches", lambda: len(client.list_pending_gangs()) == 1)
        client.list_queues(), client.list_nodes(), client.releasing_gpus()
        client.apply(world.change("a", frm=3, to=4))
        assert client.flush_events(WAIT_S)
    finally:
        assert client.stop(5.0)
    assert len(world.core.list_namespaced_event(world.ns).items) == 1
    seen = control_plane.audit_requests(since=since)
    mine = [r for r in seen if r.user == user]
    assert mine and all(r.code < 400 for r in mine), [r for r in mine if r.code >= 400]
    allowed = {(resource, verb) for rule in RULES for resource in rule["resources"]
               for verb in rule["verbs"]}  # fmt: skip
    assert {(r.resource, r.verb) for r in mine} <= allowed


class Unrenderable:
    """An explanation whose sentence fails to render."""

    def render(self, job: str) -> str:
        raise RuntimeError("the template is broken")

    def __str__(self) -> str:
        return "an unrenderable explanation"


def test_an_explanation_that_fails_to_render_never_fails_the_write(world, started, caplog):
    world.job("a", replicas=2)
    wait_for("the job", lambda: len(started.list_jobs()) == 1)
    change = dataclasses.replace(world.change("a", frm=2, to=3), why=Unrenderable())
    with caplog.at_level(logging.WARNING):
        started.apply(change)
    assert started.flush_events(WAIT_S)
    assert world.get("a")["spec"]["tasks"][0]["replicas"] == 3
    assert "the template is broken" in caplog.text
    (event,) = world.core.list_namespaced_event(world.ns).items
    assert event.message == "an unrenderable explanation"


def test_a_client_from_the_planes_kubeconfig_reads_the_cluster(world, control_plane):
    world.job("a")
    client = VolcanoClient(from_kubeconfig(str(control_plane.kubeconfig_path)),
                           namespace=world.ns, watch=False)  # fmt: skip
    assert [j.key for j in client.list_jobs()] == [f"{world.ns}/a"]
