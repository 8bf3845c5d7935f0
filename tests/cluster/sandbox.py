"""One test's own corner of the shared control plane: its namespace, nodes, queues and jobs.

Nodes and queues are cluster-scoped and the plane is shared by the session, so a sandbox names
them after its namespace, labels its nodes ``tide-test=<namespace>`` (the stand-in Volcano and
the Volcano client see only those) and deletes them when the test ends.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.standin import NodeOrder, StandInVolcano
from tests.cluster.standin_objects import BATCH, GPU, SCHEDULING, TASK_INDEX

RECORDINGS = Path(__file__).resolve().parents[2].parent / "shared" / "volcano-wire" / "v1.15.1"
NODE_LABEL = "tide-test"
JSON_PATCH = "application/json-patch+json"


def recording(name: str) -> Any:
    """One JSON file of ``../shared/volcano-wire/v1.15.1/``."""
    return json.loads((RECORDINGS / name).read_text())


def job_manifest(
    name: str,
    *,
    queue: str,
    replicas: int,
    min_available: int,
    gpus_per_pod: int = 1,
    task_min_available: int | None = None,
    elastic: bool = True,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Volcano Job shaped as vcjob-running.json: one task ``worker``, each pod one CPU and
    ``gpus_per_pod`` GPUs; elastic ones carry ``tide.io/elastic: "true"`` and a task
    ``minAvailable`` (default the job's) below replicas, as DESIGN.md's elastic pattern says."""
    task_min = min_available if task_min_available is None else task_min_available
    meta: dict[str, Any] = {"name": name, "annotations": dict(annotations or {})}
    if elastic:
        meta["annotations"]["tide.io/elastic"] = "true"
    return {
        "apiVersion": f"{BATCH[0]}/{BATCH[1]}",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "maxRetry": 3,
            "minAvailable": min_available,
            "queue": queue,
            "schedulerName": "volcano",
            "tasks": [
                {
                    "maxRetry": 3,
                    "minAvailable": task_min,
                    "name": "worker",
                    "replicas": replicas,
                    "template": {
                        "metadata": {},
                        "spec": {
                            "containers": [
                                {
                                    "image": "x",
                                    "name": "t",
                                    "resources": {
                                        "limits": {GPU: str(gpus_per_pod)},
                                        "requests": {"cpu": "1", GPU: str(gpus_per_pod)},
                                    },
                                }
                            ],
                            "restartPolicy": "OnFailure",
                        },
                    },
                }
            ],
        },
    }


class Sandbox:
    """A test's namespace on the shared plane, with its own nodes and queues.

    Args:
        plane: the session's ``ControlPlane``.
        namespace: the test's namespace.
    """

    def __init__(self, plane: Any, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace
        self.api = plane.api_client()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.node_selector = f"{NODE_LABEL}={namespace}"
        self.nodes: list[str] = []
        self.queues: list[str] = []

    def add_nodes(self, count: int, *, gpus: int = 8) -> list[str]:
        """``count`` fake GPU nodes named ``<namespace>-gpu-<i>``, labelled for this sandbox."""
        names = []
        for _ in range(count):
            name = f"{self.namespace}-gpu-{len(self.nodes)}"
            self.plane.add_gpu_node(name, gpus=gpus)
            self.nodes.append(name)
            self.core.patch_node(name, {"metadata": {"labels": {NODE_LABEL: self.namespace}}})
            names.append(name)
        return names

    def add_queue(self, suffix: str, *, weight: int, **gpus: int | None) -> str:
        """A Queue named ``<namespace>-<suffix>``, Open."""
        name = f"{self.namespace}-{suffix}"
        self.plane.create_queue(name, weight, **gpus)
        self.queues.append(name)
        return name

    def standin(self, **options: Any) -> StandInVolcano:
        """A stand-in Volcano that sees this sandbox's namespace, nodes and queues."""
        options.setdefault("node_order", NodeOrder.SPREAD)
        return StandInVolcano(
            self.api,
            namespace=self.namespace,
            node_selector=self.node_selector,
            queues=self.queues,
            **options,
        )

    # --- jobs -------------------------------------------------------------------------------

    def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            *BATCH, self.namespace, "jobs", body
        )
        return created

    def job(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            *BATCH, self.namespace, "jobs", name
        )
        return found

    def scale(self, name: str, replicas: int) -> None:
        """Set the Job's task 0 replicas by JSON patch, as the README says it works."""
        self.custom.patch_namespaced_custom_object(
            *BATCH,
            self.namespace,
            "jobs",
            name,
            [
                {"op": "test", "path": "/spec/tasks/0/name", "value": "worker"},
                {"op": "replace", "path": "/spec/tasks/0/replicas", "value": replicas},
            ],
            _content_type=JSON_PATCH,
        )

    def podgroup(self, job: str) -> dict[str, Any]:
        """The PodGroup the stand-in made for ``job`` (``<job>-<uid>``)."""
        uid = self.job(job)["metadata"]["uid"]
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            *SCHEDULING, self.namespace, "podgroups", f"{job}-{uid}"
        )
        return found

    def podgroup_phase(self, job: str) -> str | None:
        try:
            return (self.podgroup(job).get("status") or {}).get("phase")
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def all_pods(self, job: str) -> list[dict[str, Any]]:
        """Every pod of ``job`` (terminating ones included), as the API returns them."""
        body = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"volcano.sh/job-name={job}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(body.data)["items"]
        return items

    def pods(self, job: str) -> dict[int, dict[str, Any]]:
        """The live (not terminating) pods of ``job`` by task index."""
        return {
            int(p["metadata"]["labels"][TASK_INDEX]): p
            for p in self.all_pods(job)
            if not p["metadata"].get("deletionTimestamp")
        }

    def uids(self, job: str) -> dict[int, str]:
        return {i: p["metadata"]["uid"] for i, p in self.pods(job).items()}

    def running(self, job: str) -> int:
        """Pods of ``job`` bound and Running, none terminating (and none left terminating)."""
        pods = self.all_pods(job)
        if any(p["metadata"].get("deletionTimestamp") for p in pods):
            return -1
        return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")

    def per_node(self, job: str) -> list[int]:
        """How many live pods of ``job`` each sandbox node holds, in node order."""
        counts = Counter(p["spec"].get("nodeName") for p in self.pods(job).values())
        return [counts.get(node, 0) for node in self.nodes]

    def queue_status(self, name: str) -> dict[str, Any]:
        queue = self.custom.get_cluster_custom_object(*SCHEDULING, "queues", name)
        status: dict[str, Any] = queue.get("status") or {}
        return status

    # --- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Delete the sandbox's nodes and queues (cluster-scoped); the namespace stays."""
        for name in self.nodes:
            try:
                self.core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise
        for name in self.queues:
            try:
                self.custom.delete_cluster_custom_object(*SCHEDULING, "queues", name)
            except ApiException as e:
                if e.status != 404:
                    raise
        self.api.close()
