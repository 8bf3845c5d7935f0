"""The stand-in Volcano against the recordings of a real Volcano v1.15.1.

Each test creates what the recording was made from, lets the stand-in step, and compares what
is on the real apiserver with the recorded objects (../shared/volcano-wire/v1.15.1/) or the
README's behaviour bullets.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest

from tests.cluster.sandbox import RECORDINGS, Sandbox, job_manifest, recording
from tests.cluster.standin import NodeOrder
from tests.cluster.standin_objects import Pod, min_resources, parse_quantity, place

needs_recordings = pytest.mark.skipif(
    not RECORDINGS.is_dir(), reason=f"the Volcano recordings are not at {RECORDINGS}"
)


def recorded_podgroups() -> dict[str, dict[str, Any]]:
    """The recorded PodGroups by their Job's name (``elastic``, ``prod``)."""
    items = recording("podgroups-with-pending-gang.json")["items"]
    return {pg["metadata"]["ownerReferences"][0]["name"]: pg for pg in items}


def recorded_job(*, queue: str) -> dict[str, Any]:
    """vcjob-running.json as it was submitted: its name, annotations and spec, in ``queue``."""
    job = recording("vcjob-running.json")
    spec = copy.deepcopy(job["spec"])
    spec["queue"] = queue
    return {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "metadata": {
            "name": job["metadata"]["name"],
            "annotations": job["metadata"]["annotations"],
        },
        "spec": spec,
    }


def gang(name: str = "prod", *, queue: str) -> dict[str, Any]:
    """The recorded production gang: 3 pods × 8 GPUs, all needed (minAvailable 3)."""
    return job_manifest(
        name, queue=queue, replicas=3, min_available=3, gpus_per_pod=8, elastic=False
    )


# --- pure -----------------------------------------------------------------------------------


@needs_recordings
@pytest.mark.parametrize(
    "job",
    ["elastic", "prod"],
    ids=["elastic-job-minresources-follow-minavailable", "gang-of-3x8-minresources"],
)
def test_min_resources_are_those_recorded(job):
    manifest = recorded_job(queue="q") if job == "elastic" else gang(queue="q")
    spec = manifest["spec"]
    if job == "elastic":
        spec["tasks"][0]["replicas"] = 5  # the recording's PodGroup had 5 running: not counted
    got = min_resources(spec["tasks"], min_available=spec["minAvailable"], path=job)
    assert got == recorded_podgroups()[job]["spec"]["minResources"]


QUANTITIES = {
    "count": ("24", Fraction(24)),
    "milli": ("1500m", Fraction(3, 2)),
    "binary": ("8Gi", Fraction(8 * 2**30)),
    "decimal-suffix": ("2k", Fraction(2000)),
    "number": (3, Fraction(3)),
}


@pytest.mark.parametrize(("text", "value"), QUANTITIES.values(), ids=QUANTITIES.keys())
def test_parse_quantity(text, value):
    assert parse_quantity(text, path="x") == value


def test_a_bad_quantity_names_where_it_is():
    with pytest.raises(
        ValueError, match=r"spec.containers\[0\]: not a Kubernetes quantity: 'lots'"
    ):
        parse_quantity("lots", path="spec.containers[0]")


def pods_of(gpus: int, count: int) -> list[Pod]:
    return [
        Pod(name=f"p-{i}", group="g", job="j", task="worker", index=i, node=None,
            phase="Pending", terminating=False, gpus=Fraction(gpus), requests={})
        for i in range(count)
    ]  # fmt: skip


PLACE = {
    # Spread: most free first, ties to the first name: pod i on node i % 4 (README: 6 per node).
    "spread-round-robin": (NodeOrder.SPREAD, pods_of(1, 6), [8, 8, 8, 8], ["a", "b", "c", "d"] * 2),
    "spread-avoids-the-busy-node": (NodeOrder.SPREAD, pods_of(1, 2), [2, 8, 8, 8], ["b", "c"]),
    # Binpack: the fullest node that fits first.
    "binpack-fills-the-fullest": (NodeOrder.BINPACK, pods_of(1, 3), [8, 2, 8, 8], ["b", "b", "a"]),
    "binpack-skips-a-node-too-full": (NodeOrder.BINPACK, pods_of(8, 2), [8, 4, 8, 0], ["a", "c"]),
    # All or nothing: the third pod of a gang has nowhere to go.
    "a-gang-that-does-not-fit": (NodeOrder.SPREAD, pods_of(8, 3), [8, 8, 7, 7], None),
}  # fmt: skip


@pytest.mark.parametrize(("order", "pods", "free", "nodes"), PLACE.values(), ids=PLACE.keys())
def test_place(order, pods, free, nodes):
    free_by_node = {name: Fraction(f) for name, f in zip("abcd", free, strict=True)}
    plan = place(pods, free_by_node, order=order)
    if nodes is None:
        assert plan is None
    else:
        assert [node for _, node in plan] == nodes[: len(pods)]
    assert free_by_node == {name: Fraction(f) for name, f in zip("abcd", free, strict=True)}


# --- on the real apiserver ------------------------------------------------------------------


@pytest.fixture
def sandbox(control_plane, namespace) -> Iterator[Sandbox]:
    box = Sandbox(control_plane, namespace)
    try:
        yield box
    finally:
        box.close()


def fill(sandbox: Sandbox, standin, *, replicas: int, name: str = "elastic", queue: str) -> None:
    """An elastic job of ``replicas`` one-GPU pods, all Running."""
    sandbox.create_job(job_manifest(name, queue=queue, replicas=replicas, min_available=1))
    standin.run_until(
        lambda: sandbox.running(name) == replicas, timeout_s=60, what=f"{replicas} pods Running"
    )


@needs_recordings
def test_the_controller_and_scheduler_make_what_was_recorded(sandbox):
    sandbox.add_nodes(1)
    queue = sandbox.add_queue("research", weight=1)
    job = sandbox.create_job(recorded_job(queue=queue))
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    standin = sandbox.standin()
    standin.run_until(lambda: sandbox.running(name) == 2, timeout_s=60, what="2 pods Running")
    standin.step()  # one more sync: the statuses catch up with the Running pods

    # The PodGroup: <job>-<uid>, owned by the Job, spec and annotations as recorded.
    want_pg = recorded_podgroups()["elastic"]
    pg = sandbox.podgroup(name)
    assert pg["metadata"]["name"] == f"{name}-{uid}"
    assert pg["metadata"]["ownerReferences"] == [
        {**want_pg["metadata"]["ownerReferences"][0], "uid": uid}
    ]
    assert pg["metadata"]["annotations"] == want_pg["metadata"]["annotations"]
    assert pg["spec"] == {**want_pg["spec"], "queue": queue}
    assert pg["status"]["phase"] == want_pg["status"]["phase"] == "Running"
    assert [(c["type"], c["reason"]) for c in pg["status"]["conditions"]] == [
        (c["type"], c["reason"]) for c in want_pg["status"]["conditions"]
    ]
    assert pg["status"]["running"] == 2

    # The pods: the recorded labels, annotations and owner; bound by the scheduler.
    want_pod = recording("pod-of-vcjob.json")
    pods = sandbox.pods(name)
    assert sorted(pods) == [0, 1]
    pod = pods[0]
    assert pod["metadata"]["name"] == want_pod["metadata"]["name"] == "elastic-worker-0"
    assert set(pod["metadata"]["labels"]) == set(want_pod["metadata"]["labels"])
    assert set(pod["metadata"]["annotations"]) == set(want_pod["metadata"]["annotations"])
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == f"{name}-{uid}"
    assert pod["metadata"]["labels"]["volcano.sh/job-namespace"] == sandbox.namespace
    assert pod["metadata"]["labels"]["volcano.sh/queue-name"] == queue
    assert [pods[i]["metadata"]["labels"]["volcano.sh/task-index"] for i in (0, 1)] == ["0", "1"]
    assert pod["metadata"]["ownerReferences"] == [
        {**want_pod["metadata"]["ownerReferences"][0], "uid": uid}
    ]
    assert pod["spec"]["schedulerName"] == want_pod["spec"]["schedulerName"] == "volcano"
    assert pod["spec"]["nodeName"] == sandbox.nodes[0]
    assert pod["status"]["phase"] == "Running"

    # The Job's status, as vcjob-running.json.
    want_status = recording("vcjob-running.json")["status"]
    status = sandbox.job(name)["status"]
    assert set(status) == set(want_status)
    assert status["running"] == want_status["running"] == 2
    assert status["taskStatusCount"] == want_status["taskStatusCount"]
    assert status["state"]["phase"] == "Running"
    assert [c["status"] for c in status["conditions"]] == ["Pending", "Running"]

    # The Queue: allocated as a string count, Open (queues.json).
    assert sandbox.queue_status(queue)["allocated"]["nvidia.com/gpu"] == "2"
    assert sandbox.queue_status(queue)["state"] == "Open"


def test_scaling_keeps_the_low_indices_and_deletes_the_high_ones(sandbox):
    sandbox.add_nodes(1)
    queue = sandbox.add_queue("research", weight=1)
    standin = sandbox.standin()
    fill(sandbox, standin, replicas=2, queue=queue)
    at_2 = sandbox.uids("elastic")

    sandbox.scale("elastic", 6)
    standin.run_until(lambda: sandbox.running("elastic") == 6, timeout_s=60, what="6 Running")
    at_6 = sandbox.uids("elastic")
    assert {i: at_6[i] for i in at_2} == at_2  # 2 → 6: the first two kept their UIDs

    sandbox.scale("elastic", 3)
    standin.run_until(lambda: sandbox.running("elastic") == 3, timeout_s=60, what="3 Running")
    at_3 = sandbox.uids("elastic")
    assert at_3 == {i: at_6[i] for i in (0, 1, 2)}  # 6 → 3: indices 3-5 deleted, 0-2 kept
    assert sorted(int(p["metadata"]["labels"]["volcano.sh/task-index"])
                  for p in sandbox.all_pods("elastic")) == [0, 1, 2]  # fmt: skip


PLACEMENT = {
    # README: "24 one-GPU pods of one job went 6 to each of the 4 nodes; after a scale-down to
    # 8, 2 stayed on each node".
    "spread-6-per-node-then-2-per-node": (NodeOrder.SPREAD, [6, 6, 6, 6], [2, 2, 2, 2]),
    # README: "With binpack ... the 8 left were on one node".
    "binpack-fills-a-node-first-then-8-on-one-node": (
        NodeOrder.BINPACK, [8, 8, 8, 0], [8, 0, 0, 0],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("order", "at_24", "at_8"), PLACEMENT.values(), ids=PLACEMENT.keys())
def test_node_order(sandbox, order, at_24, at_8):
    sandbox.add_nodes(4)
    queue = sandbox.add_queue("research", weight=1)
    standin = sandbox.standin(node_order=order)
    fill(sandbox, standin, replicas=24, queue=queue)
    assert sandbox.per_node("elastic") == at_24
    sandbox.scale("elastic", 8)
    standin.run_until(lambda: sandbox.running("elastic") == 8, timeout_s=90, what="8 Running")
    assert sandbox.per_node("elastic") == at_8


ENQUEUE = {
    # README: with research at 28 of 32 GPUs the 3 × 8 gang never became Inqueue.
    "28-of-32-held-idle-4x1.2-below-24": (28, "Pending"),
    "13-held-idle-19x1.2-below-24": (13, "Pending"),
    "12-held-idle-20x1.2-reaches-24": (12, "Inqueue"),
}


@pytest.mark.parametrize(("held", "phase"), ENQUEUE.values(), ids=ENQUEUE.keys())
def test_overcommit_keeps_a_gang_pending_while_idle_gpus_times_its_factor_fall_short(
    sandbox, held, phase
):
    sandbox.add_nodes(4)
    research = sandbox.add_queue("research", weight=1)
    production = sandbox.add_queue("production", weight=3)
    standin = sandbox.standin(node_order=NodeOrder.BINPACK, overcommit=True)
    fill(sandbox, standin, replicas=held, queue=research)
    sandbox.create_job(gang(queue=production))
    reports = [standin.step() for _ in range(4)]

    assert sandbox.podgroup_phase("prod") == phase
    refused = [name for r in reports for name, _ in r.refused_enqueue]
    if phase == "Pending":
        assert refused and all(name.startswith("prod-") for name in refused)
        assert sandbox.all_pods("prod") == []  # the controller makes no pod for a Pending gang
    else:
        assert refused == []
        # Enqueued, but 20 idle GPUs on 2 whole nodes do not hold 3 × 8: none of it is bound.
        assert len(sandbox.all_pods("prod")) == 3
        assert all(not p["spec"].get("nodeName") for p in sandbox.all_pods("prod"))


def test_a_pending_gang_enqueues_and_runs_once_enough_is_free_and_nothing_is_evicted(sandbox):
    sandbox.add_nodes(4)
    research = sandbox.add_queue("research", weight=1)
    production = sandbox.add_queue("production", weight=3)
    standin = sandbox.standin(node_order=NodeOrder.BINPACK, overcommit=True)
    fill(sandbox, standin, replicas=28, queue=research)
    standin.step()
    assert sandbox.queue_status(research)["allocated"]["nvidia.com/gpu"] == "28"  # README
    before = sandbox.uids("elastic")
    sandbox.create_job(gang(queue=production))
    for _ in range(4):
        standin.step()
    assert sandbox.podgroup_phase("prod") == "Pending"
    assert sandbox.uids("elastic") == before  # the stand-in never evicts

    sandbox.scale("elastic", 8)
    standin.run_until(lambda: sandbox.running("prod") == 3, timeout_s=90, what="the gang Running")
    assert sandbox.podgroup_phase("prod") == "Running"
    assert sorted(sandbox.per_node("prod")) == [0, 1, 1, 1]  # one 8-GPU pod per whole node
    assert sandbox.uids("elastic") == {i: before[i] for i in range(8)}
    standin.step()
    assert sandbox.queue_status(production)["allocated"]["nvidia.com/gpu"] == "24"


def test_a_gang_is_bound_all_or_nothing(sandbox):
    sandbox.add_nodes(4)
    research = sandbox.add_queue("research", weight=1)
    production = sandbox.add_queue("production", weight=3)
    standin = sandbox.standin(node_order=NodeOrder.BINPACK)
    fill(sandbox, standin, replicas=16, queue=research)  # 2 whole nodes free: 2 of 3 would fit
    before = sandbox.uids("elastic")
    sandbox.create_job(gang(queue=production))
    reports = [standin.step() for _ in range(4)]

    # Without overcommit the gang becomes Inqueue at once (README), and waits there.
    pg = sandbox.podgroup("prod")
    assert pg["status"]["phase"] == "Inqueue"
    (condition,) = pg["status"]["conditions"]
    assert (condition["type"], condition["reason"]) == ("Unschedulable", "NotEnoughResources")
    assert "3/3 tasks in gang unschedulable" in condition["message"]
    assert [p["spec"].get("nodeName") for p in sandbox.all_pods("prod")] == [None] * 3
    assert not any(r.bound for r in reports)
    assert sandbox.uids("elastic") == before

    sandbox.scale("elastic", 8)
    standin.run_until(lambda: sandbox.running("prod") == 3, timeout_s=90, what="the gang Running")
    assert sandbox.podgroup("prod")["status"]["phase"] == "Running"


def test_pods_beyond_min_member_are_placed_one_by_one_while_gpus_are_free(sandbox):
    sandbox.add_nodes(1)
    queue = sandbox.add_queue("research", weight=1)
    standin = sandbox.standin()
    sandbox.create_job(job_manifest("elastic", queue=queue, replicas=10, min_available=2))
    standin.run_until(lambda: sandbox.running("elastic") == 8, timeout_s=60, what="8 Running")
    for _ in range(2):
        standin.step()
    pods = sandbox.pods("elastic")
    assert sorted(i for i, p in pods.items() if p["spec"].get("nodeName")) == list(range(8))
    assert sorted(i for i, p in pods.items() if not p["spec"].get("nodeName")) == [8, 9]
    assert sandbox.podgroup_phase("elastic") == "Running"


def test_a_job_it_cannot_read_is_skipped_with_its_name_and_the_others_proceed(sandbox):
    sandbox.add_nodes(1)
    queue = sandbox.add_queue("research", weight=1)
    bad = job_manifest("bad", queue=queue, replicas=2, min_available=1)
    del bad["spec"]["minAvailable"]  # the API takes it; the stand-in needs it for minMember
    sandbox.create_job(bad)
    sandbox.create_job(job_manifest("good", queue=queue, replicas=2, min_available=1))
    standin = sandbox.standin()
    report = standin.step()
    assert report.problems == (("bad", f"job {sandbox.namespace}/bad: spec.minAvailable: not set"),)
    standin.run_until(lambda: sandbox.running("good") == 2, timeout_s=60, what="good Running")
    assert sandbox.all_pods("bad") == []
