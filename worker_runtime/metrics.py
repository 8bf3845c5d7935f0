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
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

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
