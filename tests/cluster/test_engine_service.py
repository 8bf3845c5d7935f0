"""Two engines on a real kube-apiserver with the Volcano client: only the leader writes; when it
stops, the other takes over and honours the cooldown the first wrote in the Job's annotation.
And ``tide engine`` as a process: SIGTERM exits 0 and releases the Lease. Waits are bounded.

No Volcano controller runs: the test sets the Job's status and creates its pods as the
controller would. The metrics come from an in-memory source (throughput measured at 1, 2 and
4 replicas); the idle GPUs are the node's, as the engine reads them from the API (its 8 GPUs
less the pods bound there: another tenant's pod sets how many are idle).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_policy.adapters.leader import LeaseApi
from scheduler_policy.adapters.memory_codec import MEMORY_ANNOTATION, decode_memory
from scheduler_policy.adapters.volcano import VolcanoClient
from scheduler_policy.policy.file import policy_yaml
from scheduler_policy.vocabulary.protocols import ClusterClient, MetricsSample
from scheduler_policy.vocabulary.state import JobKey, Reason
from tests.cluster.controlplane import ControlPlane
from tests.cluster.test_volcano_client import World
from tests.scheduler_policy.builders import make_policy, usl_points
from tide.engine.command import serve
from tide.engine.options import EngineOptions
from tide.engine.service import EngineService

WAIT_S = 60.0
COOLDOWN_S = 3600.0


def wait_for(what: str, check: Callable[[], bool]) -> None:
    end = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {WAIT_S:g} s")
        time.sleep(0.1)


def scrape(port: int) -> dict[str, float]:
    """``/metrics`` of an engine, as {series: value} for the unlabelled and labelled lines."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            values[series] = float(value)
    return values


class Metrics:
    """Throughput of the job at 1, 2 and 4 replicas (the free GPUs come from the nodes)."""

    def __init__(self, job: JobKey) -> None:
        self.job = job

    def sample(self, *, now_s: float) -> MetricsSample:
        return MetricsSample(
            fresh=True, cluster_free_gpus=float("nan"),
            job_throughput={self.job: usl_points(1, 2, 4)},
        )  # fmt: skip


class Link:
    """The world's namespaced Volcano client and the Lease in its namespace, as ``Link``."""

    def __init__(self, world: World) -> None:
        self.client = world.client()
        self._lease_api = world.plane.api_client()

    @property
    def cluster(self) -> ClusterClient:
        client: VolcanoClient = self.client
        return client

    def lease_api(self, *, namespace: str, name: str) -> LeaseApi:
        return LeaseApi(self._lease_api, namespace=namespace, name=name)

    def sync(self, *, timeout_s: float) -> None:
        self.client.start()
        assert self.client.wait_synced(timeout_s)

    def on_change(self, callback: Callable[[str], None]) -> None:
        self.client.on_change(callback)

    def stop(self) -> None:
        self.client.stop()


@dataclasses.dataclass
class Engine:
    name: str
    stop: threading.Event
    thread: threading.Thread
    started: list[tuple[EngineService, int]]

    @property
    def service(self) -> EngineService:
        return self.started[0][0]

    @property
    def port(self) -> int:
        return self.started[0][1]

    def metric(self, series: str) -> float | None:
        return scrape(self.port).get(series)


@pytest.fixture
def world(control_plane: ControlPlane, namespace: str) -> World:
    return World(control_plane, namespace)


@pytest.fixture
def engines(world: World, tmp_path: Path) -> Iterator[Callable[[str, Metrics], Engine]]:
    running: list[Engine] = []
    path = tmp_path / "policy.yaml"
    policy = dataclasses.replace(
        make_policy(world.queue, cooldown_s=COOLDOWN_S), name="two-engines", interval_s=1.0
    )
    path.write_text(policy_yaml(policy))

    def start(name: str, metrics: Metrics) -> Engine:
        options = EngineOptions(
            policy_path=path, host="127.0.0.1", port=0, identity=name,
            lease_namespace=world.ns, lease_name="tide-engine", namespace=world.ns,
            lease_duration_s=4.0, renew_every_s=0.5,
        )  # fmt: skip
        stop = threading.Event()
        started: list[tuple[EngineService, int]] = []
        thread = threading.Thread(
            target=serve, args=(options,), daemon=True,
            kwargs={"connect": lambda _o: Link(world), "metrics": lambda _p: metrics,
                    "stop": stop, "on_started": lambda s, p: started.append((s, p))},
        )  # fmt: skip
        thread.start()
        wait_for(f"{name} to start", lambda: bool(started) or not thread.is_alive())
        assert started, f"{name} did not start"
        engine = Engine(name, stop, thread, started)
        running.append(engine)
        return engine

    yield start
    for engine in running:
        engine.stop.set()
    for engine in running:
        engine.thread.join(WAIT_S)


def replicas(world: World, name: str) -> int:
    return int(world.get(name)["spec"]["tasks"][0]["replicas"])


def test_only_the_leader_writes_and_the_next_leader_honours_its_cooldown(
    world: World, engines: Callable[[str, Metrics], Engine]
) -> None:
    world.job("a", replicas=2)
    world.running("a")
    for index in range(2):
        world.pod("a", index, node=world.node)
    other = world.pod("other", 0, node=world.node, gpus=4)  # leaves 2 of the 8 GPUs idle
    key = JobKey(f"{world.ns}/a")
    metrics = Metrics(key)
    first = engines("engine-1", metrics)
    wait_for("engine-1 to lead", lambda: first.metric("tide_leader") == 1)
    second = engines("engine-2", metrics)
    wait_for("engine-2 to decide", lambda: second.service.last_round is not None)
    # engine-1 grew the job into the 2 idle GPUs; engine-2 decided the same and wrote nothing.
    wait_for("the leader's write", lambda: replicas(world, "a") == 4)
    for index in (2, 3):
        world.pod("a", index, node=world.node)  # as Volcano's controller would
    written = decode_memory(world.get("a")["metadata"]["annotations"][MEMORY_ANNOTATION], job=key)
    assert written.last_rescale_s is not None
    assert first.metric('tide_replica_writes_total{outcome="applied"}') == 1
    assert second.metric("tide_leader") == 0
    assert second.metric('tide_replica_writes_total{outcome="applied"}') == 0
    assert second.service.last_round is not None and not second.service.last_round.wrote
    # Four more idle GPUs: without the cooldown, the job would grow to 8.
    world.core.delete_namespaced_pod(other, world.ns, grace_period_seconds=0)
    first.stop.set()
    first.thread.join(WAIT_S)
    assert not first.thread.is_alive()
    wait_for("engine-2 to lead", lambda: second.metric("tide_leader") == 1)
    wait_for(
        "a round of engine-2 as the leader",
        lambda: second.service.last_round is not None and second.service.last_round.wrote,
    )
    round_ = second.service.last_round
    assert round_ is not None
    (decision,) = [d for d in round_.result.decisions if d.job == key]
    assert decision.reason is Reason.COOLDOWN, decision.message
    assert decision.target_replicas == decision.current_replicas == 4
    assert replicas(world, "a") == 4
    stored = decode_memory(world.get("a")["metadata"]["annotations"][MEMORY_ANNOTATION], job=key)
    assert stored.last_rescale_s == written.last_rescale_s  # the first leader's rescale time


def test_sigterm_stops_the_engine_process_cleanly(
    control_plane: ControlPlane, world: World, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(dataclasses.replace(make_policy(world.queue), interval_s=1.0)))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "TIDE_ENGINE_IDENTITY": "engine-process"}  # fmt: skip
    command = [
        sys.executable, "-m", "tide", "engine", "--policy", str(path),
        "--kubeconfig", str(control_plane.kubeconfig_path), "--prometheus", "http://127.0.0.1:9",
        "--listen", "127.0.0.1:0", "--namespace", world.ns, "--lease-namespace", world.ns,
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    port: list[int] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "tide engine running" in line:
                port.append(
                    int(json.loads(line)["message"].split("HTTP on 127.0.0.1:")[1].split(",")[0])
                )

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for("the engine to run", lambda: bool(port) or process.poll() is not None)
        assert port, "".join(lines[-20:])
        wait_for("readiness", lambda: ready(port[0]))
        lease = LeaseApi(control_plane.api_client(), namespace=world.ns, name="tide-engine")
        wait_for("the Lease", lambda: (lease.read() or NOLEASE).holder == "engine-process")
        process.send_signal(signal.SIGTERM)
        code = process.wait(WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT_S)
    reader.join(WAIT_S)
    assert code == 0, "".join(lines[-20:])
    assert any("received SIGTERM" in line for line in lines)
    record = lease.read()
    assert record is not None and not record.held  # released on the way out


@dataclasses.dataclass
class _NoLease:
    holder: str | None = None


NOLEASE: Any = _NoLease()


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return int(answer.status) == 200
    except (urllib.error.URLError, OSError):
        return False
