"""The simulator's mutable inner state: jobs as they run and the nodes' free GPUs.

These objects never leave the simulator; what crosses its boundary is built from them as the
engine's frozen dataclasses (``JobState``, ``QueueState``) or the report's.
"""

from __future__ import annotations

import enum

from scheduler_policy.vocabulary.state import JobKey, QueueName, ThroughputPoint
from simulations.adaptive_batch import BatchRun
from simulations.cluster_config import NodeOrder
from simulations.workload import WorkloadJob


class Status(enum.Enum):
    """Where a job is in its life in the simulated cluster.

    Transitions (the only ones the simulator makes):
        WAITING -> PENDING: the job is submitted.
        PENDING -> INQUEUE: the enqueue gate admits it.
        INQUEUE -> RUNNING: its gang minimum is placed.
        RUNNING -> INQUEUE: a node failure took it below its minimum.
        RUNNING -> PENDING: it was suspended (preempted whole) by a preemptive baseline.
        RUNNING -> DONE: all its work is done.
    """

    WAITING = "Waiting"
    PENDING = "Pending"
    INQUEUE = "Inqueue"
    RUNNING = "Running"
    DONE = "Done"


class SimJob:
    """One job's runtime state (mutable; internal to the simulator).

    Attributes:
        annotations: the Job's annotations; the engine's memory is ``tide.io/memory``.
        pods: the node of each placed pod of its scaling task, in task-index order.
        pod_indices: the task index of each of ``pods`` (ascending; as Volcano's
            ``volcano.sh/task-index``): a pod keeps its index while it runs, a scale-down takes
            the highest, and a new pod takes the lowest free one (a node failure's victims
            leave gaps that their replacements fill, as Volcano recreates a missing pod under
            its own name).

    Attributes (derived from the placed pods, read at every event for every running job, so
    stored; ``pods_changed`` keeps them current):
        gpus: GPUs its placed pods hold.
        rate: work units per second at its placed size (ignoring a restart in progress).
        effective_gpus: GPUs' worth of useful progress while not restarting (its speedup over
            one replica times its GPUs per replica).
        version: bumped by ``ClusterCore`` at every change that moves its completion time.
        batch: the batch it trains at, when it adapts its batch (``WorkloadJob.adaptive``);
            None at its submitted batch.
        work_units: its whole work: progress for an adaptive job (the end of its last epoch),
            else ``spec.work_units``.
        samples_per_s: training samples per second at its placed size (what it exports as
            throughput).
    """

    __slots__ = (
        "annotations",
        "attained_gpu_s",
        "batch",
        "done_units",
        "effective_gpus",
        "end_s",
        "first_start_s",
        "gpus",
        "key",
        "killed_gpu_s",
        "killed_units",
        "kills",
        "pod_indices",
        "pods",
        "points",
        "queue",
        "rate",
        "replica_log",
        "rescales",
        "restart_cost_s",
        "restart_gpu_s",
        "restart_until_s",
        "samples_per_s",
        "save_exit_s",
        "spec",
        "spec_replicas",
        "startup",
        "status",
        "unckpt_s",
        "version",
        "work_units",
    )

    def __init__(
        self,
        spec: WorkloadJob,
        *,
        queue: QueueName,
        restart_cost_s: float,
        save_exit_s: float = 0.0,
    ) -> None:
        self.spec = spec
        self.key: JobKey = spec.key
        self.queue = queue
        self.restart_cost_s = restart_cost_s
        # Seconds its departing workers hold their GPUs after a graceful stop (save and exit).
        self.save_exit_s = save_exit_s
        self.status = Status.WAITING
        self.spec_replicas = spec.requested_replicas
        self.pods: list[int] = []
        self.pod_indices: list[int] = []
        self.done_units = 0.0
        self.unckpt_s = 0.0
        self.restart_until_s = 0.0
        self.first_start_s: float | None = None
        self.end_s: float | None = None
        self.startup = True
        # As on a Volcano Job: the engine's memory is the tide.io/memory annotation, written
        # and read through scheduler_policy.adapters.memory_codec, as production does.
        self.annotations: dict[str, str] = {}
        self.points: list[ThroughputPoint] = []
        self.rescales = 0
        self.kills = 0
        self.restart_gpu_s = 0.0
        self.killed_units = 0.0
        self.killed_gpu_s = 0.0
        self.attained_gpu_s = 0.0
        self.replica_log: list[tuple[float, int]] = []
        self.gpus = 0
        self.rate = 0.0
        self.effective_gpus = 0.0
        self.version = 0
        self.samples_per_s = 0.0
        adaptive = spec.adaptive
        self.batch = None if adaptive is None else BatchRun(adaptive)
        self.work_units = spec.work_units if adaptive is None else adaptive.planned_progress

    def pods_changed(self) -> None:
        """Recompute what derives from the placed pods; call after every change to ``pods``
        (and, for an adaptive job, at each epoch boundary: the batch is chosen again)."""
        n = len(self.pods)
        spec = self.spec
        self.gpus = n * spec.gpus_per_replica
        batch = self.batch
        if batch is None:
            self.rate = spec.profile.rate(n)
            self.effective_gpus = spec.gpus_per_replica * self.rate / spec.profile.rate(1)
            self.samples_per_s = self.rate * spec.profile.samples_per_unit
            return
        if n == 0:
            self.rate = self.samples_per_s = self.effective_gpus = 0.0
            return
        batch.follow(replicas=n, progress=self.done_units)
        self.rate = batch.progress_rate()
        self.samples_per_s = batch.samples_per_s()
        # Utilization in GPUs' worth of the submitted batch's speedup (the report's figure).
        self.effective_gpus = spec.gpus_per_replica * spec.profile.speedup(n)

    @property
    def next_stop_units(self) -> float:
        """Done work at which the job next stops: its end, or an adaptive job's next epoch end."""
        batch = self.batch
        if batch is None:
            return self.work_units
        return batch.app.epoch_ends[batch.epoch]

    @property
    def remaining_units(self) -> float:
        """Work left."""
        return max(0.0, self.work_units - self.done_units)

    @property
    def wanted_pods(self) -> int:
        """Pods its spec asks for that are not placed."""
        return max(0, self.spec_replicas - len(self.pods))

    def completion_s(self, now_s: float) -> float:
        """When it will finish at its current size, if nothing changes; inf when not running."""
        rate = self.rate
        if self.status is not Status.RUNNING or rate <= 0:
            return float("inf")
        return max(now_s, self.restart_until_s) + self.remaining_units / rate

    def next_stop_s(self, now_s: float) -> float:
        """When it next stops at its current size: its completion, or an adaptive job's next
        epoch boundary (where its rate changes); inf when not running."""
        if self.batch is None:
            return self.completion_s(now_s)
        rate = self.rate
        if self.status is not Status.RUNNING or rate <= 0:
            return float("inf")
        left = max(0.0, self.next_stop_units - self.done_units)
        return max(now_s, self.restart_until_s) + left / rate


class Nodes:
    """Free GPUs per node, which nodes are up, and where the scheduler puts a pod.

    Attributes:
        order: how a pod's node is chosen (``NodeOrder``).
        names: each node's name (``node-0``, ``node-1``, ...), as the engine sees it.
        changes: bumped at every change of a node's free GPUs or health (a view built from
            the nodes is current while it is unchanged).
    """

    __slots__ = (
        "_total_free",
        "_up_count",
        "changes",
        "free",
        "gpus_per_node",
        "names",
        "order",
        "up",
    )

    def __init__(
        self, *, count: int, gpus_per_node: int, order: NodeOrder = NodeOrder.SPREAD
    ) -> None:
        self.gpus_per_node = gpus_per_node
        self.order = order
        self.free = [gpus_per_node] * count
        self.up = [True] * count
        self.names = tuple(f"node-{i}" for i in range(count))
        self.changes = 0
        # Kept as the lists change (through the methods below only): summing them at every
        # event was a quarter of a long simulation's time.
        self._total_free = gpus_per_node * count
        self._up_count = count

    @property
    def total_free(self) -> int:
        """Free GPUs on nodes that are up."""
        return self._total_free

    @property
    def healthy_gpus(self) -> int:
        """GPUs on nodes that are up."""
        return self.gpus_per_node * self._up_count

    def set_down(self, node: int) -> None:
        """The node fails: its GPUs leave the cluster (its pods must be released first)."""
        if self.up[node]:
            self._total_free -= self.free[node]
            self._up_count -= 1
        self.up[node] = False
        self.free[node] = self.gpus_per_node
        self.changes += 1

    def set_up(self, node: int) -> None:
        """The node comes back, empty."""
        if self.up[node]:
            self._total_free -= self.free[node]
        else:
            self._up_count += 1
        self.up[node] = True
        self.free[node] = self.gpus_per_node
        self._total_free += self.gpus_per_node
        self.changes += 1

    def place(self, gpus: int, count: int) -> list[int] | None:
        """Reserve ``count`` pods of ``gpus`` each, all or none, one after another by ``order``.

        ``SPREAD`` (Volcano's default ``nodeorder``, least requested): each pod to the node
        with the most free GPUs that fits it. ``BINPACK`` (the ``binpack`` plugin): each pod to
        the fullest node that fits it. A tie goes to the first node.

        Args:
            gpus: GPUs per pod.
            count: number of pods.

        Returns:
            The node of each pod, in order, or None (and nothing reserved) if they do not all
            fit.
        """
        free = self.free
        up = self.up
        spread = self.order is NodeOrder.SPREAD
        chosen: list[int] = []
        for _ in range(count):
            best = -1
            best_free = 0
            for i, left in enumerate(free):
                if (
                    left >= gpus
                    and up[i]
                    and (best < 0 or (left > best_free if spread else left < best_free))
                ):
                    best = i
                    best_free = left
            if best < 0:
                self.release(gpus, chosen)
                return None
            free[best] -= gpus
            self._total_free -= gpus
            chosen.append(best)
        self.changes += 1
        return chosen

    def release(self, gpus: int, nodes: list[int]) -> None:
        """Give back pods of ``gpus`` each on ``nodes``."""
        for node in nodes:
            self.free[node] += gpus
            if self.up[node]:
                self._total_free += gpus
        if nodes:
            self.changes += 1
