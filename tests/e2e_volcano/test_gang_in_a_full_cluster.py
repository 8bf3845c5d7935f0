"""The case that matters most, on Volcano v1.15.1's own scheduler, controller and webhook.

An elastic research job holds 28 of 32 GPUs (4 nodes of 8); a production gang of 3 pods × 8 GPUs
arrives. With the shipped scheduler configuration (Volcano's default tiers with ``overcommit``),
Volcano alone never enqueues the gang (``../shared/volcano-wire/v1.15.1/README.md``: 240 s), so
reclaim never runs for it. With ``tide engine`` running, tide reads the pending PodGroup, shrinks
the research job by its highest indices so that the gang's pods get whole nodes, and the gang must
run within 3 minutes with no pod evicted: both with the shipped configuration (``binpack``) and
with Volcano's default node order (``spread``: no ``binpack``, ``nodeorder`` as shipped by
Volcano).

The elastic job's pods are KWOK's: they export no throughput, so tide never grows the job (its
metrics are stale) but still shrinks it to its queue's budget for the pending gang, as
DESIGN.md's "Graceful shrink" says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import ControlPlane
from tests.cluster.processes import free_port
from tests.e2e_volcano.conftest import StartVolcano
from tests.prometheus_server import PrometheusServer, require_binaries

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONF = ROOT / "charts" / "tide" / "files" / "volcano-scheduler.conf"
GANG_DEADLINE_S = 180.0
ALONE_WAIT_S = 60.0
NODES, GPUS_PER_NODE = 4, 8


def _conf(*, extender_url: str, binpack: bool) -> str:
    """The shipped scheduler configuration, pointed at the test's engine; without binpack it is
    Volcano's default node order (nodeorder with its default weights)."""
    conf = yaml.safe_load(SHIPPED_CONF.read_text())
    for tier in conf["tiers"]:
        plugins = []
        for plugin in tier["plugins"]:
            if plugin["name"] == "extender":
                plugin["arguments"]["extender.urlPrefix"] = extender_url
            if not binpack and plugin["name"] == "binpack":
                continue
            if not binpack and plugin["name"] == "nodeorder":
                plugin.pop("arguments", None)
            plugins.append(plugin)
        tier["plugins"] = plugins
    text: str = yaml.safe_dump(conf, sort_keys=False)
    return text


POLICY = """\
apiVersion: tide.io/v1alpha1
kind: ElasticPolicy
metadata:
  name: e2e
spec:
  interval: 5s
  defaults:
    cooldown: 0s
    maxStepUp: 32
    maxStepDown: 32
    stabilizationWindow:
      up: 0s
      down: 0s
  queues:
    - name: research
      elastic: true
      borrowIdleGpus: true
    - name: production
      elastic: false
"""


def _api(plane: ControlPlane) -> tuple[Any, Any]:
    from kubernetes import client

    api = plane.api_client()
    return client.CustomObjectsApi(api), client.CoreV1Api(api)


def _wait(what: str, probe: Any, *, timeout_s: float, interval_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)


def _queue(custom: Any, name: str, weight: int) -> None:
    body = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": weight, "reclaimable": True},
    }
    custom.create_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", body)
    _wait(
        f"queue {name} Open (Volcano's queue controller)",
        lambda: custom.get_cluster_custom_object(
            "scheduling.volcano.sh", "v1beta1", "queues", name
        ).get("status", {}).get("state") == "Open",
        timeout_s=30,
    )  # fmt: skip


def _job(
    name: str, *, queue: str, replicas: int, min_available: int, gpus: int, elastic: bool
) -> dict[str, Any]:
    annotations = (
        {"tide.io/elastic": "true", "tide.io/min-replicas": "1", "tide.io/max-replicas": "32"}
        if elastic
        else {}
    )
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": "volcano",
            "queue": queue,
            "minAvailable": min_available,
            "tasks": [
                {
                    "name": "worker",
                    "replicas": replicas,
                    "minAvailable": min_available,
                    "template": {
                        "metadata": {"labels": {"tide.io/elastic": "true"} if elastic else {}},
                        "spec": {
                            "restartPolicy": "Never",
                            "terminationGracePeriodSeconds": 5,
                            "containers": [
                                {
                                    "name": "worker",
                                    "image": "busybox",
                                    "resources": {
                                        "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1"},
                                        "limits": {"nvidia.com/gpu": str(gpus), "cpu": "1"},
                                    },
                                }
                            ],
                        },
                    },
                }
            ],
        },
    }


def _pods(core: Any, namespace: str, job: str) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"volcano.sh/job-name={job}")
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


def _running(core: Any, namespace: str, job: str) -> list[Any]:
    return [p for p in _pods(core, namespace, job) if p.status.phase == "Running"]


def _setup(plane: ControlPlane) -> tuple[Any, Any, str]:
    custom, core = _api(plane)
    for i in range(NODES):
        plane.add_gpu_node(f"gpu-{i}", gpus=GPUS_PER_NODE)
    namespace = plane.new_namespace("e2e")
    _queue(custom, "research", 1)
    _queue(custom, "production", 3)
    custom.create_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", namespace, "jobs",
        _job("research", queue="research", replicas=28, min_available=1, gpus=1, elastic=True),
    )  # fmt: skip
    _wait(
        "28 research pods Running",
        lambda: len(_running(core, namespace, "research")) == 28,
        timeout_s=90,
    )
    return custom, core, namespace


def _submit_gang(custom: Any, namespace: str) -> float:
    custom.create_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", namespace, "jobs",
        _job("prod", queue="production", replicas=3, min_available=3, gpus=8, elastic=False),
    )  # fmt: skip
    return time.monotonic()


def _evictions(core: Any, namespace: str) -> list[str]:
    events = core.list_namespaced_event(namespace).items
    return [
        f"{e.involved_object.name}: {e.message}"
        for e in events
        if e.reason == "Evict" or "evict" in (e.message or "").lower()
    ]


def _start_prometheus(tmp_path: Path, targets: list[str]) -> PrometheusServer:
    require_binaries()
    return PrometheusServer(tmp_path / "prometheus", scrape_targets=targets).start()


def _start_engine(
    tmp_path: Path, plane: ControlPlane, *, prometheus: str, port: int, namespace: str
) -> subprocess.Popen[bytes]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    log = open(tmp_path / "engine.log", "wb")  # noqa: SIM115 (closed with the process)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [
            sys.executable, "-m", "tide", "engine",
            "--policy", str(policy),
            "--kubeconfig", str(plane.kubeconfig_path),
            "--prometheus", prometheus,
            "--listen", f"127.0.0.1:{port}",
            "--lease-namespace", namespace,
        ],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
    )  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_volcano_alone_leaves_the_gang_pending(
    start_volcano: StartVolcano, tmp_path: Path, record_property: Any
) -> None:
    # No engine answers at the extender's URL: with `ignorable: true` the scheduler proceeds as
    # without an extender (the recordings' README).
    conf = _conf(extender_url=f"http://127.0.0.1:{free_port()}/extender", binpack=True)
    plane, _ = start_volcano(conf)
    custom, core, namespace = _setup(plane)
    _submit_gang(custom, namespace)
    time.sleep(ALONE_WAIT_S)
    assert _running(core, namespace, "prod") == []
    assert len(_running(core, namespace, "research")) == 28
    groups = custom.list_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", namespace, "podgroups"
    )["items"]
    phases = {g["metadata"]["name"].rsplit("-", 5)[0]: g["status"].get("phase") for g in groups}
    record_property("podgroup_phases", json.dumps(phases))
    assert phases["prod"] in ("Pending", "Inqueue"), phases


@pytest.mark.parametrize("binpack", [True, False], ids=["shipped-binpack", "default-spread"])
def test_tide_runs_the_gang_with_no_pod_evicted(
    start_volcano: StartVolcano, tmp_path: Path, binpack: bool, record_property: Any
) -> None:
    port = free_port()
    plane, volcano = start_volcano(
        _conf(extender_url=f"http://127.0.0.1:{port}/extender", binpack=binpack)
    )
    custom, core, namespace = _setup(plane)
    prometheus = _start_prometheus(
        tmp_path, [f"127.0.0.1:{volcano.metrics_port}", f"127.0.0.1:{port}"]
    )
    engine = _start_engine(
        tmp_path, plane, prometheus=prometheus.url, port=port, namespace=namespace
    )
    try:
        before = {p.metadata.name: p.metadata.uid for p in _pods(core, namespace, "research")}
        submitted = _submit_gang(custom, namespace)
        _wait(
            "the production gang's 3 pods Running",
            lambda: engine.poll() is None and len(_running(core, namespace, "prod")) == 3,
            timeout_s=GANG_DEADLINE_S,
            interval_s=2.0,
        )
        waited_s = time.monotonic() - submitted
        record_property("gang_running_after_s", round(waited_s, 1))
        assert _evictions(core, namespace) == []
        after = {p.metadata.name: p.metadata.uid for p in _pods(core, namespace, "research")}
        kept = sorted(int(re.sub(r".*-", "", name)) for name in after)
        # tide's shrink: Volcano's controller deletes the highest indices; the others keep
        # their UIDs (nobody evicted or recreated them).
        assert kept == list(range(len(kept))), kept
        assert all(before[name] == uid for name, uid in after.items())
        record_property("research_replicas_after", len(kept))
        print(f"node order {'binpack' if binpack else 'spread'}: gang Running after "
              f"{waited_s:.1f} s; research kept {len(kept)} of 28 pods")  # fmt: skip
    finally:
        _stop(engine)
        prometheus.stop()
        print((tmp_path / "engine.log").read_text(errors="replace")[-4000:])
