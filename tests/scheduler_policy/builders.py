"""Small builders for the engine's tests: make_job(...), make_queue(...), make_observation(...)."""

from __future__ import annotations

from scheduler_policy.policy.spec import Defaults, ElasticPolicy, Headroom, QueuePolicy
from scheduler_policy.vocabulary.state import (
    JobKey,
    JobPhase,
    JobState,
    Observation,
    QueueName,
    QueueState,
    ThroughputPoint,
)

NOW_S = 1_000_000.0


def usl_points(
    *sizes: int, lam: float = 100.0, sigma: float = 0.02, kappa: float = 0.0
) -> tuple[ThroughputPoint, ...]:
    """Exact USL measurements at ``sizes``, one hour before NOW_S."""
    return tuple(
        ThroughputPoint(
            time_s=NOW_S - 3600 + i,
            replicas=n,
            samples_per_s=lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1)),
        )
        for i, n in enumerate(sizes)
    )


def make_job(
    name: str = "job",
    *,
    queue: str = "q",
    gpus_per_replica: float = 1.0,
    min_replicas: int = 1,
    max_replicas: int = 8,
    current: int = 2,
    phase: JobPhase = JobPhase.RUNNING,
    elastic: bool = True,
    sizes: tuple[int, ...] = (1, 2, 4),
    sigma: float = 0.02,
    kappa: float = 0.0,
    remaining_samples: float | None = None,
    restart_cost_s: float | None = None,
    last_rescale_s: float | None = None,
    scheduled: int | None = None,
    stale: str | None = None,
    requested: int | None = None,
) -> JobState:
    return JobState(
        key=JobKey(f"ns/{name}"),
        queue=QueueName(queue),
        gpus_per_replica=gpus_per_replica,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        current_replicas=current,
        phase=phase,
        elastic=elastic,
        throughput_history=usl_points(*sizes, sigma=sigma, kappa=kappa),
        remaining_samples=remaining_samples,
        restart_cost_s=restart_cost_s,
        last_rescale_s=last_rescale_s,
        scheduled_replicas=scheduled,
        stale_reason=stale,
        requested_replicas=requested,
    )


def make_queue(
    name: str = "q",
    *,
    capability: float | None = 16.0,
    deserved: float | None = None,
    pending: float = 0.0,
) -> QueueState:
    return QueueState(
        name=QueueName(name),
        capability_gpus=capability,
        deserved_gpus=deserved,
        guarantee_gpus=0.0,
        allocated_gpus=0.0,
        pending_nonelastic_gpus=pending,
    )


def make_observation(
    *jobs: JobState,
    queues: tuple[QueueState, ...] | None = None,
    free: float = 8.0,
    fresh: bool = True,
    now_s: float = NOW_S,
) -> Observation:
    return Observation(
        time_s=now_s,
        queues=queues if queues is not None else (make_queue(),),
        jobs=tuple(jobs),
        cluster_free_gpus=free,
        metrics_fresh=fresh,
    )


def make_policy(
    *queues: str,
    borrow: bool = False,
    headroom_gpus: float = 0.0,
    max_elastic_gpus: float | None = None,
    **defaults: float,
) -> ElasticPolicy:
    base = {"cooldown_s": 0.0, "window_down_s": 0.0, "tolerance": 0.0, "max_step_up": 100,
            "max_step_down": 100, "restart_cost_s": 0.0}  # fmt: skip
    base.update(defaults)
    return ElasticPolicy(
        name="test",
        defaults=Defaults(**base),  # type: ignore[arg-type]
        queues=tuple(
            QueuePolicy(
                name=QueueName(q),
                borrow=borrow,
                headroom=Headroom(gpus=headroom_gpus),
                max_elastic_gpus=max_elastic_gpus,
            )
            for q in (queues or ("q",))
        ),
    )
