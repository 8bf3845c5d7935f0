"""The ElasticPolicy a cluster admin writes, as frozen dataclasses.

Parsing lives in ``policy_file``; this module only says what a policy is. Durations are seconds
(``*_s``), GPU amounts are whole or fractional GPUs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from scheduler_policy.vocabulary.state import QueueName


class Objective(str, enum.Enum):
    """What the allocator's greedy ranks replicas by.

    ``completionTime`` (the default): a replica's relative speedup per GPU divided by the square
    root of the job's expected remaining time, so jobs nearer completion come first, while a
    long job's first replicas, which buy more than a short job's last, are not all kept out
    (shortest-remaining-time-first softened; ``allocate`` says what it measured). ``speedup``:
    relative speedup per GPU alone, which spreads GPUs in proportion to how well jobs scale,
    whatever their length.
    """

    COMPLETION_TIME = "completionTime"
    SPEEDUP = "speedup"


@dataclass(frozen=True, slots=True)
class Defaults:
    """Damping and cost settings that apply to every job unless a job's annotations override them.

    Attributes:
        tolerance: the least predicted relative throughput gain worth a rescale (0.05 = 5%).
        restart_cost_s: seconds of progress a membership change costs a job.
        cooldown_s: least time between two rescales of one job. It only keeps a job from
            moving every round: the allocator weighs what a rescale costs (``restart_cost_s``).
            The default, 2 minutes, as the down window: with both at 5 minutes (HPA's
            scale-down window) tide averaged 0.725 h on Pollux workloads 1-4, at 2 minutes
            0.716 h with 19% more rescales, at 1 minute 0.715 h with 29% more (20 runs each,
            ``benchmarks/policy_quality.py``'s cases; BENCHMARKS.md, 2026-12-02 fourth session).
        max_step_up: most replicas added to one job in one decision, while its scaling curve
            is a prediction (not yet measured at two sizes); a measured job moves in one step,
            since every change restarts it whatever the step.
        max_step_down: likewise, most replicas removed.
        window_up_s: scale up only to the lowest target recommended over this window.
        window_down_s: scale down only to the highest target recommended over this window
            (2 minutes by default, as ``cooldown_s``).
        assumed_remaining_s: remaining run time assumed for a job that does not report its
            progress, when it starts; the estimate grows with the job's age (``allocate``).
        starvation_bound_s: the age after which a job below the replicas its owner asked for
            gains priority (aging). With a bound, the replicas up to a job's asked size rank at
            its remaining time at its asked size, and past the bound that time is divided by
            ``1 + (age - bound) / bound``, so shortest-remaining-first lets no long job sit
            below its asked size for ever. None for no aging: every replica ranks at the
            remaining time at the size the job holds.
    """

    tolerance: float = 0.05
    restart_cost_s: float = 30.0
    cooldown_s: float = 120.0
    max_step_up: int = 4
    max_step_down: int = 2
    window_up_s: float = 0.0
    window_down_s: float = 120.0
    assumed_remaining_s: float = 3600.0
    starvation_bound_s: float | None = 1800.0


@dataclass(frozen=True, slots=True)
class Headroom:
    """GPUs a queue keeps free of elastic growth for its non-elastic work.

    Attributes:
        gpus: a fixed number of GPUs.
        forecast_quantile: if set, also keep the forecast demand at this quantile (0 < q < 1).
        horizon_s: how far ahead the forecast looks.
    """

    gpus: float = 0.0
    forecast_quantile: float | None = None
    horizon_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """How tide treats one Volcano Queue.

    Attributes:
        name: the queue's name.
        elastic: whether tide scales this queue's jobs at all.
        borrow: whether its jobs may grow into idle GPUs beyond the queue's deserved share.
        headroom: GPUs kept free for non-elastic work.
        max_elastic_gpus: a cap on the GPUs the queue's elastic jobs hold together; None for none.
    """

    name: QueueName
    elastic: bool = True
    borrow: bool = False
    headroom: Headroom = field(default_factory=Headroom)
    max_elastic_gpus: float | None = None


# The PromQL each figure is read with. Every template may use the placeholder ``${rateWindow}``
# (the rate window as a PromQL duration, ``120s``); ``$1`` and the like, as in label_replace, are
# PromQL's own and pass through. Results must keep the labels named: ``queue_name`` for queue
# figures, ``namespace`` and ``volcano_job`` for job figures, none for cluster figures. Volcano's
# queue figures are milli-units (1 GPU reads 1000); the source converts them, so an override of
# a ``queue*`` figure other than ``queueLastSample`` and ``queueNonelasticDemand`` must keep
# milli-units too.
_GPU = 'resource="nvidia.com/gpu"'
_KSM_GPU = 'resource="nvidia_com_gpu"'
# Pods that hold or wait for GPUs now: kube-state-metrics keeps exporting finished pods' requests.
_LIVE_POD = (
    "on (namespace, pod) group_left () "
    '(max by (namespace, pod) (kube_pod_status_phase{phase=~"Pending|Running"}) == 1)'
)


_SHAPE = "namespace, volcano_job, nodes, replicas, local_batch"


def _step_mean(histogram: str) -> str:
    """The mean of a worker step histogram per job and shape over the step window."""
    return (
        f"sum by ({_SHAPE}) (increase({histogram}_sum[${{stepWindow}}]))"
        f" / sum by ({_SHAPE}) (increase({histogram}_count[${{stepWindow}}]))"
    )


@dataclass(frozen=True, slots=True)
class PrometheusQueries:
    """The PromQL templates of every figure the Prometheus source reads (file keys in camelCase).

    Attributes:
        queue_allocated: GPUs each queue's pods hold, milli-units (Volcano scheduler).
        queue_request: GPUs each queue's jobs request, milli-units.
        queue_deserved: each queue's deserved share, milli-units (only queues with a share).
        queue_capacity: each queue's capacity, milli-units (capacity plugin only; may be absent).
        queue_real_capacity: each queue's real capacity, milli-units (capacity plugin only).
        queue_last_sample: when each queue's figures were last scraped, seconds since the epoch.
        queue_nonelastic_demand: GPUs (whole units) requested by each queue's running and
            pending pods that are not elastic: kube-state-metrics' pod requests joined with the
            pods' ``volcano.sh/queue-name`` label, leaving out pods labelled
            ``tide.io/elastic: "true"``. kube-state-metrics must export both labels
            (``--metric-labels-allowlist=pods=[volcano.sh/queue-name,tide.io/elastic]``).
            Read as a range for the demand forecaster.
        cluster_allocatable: GPUs the nodes can allocate (kube-state-metrics).
        cluster_requested: GPUs requested by pods bound to a node and not finished
            (``or vector(0)``: no such pod is 0, not missing).
        cluster_last_sample: when the nodes' figures were last scraped.
        job_throughput: each job's training samples per second over all its pods.
        job_world_size: each job's workers in its current membership.
        job_nodes: the nodes each job's current membership spans (torchrun's agents, the
            workers' ``tide_worker_nodes``); a job without the series has unknown nodes.
        job_last_sample: when each job's throughput counter was last scraped.
        job_planned_samples: samples each job's run will consume in all (only jobs that
            declare their epochs and dataset).
        job_consumed_samples: samples each job has consumed since it began, restarts included.
        job_optim_step_seconds: adaptive-batch jobs' mean synchronising micro batch and
            optimizer update per shape over ``${stepWindow}`` (the throughput lookback): the
            ``tide_worker_optim_step_seconds`` histogram's ``_sum`` over its ``_count``, by
            ``namespace, volcano_job, nodes, replicas, local_batch``.
        job_accumulation_step_seconds: likewise, one accumulation micro batch.
        job_sync_seconds: likewise, a step's gradient all-reduce.
        job_grad_sqr: each adaptive job's smoothed squared gradient norm.
        job_grad_var: each adaptive job's smoothed gradient variance at its initial batch.
        job_batch_size: each adaptive job's current global batch.
        job_progress: each adaptive job's scale-invariant iterations done.
        job_planned_progress: each adaptive job's scale-invariant iterations in all (only jobs
            that declare their epochs and dataset).
    """

    queue_allocated: str = f"volcano_queue_allocated_scalar_resources{{{_GPU}}}"
    queue_request: str = f"volcano_queue_request_scalar_resources{{{_GPU}}}"
    queue_deserved: str = f"volcano_queue_deserved_scalar_resources{{{_GPU}}}"
    queue_capacity: str = f"volcano_queue_capacity_scalar_resources{{{_GPU}}}"
    queue_real_capacity: str = f"volcano_queue_real_capacity_scalar_resources{{{_GPU}}}"
    queue_last_sample: str = (
        f"max by (queue_name) (timestamp(volcano_queue_allocated_scalar_resources{{{_GPU}}}))"
    )
    queue_nonelastic_demand: str = (
        "sum by (queue_name) (label_replace("
        f"kube_pod_container_resource_requests{{{_KSM_GPU}}} * {_LIVE_POD}"
        " * on (namespace, pod) group_left (label_volcano_sh_queue_name)"
        " max by (namespace, pod, label_volcano_sh_queue_name) (kube_pod_labels{"
        'label_volcano_sh_queue_name!="", label_tide_io_elastic!="true"}),'
        ' "queue_name", "$1", "label_volcano_sh_queue_name", "(.+)"))'
    )
    cluster_allocatable: str = f"sum(kube_node_status_allocatable{{{_KSM_GPU}}})"
    cluster_requested: str = (
        f'sum(kube_pod_container_resource_requests{{{_KSM_GPU}, node!=""}} * {_LIVE_POD})'
        " or vector(0)"
    )
    cluster_last_sample: str = f"max(timestamp(kube_node_status_allocatable{{{_KSM_GPU}}}))"
    job_throughput: str = (
        "sum by (namespace, volcano_job) (rate(tide_worker_samples_total[${rateWindow}]))"
    )
    job_world_size: str = "max by (namespace, volcano_job) (tide_worker_world_size)"
    job_nodes: str = "max by (namespace, volcano_job) (tide_worker_nodes)"
    job_last_sample: str = "max by (namespace, volcano_job) (timestamp(tide_worker_samples_total))"
    job_planned_samples: str = "max by (namespace, volcano_job) (tide_worker_planned_samples)"
    job_consumed_samples: str = "max by (namespace, volcano_job) (tide_worker_consumed_samples)"
    job_optim_step_seconds: str = _step_mean("tide_worker_optim_step_seconds")
    job_accumulation_step_seconds: str = _step_mean("tide_worker_accumulation_step_seconds")
    job_sync_seconds: str = _step_mean("tide_worker_sync_seconds")
    job_grad_sqr: str = "avg by (namespace, volcano_job) (tide_worker_grad_sqr)"
    job_grad_var: str = "avg by (namespace, volcano_job) (tide_worker_grad_var)"
    job_batch_size: str = "max by (namespace, volcano_job) (tide_worker_batch_size)"
    job_progress: str = "max by (namespace, volcano_job) (tide_worker_progress)"
    job_planned_progress: str = "max by (namespace, volcano_job) (tide_worker_planned_progress)"


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Where and how the engine reads its metrics (``spec.metrics.prometheus``).

    Attributes:
        rate_window_s: the window of throughput rates (``${rateWindow}``).
        lookback_s: how far back throughput history is read for the scaling models.
        demand_lookback_s: how far back queue demand history is read for the forecaster.
        queries: the PromQL of each figure.
    """

    rate_window_s: float = 120.0
    lookback_s: float = 6 * 3600.0
    demand_lookback_s: float = 7 * 86400.0
    queries: PrometheusQueries = field(default_factory=PrometheusQueries)


@dataclass(frozen=True, slots=True)
class ElasticPolicy:
    """A whole policy file.

    Attributes:
        name: ``metadata.name``.
        interval_s: seconds between two reconciles.
        model_refit_s: least time between two refits of one job's scaling model when nothing new
            was measured.
        objective: what the allocator ranks replicas by.
        defaults: settings for every job.
        queues: the queues tide manages; jobs in other queues are left alone.
        metrics: how the Prometheus source reads the figures.
    """

    name: str = "default"
    interval_s: float = 60.0
    model_refit_s: float = 600.0
    objective: Objective = Objective.COMPLETION_TIME
    defaults: Defaults = field(default_factory=Defaults)
    queues: tuple[QueuePolicy, ...] = ()
    metrics: MetricsSettings = field(default_factory=MetricsSettings)

    def queue(self, name: QueueName) -> QueuePolicy | None:
        """The policy for queue ``name``, or None when tide does not manage it."""
        for queue in self.queues:
            if queue.name == name:
                return queue
        return None
