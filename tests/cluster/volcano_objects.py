"""Volcano's objects (and KWOK's nodes) as the control plane installs and the tests create them.

``volcano_documents`` reads Volcano v1.15.1's CRDs and ValidatingAdmissionPolicies (with their
bindings) from ``../shared/volcano-crds/``; ``queue_body`` and ``volcano_job_body`` build valid
Queues and Jobs; ``policy_probes`` builds, per policy, a dry-run request that the policy must
refuse, which tells when a policy is in force.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.processes import ControlPlaneError, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
# The shared ground truth sits beside the checkout (../shared), as CI lays it out.
SHARED_DIR = REPO_ROOT.parent / "shared"
VOLCANO_CRDS_DIR = SHARED_DIR / "volcano-crds"
KWOK_STAGES_DIR = SHARED_DIR / "kwok-stages"

# libyaml's loader when PyYAML has it: the CRD files are 1 s of pure-Python parsing.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

GPU_RESOURCE = "nvidia.com/gpu"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
QUEUE_GROUP = "scheduling.volcano.sh"
QUEUE_VERSION = "v1beta1"
JOB_GROUP = "batch.volcano.sh"
JOB_VERSION = "v1alpha1"


def volcano_documents(folder: Path = VOLCANO_CRDS_DIR) -> list[dict[str, Any]]:
    """Every object of Volcano's CRD files and admission-policy files, CRDs first.

    Args:
        folder: the CRD folder; its ``admission-policies/`` holds the policies and bindings.

    Returns:
        The objects, in file order (each policy before its binding).

    Raises:
        ControlPlaneError: a folder holds no YAML file, or a document is not an object.
    """
    crd_files = sorted(folder.glob("*.yaml"))
    policy_files = sorted((folder / "admission-policies").glob("*.yaml"))
    if not crd_files:
        raise ControlPlaneError(f"{folder}: no CRD files (*.yaml)")
    if not policy_files:
        raise ControlPlaneError(f"{folder / 'admission-policies'}: no policy files (*.yaml)")
    docs: list[dict[str, Any]] = []
    for path in (*crd_files, *policy_files):
        for doc in yaml.load_all(path.read_text(), Loader=_SAFE_LOADER):
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
                raise ControlPlaneError(f"{path}: a document is not a Kubernetes object")
            docs.append(doc)
    return docs


def kwok_stages_config(folder: Path = KWOK_STAGES_DIR) -> str:
    """The KWOK stages of ``folder`` joined with ``---`` into one ``kwok --config`` document.

    Raises:
        ControlPlaneError: the folder holds no stage file.
    """
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise ControlPlaneError(f"{folder}: no stage files (*.yaml)")
    return "\n---\n".join(f.read_text().strip() for f in files) + "\n"


def _gpus(gpus: int) -> dict[str, str]:
    return {GPU_RESOURCE: str(gpus)}


def queue_body(
    name: str,
    *,
    weight: int,
    capability_gpus: int | None = None,
    deserved_gpus: int | None = None,
    guarantee_gpus: int | None = None,
) -> dict[str, Any]:
    """A ``scheduling.volcano.sh/v1beta1`` Queue (GPU figures in whole GPUs, omitted when None)."""
    spec: dict[str, Any] = {"weight": weight, "reclaimable": True}
    if capability_gpus is not None:
        spec["capability"] = _gpus(capability_gpus)
    if deserved_gpus is not None:
        spec["deserved"] = _gpus(deserved_gpus)
    if guarantee_gpus is not None:
        spec["guarantee"] = {"resource": _gpus(guarantee_gpus)}
    return {
        "apiVersion": f"{QUEUE_GROUP}/{QUEUE_VERSION}",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


def volcano_job_body(
    name: str, *, queue: str, replicas: int, min_available: int = 1, gpus_per_pod: int = 1
) -> dict[str, Any]:
    """A ``batch.volcano.sh/v1alpha1`` Job with one elastic task ``worker``.

    Args:
        name: the job's name.
        queue: its ``spec.queue``.
        replicas: ``tasks[0].replicas``.
        min_available: ``spec.minAvailable`` (Volcano's policy refuses more than ``replicas``).
        gpus_per_pod: each worker's ``nvidia.com/gpu`` request and limit.

    Returns:
        The body to create (the namespace comes from the create call); ``tasks[0].minAvailable``
        is 1 (0 when ``replicas`` is 0), so only ``replicas`` needs to move to rescale.
    """
    return {
        "apiVersion": f"{JOB_GROUP}/{JOB_VERSION}",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "queue": queue,
            "minAvailable": min_available,
            "tasks": [
                {
                    "name": "worker",
                    "replicas": replicas,
                    "minAvailable": min(1, replicas),
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "worker",
                                    "image": "busybox",
                                    "resources": {
                                        "limits": _gpus(gpus_per_pod),
                                        "requests": _gpus(gpus_per_pod),
                                    },
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def gpu_node_body(name: str, *, gpus: int, cpu: str, memory: str) -> dict[str, Any]:
    """A Node that KWOK manages (annotation ``kwok.x-k8s.io/node: fake``, label ``type: kwok``).

    Args:
        name: the node's name.
        gpus: its ``nvidia.com/gpu`` capacity and allocatable.
        cpu: its CPU capacity and allocatable (a Kubernetes quantity).
        memory: its memory capacity and allocatable (a Kubernetes quantity).

    Returns:
        The body to create: a Node keeps the status it is created with (capacity,
        allocatable); KWOK adds the conditions and addresses and keeps them fresh.
    """
    resources = {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/role": "agent",
            },
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def policy_probes(api: Any, *, name: str, namespace: str) -> dict[str, Callable[[], Any]]:
    """Per policy, a dry-run create (nothing is stored) that breaks exactly one of its rules.

    The podgroup policy allows everything, so it has none; a policy in force answers its probe
    with HTTP 422 naming it.

    Args:
        api: an admin ``kubernetes.client.ApiClient``.
        name: the probe objects' name.
        namespace: where the namespaced probes go (it must exist).

    Returns:
        Policy name → a call that sends its probe.
    """
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    bad_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            # The policy allows one of the two disruption-budget annotations, not both.
            "annotations": {
                "volcano.sh/jdb-min-available": "1",
                "volcano.sh/jdb-max-unavailable": "1",
            },
        },
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "busybox"}]},
    }
    return {
        # spec.minAvailable above the total replicas.
        "job-validation-policy": lambda: custom.create_namespaced_custom_object(
            JOB_GROUP,
            JOB_VERSION,
            namespace,
            "jobs",
            volcano_job_body(name, queue="default", replicas=1, min_available=2),
            dry_run="All",
        ),
        # deserved above capability.
        "queue-validation-policy": lambda: custom.create_cluster_custom_object(
            QUEUE_GROUP,
            QUEUE_VERSION,
            "queues",
            queue_body(name, weight=1, capability_gpus=1, deserved_gpus=2),
            dry_run="All",
        ),
        "pod-validation-policy": lambda: core.create_namespaced_pod(
            namespace, bad_pod, dry_run="All"
        ),
        # A member pattern with an unmatched parenthesis (the CRD's schema lets it through).
        "hypernode-validation-policy": lambda: custom.create_cluster_custom_object(
            "topology.volcano.sh",
            "v1alpha1",
            "hypernodes",
            {
                "apiVersion": "topology.volcano.sh/v1alpha1",
                "kind": "HyperNode",
                "metadata": {"name": name},
                "spec": {
                    "tier": 1,
                    "members": [
                        {"type": "Node", "selector": {"regexMatch": {"pattern": "gpu-(a"}}}
                    ],
                },
            },
            dry_run="All",
        ),
    }


def install_volcano(api: Any, *, established_s: float, policies_in_force_s: float) -> None:
    """Creates Volcano's CRDs, policies and bindings; returns when all are in force.

    Args:
        api: an admin ``kubernetes.client.ApiClient``.
        established_s: how long the CRDs may take to be ``Established``.
        policies_in_force_s: how long each policy may take to refuse its probe.

    Raises:
        ControlPlaneError: a create failed, or a bound passed.
    """
    from kubernetes import client, utils

    docs = volcano_documents()
    for doc in docs:
        try:
            utils.create_from_dict(api, doc)
        except utils.FailToCreateError as e:
            raise ControlPlaneError(f"creating {doc['kind']} {doc['metadata']['name']}: {e}") from e
    crds = [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
    extensions = client.ApiextensionsV1Api(api)

    def established() -> bool:
        ok = {
            item.metadata.name
            for item in extensions.list_custom_resource_definition().items
            if item.metadata
            and item.status
            and any(
                c.type == "Established" and c.status == "True" for c in item.status.conditions or ()
            )
        }
        return all(name in ok for name in crds)

    wait_until(
        f"Volcano CRDs Established ({', '.join(crds)})", established, timeout_s=established_s
    )
    policies = [d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    wait_policies_in_force(api, policies, timeout_s=policies_in_force_s)


def wait_policies_in_force(api: Any, policies: list[str], *, timeout_s: float) -> None:
    """Waits until each policy that has a probe refuses it (HTTP 422 naming the policy).

    Raises:
        ControlPlaneError: a probe was refused by something other than its policy (the probe is
            wrong), or a policy was not in force within ``timeout_s``.
    """
    from kubernetes.client.exceptions import ApiException

    probes = policy_probes(api, name=f"policy-probe-{uuid.uuid4().hex[:6]}", namespace="default")
    for policy in policies:
        probe = probes.get(policy)
        if probe is None:
            continue  # it refuses nothing (the podgroup policy allows every PodGroup)

        def refused(probe: Callable[[], Any] = probe, policy: str = policy) -> bool:
            try:
                probe()
            except ApiException as e:
                if e.status == 422 and policy in str(e.body):
                    return True
                if e.status == 422:
                    raise ControlPlaneError(
                        f"the probe of {policy} was refused by something else: {e.body}"
                    ) from e
                return False
            return False  # accepted: the policy is not in force yet

        wait_until(f"{policy} in force", refused, timeout_s=timeout_s, interval_s=0.3)
