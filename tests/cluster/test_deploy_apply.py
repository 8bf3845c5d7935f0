"""What tide ships, applied to a real kube-apiserver (Volcano's CRDs and admission policies in
force): the rendered chart and the kustomize base apply, the engine's pod passes the
"restricted" Pod Security Standard, the example Queues and Job pass Volcano's policies, and the
engine's ServiceAccount can do exactly what the engine does and nothing else, as the audit log
shows. No controller manager runs: the Deployment's pods are not created, so the test creates
one pod from its template to have it admitted."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from tests.cluster.controlplane import AuditRequest, ControlPlane
from tests.manifests.render import REPO, helm_template, kustomize_overlay, one

EXAMPLES = REPO / "manifests" / "examples"
FIELD_MANAGER = "tide-deploy-test"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "Namespace", "Queue", "Node"}


# --- helpers ----------------------------------------------------------------------------------


def apply(api: Any, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Server-side apply each object, in order; the objects as stored.

    Raises:
        ApiException: the API refused one (its message names the object).
    """
    dynamic = DynamicClient(api)
    stored: list[dict[str, Any]] = []
    for obj in objects:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        result = resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        stored.append(result.to_dict())
    return stored


def label_restricted(plane: ControlPlane, namespace: str) -> None:
    """Enforce the "restricted" Pod Security Standard in ``namespace``."""
    with plane.api_client() as api:
        client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})


def pod_from_template(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    """The pod the Deployment's ReplicaSet would create (no controller manager runs here)."""
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": deployment["metadata"]["namespace"],
            "labels": template["metadata"]["labels"],
        },
        "spec": copy.deepcopy(template["spec"]),
    }


def create_pod(plane: ControlPlane, pod: dict[str, Any]) -> int:
    """Create ``pod`` as the admin; the HTTP status (201, or the refusal's)."""
    with plane.api_client() as api:
        try:
            client.CoreV1Api(api).create_namespaced_pod(pod["metadata"]["namespace"], pod)
        except ApiException as e:
            return int(e.status)
    return 201


def is_subset(sent: Any, stored: Any) -> bool:
    """Whether everything sent was stored as sent (the API may add fields, never drop one)."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            k in stored and is_subset(v, stored[k]) for k, v in sent.items()
        )
    if isinstance(sent, list):
        return (
            isinstance(stored, list)
            and len(sent) == len(stored)
            and all(is_subset(a, b) for a, b in zip(sent, stored, strict=True))
        )
    return bool(sent == stored)


def delete_quietly(plane: ControlPlane, objects: list[dict[str, Any]]) -> None:
    """Delete what a test made cluster-wide, so tests sharing the plane do not see it."""
    with plane.api_client() as api:
        dynamic = DynamicClient(api)
        for obj in objects:
            resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            try:
                resource.delete(
                    name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace")
                )
            except ApiException as e:
                if e.status != 404:
                    raise


# --- the chart and the base apply -----------------------------------------------------------


def _chart(plane: ControlPlane, tmp_path: Path) -> list[dict[str, Any]]:
    namespace = plane.new_namespace("chart")
    # The release is named after its namespace, so its cluster-scoped names are its own.
    return helm_template(release=namespace, namespace=namespace, workdir=tmp_path)


def _base(plane: ControlPlane, tmp_path: Path) -> list[dict[str, Any]]:
    namespace = plane.new_namespace("base")
    # Cluster-scoped names of the base's own, unlike any other test's.
    return kustomize_overlay(tmp_path / "overlay", namespace=namespace, name_prefix=f"{namespace}-")


@pytest.mark.parametrize("render", [_chart, _base], ids=["helm-chart", "kustomize-base"])
def test_rendered_objects_apply_and_the_engine_pod_is_admitted_as_restricted(
    control_plane: ControlPlane, tmp_path: Path, render: Any
) -> None:
    objects = render(control_plane, tmp_path)
    deployment = one(objects, "Deployment")
    namespace = deployment["metadata"]["namespace"]
    label_restricted(control_plane, namespace)
    try:
        with control_plane.api_client() as api:
            stored = apply(api, objects)
        assert [(o["kind"], o["metadata"]["name"]) for o in stored] == [
            (o["kind"], o["metadata"]["name"]) for o in objects
        ]
        for sent, kept in zip(objects, stored, strict=True):
            content = {k: v for k, v in sent.items() if k != "metadata"}
            assert is_subset(content, kept), (
                f"{sent['kind']} {sent['metadata']['name']}: the API dropped or changed a field"
            )
        # The engine's pod passes the restricted Pod Security Standard; a copy that may
        # escalate privileges does not, so the standard is in force here.
        pod = pod_from_template(deployment, "engine-probe")
        assert create_pod(control_plane, pod) == 201
        unsafe = pod_from_template(deployment, "engine-unsafe")
        del unsafe["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"]
        assert create_pod(control_plane, unsafe) == 403
    finally:
        delete_quietly(control_plane, [o for o in objects if o["kind"] in CLUSTER_SCOPED])


# --- the example Queues and Job pass Volcano's admission policies ---------------------------


EXAMPLE_JOBS = ("elastic-pytorch-job.yaml", "adaptive-pytorch-job.yaml")


def _examples(
    suffix: str, namespace: str, job_file: str = EXAMPLE_JOBS[0]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The example Queues (renamed ``<name>-<suffix>``: Queues are cluster-wide) and an
    example Job (``job_file``) and its PVC in ``namespace``, sent to the renamed queue."""
    queues = list(yaml.safe_load_all((EXAMPLES / "queues.yaml").read_text()))
    for queue in queues:
        queue["metadata"]["name"] += f"-{suffix}"
    job_objects = list(yaml.safe_load_all((EXAMPLES / job_file).read_text()))
    for obj in job_objects:
        obj["metadata"]["namespace"] = namespace
        if obj["kind"] == "Job":
            obj["spec"]["queue"] += f"-{suffix}"
    return queues, job_objects


@pytest.fixture(params=EXAMPLE_JOBS, ids=["plain", "adaptive"])
def examples(
    request: pytest.FixtureRequest, control_plane: ControlPlane, namespace: str
) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    queues, job_objects = _examples(uuid.uuid4().hex[:6], namespace, request.param)
    yield queues, job_objects
    delete_quietly(control_plane, queues)


def test_example_queues_and_job_pass_volcanos_admission_policies(
    control_plane: ControlPlane,
    examples: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    queues, job_objects = examples
    with control_plane.api_client() as api:
        custom = client.CustomObjectsApi(api)
        for queue in queues:
            stored = custom.create_cluster_custom_object(
                "scheduling.volcano.sh", "v1beta1", "queues", queue
            )
            assert is_subset(queue["spec"], stored["spec"]), "no Queue field was pruned"
            # Volcano's controller opens a new Queue; its webhook takes Jobs only then.
            opened = custom.patch_cluster_custom_object_status(
                "scheduling.volcano.sh",
                "v1beta1",
                "queues",
                queue["metadata"]["name"],
                {"status": {"state": "Open"}},
                _content_type="application/merge-patch+json",
            )
            assert opened["status"]["state"] == "Open"
        stored_objects = apply(api, job_objects)
        job = one(job_objects, "Job")
        stored_job = one(stored_objects, "Job")
        assert is_subset(job["spec"], stored_job["spec"]), "no Job field was pruned"
        # What tide does to it: a JSON patch of the worker task's replicas, within 1..3.
        stored_job = custom.patch_namespaced_custom_object(
            "batch.volcano.sh",
            "v1alpha1",
            job["metadata"]["namespace"],
            "jobs",
            job["metadata"]["name"],
            [
                {"op": "test", "path": "/spec/tasks/1/name", "value": "worker"},
                {"op": "replace", "path": "/spec/tasks/1/replicas", "value": 3},
            ],
            _content_type="application/json-patch+json",
        )
        assert stored_job["spec"]["tasks"][1]["replicas"] == 3


@pytest.mark.parametrize(
    ("break_it", "policy"),
    [
        (lambda q, j: q[0]["spec"]["deserved"].update({"nvidia.com/gpu": "65"}), "queue"),
        (lambda q, j: one(j, "Job")["spec"]["tasks"][1].update(minAvailable=3), "job"),
    ],
    ids=["queue-deserved-above-capability", "job-task-minavailable-above-replicas"],
)
def test_volcanos_admission_policies_are_in_force_for_the_examples(
    control_plane: ControlPlane,
    examples: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    break_it: Any,
    policy: str,
) -> None:
    # The control for the test above: the same examples, one rule broken, are refused.
    queues, job_objects = examples
    break_it(queues, job_objects)
    target = queues[0] if policy == "queue" else one(job_objects, "Job")
    with control_plane.api_client() as api, pytest.raises(ApiException) as refused:
        apply(api, [target])
    assert refused.value.status == 422
    assert f"{policy}-validation-policy" in str(refused.value.body)


def test_the_adaptive_examples_pods_read_their_annotations_through_the_downward_api(
    control_plane: ControlPlane, namespace: str
) -> None:
    # No Volcano controller runs to make the pods: each task's pod, as Volcano makes it from
    # the template, is sent as a dry run, so the API server validates every fieldRef path.
    [job] = [
        o
        for o in yaml.safe_load_all((EXAMPLES / EXAMPLE_JOBS[1]).read_text())
        if o["kind"] == "Job"
    ]
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        for task in job["spec"]["tasks"]:
            template = copy.deepcopy(task["template"])
            metadata = template["metadata"] | {"name": f"adaptive-train-{task['name']}-0"}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                   "spec": template["spec"]}  # fmt: skip
            stored = core.create_namespaced_pod(namespace, pod, dry_run="All").to_dict()
            env = stored["spec"]["containers"][0]["env"]
            paths = {
                e["name"]: e["value_from"]["field_ref"]["field_path"]
                for e in env
                if e["name"].startswith("TIDE_") and e["value_from"] is not None
            }
            assert len(paths) == 6, paths
            for path in paths.values():
                key = path.removeprefix("metadata.annotations['").removesuffix("']")
                assert key in stored["metadata"]["annotations"], (task["name"], path)
            bad = copy.deepcopy(pod)
            bad["spec"]["containers"][0]["env"][-2]["valueFrom"]["fieldRef"]["fieldPath"] = (
                "metadata.annotations[tide.io/accumulation]"  # the quotes left out
            )
            with pytest.raises(ApiException) as refused:
                core.create_namespaced_pod(namespace, bad, dry_run="All")
            assert refused.value.status == 422, task["name"]


# --- least privilege, proved with the engine's own token ------------------------------------


@dataclass(frozen=True)
class Call:
    """One request made with the engine's token.

    Attributes:
        method: the HTTP method.
        path: the URL path and query.
        verb: the Kubernetes verb the audit log records for it.
        resource: the resource (``plural`` or ``plural/subresource``).
        body: the JSON body, if any.
        content_type: its content type.
    """

    method: str
    path: str
    verb: str
    resource: str
    body: Any = None
    content_type: str = "application/json"


@dataclass(frozen=True)
class World:
    """What the least-privilege tests act on: the chart's release and a namespace of work."""

    plane: ControlPlane
    token: str
    user: str
    engine_ns: str
    work_ns: str
    lease: str
    job: str
    podgroup: str
    pod: str
    queue: dict[str, Any]
    node: str

    def path(self, template: str) -> str:
        return template.format(
            e=self.engine_ns,
            w=self.work_ns,
            lease=self.lease,
            job=self.job,
            pg=self.podgroup,
            pod=self.pod,
            queue=self.queue["metadata"]["name"],
            node=self.node,
        )


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    plane = control_plane
    engine_ns = plane.new_namespace("engine")
    work_ns = plane.new_namespace("work")
    suffix = work_ns.rsplit("-", 1)[1]
    objects = helm_template(
        release=engine_ns, namespace=engine_ns, workdir=tmp_path_factory.mktemp("chart")
    )
    account = one(objects, "ServiceAccount")["metadata"]["name"]
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    lease = next(a.split("=", 1)[1] for a in args if a.startswith("--lease-name="))
    node = f"gpu-{suffix}"
    made: list[dict[str, Any]] = [o for o in objects if o["kind"] in CLUSTER_SCOPED]
    try:
        with plane.api_client() as api:
            apply(api, objects)
            queue = plane.create_queue(f"research-{suffix}", weight=1, capability_gpus=8)
            made.append(queue)
            job = example_job(api, work_ns, queue["metadata"]["name"])
            podgroup = {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": "gang", "namespace": work_ns},
                "spec": {"minMember": 1, "queue": queue["metadata"]["name"]},
            }
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "worker-0", "namespace": work_ns},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
            apply(api, [podgroup, pod])
            made.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            plane.add_gpu_node(node, gpus=8)
            token = client.CoreV1Api(api).create_namespaced_service_account_token(
                account, engine_ns, {"spec": {"expirationSeconds": 3600}}
            )
        yield World(
            plane=plane,
            token=token.status.token,
            user=f"system:serviceaccount:{engine_ns}:{account}",
            engine_ns=engine_ns,
            work_ns=work_ns,
            lease=lease,
            job=job,
            podgroup="gang",
            pod="worker-0",
            queue=queue,
            node=node,
        )
    finally:
        delete_quietly(plane, made)


def example_job(api: Any, namespace: str, queue: str) -> str:
    """Create the example elastic Job in ``namespace``, in ``queue``; its name."""
    [job] = [
        o
        for o in yaml.safe_load_all((EXAMPLES / "elastic-pytorch-job.yaml").read_text())
        if o["kind"] == "Job"
    ]
    job["metadata"]["namespace"] = namespace
    job["spec"]["queue"] = queue
    apply(api, [job])
    return str(job["metadata"]["name"])


def send(world: World, call: Call) -> int:
    """Make ``call`` with the engine's token; the HTTP status."""
    with world.plane.api_client_for_token(world.token) as api:
        method, url, headers, body, post = api.param_serialize(
            method=call.method,
            resource_path=world.path(call.path),
            header_params={"Content-Type": call.content_type, "Accept": "application/json"},
            body=call.body,
            auth_settings=["BearerToken"],
        )
        response = api.call_api(method, url, header_params=headers, body=body, post_params=post,
                                _request_timeout=15)  # fmt: skip
        response.read()  # a watch ends after its timeoutSeconds
        return int(response.status)


JOBS = "/apis/batch.volcano.sh/v1alpha1"
SCHED = "/apis/scheduling.volcano.sh/v1beta1"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{e}/leases"
WATCH = "?watch=true&timeoutSeconds=1"


def _lease_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "engine-0", "leaseDurationSeconds": 15},
    }


# In order: the Lease is created before it is read and updated.
ALLOWED = {
    "get-job": Call("GET", JOBS + "/namespaces/{w}/jobs/{job}", "get", "jobs"),
    "list-jobs": Call("GET", JOBS + "/jobs", "list", "jobs"),
    "watch-jobs": Call("GET", JOBS + "/jobs" + WATCH, "watch", "jobs"),
    "patch-job-replicas": Call(
        "PATCH",
        JOBS + "/namespaces/{w}/jobs/{job}",
        "patch",
        "jobs",
        [
            {"op": "test", "path": "/spec/tasks/1/name", "value": "worker"},
            {"op": "replace", "path": "/spec/tasks/1/replicas", "value": 1},
        ],
        "application/json-patch+json",
    ),
    "get-queue": Call("GET", SCHED + "/queues/{queue}", "get", "queues"),
    "list-queues": Call("GET", SCHED + "/queues", "list", "queues"),
    "watch-queues": Call("GET", SCHED + "/queues" + WATCH, "watch", "queues"),
    "get-podgroup": Call("GET", SCHED + "/namespaces/{w}/podgroups/{pg}", "get", "podgroups"),
    "list-podgroups": Call("GET", SCHED + "/podgroups", "list", "podgroups"),
    "watch-podgroups": Call("GET", SCHED + "/podgroups" + WATCH, "watch", "podgroups"),
    "get-pod": Call("GET", "/api/v1/namespaces/{w}/pods/{pod}", "get", "pods"),
    "list-pods": Call("GET", "/api/v1/pods", "list", "pods"),
    "watch-pods": Call("GET", "/api/v1/pods" + WATCH, "watch", "pods"),
    "get-node": Call("GET", "/api/v1/nodes/{node}", "get", "nodes"),
    "list-nodes": Call("GET", "/api/v1/nodes", "list", "nodes"),
    "watch-nodes": Call("GET", "/api/v1/nodes" + WATCH, "watch", "nodes"),
    "create-event": Call(
        "POST",
        "/api/v1/namespaces/{w}/events",
        "create",
        "events",
        {
            "metadata": {"generateName": "elastic-train."},
            "involvedObject": {"kind": "Job", "namespace": "{w}", "name": "elastic-train"},
            "reason": "ScaleUpForIdleGpus",
            "message": "worker 2 -> 3",
            "type": "Normal",
            "source": {"component": "tide-engine"},
        },
    ),
    "create-own-lease": Call("POST", LEASES, "create", "leases", "LEASE"),
    "get-own-lease": Call("GET", LEASES + "/{lease}", "get", "leases"),
    "update-own-lease": Call("PUT", LEASES + "/{lease}", "update", "leases", "LEASE"),
}
REFUSED = {
    "delete-job": Call("DELETE", JOBS + "/namespaces/{w}/jobs/{job}", "delete", "jobs"),
    "create-job": Call("POST", JOBS + "/namespaces/{w}/jobs", "create", "jobs", {}),
    "patch-job-status": Call(
        "PATCH",
        JOBS + "/namespaces/{w}/jobs/{job}/status",
        "patch",
        "jobs/status",
        {"status": {}},
        "application/merge-patch+json",
    ),
    "patch-podgroup": Call(
        "PATCH",
        SCHED + "/namespaces/{w}/podgroups/{pg}",
        "patch",
        "podgroups",
        {"spec": {"minMember": 2}},
        "application/merge-patch+json",
    ),
    "update-queue": Call("PUT", SCHED + "/queues/{queue}", "update", "queues", "QUEUE"),
    "list-secrets": Call("GET", "/api/v1/secrets", "list", "secrets"),
    "create-pod": Call("POST", "/api/v1/namespaces/{w}/pods", "create", "pods", {}),
    "delete-pod": Call("DELETE", "/api/v1/namespaces/{w}/pods/{pod}", "delete", "pods"),
    "evict-pod": Call(
        "POST",
        "/api/v1/namespaces/{w}/pods/{pod}/eviction",
        "create",
        "pods/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "worker-0"}},
    ),
    "patch-node": Call(
        "PATCH",
        "/api/v1/nodes/{node}",
        "patch",
        "nodes",
        {"spec": {"unschedulable": True}},
        "application/merge-patch+json",
    ),
    "list-events": Call("GET", "/api/v1/events", "list", "events"),
    "list-leases": Call("GET", LEASES, "list", "leases"),
    "get-other-lease": Call("GET", LEASES + "/someone-else", "get", "leases"),
    "patch-own-lease": Call(
        "PATCH", LEASES + "/{lease}", "patch", "leases", {}, "application/merge-patch+json"
    ),
    "delete-own-lease": Call("DELETE", LEASES + "/{lease}", "delete", "leases"),
    "create-lease-elsewhere": Call(
        "POST", "/apis/coordination.k8s.io/v1/namespaces/{w}/leases", "create", "leases", "LEASE"
    ),
}


def _resolve(world: World, call: Call) -> Call:
    """Fill the names into a call's body: the Lease, the Queue as stored, the work namespace."""
    body: Any = call.body
    if body == "LEASE":
        body = _lease_body(world.lease)
        if call.method == "PUT":
            body["spec"]["holderIdentity"] = "engine-1"  # a renewal by the other replica
    elif body == "QUEUE":
        body = copy.deepcopy(world.queue)
        body["spec"]["weight"] = 2
    elif isinstance(body, dict):
        body = json.loads(json.dumps(body).replace("{w}", world.work_ns))
    return Call(call.method, call.path, call.verb, call.resource, body, call.content_type)


def _prepare(world: World, name: str, call: Call) -> Call:
    """As the admin, put the engine's Lease in the state a case needs (absent before the
    create, present before the get and the update), so each case runs alone too; the call,
    with the Lease's resourceVersion for an update (the API takes no unconditional one)."""
    with world.plane.api_client() as api:
        leases = client.CoordinationV1Api(api)
        try:
            if name == "create-own-lease":
                leases.delete_namespaced_lease(world.lease, world.engine_ns)
            elif name in ("get-own-lease", "update-own-lease", "patch-own-lease"):
                leases.create_namespaced_lease(world.engine_ns, _lease_body(world.lease))
        except ApiException as e:
            if e.status not in (404, 409):  # already absent, already there
                raise
        if call.method == "PUT" and call.resource == "leases":
            stored = leases.read_namespaced_lease(world.lease, world.engine_ns)
            body = copy.deepcopy(call.body)
            body["metadata"]["resourceVersion"] = stored.metadata.resource_version
            return Call(call.method, call.path, call.verb, call.resource, body, call.content_type)
    return call


def _audited(world: World, call: Call, code: int, since: float) -> list[AuditRequest]:
    resource, _, subresource = call.resource.partition("/")

    def match(r: AuditRequest) -> bool:
        return (
            r.user == world.user
            and r.verb == call.verb
            and r.resource == resource
            and r.subresource == subresource
            and r.code == code
        )

    return world.plane.wait_for_audit(match, since=since)


@pytest.mark.parametrize("name", list(ALLOWED), ids=list(ALLOWED))
def test_the_engines_account_may_do_what_the_engine_does(world: World, name: str) -> None:
    call = _prepare(world, name, _resolve(world, ALLOWED[name]))
    since = time.time() - 1
    code = send(world, call)
    assert code in (200, 201), f"{name}: {call.method} {world.path(call.path)} -> {code}"
    assert _audited(world, call, code, since), f"{name}: not in the audit log with {code}"


@pytest.mark.parametrize("name", list(REFUSED), ids=list(REFUSED))
def test_the_engines_account_is_refused_everything_else(world: World, name: str) -> None:
    call = _prepare(world, name, _resolve(world, REFUSED[name]))
    since = time.time() - 1
    code = send(world, call)
    assert code == 403, f"{name}: {call.method} {world.path(call.path)} -> {code}"
    assert _audited(world, call, 403, since), f"{name}: not in the audit log with 403"


def test_the_engine_itself_works_with_the_charts_token(world: World, tmp_path: Path) -> None:
    # tide engine --once, with the Volcano client and the Lease on the chart's ServiceAccount
    # token: its patch and its Event go through, and every request it made was allowed (the
    # audit log), but for the first read of a Lease that does not exist yet.
    from scheduler_policy.vocabulary.protocols import MetricsSample
    from scheduler_policy.vocabulary.state import JobKey, ThroughputPoint
    from tide.engine.command import run_once
    from tide.engine.options import EngineOptions

    plane, queue = world.plane, world.queue["metadata"]["name"]
    with plane.api_client() as api:
        # The account's own Lease, as the calls above left it (held by their made-up holder).
        try:
            client.CoordinationV1Api(api).delete_namespaced_lease(world.lease, world.engine_ns)
        except ApiException as e:
            if e.status != 404:
                raise
        # What Volcano's controller would have set.
        client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
            "batch.volcano.sh", "v1alpha1", world.work_ns, "jobs", world.job,
            {"status": {"state": {"phase": "Running"}}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nmetadata:\n  name: token-test\n"
        "spec:\n  interval: 30s\n  defaults:\n    cooldown: 0s\n"
        "    stabilizationWindow:\n      up: 0s\n      down: 0s\n"
        f"  queues:\n    - name: {queue}\n      elastic: true\n      borrowIdleGpus: true\n"
    )
    key = JobKey(f"{world.work_ns}/{world.job}")

    class Measured:
        def sample(self, *, now_s: float) -> MetricsSample:
            points = (ThroughputPoint(now_s - 60, 1, 100.0), ThroughputPoint(now_s - 30, 2, 190.0))
            return MetricsSample(
                fresh=True,
                cluster_free_gpus=float("nan"),  # the client's nodes give it
                job_throughput={key: points},
                queue_allocated_gpus={queue: 0.0},
            )

    options = EngineOptions(
        policy_path=policy,
        kubeconfig=plane.kubeconfig_for_token(world.token),
        once=True,
        lease_namespace=world.engine_ns,
        lease_name=world.lease,
        namespace=world.work_ns,
    )
    since = time.time()
    outcome = run_once(options, metrics=lambda _policy: Measured())
    result = outcome.result
    assert outcome.wrote and not result.failed, outcome
    assert [c.job for c in result.applied] == [key], result.decisions
    requests = plane.wait_for_audit(
        lambda r: r.user == world.user and r.verb == "create" and r.resource == "events",
        since=since,
    )
    mine = [r for r in plane.audit_requests(since) if r.user == world.user]
    refused = [
        r for r in mine
        if r.code >= 400 and not (r.resource == "leases" and r.verb == "get" and r.code == 404)
    ]  # fmt: skip
    assert refused == [], refused
    verbs = {(r.verb, r.resource) for r in mine}
    assert {("patch", "jobs"), ("create", "events"), ("create", "leases")} <= verbs, verbs
    assert requests
