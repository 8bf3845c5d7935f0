"""``VolcanoClient``: the engine's ``ClusterClient`` on a real Kubernetes API server.

It reads Volcano Jobs, Queues, PodGroups, pods and nodes from caches kept current by watches
(``informer.Informer``: list once, then watch), or, with ``watch=False``, by listing at each
call (for a single reconcile). It writes one thing: a JSON patch of a Volcano Job's scaling
task (``volcano_job.replica_patch``), with the engine's memory in the same patch, followed by
a Kubernetes Event on the Job saying why.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from scheduler_policy.adapters.volcano.counts import RequestCounter, RequestCounts
from scheduler_policy.adapters.volcano.events import EventRecorder
from scheduler_policy.adapters.volcano.informer import Informer
from scheduler_policy.adapters.volcano.read import (
    PodRead,
    ReadProblem,
    podgroup_owner,
    read_node,
    read_pod,
    read_podgroup,
    read_queue,
)
from scheduler_policy.adapters.volcano.write import BATCH, JSON_PATCH, JobWriter, api_message
from scheduler_policy.adapters.volcano_job import (
    GPU_RESOURCE,
    UnreadJob,
    VolcanoJob,
    read_job,
)
from scheduler_policy.vocabulary.errors import (
    PermanentError,
    TemporaryError,
)
from scheduler_policy.vocabulary.protocols import ReplicaChange
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobState,
    NodeState,
    PendingGang,
    PodPlacement,
    QueueState,
)

__all__ = ["DEFAULT_MAX_CONCURRENT_WRITES", "JSON_PATCH", "VolcanoClient", "from_kubeconfig"]

logger = logging.getLogger(__name__)

SCHEDULING = ("scheduling.volcano.sh", "v1beta1")

DEFAULT_MAX_CONCURRENT_WRITES = 8
"""Job patches in flight at once (``apply_changes`` runs that many threads). A write waits mostly
on the API server (admission, etcd), so a few in flight overlap those waits: the first
reconcile after a start stores 1,000 jobs' memories, one after another 20 s on 2 cores
(BENCHMARKS.md). 8 writers and the 5 watches stay within the connections the ``kubernetes``
client keeps by default (``connection_pool_maxsize``: 5 per core, 10 on 2 cores): more idle
connections at once than that are closed, and the next round opens them again."""


@dataclass(frozen=True, slots=True)
class _PodGroupRead:
    """A pending PodGroup as kept: the gang, and the Volcano Job that owns it (if any)."""

    owner: JobKey | None
    gang: PendingGang


def from_kubeconfig(path: str | None) -> k8s.ApiClient:
    """An API client from a kubeconfig file, or from the pod's service account.

    Args:
        path: the kubeconfig file; None for the in-cluster configuration (the service
            account's token and the ``KUBERNETES_SERVICE_*`` environment).

    Returns:
        The client, for ``VolcanoClient``.

    Raises:
        PermanentError: the configuration cannot be loaded; the message names the file.
    """
    try:
        if path is None:
            configuration = k8s.Configuration()
            # The kubernetes package's config loaders are untyped.
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return k8s.ApiClient(configuration)
        api: k8s.ApiClient = k8s_config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        return api
    except (ConfigException, OSError, TypeError, ValueError) as e:
        where = "the in-cluster configuration" if path is None else f"kubeconfig {path}"
        raise PermanentError(f"{where}: cannot be loaded: {e}") from e


def _log_problem(problem: ReadProblem | UnreadJob) -> None:
    logger.warning("skipping %s: %s", problem.source, problem.problem)


class VolcanoClient:
    """Volcano's Jobs, Queues and PodGroups, and the pods and nodes under them, for the engine.

    Reads come from watches (``start``, then ``wait_synced``; until then every ``list_*``
    raises ``TemporaryError`` rather than answer from an empty cache) or, with
    ``watch=False``, from a list at each call. A write puts the Job it returns into the cache,
    so the next ``list_jobs`` reads it. See the package docstring for the RBAC it needs.

    Args:
        api_client: a ``kubernetes.client.ApiClient`` (``from_kubeconfig``).
        namespace: the namespace whose Jobs, PodGroups and pods are read; None for all.
            Queues and nodes are cluster-wide either way. With a namespace, a node's free GPUs
            count the pods of that namespace only.
        node_selector: a label selector (``gpu=true``) for the nodes to read; None for all.
        watch: keep caches by watching (for the engine's loop); False lists at each call
            (for a single reconcile, ``--once``).
        events: create a Kubernetes Event on the Job after each change of replicas.
        component: the Events' source component.
        max_conflict_retries: times a write is rebuilt and sent again after the Job changed
            under it (while it still has the replicas the change was made from).
        watch_timeout_s: how long the server keeps one watch open before it is renewed.
        max_concurrent_writes: Job patches ``apply_changes`` sends at once (its threads call
            ``apply``, which is thread-safe); 1 writes one after another.

    Raises:
        ValueError: ``max_conflict_retries`` is negative, or ``max_concurrent_writes`` < 1.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        namespace: str | None = None,
        node_selector: str | None = None,
        watch: bool = True,
        events: bool = True,
        component: str = "tide-engine",
        max_conflict_retries: int = 3,
        watch_timeout_s: float = 300.0,
        max_concurrent_writes: int = DEFAULT_MAX_CONCURRENT_WRITES,
    ) -> None:
        if max_conflict_retries < 0:
            raise ValueError(f"max_conflict_retries must be >= 0, got {max_conflict_retries}")
        if isinstance(max_concurrent_writes, bool) or not (
            isinstance(max_concurrent_writes, int) and max_concurrent_writes >= 1
        ):
            raise ValueError(
                f"max_concurrent_writes must be an integer >= 1, got {max_concurrent_writes!r}"
            )
        self._max_concurrent_writes = max_concurrent_writes
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._namespace = namespace
        self._watching = watch
        self._counter = RequestCounter()
        self._recorder = (
            EventRecorder(self._core, component=component, counter=self._counter,
                          background=watch)
            if events
            else None
        )  # fmt: skip
        self._max_retries = max_conflict_retries
        self._callbacks: list[Callable[[str], None]] = []
        self._callbacks_lock = threading.Lock()
        self._started = False

        def scoped(group_version: tuple[str, str], plural: str) -> tuple[Any, tuple[str, ...]]:
            if namespace is None:
                return self._custom.list_cluster_custom_object, (*group_version, plural)
            return self._custom.list_namespaced_custom_object, (*group_version, namespace, plural)

        common = {"counter": self._counter, "watch_timeout_s": watch_timeout_s}
        call, args = scoped(BATCH, "jobs")
        self._jobs: Informer[VolcanoJob] = Informer(
            kind="Job", call=call, args=args, read=self._read_job, on_event=self._job_changed,
            key=lambda job: job.state.key, **common,  # type: ignore[arg-type]
        )  # fmt: skip
        self._queues: Informer[QueueState] = Informer(
            kind="Queue", call=self._custom.list_cluster_custom_object,
            args=(*SCHEDULING, "queues"), read=self._read_queue, **common,  # type: ignore[arg-type]
        )  # fmt: skip
        call, args = scoped(SCHEDULING, "podgroups")
        self._podgroups: Informer[_PodGroupRead] = Informer(
            kind="PodGroup", call=call, args=args, read=self._read_podgroup,
            on_event=self._podgroup_changed, **common,  # type: ignore[arg-type]
        )  # fmt: skip
        pods_call = (
            self._core.list_pod_for_all_namespaces
            if namespace is None
            else self._core.list_namespaced_pod
        )
        self._pods: Informer[PodRead] = Informer(
            kind="Pod", call=pods_call, args=() if namespace is None else (namespace,),
            read=self._read_pod,
            # A finished pod holds no GPUs; the selector keeps them out of the cache.
            list_kwargs={"field_selector": "status.phase!=Succeeded,status.phase!=Failed"},
            **common,  # type: ignore[arg-type]
        )  # fmt: skip
        self._nodes: Informer[Mapping[str, Any]] = Informer(
            kind="Node", call=self._core.list_node, args=(), read=self._slim_node,
            list_kwargs={} if node_selector is None else {"label_selector": node_selector},
            **common,  # type: ignore[arg-type]
        )  # fmt: skip
        self._all = (self._jobs, self._queues, self._podgroups, self._pods, self._nodes)
        self._writer = JobWriter(
            self._custom, jobs=self._jobs, watching=watch, namespace=namespace,
            max_retries=max_conflict_retries, counter=self._counter, recorder=self._recorder,
        )  # fmt: skip

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watches (one daemon thread per kind). No-op with ``watch=False``."""
        if not self._watching or self._started:
            return
        self._started = True
        for informer in self._all:
            informer.start()

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait until every kind has been listed once; whether they have, within ``timeout_s``."""
        if not self._watching:
            return True
        end = time.monotonic() + timeout_s
        return all(i.wait_synced(max(0.0, end - time.monotonic())) for i in self._all)

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop the watches and join their threads, within ``timeout_s`` in all.

        Returns:
            Whether every thread ended.
        """
        end = time.monotonic() + timeout_s
        ended = [i.stop(max(0.0, end - time.monotonic())) for i in self._all]
        if self._recorder is not None:
            ended.append(self._recorder.stop(max(0.1, end - time.monotonic())))
        return all(ended)

    @property
    def running_threads(self) -> int:
        """Threads of this client alive now (the watches, and the Events' sender)."""
        events = self._recorder is not None and self._recorder.running
        return sum(1 for i in self._all if i.running) + int(events)

    def on_change(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(why)`` when a PodGroup becomes pending or an elastic Job appears.

        It is called from a watch thread: keep it short (set an event the loop waits on).
        """
        with self._callbacks_lock:
            self._callbacks.append(callback)

    @property
    def max_concurrent_writes(self) -> int:
        """Job patches ``apply_changes`` may send at once (``apply`` is thread-safe)."""
        return self._max_concurrent_writes

    def requests(self) -> RequestCounts:
        """The requests made so far, by kind."""
        return self._counter.snapshot()

    # -- readers for the caches ---------------------------------------------------------------

    @staticmethod
    def _read_job(obj: Mapping[str, Any]) -> VolcanoJob | None:
        read = read_job(obj)
        if isinstance(read, UnreadJob):
            _log_problem(read)
            return None
        if read.state.read_problems and read.state.elastic:
            logger.warning(
                "Job %s: %s", read.state.key, "; ".join(read.state.read_problems)
            )  # it is still listed: triage holds it with InvalidJobSpec
        return read

    @staticmethod
    def _read_queue(obj: Mapping[str, Any]) -> QueueState | None:
        read = read_queue(obj)
        if isinstance(read, ReadProblem):
            _log_problem(read)
            return None
        return read

    @staticmethod
    def _read_podgroup(obj: Mapping[str, Any]) -> _PodGroupRead | None:
        read = read_podgroup(obj, elastic_jobs=())
        if isinstance(read, ReadProblem):
            _log_problem(read)
            return None
        if read is None:
            return None
        return _PodGroupRead(owner=podgroup_owner(obj), gang=read)

    @staticmethod
    def _read_pod(obj: Mapping[str, Any]) -> PodRead | None:
        read = read_pod(obj)
        if isinstance(read, ReadProblem):
            _log_problem(read)
            return None
        if read.gpus == 0 and read.job is None:
            return None  # neither a job's pod nor a holder of GPUs: nothing to keep
        return read

    @staticmethod
    def _slim_node(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """What ``read_node`` reads of a node (a node object is large: its images)."""
        metadata = obj.get("metadata")
        status = obj.get("status")
        spec = obj.get("spec")
        allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
        if not isinstance(allocatable, Mapping) or GPU_RESOURCE not in allocatable:
            return None
        return {
            "metadata": {"name": metadata.get("name") if isinstance(metadata, Mapping) else None},
            "spec": {"unschedulable": spec.get("unschedulable")}
            if isinstance(spec, Mapping)
            else {},
            "status": {"allocatable": {GPU_RESOURCE: allocatable[GPU_RESOURCE]}},
        }

    # -- change notices -----------------------------------------------------------------------

    def _fire(self, why: str) -> None:
        with self._callbacks_lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(why)
            except Exception:
                logger.exception("on_change callback failed (%s)", why)

    def _job_changed(self, before: VolcanoJob | None, after: VolcanoJob | None) -> None:
        if (
            after is not None
            and after.state.elastic
            and (before is None or not before.state.elastic)
        ):
            self._fire(f"elastic Job {after.state.key} added")

    def _podgroup_changed(self, before: _PodGroupRead | None, after: _PodGroupRead | None) -> None:
        if after is None or before is not None:
            return
        if after.owner is not None and after.owner in self._elastic_keys():
            return
        self._fire(f"PodGroup {after.gang.key} is {after.gang.phase}")

    # -- reading ------------------------------------------------------------------------------

    def _fresh(self, *informers: Informer[Any]) -> None:
        """Make the caches current: list them now without watches, else check they synced.

        Raises:
            TemporaryError: the list failed, or the watches have not listed yet.
        """
        for informer in informers:
            if self._watching:
                if not informer.synced:
                    raise TemporaryError(
                        f"the {informer.kind} cache has not synced yet (call start() and "
                        "wait_synced() first)"
                    )
                continue
            try:
                informer.relist()
            except ApiException as e:
                raise TemporaryError(
                    f"listing {informer.kind}s failed: HTTP {e.status}: {api_message(e)}"
                ) from e
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise TemporaryError(f"listing {informer.kind}s failed: {e}") from e

    def _elastic_keys(self) -> set[JobKey]:
        return {job.state.key for job in self._jobs.items() if job.state.elastic}

    def _gangs(self) -> list[PendingGang]:
        elastic = self._elastic_keys()
        gangs = [
            read.gang
            for read in self._podgroups.items()
            if read.owner is None or read.owner not in elastic
        ]
        gangs.sort(key=lambda g: (math.inf if g.since_s is None else g.since_s, g.key))
        return gangs

    def list_queues(self) -> Sequence[QueueState]:
        """See base class. Each queue's ``pending_nonelastic_gpus`` sums its pending gangs."""
        self._fresh(self._queues, self._podgroups, self._jobs)
        pending: dict[str, float] = defaultdict(float)
        for gang in self._gangs():
            pending[gang.queue] += gang.gpus
        queues = [
            dataclasses.replace(q, pending_nonelastic_gpus=pending[q.name]) if q.name in pending
            else q
            for q in self._queues.items()
        ]  # fmt: skip
        return sorted(queues, key=lambda q: q.name)

    def list_jobs(self) -> Sequence[JobState]:
        """See base class. ``pods`` and ``scheduled_replicas`` come from the pods cache."""
        self._fresh(self._jobs, self._pods)
        placed: dict[tuple[JobKey, str], list[PodPlacement]] = defaultdict(list)
        for pod in self._pods.items():
            placement = pod.placement
            if placement is not None and pod.job is not None and pod.task is not None:
                placed[(pod.job, pod.task)].append(placement)
        jobs = []
        for read in self._jobs.items():
            state = read.state
            pods = sorted(placed.get((state.key, state.task), ()), key=lambda p: p.index)
            jobs.append(
                dataclasses.replace(
                    state,
                    pods=tuple(pods),
                    scheduled_replicas=sum(1 for p in pods if p.node is not None),
                )
            )
        return sorted(jobs, key=lambda j: j.key)

    def list_nodes(self) -> Sequence[NodeState]:
        """See base class. Free GPUs: allocatable minus the GPUs of the pods bound there."""
        self._fresh(self._nodes, self._pods)
        bound: dict[str, float] = defaultdict(float)
        for pod in self._pods.items():
            if pod.holds_gpus and pod.node is not None:
                bound[pod.node] += pod.gpus
        nodes = []
        for slim in self._nodes.items():
            name = slim["metadata"]["name"]
            read = read_node(slim, bound.get(name, 0.0) if isinstance(name, str) else 0.0)
            if isinstance(read, ReadProblem):
                _log_problem(read)
            elif read is not None:
                nodes.append(read)
        return sorted(nodes, key=lambda n: n.name)

    def list_pending_gangs(self) -> Sequence[PendingGang]:
        """See base class. PodGroups of elastic Jobs are left out; oldest first."""
        self._fresh(self._podgroups, self._jobs)
        return self._gangs()

    def releasing_gpus(self) -> float:
        """GPUs held by terminating pods bound to a node: they come free shortly."""
        self._fresh(self._pods)
        return sum(p.gpus for p in self._pods.items() if p.terminating and p.holds_gpus)

    def apply(self, change: ReplicaChange) -> None:
        """See base class, and ``write.JobWriter.apply`` for what is sent and raised.

        Thread-safe: ``apply_changes`` calls it from ``max_concurrent_writes`` threads at once
        (the caches and counters it updates take their locks; the API client's connection pool
        is shared by its threads).
        """
        self._writer.apply(change)

    def flush_events(self, timeout_s: float) -> bool:
        """Wait until the Events recorded so far are sent; whether they are, within the bound."""
        return self._recorder is None or self._recorder.flush(timeout_s)
