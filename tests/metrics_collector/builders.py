"""Series as a real Volcano scheduler, kube-state-metrics and tide's workers export them.

Label sets follow the recording in ``volcano-wire/v1.15.1/scheduler-metrics-queues.txt``
(``volcano_queue_*_scalar_resources{queue_name, resource="nvidia.com/gpu"}``, milli-units) and
kube-state-metrics v2 (``resource="nvidia_com_gpu"``, ``unit="integer"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.prometheus_server import Series

SCRAPE_S = 15.0


def times(start_s: float, end_s: float, every_s: float = SCRAPE_S) -> list[float]:
    """Scrape times from ``start_s`` to ``end_s`` (inclusive when it falls on the grid)."""
    out: list[float] = []
    t = start_s
    while t <= end_s + 1e-9:
        out.append(t)
        t += every_s
    return out


def gauge(name: str, labels: dict[str, str], value: float, at: Sequence[float]) -> Series:
    return Series(name, labels, [(t, value) for t in at])


def volcano_queue(queue: str, *, at: Sequence[float], **gpus: float) -> list[Series]:
    """``volcano_queue_<figure>_scalar_resources`` of one queue, e.g. ``allocated=28`` GPUs,
    written in milli-units as the scheduler does (28 GPUs read 28000)."""
    labels = {"queue_name": queue, "resource": "nvidia.com/gpu"}
    return [
        gauge(f"volcano_queue_{figure}_scalar_resources", labels, value * 1000, at)
        for figure, value in gpus.items()
    ]


def ksm_node(node: str, gpus: float, at: Sequence[float]) -> Series:
    labels = {"node": node, "resource": "nvidia_com_gpu", "unit": "integer"}
    return gauge("kube_node_status_allocatable", labels, gpus, at)


def ksm_pod(
    namespace: str,
    pod: str,
    *,
    gpus: float,
    phase: str,
    node: str,
    queue: str,
    elastic: bool,
    at: Sequence[float],
) -> list[Series]:
    """A pod's GPU request, phase and labels as kube-state-metrics exports them."""
    who = {"namespace": namespace, "pod": pod}
    request = who | {"container": "main", "node": node, "resource": "nvidia_com_gpu",
                     "unit": "integer"}  # fmt: skip
    phases = [
        gauge("kube_pod_status_phase", who | {"phase": p}, float(p == phase), at)
        for p in ("Pending", "Running", "Succeeded", "Failed", "Unknown")
    ]
    labels = who | {
        "label_volcano_sh_queue_name": queue,
        "label_tide_io_elastic": "true" if elastic else "",
    }
    return [
        gauge("kube_pod_container_resource_requests", request, gpus, at),
        gauge("kube_pod_labels", labels, 1.0, at),
        *phases,
    ]


def worker_pod(
    namespace: str,
    job: str,
    pod: str,
    *,
    samples_per_s: float,
    world_size: float,
    at: Sequence[float],
    counter_name: str = "tide_worker_samples_total",
    start_count: float = 0.0,
) -> list[Series]:
    """One pod's samples counter (rising at ``samples_per_s``) and world size gauge."""
    labels = {"namespace": namespace, "volcano_job": job, "pod": pod}
    first = at[0]
    return [
        Series(
            counter_name,
            labels,
            [(t, start_count + samples_per_s * (t - first)) for t in at],
            type="counter",
        ),
        gauge("tide_worker_world_size", labels, world_size, at),
    ]
