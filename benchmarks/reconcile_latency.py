"""Latency of one reconcile against a real kube-apiserver with 1,000 elastic Volcano Jobs.

Starts the cluster tests' control plane (etcd, kube-apiserver v1.36.3 with Volcano's CRDs and
admission policies, KWOK; ``tests/cluster/controlplane.py``), creates ``--queues`` queues,
``--nodes`` KWOK nodes and ``--jobs`` elastic Jobs of ``--replicas`` one-GPU workers each, with
their pods bound to the nodes (as Volcano's controller and scheduler would), then runs
``reconcile`` (observe → fit → decide → apply) with ``VolcanoClient`` in watch mode (synced
before the first round) and a trivial metrics source (every job measured at 1 and 2 replicas,
free GPUs from the client's nodes). Each round advances the engine's clock by the policy's
interval; from the third round on, a pending gang of ``--gang-gpus`` GPUs is submitted to one
queue in turn before the round (a PodGroup in phase ``Inqueue``), so that rounds also shrink.
Between rounds, outside the timed part, the benchmark does what Volcano's controller would: it
creates the pods of grown jobs and deletes those above a shrunk job's replicas, then waits for
the client's watches to see them.

Prints each round (wall time, writes, requests) and the p50/p90 over the rounds; ``--json PATH``
writes the records. Needs the binaries of ``make cluster-deps`` and ``../shared``.

    python benchmarks/reconcile_latency.py --json benchmarks/out/reconcile_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubernetes import client as k8s  # noqa: E402

from scheduler_policy.adapters.volcano import (  # noqa: E402
    DEFAULT_MAX_CONCURRENT_WRITES,
    VolcanoClient,
)
from scheduler_policy.engine.reconcile import reconcile  # noqa: E402
from scheduler_policy.models.cache import ModelCache  # noqa: E402
from scheduler_policy.policy.spec import Defaults, ElasticPolicy, QueuePolicy  # noqa: E402
from scheduler_policy.vocabulary.protocols import MetricsSample, ReplicaChange  # noqa: E402
from scheduler_policy.vocabulary.state import JobKey, QueueName, ThroughputPoint  # noqa: E402
from tests.cluster.controlplane import ControlPlane  # noqa: E402

NAMESPACE = "bench"
BATCH = ("batch.volcano.sh", "v1alpha1")
SCHEDULING = ("scheduling.volcano.sh", "v1beta1")
NOW_S = 1_800_000_000.0
CREATE_THREADS = 8
SETTLE_S = 180.0


class TimedWrites:
    """The client, with the time its writes take counted apart.

    ``apply_changes`` calls ``apply`` from the client's ``max_concurrent_writes`` threads (the
    attribute reaches it through ``__getattr__``), so a round's writing is timed as the span
    from the first write's start to the last one's end (``write_s``), and each write's own
    duration is summed apart (``busy_s``).
    """

    def __init__(self, client: VolcanoClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.busy_s = 0.0
            self._first: float | None = None
            self._last: float | None = None

    @property
    def write_s(self) -> float:
        with self._lock:
            return 0.0 if self._first is None or self._last is None else self._last - self._first

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def apply(self, change: ReplicaChange) -> None:
        start = time.perf_counter()
        try:
            self.client.apply(change)
        finally:
            end = time.perf_counter()
            with self._lock:
                self.busy_s += end - start
                self._first = start if self._first is None else min(self._first, start)
                self._last = end if self._last is None else max(self._last, end)


class TrivialMetrics:
    """Every job measured at 1 and 2 replicas (a good scaler); free GPUs from the nodes."""

    def __init__(self, cluster: VolcanoClient, jobs: Iterable[JobKey]) -> None:
        self._cluster = cluster
        self._jobs = list(jobs)

    def sample(self, *, now_s: float) -> MetricsSample:
        history = (
            ThroughputPoint(now_s - 600.0, 1, 100.0),
            ThroughputPoint(now_s - 300.0, 2, 190.0),
        )
        return MetricsSample(
            fresh=True,
            cluster_free_gpus=sum(n.free_gpus for n in self._cluster.list_nodes()),
            job_throughput={key: history for key in self._jobs},
            job_remaining_samples={key: 1e9 for key in self._jobs},
        )


def job_body(name: str, *, queue: str, replicas: int) -> dict[str, Any]:
    container = {"name": "worker", "image": "x",
                 "resources": {"requests": {"nvidia.com/gpu": "1"},
                               "limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name,
                     "annotations": {"tide.io/elastic": "true", "tide.io/max-replicas": "8"}},
        "spec": {"schedulerName": "volcano", "queue": queue, "minAvailable": 1,
                 "tasks": [{"name": "worker", "replicas": replicas, "minAvailable": 1,
                            "template": {"spec": {"restartPolicy": "OnFailure",
                                                  "containers": [container]}}}]},
    }  # fmt: skip


def pod_body(job: str, index: int, *, queue: str, node: str) -> dict[str, Any]:
    labels = {"volcano.sh/job-name": job, "volcano.sh/job-namespace": NAMESPACE,
              "volcano.sh/queue-name": queue, "volcano.sh/task-index": str(index),
              "volcano.sh/task-spec": "worker"}  # fmt: skip
    return {
        "metadata": {"name": f"{job}-worker-{index}", "labels": labels},
        "spec": {"nodeName": node, "schedulerName": "volcano",
                 "containers": [{"name": "t", "image": "x",
                                 "resources": {"requests": {"nvidia.com/gpu": "1"},
                                               "limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip


def in_parallel(calls: list[Callable[[], object]]) -> None:
    with ThreadPoolExecutor(CREATE_THREADS) as pool:
        for future in [pool.submit(call) for call in calls]:
            future.result()


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = SETTLE_S) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout_s:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(0.2)
    return time.monotonic() - began


class Cluster:
    """The benchmark's objects on the plane, and the controller's part between rounds."""

    def __init__(self, plane: ControlPlane, *, queues: int, nodes: int, node_gpus: int) -> None:
        self.api = plane.api_client()
        self.custom = k8s.CustomObjectsApi(self.api)
        self.core = k8s.CoreV1Api(self.api)
        self.queues = [f"bench-q{i:02d}" for i in range(queues)]
        self.nodes = [f"bench-n{i:02d}" for i in range(nodes)]
        self.pods: dict[str, set[int]] = {}
        self.queue_of: dict[str, str] = {}
        self._next_node = 0
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        for name in self.nodes:
            plane.add_gpu_node(name, gpus=node_gpus)

    def submit_gang(self, name: str, *, queue: str, gpus: int) -> None:
        """A non-elastic gang waiting for GPUs, as Volcano's controller makes its PodGroup."""
        members = max(1, gpus // 8)
        self.custom.create_namespaced_custom_object(*SCHEDULING, NAMESPACE, "podgroups", {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": members, "queue": queue,
                     "minResources": {"nvidia.com/gpu": str(gpus)}},
            "status": {"phase": "Inqueue"},
        })  # fmt: skip

    def node(self) -> str:
        self._next_node = (self._next_node + 1) % len(self.nodes)
        return self.nodes[self._next_node]

    def create_jobs(self, count: int, replicas: int) -> list[JobKey]:
        names = [f"job-{i:04d}" for i in range(count)]
        for i, name in enumerate(names):
            self.queue_of[name] = self.queues[i % len(self.queues)]
            self.pods[name] = set()
        in_parallel([
            (lambda n=n: self.custom.create_namespaced_custom_object(
                *BATCH, NAMESPACE, "jobs", job_body(n, queue=self.queue_of[n], replicas=replicas)))
            for n in names
        ])  # fmt: skip
        in_parallel([
            (lambda n=n: self.custom.patch_namespaced_custom_object_status(
                *BATCH, NAMESPACE, "jobs", n, {"status": {"state": {"phase": "Running"}}},
                _content_type="application/merge-patch+json"))
            for n in names
        ])  # fmt: skip
        self.follow({name: replicas for name in names})
        return [JobKey(f"{NAMESPACE}/{name}") for name in names]

    def follow(self, replicas: dict[str, int]) -> int:
        """Create and delete pods so that each job has ``replicas`` of them; the pods touched."""
        calls: list[Callable[[], object]] = []
        for name, want in replicas.items():
            have = self.pods[name]
            for index in sorted(set(range(want)) - have):
                body = pod_body(name, index, queue=self.queue_of[name], node=self.node())
                calls.append(lambda body=body: self.core.create_namespaced_pod(NAMESPACE, body))
            for index in sorted(have - set(range(want))):
                pod = f"{name}-worker-{index}"
                calls.append(lambda pod=pod: self.core.delete_namespaced_pod(
                    pod, NAMESPACE, grace_period_seconds=0))  # fmt: skip
            self.pods[name] = set(range(want))
        in_parallel(calls)
        return len(calls)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=2, help="each job's replicas at start")
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--node-gpus", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=12, help="timed reconciles")
    parser.add_argument("--gang-gpus", type=int, default=16,
                        help="GPUs of the pending gang submitted before each round from the "
                             "third on, to a queue in turn (0: none)")  # fmt: skip
    parser.add_argument("--max-concurrent-writes", type=int,
                        default=DEFAULT_MAX_CONCURRENT_WRITES,
                        help="Job patches in flight at once (1: one after another)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"machine: {os.cpu_count()} cores, {memory_gb:.1f} GiB, Python "
          f"{platform.python_version()}, {platform.platform()}")  # fmt: skip
    print(f"command: {command}")
    print("load average at start (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))

    with tempfile.TemporaryDirectory(prefix="tide-bench-") as workdir:
        plane = ControlPlane.start(Path(workdir) / "plane")
        try:
            records = run(plane, args)
        finally:
            plane.stop()
    print("load average at end (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")


def run(plane: ControlPlane, args: argparse.Namespace) -> list[dict[str, object]]:
    began = time.monotonic()
    cluster = Cluster(plane, queues=args.queues, nodes=args.nodes, node_gpus=args.node_gpus)
    per_queue = args.jobs * args.replicas / args.queues
    for name in cluster.queues:
        plane.create_queue(name, weight=1, capability_gpus=int(per_queue * 1.25))
    keys = cluster.create_jobs(args.jobs, args.replicas)
    print(f"set up {args.jobs} jobs, {args.jobs * args.replicas} pods, {args.nodes} nodes in "
          f"{time.monotonic() - began:.1f} s")  # fmt: skip

    client = VolcanoClient(plane.api_client(), namespace=NAMESPACE, node_selector="type=kwok",
                           max_concurrent_writes=args.max_concurrent_writes)  # fmt: skip
    synced_began = time.monotonic()
    client.start()
    if not client.wait_synced(SETTLE_S):
        raise RuntimeError("the client's watches did not sync")
    pods = args.jobs * args.replicas
    wait_until("the pods in the client's cache",
               lambda: sum(len(j.pods) for j in client.list_jobs()) == pods)  # fmt: skip
    print(f"client synced in {time.monotonic() - synced_began:.1f} s")
    metrics = TrivialMetrics(client, keys)
    policy = ElasticPolicy(
        name="bench", interval_s=60.0, defaults=Defaults(cooldown_s=120.0),
        queues=tuple(QueuePolicy(QueueName(q), borrow=False) for q in cluster.queues),
    )  # fmt: skip
    models = ModelCache(refit_s=policy.model_refit_s)

    timed = TimedWrites(client)
    print(f"{'round':>5} {'reconcile s':>12} {'of it writing s':>16} {'writes':>7} "
          f"{'failed':>7} {'requests':>9}")  # fmt: skip
    seconds: list[float] = []
    records: list[dict[str, object]] = []
    now_s = NOW_S
    try:
        for round_ in range(args.rounds):
            if args.gang_gpus and round_ >= 2:
                # Demand arrives: the engine shrinks that queue's jobs to make room for it.
                gangs = len(client.list_pending_gangs())
                cluster.submit_gang(
                    f"gang-{round_:03d}",
                    gpus=args.gang_gpus,
                    queue=cluster.queues[round_ % len(cluster.queues)],
                )
                wait_until(
                    "the gang in the client's cache",
                    lambda gangs=gangs: len(client.list_pending_gangs()) > gangs,
                )
            before = client.requests()
            timed.reset()
            start = time.perf_counter()
            result = reconcile(metrics=metrics, cluster=timed, policy=policy, now_s=now_s,
                               models=models)  # fmt: skip
            elapsed = time.perf_counter() - start
            after = client.requests()
            requests = (after.patches + after.gets + after.events + after.lists
                        - before.patches - before.gets - before.events - before.lists)  # fmt: skip
            writes = len(result.applied)
            seconds.append(elapsed)
            print(f"{round_:>5} {elapsed:>12.3f} {timed.write_s:>16.3f} {writes:>7} "
                  f"{len(result.failed):>7} {requests:>9}")  # fmt: skip
            records.append({"metric": "reconcile_latency", "value": round(elapsed, 4),
                            "unit": "s", "round": round_, "writes": writes,
                            "writing_s": round(timed.write_s, 4),
                            "write_busy_s": round(timed.busy_s, 4),
                            "failed": len(result.failed), "requests": requests,
                            "jobs": args.jobs})  # fmt: skip
            # Volcano's part: pods follow the replicas; then the watches see them.
            want = {c.job.split("/", 1)[1]: c.to_replicas for c in result.applied}
            cluster.follow(want)
            expected = sum(len(v) for v in cluster.pods.values())
            wait_until("the pods in the client's cache",
                       lambda expected=expected: sum(len(j.pods) for j in client.list_jobs())
                       == expected)  # fmt: skip
            now_s += policy.interval_s
    finally:
        client.stop()
    p50, p90 = statistics.median(seconds), percentile(seconds, 0.9)
    writes_total = sum(int(r["writes"]) for r in records)  # type: ignore[call-overload]
    busy_total = sum(float(r["write_busy_s"]) for r in records)  # type: ignore[arg-type]
    per_write_ms = 1000.0 * busy_total / writes_total if writes_total else 0.0
    print(
        f"writes: {writes_total} in all, {per_write_ms:.1f} ms each on average "
        "(patch, conflict handling, cache update; Events are sent from a thread), "
        f"up to {client.max_concurrent_writes} at once"
    )
    print(f"reconcile over {len(seconds)} rounds: p50 {p50:.3f} s, p90 {p90:.3f} s, "
          f"max {max(seconds):.3f} s (target p50 < 2 s)")  # fmt: skip
    common = {"jobs": args.jobs, "pods_at_start": args.jobs * args.replicas,
              "queues": args.queues, "nodes": args.nodes, "rounds": len(seconds)}  # fmt: skip
    records += [
        {"metric": "reconcile_latency_p50", "value": round(p50, 4), "unit": "s", **common},
        {"metric": "reconcile_latency_p90", "value": round(p90, 4), "unit": "s", **common},
        {"metric": "reconcile_latency_max", "value": round(max(seconds), 4), "unit": "s",
         **common},
        {"metric": "write_latency_mean", "value": round(per_write_ms, 2), "unit": "ms",
         "writes": writes_total, "max_concurrent_writes": client.max_concurrent_writes,
         **common},
        {"metric": "reconcile_latency_round0", "value": round(seconds[0], 4), "unit": "s",
         **common},
        {"metric": "watch_requests", "value": client.requests().watches, "unit": "count",
         **common},
        {"metric": "list_requests", "value": client.requests().lists, "unit": "count", **common},
    ]  # fmt: skip
    return records


if __name__ == "__main__":
    main()
