"""The simulated cluster's state and physics: time advance, progress, restarts, lost work.

``ClusterCore`` owns the jobs and nodes and does what the world does between decisions: jobs make
progress at their profile's rate, a membership change costs a restart, an abrupt kill loses the
work since the last checkpoint, and a graceful stop holds the departing pods' GPUs for the job's
save-and-exit time (they are *releasing*: no pod is placed on them until they free). The
scheduler (``volcano``) and the protocol surface (``cluster.SimulatedCluster``) build on it.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from dataclasses import dataclass

from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations.cluster_config import ClusterSpec
from simulations.state import Nodes, SimJob, Status
from simulations.workload import Workload

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """The cluster at one time, for the utilization plot.

    Attributes:
        time_s: simulated time.
        allocated_gpus: GPUs held by pods.
        effective_gpus: GPUs' worth of useful progress (each job's speedup over one replica times
            its GPUs per replica; zero while restarting).
    """

    time_s: float
    allocated_gpus: float
    effective_gpus: float


class ClusterCore:
    """Jobs, nodes and simulated time (mutable; internal to the simulator)."""

    def __init__(self, *, spec: ClusterSpec, workload: Workload) -> None:
        self.spec = spec
        self.now_s = 0.0
        self.nodes = Nodes(
            count=spec.nodes, gpus_per_node=spec.gpus_per_node, order=spec.node_order
        )
        self.jobs: dict[JobKey, SimJob] = {}
        self.order: list[SimJob] = []
        self.running: dict[JobKey, SimJob] = {}
        self.waiting_by_queue: dict[QueueName, list[SimJob]] = {q.name: [] for q in spec.queues}
        self.done_count = 0
        self.alloc_gpu_s = 0.0
        self.effective_gpu_s = 0.0
        self.idle_waiting_gpu_s = 0.0
        self.blocked_queues: frozenset[QueueName] = frozenset()
        self.last_deserved: dict[QueueName, float] = {}
        self.blocked_queue_s: dict[QueueName, float] = {q.name: 0.0 for q in spec.queues}
        self.timeline: list[TimelinePoint] = []
        # (completion time, sequence, job version, job): a running job's completion time stays
        # the same until the job changes, so it is pushed at each change; an entry whose version
        # is no longer the job's is stale and skipped. Scanning every running job at every event
        # for the next completion was a fifth of a long replay's time.
        self._completions: list[tuple[float, int, int, SimJob]] = []
        self._pushed = 0
        # Pods that stopped gracefully and are still saving and exiting: (when they free, seq,
        # node, GPUs). Their GPUs are not free on their node until then.
        self._held: list[tuple[float, int, int, int]] = []
        self.held_gpus = 0
        # What Volcano's reclaim asked tide's extender in the last session (``run_session``):
        # the pods withheld, and when the earliest of their grace windows ends.
        self.withheld_pods = 0
        self.withheld_until_s: float | None = None
        for job_spec in workload.jobs:
            queue = job_spec.queue or spec.default_queue(elastic=job_spec.elastic)
            if spec.queue(queue) is None:
                known = ", ".join(q.name for q in spec.queues)
                raise ValueError(
                    f"{job_spec.source or job_spec.key}: queue {queue!r} is not in cluster "
                    f"{spec.name!r} (queues: {known})"
                )
            if job_spec.key in self.jobs:
                raise ValueError(f"{job_spec.source or job_spec.key}: duplicate job {job_spec.key}")
            cost = job_spec.restart_cost_s
            save = job_spec.save_exit_s
            job = SimJob(
                job_spec,
                queue=queue,
                restart_cost_s=spec.restart_cost_s if cost is None else cost,
                save_exit_s=spec.save_exit_s if save is None else save,
            )
            self.jobs[job.key] = job
            self.order.append(job)
        self.order.sort(key=lambda j: (j.spec.submit_s, j.key))

    # --- time -------------------------------------------------------------------------------

    def advance(self, to_s: float) -> None:
        """Let simulated time run to ``to_s``: progress, checkpoints and accounting.

        The caller never advances past a job's completion (see ``next_completion``).

        Args:
            to_s: the new time; not before the current one.
        """
        dt = to_s - self.now_s
        if dt <= 0:
            return
        t0 = self.now_s
        for job in self.running.values():
            gpus = job.gpus
            self.alloc_gpu_s += gpus * dt
            job.attained_gpu_s += gpus * dt
            restart_until = job.restart_until_s
            if restart_until > t0:
                stalled = min(to_s, restart_until) - t0
                if not job.startup:
                    job.restart_gpu_s += gpus * stalled
                useful = to_s - restart_until
                if useful <= 0:
                    continue
            else:
                useful = dt
            job.done_units += job.rate * useful
            job.unckpt_s = (job.unckpt_s + useful) % job.spec.checkpoint_interval_s
            self.effective_gpu_s += job.effective_gpus * useful
        self.alloc_gpu_s += self.held_gpus * dt  # held while the workers save and exit
        for queue in self.blocked_queues:
            self.blocked_queue_s[queue] += dt
        free = self.nodes.total_free  # pods change only at events: constant over dt
        if free and any(self.waiting_by_queue.values()):
            self.idle_waiting_gpu_s += free * dt
        self.now_s = to_s

    def _changed(self, job: SimJob) -> None:
        """The job's pods, restart or work changed: recompute it and its completion."""
        job.pods_changed()
        job.version += 1
        completion = job.next_stop_s(self.now_s)
        if completion < float("inf"):
            self._pushed += 1
            heapq.heappush(self._completions, (completion, self._pushed, job.version, job))

    def _live(self, entry: tuple[float, int, int, SimJob]) -> bool:
        _, _, version, job = entry
        return version == job.version and job.status is Status.RUNNING

    def next_completion(self) -> tuple[float, SimJob | None]:
        """The earliest completion among running jobs, if nothing changes before it."""
        heap = self._completions
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        if not heap:
            return float("inf"), None
        return heap[0][0], heap[0][3]

    def finish_due(self) -> list[SimJob]:
        """Mark every running job whose work is done as done and release its pods.

        An adaptive job that reached the end of an epoch before its last goes on: its batch is
        chosen again for the new epoch's statistics and its rate recomputed
        (``simulations.adaptive_batch``), and it is not in the list.

        Returns:
            The jobs that finished.
        """
        heap = self._completions
        finished = []
        while heap and heap[0][0] <= self.now_s:
            entry = heapq.heappop(heap)
            if not self._live(entry):
                continue
            job = entry[3]
            if job.batch is not None and job.next_stop_units < job.work_units:
                job.done_units = job.next_stop_units  # exactly at the boundary
                self._changed(job)  # the new epoch: batch, rate and next stop
                continue
            finished.append(job)
        for job in finished:
            job.done_units = job.work_units
            self._release_all(job)
            del self.running[job.key]
            job.status = Status.DONE
            job.end_s = self.now_s
            self.done_count += 1
            logger.debug("t=%.0f job %s done", self.now_s, job.key)
        return finished

    def next_release_s(self) -> float:
        """When the earliest held (releasing) pod frees its GPUs; inf when none is held."""
        return self._held[0][0] if self._held else float("inf")

    def releasing_on_nodes(self) -> list[int]:
        """GPUs of held (releasing) pods on each node, by node index."""
        out = [0] * len(self.nodes.free)
        for _, _, node, gpus in self._held:
            out[node] += gpus
        return out

    def free_released(self) -> bool:
        """Give back the GPUs of every held pod whose save-and-exit time is over.

        Returns:
            True when some GPUs came free.
        """
        held = self._held
        freed = False
        while held and held[0][0] <= self.now_s:
            _, _, node, gpus = heapq.heappop(held)
            self.held_gpus -= gpus
            self.nodes.release(gpus, [node])
            freed = True
        return freed

    def _let_go(self, job: SimJob, nodes: list[int], *, graceful: bool) -> None:
        """The pods of ``job`` on ``nodes`` stop: a graceful stop holds their GPUs for the
        job's save-and-exit time, anything else frees them at once."""
        gpus = job.spec.gpus_per_replica
        if not graceful or job.save_exit_s <= 0 or not nodes:
            self.nodes.release(gpus, nodes)
            return
        free_s = self.now_s + job.save_exit_s
        for node in nodes:
            self._pushed += 1
            heapq.heappush(self._held, (free_s, self._pushed, node, gpus))
            self.held_gpus += gpus

    def submit(self, job: SimJob) -> None:
        """The job arrives: it waits for the enqueue gate."""
        job.status = Status.PENDING
        self.waiting_by_queue[job.queue].append(job)

    def sample_timeline(self) -> None:
        """Record allocated and effective GPUs now."""
        allocated = 0.0
        effective = 0.0
        for job in self.running.values():
            allocated += job.gpus
            if job.restart_until_s <= self.now_s:
                effective += job.spec.gpus_per_replica * job.spec.profile.speedup(len(job.pods))
        self.timeline.append(TimelinePoint(self.now_s, allocated, effective))

    # --- membership changes -------------------------------------------------------------------

    def _save_or_lose(self, job: SimJob, *, graceful: bool) -> None:
        """Before the workers stop: a graceful stop checkpoints, an abrupt one loses work."""
        if graceful or not job.pods:
            job.unckpt_s = 0.0
            return
        if job.restart_until_s > self.now_s:
            return  # still restarting: nothing done since the checkpoint it restarted from
        lost = min(job.done_units, job.rate * job.unckpt_s)
        if lost > 0:
            job.done_units -= lost
            job.killed_units += lost
            job.killed_gpu_s += job.gpus * job.unckpt_s
        job.unckpt_s = 0.0

    def _restart(self, job: SimJob) -> None:
        """The workers restart at the new size: ``restart_cost_s`` without progress."""
        job.restart_until_s = self.now_s + job.restart_cost_s
        job.replica_log.append((self.now_s, len(job.pods)))
        self._changed(job)

    def add_pods(self, job: SimJob, nodes: list[int]) -> None:
        """Placed pods join the job (the gang start or a scale-up): one restart.

        Each new pod takes the lowest task index the job's pods leave free: the next ones at
        the end, or first the gaps a node failure left (Volcano recreates a missing pod under
        its own name and index).

        Args:
            job: the job.
            nodes: the node of each new pod, already reserved.
        """
        if not nodes:
            return
        starting = job.status is not Status.RUNNING
        self._save_or_lose(job, graceful=True)
        _join(job, nodes)
        if not starting and job.replica_log and job.replica_log[-1][0] == self.now_s:
            # More pods in the same session as its last change: still one restart.
            job.replica_log[-1] = (self.now_s, len(job.pods))
            self._changed(job)
            return
        if starting:
            job.status = Status.RUNNING
            self.running[job.key] = job
            if job.first_start_s is None:
                job.first_start_s = self.now_s
            else:
                job.startup = False
                job.rescales += 1
        else:
            job.startup = False
            job.rescales += 1
        self._restart(job)

    def remove_pods(self, job: SimJob, count: int, *, graceful: bool) -> None:
        """Take the job's ``count`` highest-index pods away: one restart, or a requeue below min.

        Args:
            job: the job.
            count: pods to remove.
            graceful: True for tide's checkpoint-first shrink, False for a kill.
        """
        count = min(count, len(job.pods))
        if count > 0:
            self._take(job, range(len(job.pods) - count, len(job.pods)), graceful=graceful)

    def kill_pods(self, job: SimJob, positions: list[int]) -> None:
        """Kill the job's pods at ``positions`` (in ``job.pods``, ascending; not empty):
        abruptly, as Volcano's reclaim evicts them."""
        if positions == list(range(positions[0], len(job.pods))):
            self._take(job, range(positions[0], len(job.pods)), graceful=False)
        else:
            self._take(job, positions, graceful=False)

    def _take(self, job: SimJob, positions: range | list[int], *, graceful: bool) -> None:
        """Remove the job's pods at ``positions`` (in ``job.pods``, ascending; not empty); their
        nodes get their GPUs back. One restart, or a requeue when it falls below its minimum."""
        self._save_or_lose(job, graceful=graceful)
        if not graceful:
            job.kills += 1
        if isinstance(positions, range) and positions.stop == len(job.pods):
            removed = job.pods[positions.start :]  # the highest indices: a shrink or a kill
            del job.pods[positions.start :]
            del job.pod_indices[positions.start :]
        else:
            gone = set(positions)
            removed = [job.pods[i] for i in positions]
            job.pods = [n for i, n in enumerate(job.pods) if i not in gone]
            job.pod_indices = [x for i, x in enumerate(job.pod_indices) if i not in gone]
        self._let_go(job, removed, graceful=graceful)
        if len(job.pods) < job.spec.min_replicas:
            self._release_all(job, graceful=graceful)
            self.running.pop(job.key, None)
            job.status = Status.INQUEUE
            job.replica_log.append((self.now_s, 0))
            self.waiting_by_queue[job.queue].append(job)
            return
        job.startup = False
        job.rescales += 1
        self._restart(job)

    def suspend(self, job: SimJob) -> None:
        """Preempt the whole job gracefully (checkpoint, release, back to the queue)."""
        if job.status is not Status.RUNNING:
            return
        self._save_or_lose(job, graceful=True)
        self._release_all(job, graceful=True)
        self.running.pop(job.key, None)
        job.status = Status.PENDING  # back through the enqueue gate, in priority order
        job.rescales += 1
        job.replica_log.append((self.now_s, 0))
        self.waiting_by_queue[job.queue].append(job)

    def _release_all(self, job: SimJob, *, graceful: bool = False) -> None:
        """Every pod of the job stops (done, suspended, or below its minimum)."""
        self._let_go(job, job.pods, graceful=graceful)
        job.pods = []
        job.pod_indices = []
        self._changed(job)

    def resize(self, job: SimJob, replicas: int) -> None:
        """Set the job's worker replicas; pods of index ``replicas`` and above are removed
        gracefully at once (as Volcano deletes them: the highest indices first).

        New pods are placed by the next scheduling session.

        Args:
            job: the job.
            replicas: the new ``spec.tasks[worker].replicas``.
        """
        job.spec_replicas = replicas
        indices = job.pod_indices
        if indices and indices[-1] >= replicas:
            first = bisect.bisect_left(indices, replicas)
            self._take(job, range(first, len(indices)), graceful=True)

    def fail_node(self, node: int) -> None:
        """A node goes down: every pod on it is killed (abruptly)."""
        if not self.nodes.up[node]:
            return
        for job in list(self.running.values()):
            victims = [i for i, n in enumerate(job.pods) if n == node]
            if victims:
                self._take(job, victims, graceful=False)
        kept = [entry for entry in self._held if entry[2] != node]
        if len(kept) != len(self._held):  # pods saving on the node die with it
            self.held_gpus = sum(entry[3] for entry in kept)
            heapq.heapify(kept)
            self._held = kept
        self.nodes.set_down(node)

    def repair_node(self, node: int) -> None:
        """A failed node comes back, empty (a node that is up is left as it is)."""
        if not self.nodes.up[node]:
            self.nodes.set_up(node)


def _join(job: SimJob, nodes: list[int]) -> None:
    """Add pods on ``nodes`` to ``job``, each at the lowest task index its pods leave free."""
    indices = job.pod_indices
    count = len(indices)
    if not count or indices[-1] == count - 1:  # no gaps: the new pods go at the end
        job.pods.extend(nodes)
        indices.extend(range(count, count + len(nodes)))
        return
    held = set(indices)
    new: list[int] = []
    candidate = 0
    while len(new) < len(nodes):
        if candidate not in held:
            new.append(candidate)
        candidate += 1
    merged = sorted(zip(indices + new, job.pods + nodes, strict=True))
    job.pod_indices = [i for i, _ in merged]
    job.pods = [n for _, n in merged]
