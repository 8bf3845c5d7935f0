"""The control plane fixture: a real kube-apiserver with Volcano's CRDs and policies, and KWOK."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster import controlplane
from tests.cluster.audit import AuditLogReader
from tests.cluster.conftest import require_control_plane_binaries
from tests.cluster.controlplane import (
    GPU_RESOURCE,
    JOB_GROUP,
    JOB_VERSION,
    QUEUE_GROUP,
    QUEUE_VERSION,
    VOLCANO_CRDS_DIR,
    ControlPlane,
    ControlPlaneError,
    binaries_present,
    parse_audit_event,
    volcano_job_body,
)
from tests.cluster.volcano_objects import REPO_ROOT, volcano_documents


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_for(what: str, probe: Callable[[], bool], *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.2)


def processes_of(workdir: Path) -> list[str]:
    """The command lines of live processes that name ``workdir`` (every component does)."""
    done = subprocess.run(
        ["pgrep", "-a", "-f", str(workdir)], capture_output=True, text=True, check=False
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


# -- without a plane ---------------------------------------------------------------------------


def test_binaries_present_names_the_missing_binary_and_the_build_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TIDE_CACHE", str(tmp_path))
    ok, why = binaries_present()
    assert not ok
    assert f"kube-apiserver ({tmp_path}" in why
    assert "kwok (" in why
    assert "make cluster-deps" in why


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [
        ("", pytest.skip.Exception),
        ("false", pytest.skip.Exception),
        ("true", pytest.fail.Exception),
    ],
    ids=["local", "ci-false", "ci"],
)
def test_missing_binaries_skip_locally_and_fail_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("TIDE_CACHE", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="make cluster-deps"):
        require_control_plane_binaries()


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            {
                "user": {"username": "system:serviceaccount:ns:engine", "groups": ["a", "b"]},
                "verb": "list",
                "objectRef": {"resource": "configmaps", "namespace": "ns", "apiVersion": "v1"},
                "responseStatus": {"code": 403},
                "requestURI": "/api/v1/namespaces/ns/configmaps",
                "requestReceivedTimestamp": "2026-01-02T03:04:05.250000Z",
            },
            controlplane.AuditRequest(
                user="system:serviceaccount:ns:engine",
                groups=("a", "b"),
                verb="list",
                api_group="",
                resource="configmaps",
                subresource="",
                namespace="ns",
                name="",
                code=403,
                request_uri="/api/v1/namespaces/ns/configmaps",
                received_at_s=1767323045.25,
            ),
        ),
        (
            {
                "user": {"username": "tide-admin"},
                "verb": "patch",
                "objectRef": {
                    "resource": "queues",
                    "subresource": "status",
                    "name": "q",
                    "apiGroup": "scheduling.volcano.sh",
                },
                "responseStatus": {"code": 200},
                "requestURI": "/apis/scheduling.volcano.sh/v1beta1/queues/q/status",
                "requestReceivedTimestamp": "2026-01-02T03:04:05Z",
            },
            controlplane.AuditRequest(
                user="tide-admin",
                groups=(),
                verb="patch",
                api_group="scheduling.volcano.sh",
                resource="queues",
                subresource="status",
                namespace="",
                name="q",
                code=200,
                request_uri="/apis/scheduling.volcano.sh/v1beta1/queues/q/status",
                received_at_s=1767323045.0,
            ),
        ),
        (
            {
                "user": {"username": "system:anonymous"},
                "verb": "get",
                "responseStatus": {"code": 401},
                "requestURI": "/readyz",
                "requestReceivedTimestamp": "2026-01-02T03:04:05.000001Z",
            },
            controlplane.AuditRequest(
                user="system:anonymous",
                groups=(),
                verb="get",
                api_group="",
                resource="",
                subresource="",
                namespace="",
                name="",
                code=401,
                request_uri="/readyz",
                received_at_s=1767323045.000001,
            ),
        ),
    ],
    ids=["namespaced-list-refused", "cluster-scoped-subresource", "non-resource-url"],
)
def test_parse_audit_event(event: dict[str, Any], expected: controlplane.AuditRequest) -> None:
    assert parse_audit_event(event) == expected


def test_a_start_that_fails_half_way_stops_what_it_started_and_shows_the_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_control_plane_binaries()
    # A kube-apiserver that dies at once, after the real etcd is up.
    fake = tmp_path / "bin" / "kube-apiserver"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'refusing to serve: a test said so' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    real = controlplane.binary_paths()
    monkeypatch.setattr(controlplane, "binary_paths", lambda: {**real, "kube-apiserver": fake})
    workdir = tmp_path / "plane"

    with pytest.raises(ControlPlaneError) as raised:
        ControlPlane.start(workdir)

    assert "kube-apiserver exited with code 3" in str(raised.value)
    assert "refusing to serve: a test said so" in str(raised.value)
    assert (workdir / "etcd.log").exists()  # etcd had started
    assert processes_of(workdir) == []


def audit_line(verb: str, at: str) -> str:
    return json.dumps(
        {
            "user": {"username": "u"},
            "verb": verb,
            "responseStatus": {"code": 200},
            "requestURI": "/api",
            "requestReceivedTimestamp": at,
        }
    )


# (name, what the log holds at each read, verbs expected after each read)
AUDIT_READS = [
    ("missing-file", [None], [[]]),
    (
        "complete-lines",
        [audit_line("get", "2026-01-01T00:00:00Z") + "\n"],
        [["get"]],
    ),
    (
        "a-half-written-line-waits-for-its-end",
        [
            audit_line("get", "2026-01-01T00:00:00Z")
            + "\n"
            + audit_line("list", "2026-01-01T00:00:01Z")[:20],
            audit_line("get", "2026-01-01T00:00:00Z")
            + "\n"
            + audit_line("list", "2026-01-01T00:00:01Z")
            + "\n",
        ],
        [["get"], ["get", "list"]],
    ),
]


@pytest.mark.parametrize(
    ("contents", "verbs"), [r[1:] for r in AUDIT_READS], ids=[r[0] for r in AUDIT_READS]
)
def test_the_audit_reader_parses_each_complete_line_once(
    tmp_path: Path, contents: list[str | None], verbs: list[list[str]]
) -> None:
    log = tmp_path / "audit.log"
    reader = AuditLogReader(log)
    for content, expected in zip(contents, verbs, strict=True):
        if content is not None:
            log.write_text(content)
        assert [r.verb for r in reader.requests()] == expected
    assert [r.verb for r in reader.requests(since=1767225601.0)] == [
        v for v in verbs[-1] if v == "list"
    ]


def test_a_component_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    marker = f"tide-orphan-check-{uuid.uuid4().hex[:8]}"
    starter = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from tests.cluster.processes import ManagedProcess
        argv = [sys.executable, "-c", "import time; time.sleep(300)", "{marker}"]
        ManagedProcess("sleeper", argv, Path(sys.argv[1]))
        print("started", flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", starter, str(tmp_path / "sleeper.log")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "started"
        assert processes_of(Path(marker)) != []
        parent.send_signal(signal.SIGKILL)  # no finalizer, no atexit
        parent.wait(timeout=10)
        wait_for("the orphan gone", lambda: processes_of(Path(marker)) == [], timeout_s=10)
    finally:
        parent.kill()
        parent.wait(timeout=10)


def test_etcd_starts_again_on_new_ports_when_its_port_was_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_control_plane_binaries()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = controlplane.free_port
        monkeypatch.setattr(controlplane, "free_port", lambda: next(ports, None) or real())
        plane = ControlPlane(tmp_path / "plane")
        plane.workdir.mkdir()
        try:
            plane._retry_taken_port("etcd", plane._start_etcd)
            assert plane.running() and list(plane.pids) == ["etcd"]
            assert "address already in use" in (plane.workdir / "etcd.1.log").read_text()
        finally:
            plane.stop()
    assert processes_of(plane.workdir) == []


# -- on the session's plane ------------------------------------------------------------------


def test_the_plane_serves_kubernetes_v1_36_3(control_plane: ControlPlane) -> None:
    assert control_plane.version == "v1.36.3"
    with control_plane.api_client() as api:
        assert client.VersionApi(api).get_code().git_version == "v1.36.3"
    kubeconfig = yaml.safe_load(control_plane.kubeconfig_path.read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == control_plane.url
    assert control_plane.url.startswith("https://127.0.0.1:")


def test_every_volcano_crd_is_established_and_a_job_in_an_open_queue_is_stored(
    control_plane: ControlPlane, namespace: str
) -> None:
    expected = {
        doc["metadata"]["name"]
        for doc in volcano_documents(VOLCANO_CRDS_DIR)
        if doc["kind"] == "CustomResourceDefinition"
    }
    assert len(expected) == len(list(VOLCANO_CRDS_DIR.glob("*.yaml")))
    assert "jobs.batch.volcano.sh" in expected and "queues.scheduling.volcano.sh" in expected
    queue = unique("q")
    with control_plane.api_client() as api:
        established = {
            crd.metadata.name
            for crd in client.ApiextensionsV1Api(api).list_custom_resource_definition().items
            if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
        }
        assert expected <= established

        stored_queue = control_plane.create_queue(queue, 2, capability_gpus=16, deserved_gpus=8)
        assert stored_queue["status"]["state"] == "Open"
        assert stored_queue["spec"]["capability"] == {GPU_RESOURCE: "16"}

        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            JOB_GROUP,
            JOB_VERSION,
            namespace,
            "jobs",
            volcano_job_body("train", queue=queue, replicas=2),
        )
        job = custom.get_namespaced_custom_object(
            JOB_GROUP, JOB_VERSION, namespace, "jobs", "train"
        )
        assert job["spec"]["queue"] == queue
        assert [t["replicas"] for t in job["spec"]["tasks"]] == [2]
        read_queue = custom.get_cluster_custom_object(QUEUE_GROUP, QUEUE_VERSION, "queues", queue)
        assert read_queue["status"]["state"] == "Open"


def extra_task(job: dict[str, Any]) -> dict[str, Any]:
    task: dict[str, Any] = json.loads(json.dumps(job["spec"]["tasks"][0]))
    task["name"] = "extra"
    return task


# (name, JSON patch built from the stored job, expected HTTP code, text the refusal must name)
PATCHES: list[tuple[str, Callable[[dict[str, Any]], list[dict[str, Any]]], int, str]] = [
    (
        "add-a-task",
        lambda job: [{"op": "add", "path": "/spec/tasks/-", "value": extra_task(job)}],
        422,
        "job updates may not add or remove tasks",
    ),
    (
        "job-min-available-above-replicas",
        lambda job: [{"op": "replace", "path": "/spec/minAvailable", "value": 9}],
        422,
        "should not be greater than total replicas in tasks",
    ),
    (
        "replicas-below-task-min-available",
        lambda job: [
            {"op": "replace", "path": "/spec/tasks/0/minAvailable", "value": 2},
            {"op": "replace", "path": "/spec/tasks/0/replicas", "value": 1},
        ],
        422,
        "'minAvailable' is greater than 'replicas' in task",
    ),
    (
        "change-the-queue",
        lambda job: [{"op": "replace", "path": "/spec/queue", "value": "elsewhere"}],
        422,
        "job-validation-policy",
    ),
    (
        "grow-replicas",
        lambda job: [
            {"op": "test", "path": "/spec/tasks/0/name", "value": "worker"},
            {"op": "replace", "path": "/spec/tasks/0/replicas", "value": 5},
        ],
        200,
        "",
    ),
    (
        "shrink-replicas-to-min-available",
        lambda job: [
            {"op": "test", "path": "/spec/tasks/0/name", "value": "worker"},
            {"op": "replace", "path": "/spec/tasks/0/replicas", "value": 1},
        ],
        200,
        "",
    ),
]


@pytest.mark.parametrize(
    ("patch", "code", "names"), [p[1:] for p in PATCHES], ids=[p[0] for p in PATCHES]
)
def test_volcano_policy_on_job_updates(
    control_plane: ControlPlane,
    namespace: str,
    patch: Callable[[dict[str, Any]], list[dict[str, Any]]],
    code: int,
    names: str,
) -> None:
    queue = unique("q")
    control_plane.create_queue(queue, 1)
    with control_plane.api_client() as api:
        custom = client.CustomObjectsApi(api)
        job = custom.create_namespaced_custom_object(
            JOB_GROUP,
            JOB_VERSION,
            namespace,
            "jobs",
            volcano_job_body("train", queue=queue, replicas=3),
        )
        operations = patch(job)

        def send() -> dict[str, Any]:
            patched: dict[str, Any] = custom.patch_namespaced_custom_object(
                JOB_GROUP,
                JOB_VERSION,
                namespace,
                "jobs",
                "train",
                operations,
                _content_type="application/json-patch+json",
            )
            return patched

        if code == 200:
            patched = send()
            replaced = {op["path"]: op["value"] for op in operations if op["op"] == "replace"}
            assert patched["spec"]["tasks"][0]["replicas"] == replaced["/spec/tasks/0/replicas"]
        else:
            with pytest.raises(ApiException) as refused:
                send()
            assert refused.value.status == code
            body = str(refused.value.body)
            assert "ValidatingAdmissionPolicy 'job-validation-policy'" in body
            assert names in body
            stored = custom.get_namespaced_custom_object(
                JOB_GROUP, JOB_VERSION, namespace, "jobs", "train"
            )
            assert stored["spec"] == job["spec"]


def bind_by_node_name(core: Any, namespace: str, pod: dict[str, Any], node: str) -> None:
    pod["spec"]["nodeName"] = node
    core.create_namespaced_pod(namespace, pod)


def bind_by_binding(core: Any, namespace: str, pod: dict[str, Any], node: str) -> None:
    core.create_namespaced_pod(namespace, pod)
    name = pod["metadata"]["name"]
    core.create_namespaced_pod_binding(
        name,
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        },
        # The API answers a Binding with a Status, which the client cannot read as a V1Binding.
        _preload_content=False,
    ).release_conn()


@pytest.mark.parametrize("bind", [bind_by_node_name, bind_by_binding], ids=["node-name", "binding"])
def test_a_kwok_gpu_node_becomes_ready_and_runs_a_pod_bound_to_it(
    control_plane: ControlPlane,
    namespace: str,
    bind: Callable[[Any, str, dict[str, Any], str], None],
) -> None:
    node_name = unique("gpu")
    node = control_plane.add_gpu_node(node_name, gpus=4)
    assert node["status"]["allocatable"][GPU_RESOURCE] == "4"
    assert node["metadata"]["labels"]["type"] == "kwok"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "worker-0"},
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "image": "busybox",
                    "resources": {"limits": {GPU_RESOURCE: "2"}, "requests": {GPU_RESOURCE: "2"}},
                }
            ],
        },
    }
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        bind(core, namespace, pod, node_name)

        def running() -> bool:
            read = core.read_namespaced_pod("worker-0", namespace)
            return bool(read.status.phase == "Running" and read.spec.node_name == node_name)

        wait_for("pod worker-0 Running on the KWOK node", running)


def test_a_service_account_token_is_held_to_its_rbac_and_the_audit_log_shows_it(
    control_plane: ControlPlane, namespace: str
) -> None:
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        rbac = client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "reader-reads-pods"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        )
        token = core.create_namespaced_service_account_token(
            "reader", namespace, {"spec": {"expirationSeconds": 3600}}
        ).status.token

    user = f"system:serviceaccount:{namespace}:reader"
    since = time.time() - 1.0
    kubeconfig = yaml.safe_load(control_plane.kubeconfig_for_token(token).read_text())
    assert kubeconfig["users"][0]["user"]["token"] == token
    with control_plane.api_client_for_token(token) as api:
        core = client.CoreV1Api(api)
        assert core.list_namespaced_pod(namespace).items == []
        with pytest.raises(ApiException) as refused:
            core.delete_collection_namespaced_pod(namespace)
        assert refused.value.status == 403
        assert user in str(refused.value.body)

    seen = control_plane.wait_for_audit(
        lambda r: r.user == user and r.verb == "deletecollection", since=since
    )
    assert [(r.resource, r.namespace, r.code) for r in seen] == [("pods", namespace, 403)]
    listed = control_plane.wait_for_audit(
        lambda r: r.user == user and r.verb == "list", since=since
    )
    assert [(r.resource, r.code) for r in listed] == [("pods", 200)]


def test_stopping_a_plane_leaves_none_of_its_processes(tmp_path: Path) -> None:
    require_control_plane_binaries()
    workdir = tmp_path / "second-plane"
    plane = ControlPlane.start(workdir)
    try:
        pids = plane.pids
        assert sorted(pids) == ["etcd", "kube-apiserver", "kwok"]
        assert plane.running()
        alive = processes_of(workdir)
        assert {str(pid) for pid in pids.values()} <= {line.split()[0] for line in alive}
    finally:
        plane.stop()
    assert processes_of(workdir) == []
    assert not plane.running()
