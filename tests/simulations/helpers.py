"""Small builders for simulator tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations.cluster import SimulatedCluster
from simulations.cluster_config import ClusterSpec, QueueSpec
from simulations.profiles import ScalingProfile
from simulations.workload import Workload, WorkloadJob

LINEAR = ScalingProfile("linear", tuple(float(n) for n in range(1, 65)))


def make_job(
    name: str,
    *,
    queue: str = "a",
    submit_s: float = 0.0,
    replicas: int = 2,
    min_r: int | None = None,
    max_r: int | None = None,
    work: float = 100.0,
    elastic: bool | None = None,
    restart_s: float = 0.0,
    ckpt_s: float = 600.0,
) -> WorkloadJob:
    """A job with a linear profile (1 unit/s per replica)."""
    min_replicas = replicas if min_r is None else min_r
    max_replicas = replicas if max_r is None else max_r
    return WorkloadJob(
        key=JobKey(f"ns/{name}"),
        submit_s=submit_s,
        queue=QueueName(queue),
        elastic=(max_replicas > min_replicas) if elastic is None else elastic,
        gpus_per_replica=1,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        requested_replicas=replicas,
        work_units=work,
        profile=LINEAR,
        checkpoint_interval_s=ckpt_s,
        restart_cost_s=restart_s,
    )


def make_cluster(
    *,
    nodes: int = 1,
    gpus: int = 4,
    queues: tuple[QueueSpec, ...] | None = None,
    reclaim: bool = True,
    overcommit: float = 1.2,
) -> ClusterSpec:
    """A cluster with queue ``a`` (and whatever ``queues`` says)."""
    return ClusterSpec(
        name="test",
        nodes=nodes,
        gpus_per_node=gpus,
        queues=queues or (QueueSpec(QueueName("a")),),
        reclaim=reclaim,
        overcommit_factor=overcommit,
    )


def make_sim(jobs: list[WorkloadJob], **cluster_kw: object) -> SimulatedCluster:
    """A simulated cluster with ``jobs`` submitted at time 0 (their submit times ignored)."""
    sim = SimulatedCluster(spec=make_cluster(**cluster_kw), workload=Workload("t", tuple(jobs)))  # type: ignore[arg-type]
    for job in sim.order:
        sim.submit(job)
    return sim


def interrupt_after(
    results_as_done: Callable[..., Iterator[Any]], count: int = 1
) -> Callable[..., Iterator[Any]]:
    """``results_as_done`` that yields its first ``count`` results, then is interrupted as by
    Ctrl-C."""

    def interrupted(*args: Any, **kwargs: Any) -> Iterator[Any]:
        results = results_as_done(*args, **kwargs)
        for _ in range(count):
            yield next(results)
        results.close()  # what an interrupt does: the workers are terminated
        raise KeyboardInterrupt

    return interrupted
