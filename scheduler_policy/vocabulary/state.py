"""The engine's vocabulary: queues, jobs, observations and decisions.

Everything here is a frozen dataclass with units in its field names. Adapters (the Volcano client,
the Prometheus source, the simulator) build these; the pure core only reads them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NamedTuple, NewType, Protocol

JobKey = NewType("JobKey", str)
"""A job's identity, ``namespace/name``."""

QueueName = NewType("QueueName", str)
"""A Volcano Queue's name (queues are cluster-scoped)."""

GPU_EPSILON = 1e-9
"""Slack for comparing float sums of GPUs (replicas may ask for fractions of one)."""


class JobPhase(enum.Enum):
    """The Volcano Job phases the engine distinguishes (``status.state.phase``)."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETED = "Completed"
    FAILED = "Failed"
    TERMINATED = "Terminated"

    @property
    def finished(self) -> bool:
        return self in (JobPhase.COMPLETED, JobPhase.FAILED, JobPhase.TERMINATED)


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """One measurement of a job's training throughput.

    Attributes:
        time_s: when it was measured, seconds since the epoch.
        replicas: how many workers the job ran with.
        samples_per_s: training samples processed per second, over all workers.
        nodes: how many nodes the workers spanned; None where unknown.
    """

    time_s: float
    replicas: int
    samples_per_s: float
    nodes: int | None = None


@dataclass(frozen=True, slots=True)
class BatchBounds:
    """The bounds of a job that lets tide choose its batch (``tide.io/adaptive-batch: "true"``).

    Attributes:
        initial_batch_size: global batch the learning rate was tuned for, and the smallest.
        max_batch_size: largest global batch.
        local_batch_min: smallest micro batch of one worker.
        local_batch_max: largest micro batch of one worker.
        accumulation: whether a step may take several micro batches per worker.
    """

    initial_batch_size: int
    max_batch_size: int
    local_batch_min: int = 1
    local_batch_max: int = 1
    accumulation: bool = False


@dataclass(frozen=True, slots=True)
class StepTimes:
    """An adaptive-batch job's measured step at one shape (the worker's ``AdaptiveMetrics``).

    Means over the metrics source's window of ``tide_worker_optim_step_seconds``,
    ``tide_worker_accumulation_step_seconds`` and ``tide_worker_sync_seconds`` at one
    ``(nodes, replicas, local_batch)``.

    Attributes:
        nodes: nodes (pods) the workers spanned.
        replicas: workers.
        local_batch_size: samples per micro batch of one worker.
        optim_step_s: a step's synchronising micro batch and optimizer update.
        accumulation_step_s: one accumulation micro batch (no all-reduce); None when the job
            took no accumulation steps at this shape.
        sync_s: the step's gradient all-reduce; None when not measured.
    """

    nodes: int
    replicas: int
    local_batch_size: int
    optim_step_s: float
    accumulation_step_s: float | None = None
    sync_s: float | None = None


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """What an adaptive-batch job's workers report of their training (exported apart, never
    multiplied: the engine fits throughput and efficiency each on its own).

    Attributes:
        batch_size: the current global batch (samples per optimizer step).
        grad_sqr: smoothed squared norm of the true gradient; None before the first estimate.
        grad_var: smoothed gradient variance at the initial batch; None before the first
            estimate.
        progress: scale-invariant iterations done (steps at the initial batch the run's steps
            are worth); None when not reported.
        planned_progress: scale-invariant iterations of the whole run; None when the job
            declares no plan.
        step_times: measured steps, one per shape the job ran at recently.
    """

    batch_size: int
    grad_sqr: float | None = None
    grad_var: float | None = None
    progress: float | None = None
    planned_progress: float | None = None
    step_times: tuple[StepTimes, ...] = ()


@dataclass(frozen=True, slots=True)
class DemandPoint:
    """GPUs a queue's non-elastic work requested (running plus pending) at one time."""

    time_s: float
    gpus: float


class Recommendation(NamedTuple):
    """A target the allocator proposed for a job at one time, read by the stabilization windows.

    A NamedTuple rather than a frozen dataclass: every job gains one per reconcile, and a tuple
    is built and compared several times faster, which matters at 10,000 jobs.
    """

    time_s: float
    replicas: int


@dataclass(frozen=True, slots=True)
class QueueState:
    """A Volcano Queue as the engine sees it.

    Attributes:
        name: the queue's name.
        capability_gpus: ``spec.capability`` GPUs, the hard ceiling; None when unset (no ceiling).
        deserved_gpus: the queue's deserved share; None when unset (then capability bounds it).
            Volcano's proportion plugin caps it at what the queue requests.
        guarantee_gpus: GPUs reserved for the queue (``spec.guarantee``).
        allocated_gpus: GPUs the queue's pods hold now.
        pending_nonelastic_gpus: GPUs requested by the queue's pending non-elastic work.
        demand_history: past GPU demand of the queue's non-elastic work, oldest first.
        weight: ``spec.weight``, the queue's part of the cluster under the proportion plugin.
        request_gpus: GPUs the queue's jobs request in all, running and waiting, as Volcano's
            scheduler counts them; None when not known.
    """

    name: QueueName
    capability_gpus: float | None
    deserved_gpus: float | None
    guarantee_gpus: float
    allocated_gpus: float
    pending_nonelastic_gpus: float
    demand_history: tuple[DemandPoint, ...] = ()
    weight: float = 1.0
    request_gpus: float | None = None


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node with GPUs, as the engine sees it.

    Attributes:
        name: the node's name.
        allocatable_gpus: ``status.allocatable`` GPUs.
        free_gpus: allocatable GPUs that no pod bound to the node requests.
    """

    name: str
    allocatable_gpus: float
    free_gpus: float


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """One pod of a job's scaling task: its task index and where it runs.

    Attributes:
        index: the pod's task index (``volcano.sh/task-index``); Volcano deletes the highest
            indices first on a scale-down.
        node: the node it is bound to; None while it waits for GPUs.
        gpus: GPUs it requests.
    """

    index: int
    node: str | None
    gpus: float


@dataclass(frozen=True, slots=True)
class PendingGang:
    """A PodGroup that waits for GPUs (phase ``Pending`` or ``Inqueue``): demand to serve.

    Attributes:
        key: ``namespace/name`` of the PodGroup.
        queue: the queue it is submitted to.
        min_member: pods that must start together (``spec.minMember``).
        gpus: GPUs the gang needs to start (``spec.minResources``).
        phase: Volcano's PodGroup phase, ``Pending`` or ``Inqueue``.
        since_s: when it was created, seconds since the epoch; None when unknown.
    """

    key: str
    queue: QueueName
    min_member: int
    gpus: float
    phase: str = "Pending"
    since_s: float | None = None

    @property
    def gpus_per_pod(self) -> float:
        """GPUs each of its pods asks, taken as even over ``min_member``."""
        return self.gpus / self.min_member if self.min_member > 0 else self.gpus


@dataclass(frozen=True, slots=True)
class JobState:
    """A Volcano Job as the engine sees it.

    Attributes:
        key: ``namespace/name``.
        queue: the queue the job is submitted to.
        gpus_per_replica: GPUs each replica of the scaling task requests.
        min_replicas: the fewest replicas the job runs with (its gang minimum).
        max_replicas: the most replicas the job may run with.
        current_replicas: ``spec.tasks[task].replicas`` now.
        scheduled_replicas: pods of the task that Volcano has bound to a node (PodScheduled);
            pods still waiting for GPUs do not count. None when unknown, taken as
            ``current_replicas``.
        phase: the Volcano Job phase.
        elastic: whether tide may change the replicas.
        throughput_history: measured throughput, oldest first.
        last_rescale_s: when tide last changed the replicas; None if never.
        restart_cost_s: seconds of progress a membership change costs; None for the policy default.
        remaining_samples: samples left to train, when the job reports it; None if unknown.
        task: the name of the task that scales.
        recommendations: recent allocator targets, the stabilization windows' memory.
        nonelastic_gpus: GPUs the job holds outside the scaling task (e.g. a master pod).
        read_problems: problems found while reading the job (e.g. a bad ``tide.io/*``
            annotation); a job with any is not planned for.
        stale_reason: why the job's own metrics cannot be trusted this round (stale, missing
            or non-finite throughput), a sentence naming what was stale; None when they can.
            Set by ``observe`` from the metrics source's verdict (``MetricsSample.stale_jobs``)
            and from non-finite points. Such a job never grows and is never shrunk for another
            job's sake or for its own low efficiency; it holds (``HoldMetricsStale``) unless
            its queue's budget forces a shrink (pending work, headroom, over budget), and its
            held GPUs count in that budget as any running elastic job's do.
        pods: the scaling task's pods with their task index and node, lowest index first,
            terminating ones included until they are gone (they hold their GPUs); empty when
            the source does not read pods.
        running_since_s: when the job first ran (its gang first scheduled), seconds on the
            engine's clock; its age, which the allocator's objective reads where the remaining
            work is unknown. None when unknown or not started.
        requested_replicas: the replicas the job's owner asked for (the scaling task's
            replicas as submitted, before tide changed them); the replicas up to it rank at
            the job's remaining time at this size, and a job that has run long is owed them
            before others grow (``Defaults.starvation_bound_s``). None when unknown.
        batch_bounds: the bounds within which the job's workers choose their batch, when the
            job opts in to adaptive batch (``tide.io/adaptive-batch``); None when it keeps its
            submitted batch.
        batch_statistics: what the adaptive-batch workers report (gradient statistics, step
            times, progress), from the metrics source; None when nothing is reported.
    """

    key: JobKey
    queue: QueueName
    gpus_per_replica: float
    min_replicas: int
    max_replicas: int
    current_replicas: int
    phase: JobPhase
    elastic: bool
    throughput_history: tuple[ThroughputPoint, ...] = ()
    last_rescale_s: float | None = None
    restart_cost_s: float | None = None
    remaining_samples: float | None = None
    task: str = "worker"
    recommendations: tuple[Recommendation, ...] = ()
    nonelastic_gpus: float = 0.0
    read_problems: tuple[str, ...] = ()
    scheduled_replicas: int | None = None
    stale_reason: str | None = None
    pods: tuple[PodPlacement, ...] = ()
    running_since_s: float | None = None
    requested_replicas: int | None = None
    batch_bounds: BatchBounds | None = None
    batch_statistics: BatchStatistics | None = None

    def with_metrics(
        self,
        history: tuple[ThroughputPoint, ...],
        remaining_samples: float | None,
        batch_statistics: BatchStatistics | None = None,
    ) -> JobState:
        """The same job with the metrics source's throughput history, remaining samples and
        batch statistics (``batch_statistics`` None keeps the job's own).

        The constructor called directly, not ``dataclasses.replace``: ``observe`` calls this for
        every job, and at 10,000 jobs ``replace`` (which inspects the fields at every call) made
        ``observe`` take 40 ms against 26 (BENCHMARKS.md, engine latency). A field added to
        ``JobState`` must be added here too; ``test_joining_metrics_keeps_every_other_field_of_
        the_job`` fails until it is.
        """
        return JobState(
            key=self.key,
            queue=self.queue,
            gpus_per_replica=self.gpus_per_replica,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            current_replicas=self.current_replicas,
            phase=self.phase,
            elastic=self.elastic,
            throughput_history=history,
            last_rescale_s=self.last_rescale_s,
            restart_cost_s=self.restart_cost_s,
            remaining_samples=remaining_samples,
            running_since_s=self.running_since_s,
            requested_replicas=self.requested_replicas,
            task=self.task,
            recommendations=self.recommendations,
            nonelastic_gpus=self.nonelastic_gpus,
            read_problems=self.read_problems,
            scheduled_replicas=self.scheduled_replicas,
            stale_reason=self.stale_reason,
            pods=self.pods,
            batch_bounds=self.batch_bounds,
            batch_statistics=(
                self.batch_statistics if batch_statistics is None else batch_statistics
            ),
        )

    @property
    def held_replicas(self) -> int:
        """Replicas that hold GPUs now: the scheduled ones, never more than the spec asks.

        Pods beyond them wait for GPUs and have not joined the job: withdrawing them (lowering
        the spec to this) costs no restart.
        """
        if self.scheduled_replicas is None:
            return self.current_replicas
        return max(0, min(self.current_replicas, self.scheduled_replicas))

    @property
    def gpus(self) -> float:
        """GPUs the job holds at its current size."""
        return self.current_replicas * self.gpus_per_replica + self.nonelastic_gpus

    def spec_problems(self) -> list[str]:
        """What makes this job impossible to plan for, as sentences; empty when it is valid."""
        if (
            not self.read_problems
            and 0 <= self.gpus_per_replica < math.inf  # False for NaN
            and 0 <= self.min_replicas <= self.max_replicas
            and self.current_replicas >= 0
            and (self.restart_cost_s is None or self.restart_cost_s >= 0)
        ):
            return []  # a valid job, every check at once: triage asks this of every job
        problems = list(self.read_problems)
        if not math.isfinite(self.gpus_per_replica) or self.gpus_per_replica < 0:
            problems.append(f"gpus_per_replica must be >= 0, got {self.gpus_per_replica}")
        if self.min_replicas < 0:
            problems.append(f"min_replicas must be >= 0, got {self.min_replicas}")
        if self.min_replicas > self.max_replicas:
            problems.append(
                f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}"
            )
        if self.current_replicas < 0:
            problems.append(f"current_replicas must be >= 0, got {self.current_replicas}")
        if self.restart_cost_s is not None and not self.restart_cost_s >= 0:
            problems.append(f"restart_cost_s must be >= 0, got {self.restart_cost_s}")
        return problems


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything one reconcile decides from.

    Attributes:
        time_s: when it was observed, seconds since the epoch.
        queues: every queue.
        jobs: every job, elastic or not, pending or running.
        cluster_free_gpus: allocatable GPUs no pod requests now.
        metrics_fresh: False when the cluster- or queue-level figures were stale, unreachable
            or NaN: every job then holds. A job whose own figures are stale says so in its
            ``stale_reason`` instead, and only that job holds.
        releasing_gpus: GPUs held by pods that are terminating (a shrink checkpointing): they
            come free shortly, so pending work needs no further shrink for them.
        nodes: the GPU nodes with their free GPUs; empty when the source does not read nodes.
        pending_gangs: PodGroups of non-elastic work waiting for GPUs, oldest first (their
            GPUs are also in their queue's ``pending_nonelastic_gpus``).
    """

    time_s: float
    queues: tuple[QueueState, ...]
    jobs: tuple[JobState, ...]
    cluster_free_gpus: float
    metrics_fresh: bool = True
    releasing_gpus: float = 0.0
    nodes: tuple[NodeState, ...] = ()
    pending_gangs: tuple[PendingGang, ...] = ()


class Reason(str, enum.Enum):
    """Why a decision is what it is: CamelCase, as in Kubernetes conditions and Events."""

    SCALE_UP_FOR_IDLE_GPUS = "ScaleUpForIdleGpus"
    SHRINK_FOR_PENDING_WORK = "ShrinkForPendingWork"
    SHRINK_FOR_GANG_SHAPE = "ShrinkForGangShape"
    SHRINK_FOR_HEADROOM = "ShrinkForHeadroom"
    SHRINK_OVER_BUDGET = "ShrinkOverBudget"
    SHRINK_LOW_EFFICIENCY = "ShrinkLowEfficiency"
    SHRINK_FOR_BETTER_USE = "ShrinkForBetterUse"
    AT_TARGET = "AtTarget"
    WITHIN_TOLERANCE = "WithinTolerance"
    RESTART_COST_EXCEEDS_GAIN = "RestartCostExceedsGain"
    LIMITED_BY_BOUNDS = "LimitedByBounds"
    LIMITED_BY_RATE = "LimitedByRate"
    COOLDOWN = "Cooldown"
    STABILIZATION_WINDOW = "StabilizationWindow"
    HOLD_METRICS_STALE = "HoldMetricsStale"
    HOLD_NOT_MEASURED = "HoldNotMeasured"
    INVALID_JOB_SPEC = "InvalidJobSpec"
    NOT_ELASTIC = "NotElastic"
    NOT_RUNNING = "NotRunning"
    QUEUE_NOT_MANAGED = "QueueNotManaged"
    WITHDRAW_UNPLACED = "WithdrawUnplacedReplicas"
    MODEL_FIT_FAILED = "ModelFitFailed"


class Explanation(Protocol):
    """What writes the sentence for people that goes with a decision, when someone reads it.

    Decisions and writes carry one, never a bare string: most of a large round's decisions are
    holds whose sentence nobody reads, and writing out all 10,000 of them took 47 ms, as long
    as the rest of the decision. One explanation may serve many decisions (a round's allocator
    decisions share one), so it is asked for the sentence of one job. ``Sentence`` is one
    already written out.
    """

    def render(self, job: JobKey) -> str:
        """The sentence of ``job``'s decision."""
        ...


@dataclass(frozen=True, slots=True)
class Sentence:
    """An explanation already written out (a hold's reason, a test's expectation)."""

    text: str

    def render(self, job: JobKey) -> str:
        """See base class: the text, whichever job asks."""
        return self.text


class ScalingDecision(NamedTuple):
    """What the engine wants for one job, and why.

    A NamedTuple (immutable, built by its own constructor) rather than a frozen dataclass: a
    round builds one per job, and 10,000 frozen dataclasses took 18 ms against 8 ms for the
    tuples (measured side by side, 2026-12-01), more than the 5 ms the house allows a trick.

    Attributes:
        job: the job's key.
        current_replicas: replicas now.
        target_replicas: replicas the engine wants; equal to current for a hold.
        reason: a CamelCase reason.
        why: what writes the sentence for people (``message``), rendered when read.
    """

    job: JobKey
    current_replicas: int
    target_replicas: int
    reason: Reason
    why: Explanation

    @property
    def message(self) -> str:
        """One sentence for people saying why."""
        return self.why.render(self.job)

    @property
    def changes(self) -> bool:
        """Whether the target differs from the replicas now."""
        return self.target_replicas != self.current_replicas


@dataclass(frozen=True, slots=True)
class JobMemory:
    """What the stabilizer remembers about one job between reconciles (stored on the Job)."""

    last_rescale_s: float | None = None
    recommendations: tuple[Recommendation, ...] = field(default_factory=tuple)
