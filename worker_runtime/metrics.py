"""Prometheus metrics of one training pod, served by its local rank 0.

Every metric carries the labels ``volcano_job`` (``VOLCANO_JOB_NAME``), ``namespace``
(``POD_NAMESPACE``) and ``pod`` (``POD_NAME``, from the Downward API). ``tide_worker_samples_total``
counts the samples this pod's workers trained on, so summing its rate over the pods of a job gives
the job's throughput; the other counters describe the job as this pod saw it (take ``max`` over
pods).

Progress: ``tide_worker_consumed_samples`` is the job's global count of consumed samples, restarts
and rescales included (the checkpointed data position, the same on every pod), and
``tide_worker_planned_samples`` the samples the whole run will consume, present only when the
script declared both its epochs and its dataset; the engine reads their difference as the job's
remaining samples. (The pods' ``samples_total`` counters restart from zero with each membership,
so they cannot tell how far the job is.)
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from worker_runtime.adascale import efficiency

if TYPE_CHECKING:  # the adaptive state holds torch objects; only its numbers are read here
    from worker_runtime.adaptive import AdaptiveBatch, StepTimes

logger = logging.getLogger(__name__)

_STEP_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_CHECKPOINT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LABELS = ("volcano_job", "namespace", "pod")


class WorkerMetrics:
    """The worker's metrics in one registry.

    Args:
        registry: Registry the metrics are registered in (a fresh one per run by default; tests
            pass their own).
        job_name: Value of the ``volcano_job`` label.
        namespace: Value of the ``namespace`` label.
        pod: Value of the ``pod`` label.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        job_name: str = "",
        namespace: str = "",
        pod: str = "",
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        labels = {"volcano_job": job_name, "namespace": namespace, "pod": pod}
        self._labels = labels
        reg = self.registry
        self.samples = Counter(
            "tide_worker_samples",
            "Samples trained on by this pod's workers.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.steps = Counter(
            "tide_worker_steps", "Optimizer steps completed by the job.", LABELS, registry=reg
        ).labels(**labels)
        self.step_seconds = Histogram(
            "tide_worker_step_seconds",
            "Wall time of one optimizer step, data loading included.",
            LABELS,
            buckets=_STEP_BUCKETS_S,
            registry=reg,
        ).labels(**labels)
        self.world_size = Gauge(
            "tide_worker_world_size", "Workers in the current membership.", LABELS, registry=reg
        ).labels(**labels)
        self.nodes = Gauge(
            "tide_worker_nodes",
            "Nodes the current membership spans: torchrun's agents (GROUP_WORLD_SIZE).",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.checkpoint_blocked_seconds = Histogram(
            "tide_worker_checkpoint_blocked_seconds",
            "Time training was blocked by one checkpoint save.",
            LABELS,
            buckets=_CHECKPOINT_BUCKETS_S,
            registry=reg,
        ).labels(**labels)
        self.checkpoint_save_seconds = Histogram(
            "tide_worker_checkpoint_save_seconds",
            "Time to serialize and commit one checkpoint to storage.",
            LABELS,
            buckets=_CHECKPOINT_BUCKETS_S,
            registry=reg,
        ).labels(**labels)
        self.checkpoint_load_seconds = Gauge(
            "tide_worker_checkpoint_load_seconds",
            "Time the last start spent loading its checkpoint.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.restarts = Counter(
            "tide_worker_restarts",
            "Starts of the job that resumed from a checkpoint (rescales and failures).",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.rescales = Counter(
            "tide_worker_rescales",
            "Starts of the job at a different world size than its checkpoint.",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.checkpoint_write_overlap_steps = Gauge(
            "tide_worker_checkpoint_write_overlap_steps",
            "Steps completed while the newest checkpoint write was in flight (the W of the "
            "kill -9 loss bound N + W).",
            LABELS,
            registry=reg,
        ).labels(**labels)
        self.samples_lost = Counter(
            "tide_worker_samples_lost",
            "Samples trained on after the checkpoint a restart resumed from (redone work).",
            LABELS,
            registry=reg,
        ).labels(**labels)

        self.consumed_samples = Gauge(
            "tide_worker_consumed_samples",
            "Samples the job has consumed since it began, over all workers, restarts and "
            "rescales (its data position).",
            LABELS,
            registry=reg,
        ).labels(**labels)
        # No child until the run knows its plan: a job that declares none exports no figure.
        self._planned_samples = Gauge(
            "tide_worker_planned_samples",
            "Samples the whole run will consume (epochs times the samples of an epoch); absent "
            "when the script declares no epochs or dataset.",
            LABELS,
            registry=reg,
        )

    def set_planned_samples(self, samples: int) -> None:
        """Export the samples the whole run will consume.

        Args:
            samples: the plan, at least 0.

        Raises:
            ValueError: ``samples`` is negative.
        """
        if samples < 0:
            raise ValueError(f"planned samples: must be >= 0, got {samples}")
        self._planned_samples.labels(**self._labels).set(samples)

    def serve(self, port: int, *, addr: str = "0.0.0.0") -> None:
        """Serve the registry over HTTP in a daemon thread until :meth:`close`.

        Args:
            port: TCP port.
            addr: Address to bind.
        """
        self.close()
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        logger.info("serving worker metrics on %s:%s", addr, port)

    def close(self) -> None:
        """Stop the HTTP server, if one runs, and free its port."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


SHAPE_LABELS = ("nodes", "replicas", "local_batch")


class AdaptiveMetrics:
    """The adaptive-batch metrics of a pod (registered only when the job opts in).

    Times carry, beside :data:`LABELS`, the shape they were measured at: ``nodes`` (pods),
    ``replicas`` (workers) and ``local_batch`` (samples per micro batch). Throughput (from
    ``tide_worker_samples_total``) and statistical efficiency are exported apart, never as their
    product: the engine fits each.

    Args:
        registry: Registry of the pod's :class:`WorkerMetrics`.
        job_name: Value of the ``volcano_job`` label.
        namespace: Value of the ``namespace`` label.
        pod: Value of the ``pod`` label.
    """

    def __init__(
        self, *, registry: CollectorRegistry, job_name: str = "", namespace: str = "", pod: str = ""
    ) -> None:
        self._labels = {"volcano_job": job_name, "namespace": namespace, "pod": pod}
        labels, reg, shaped = self._labels, registry, (*LABELS, *SHAPE_LABELS)
        self.optim_step_seconds = Histogram(
            "tide_worker_optim_step_seconds",
            "Wall time of a step's synchronising micro batch and optimizer update (the step "
            "minus its accumulation micro batches).",
            shaped,
            buckets=_STEP_BUCKETS_S,
            registry=reg,
        )
        self.accumulation_step_seconds = Histogram(
            "tide_worker_accumulation_step_seconds",
            "Wall time of one accumulation micro batch (forward and backward, no all-reduce).",
            shaped,
            buckets=_STEP_BUCKETS_S,
            registry=reg,
        )
        self.sync_seconds = Histogram(
            "tide_worker_sync_seconds",
            "Wall time of a step's gradient all-reduce, first bucket sent to last reduced.",
            shaped,
            buckets=_STEP_BUCKETS_S,
            registry=reg,
        )

        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, LABELS, registry=reg)

        self.grad_sqr = gauge(
            "tide_worker_grad_sqr", "Smoothed estimate of the true gradient's squared norm."
        ).labels(**labels)
        self.grad_var = gauge(
            "tide_worker_grad_var",
            "Smoothed estimate of the gradient variance at the initial batch.",
        ).labels(**labels)
        self.initial_batch_size = gauge(
            "tide_worker_initial_batch_size", "Global batch the learning rate was tuned for."
        ).labels(**labels)
        self.max_batch_size = gauge(
            "tide_worker_max_batch_size", "Largest global batch the job allows."
        ).labels(**labels)
        self.batch_size = gauge(
            "tide_worker_batch_size", "Current global batch (samples per optimizer step)."
        ).labels(**labels)
        self.local_batch_size = gauge(
            "tide_worker_local_batch_size", "Current micro batch of one worker."
        ).labels(**labels)
        self.accumulation_steps = gauge(
            "tide_worker_accumulation_steps", "Current micro batches per worker per step."
        ).labels(**labels)
        self.local_batch_min = gauge(
            "tide_worker_local_batch_min", "Smallest micro batch the job allows."
        ).labels(**labels)
        self.local_batch_max = gauge(
            "tide_worker_local_batch_max", "Largest micro batch the job allows."
        ).labels(**labels)
        self.efficiency = gauge(
            "tide_worker_statistical_efficiency",
            "Progress per sample of the current batch relative to the initial batch (gain / "
            "scale).",
        ).labels(**labels)
        self.progress = gauge(
            "tide_worker_progress",
            "Scale-invariant iterations done: the sum of every step's gain (steps at the "
            "initial batch that the run's steps are worth).",
        ).labels(**labels)
        self._planned_progress = gauge(
            "tide_worker_planned_progress",
            "Scale-invariant iterations of the whole run (its samples over the initial batch); "
            "absent when the script declares no epochs or dataset.",
        )

    def observe_step(self, adaptive: AdaptiveBatch, times: StepTimes) -> None:
        """Record one step's times at the shape it ran at.

        Args:
            adaptive: The worker's adaptive state: its nodes, workers and micro batch are the
                shape.
            times: The step's times (the all-reduce only when measured).
        """
        shape = {
            "nodes": str(adaptive.nodes),
            "replicas": str(adaptive.world_size),
            "local_batch": str(adaptive.choice.local_batch_size),
        }
        self.optim_step_seconds.labels(**self._labels, **shape).observe(times.optim_step_s)
        for seconds in times.accumulation_s:
            self.accumulation_step_seconds.labels(**self._labels, **shape).observe(seconds)
        if times.sync_s is not None:
            self.sync_seconds.labels(**self._labels, **shape).observe(times.sync_s)

    def export(self, adaptive: AdaptiveBatch) -> None:
        """Export the bounds, the batch in use, the progress and the gradient statistics.

        Args:
            adaptive: The worker's adaptive state (its statistics are left unexported until a
                step has been averaged).
        """
        settings, choice, stats = adaptive.settings, adaptive.choice, adaptive.stats
        self.initial_batch_size.set(settings.initial_batch_size)
        self.max_batch_size.set(settings.max_batch_size)
        self.local_batch_min.set(settings.local_batch_min)
        self.local_batch_max.set(settings.local_batch_max)
        self.batch_size.set(choice.global_batch_size)
        self.local_batch_size.set(choice.local_batch_size)
        self.accumulation_steps.set(choice.accumulation_steps)
        self.progress.set(adaptive.progress)
        if stats.ready:
            self.grad_sqr.set(stats.grad_sqr)
            self.grad_var.set(stats.grad_var)
            self.efficiency.set(
                efficiency(grad_sqr=stats.grad_sqr, grad_var=stats.grad_var, scale=adaptive.scale)
            )

    def set_planned_progress(self, iterations: float) -> None:
        """Export the scale-invariant iterations of the whole run.

        Args:
            iterations: At least 0.

        Raises:
            ValueError: ``iterations`` is negative.
        """
        if iterations < 0:
            raise ValueError(f"planned progress: must be >= 0, got {iterations}")
        self._planned_progress.labels(**self._labels).set(iterations)
