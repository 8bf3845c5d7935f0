"""The worker's view of its environment: torchrun's variables plus tide's own.

Variables read (all optional except where torchrun always sets them):

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``
    Set by torchrun for every worker; default to a single-process run.
``GROUP_WORLD_SIZE``
    Set by torchrun: the agents (pods) in the membership, one per node the job spans (each
    pod is placed on a node of its own); defaults to ``WORLD_SIZE / LOCAL_WORLD_SIZE``.
``TORCHELASTIC_RESTART_COUNT``
    Set by torchrun; counts failure restarts only (a membership change does not raise it).
``TIDE_METRICS_PORT``
    TCP port on which local rank 0 of each pod serves Prometheus metrics; unset or empty means
    no metrics server.
``VOLCANO_JOB_NAME``
    Name of the Volcano Job, exposed through the downward API from the pod label
    ``volcano.sh/job-name``; it labels every metric (``volcano_job``).
``POD_NAMESPACE``
    Namespace of the pod, exposed through the downward API from ``metadata.namespace``; it labels
    every metric (``namespace``).
``POD_NAME``
    Name of the pod, exposed through the downward API from ``metadata.name``; it labels every
    metric (``pod``).

Adaptive batch (opt-in per job; see :mod:`worker_runtime.adaptive`). Each variable carries the
value of the Volcano Job annotation of the same name (``tide.io/adaptive-batch`` is
``TIDE_ADAPTIVE_BATCH``: ``TIDE_`` plus the name in upper case, ``-`` as ``_``), which ``tide
validate`` checks; the job template passes them as literal values or, when the annotations are on
the pod template too, through the downward API (``metadata.annotations['tide.io/...']``):

``TIDE_ADAPTIVE_BATCH``
    ``"true"`` opts in; unset, empty or ``"false"`` keeps the batch the script sets.
``TIDE_INITIAL_BATCH_SIZE``
    Global batch the learning rate was tuned for, and the smallest the run uses (required).
``TIDE_MAX_BATCH_SIZE``
    Largest global batch (required).
``TIDE_LOCAL_BATCH_MIN``, ``TIDE_LOCAL_BATCH_MAX``
    Bounds of a worker's micro batch (default 1; the maximum is required: what fits in memory).
``TIDE_ACCUMULATION``
    ``"true"`` lets a step take several micro batches per worker (default ``"false"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from worker_runtime.errors import ConfigError

METRICS_PORT_ENV = "TIDE_METRICS_PORT"
JOB_NAME_ENV = "VOLCANO_JOB_NAME"
NAMESPACE_ENV = "POD_NAMESPACE"
POD_NAME_ENV = "POD_NAME"
ADAPTIVE_BATCH_ENV = "TIDE_ADAPTIVE_BATCH"
INITIAL_BATCH_ENV = "TIDE_INITIAL_BATCH_SIZE"
MAX_BATCH_ENV = "TIDE_MAX_BATCH_SIZE"
LOCAL_BATCH_MIN_ENV = "TIDE_LOCAL_BATCH_MIN"
LOCAL_BATCH_MAX_ENV = "TIDE_LOCAL_BATCH_MAX"
ACCUMULATION_ENV = "TIDE_ACCUMULATION"
ADAPTIVE_ENVS = (
    ADAPTIVE_BATCH_ENV,
    INITIAL_BATCH_ENV,
    MAX_BATCH_ENV,
    LOCAL_BATCH_MIN_ENV,
    LOCAL_BATCH_MAX_ENV,
    ACCUMULATION_ENV,
)


@dataclass(frozen=True, slots=True)
class AdaptiveBatchSettings:
    """Bounds of a job that lets tide choose its batch (``TIDE_ADAPTIVE_BATCH=true``).

    Attributes:
        initial_batch_size: Global batch (samples per step) the learning rate was tuned for; the
            smallest global batch the run takes, and the unit of its progress.
        max_batch_size: Largest global batch.
        local_batch_min: Smallest micro batch of one worker.
        local_batch_max: Largest micro batch of one worker (what fits in its memory).
        accumulation: Whether a step may take several micro batches per worker.
    """

    initial_batch_size: int
    max_batch_size: int
    local_batch_min: int
    local_batch_max: int
    accumulation: bool

    def __post_init__(self) -> None:
        if self.initial_batch_size < 1:
            raise ConfigError(f"{INITIAL_BATCH_ENV}: must be >= 1, got {self.initial_batch_size}")
        if self.max_batch_size < self.initial_batch_size:
            raise ConfigError(
                f"{MAX_BATCH_ENV}: must be >= {INITIAL_BATCH_ENV} ({self.initial_batch_size}), "
                f"got {self.max_batch_size}"
            )
        if self.local_batch_min < 1:
            raise ConfigError(f"{LOCAL_BATCH_MIN_ENV}: must be >= 1, got {self.local_batch_min}")
        if self.local_batch_max < self.local_batch_min:
            raise ConfigError(
                f"{LOCAL_BATCH_MAX_ENV}: must be >= {LOCAL_BATCH_MIN_ENV} "
                f"({self.local_batch_min}), got {self.local_batch_max}"
            )
        if self.local_batch_min > self.max_batch_size:
            raise ConfigError(
                f"{LOCAL_BATCH_MIN_ENV}: must be <= {MAX_BATCH_ENV} ({self.max_batch_size}), "
                f"got {self.local_batch_min}"
            )

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> AdaptiveBatchSettings | None:
        """Read the adaptive-batch variables.

        Args:
            env: The environment.

        Returns:
            The settings, or ``None`` when the job does not opt in.

        Raises:
            ConfigError: When a variable is malformed, a bound is missing or inconsistent, or a
                bound is set without ``TIDE_ADAPTIVE_BATCH=true`` (it would do nothing).
        """
        enabled = _bool_var(env, ADAPTIVE_BATCH_ENV, default=False)
        if not enabled:
            stray = [n for n in ADAPTIVE_ENVS[1:] if env.get(n, "").strip()]
            if stray:
                raise ConfigError(
                    f"{stray[0]}: set without {ADAPTIVE_BATCH_ENV}=true, so it would do nothing"
                )
            return None
        for name in (INITIAL_BATCH_ENV, MAX_BATCH_ENV, LOCAL_BATCH_MAX_ENV):
            if not env.get(name, "").strip():
                raise ConfigError(f"{name}: required with {ADAPTIVE_BATCH_ENV}=true")
        return cls(
            initial_batch_size=_int_var(env, INITIAL_BATCH_ENV, 0, minimum=1),
            max_batch_size=_int_var(env, MAX_BATCH_ENV, 0, minimum=1),
            local_batch_min=_int_var(env, LOCAL_BATCH_MIN_ENV, 1, minimum=1),
            local_batch_max=_int_var(env, LOCAL_BATCH_MAX_ENV, 0, minimum=1),
            accumulation=_bool_var(env, ACCUMULATION_ENV, default=False),
        )


@dataclass(frozen=True, slots=True)
class WorkerEnv:
    """Identity of this worker process within the current torchrun membership.

    Attributes:
        rank: Global rank, ``0 <= rank < world_size``.
        world_size: Number of workers in the current membership.
        local_rank: Rank within this node (pod).
        local_world_size: Number of workers on this node (pod).
        restart_count: ``TORCHELASTIC_RESTART_COUNT`` (failure restarts only).
        job_name: Volcano Job name, ``""`` when unknown.
        namespace: Kubernetes namespace, ``""`` when unknown.
        metrics_port: Port for the metrics server, ``None`` for no server.
        pod_name: Kubernetes pod name, ``""`` when unknown.
        adaptive: The adaptive-batch bounds, ``None`` when the job does not opt in.
        group_world_size: agents (pods) in the membership, the nodes the job spans.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    restart_count: int
    job_name: str
    namespace: str
    metrics_port: int | None
    pod_name: str = ""
    adaptive: AdaptiveBatchSettings | None = None
    group_world_size: int = 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Read the environment.

        Args:
            environ: Mapping to read; ``os.environ`` when ``None``.

        Returns:
            The parsed environment.

        Raises:
            ConfigError: When a variable is not an integer or out of range.
        """
        env = os.environ if environ is None else environ
        rank = _int_var(env, "RANK", 0, minimum=0)
        world_size = _int_var(env, "WORLD_SIZE", 1, minimum=1)
        if rank >= world_size:
            raise ConfigError(f"RANK: must be < WORLD_SIZE={world_size}, got {rank}")
        port_text = env.get(METRICS_PORT_ENV, "").strip()
        metrics_port = None
        if port_text:
            metrics_port = _int_var(env, METRICS_PORT_ENV, 0, minimum=1)
            if metrics_port > 65535:
                raise ConfigError(f"{METRICS_PORT_ENV}: must be <= 65535, got {metrics_port}")
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=_int_var(env, "LOCAL_RANK", 0, minimum=0),
            local_world_size=_int_var(env, "LOCAL_WORLD_SIZE", 1, minimum=1),
            restart_count=_int_var(env, "TORCHELASTIC_RESTART_COUNT", 0, minimum=0),
            job_name=env.get(JOB_NAME_ENV, ""),
            namespace=env.get(NAMESPACE_ENV, ""),
            metrics_port=metrics_port,
            pod_name=env.get(POD_NAME_ENV, ""),
            adaptive=AdaptiveBatchSettings.from_environ(env),
            group_world_size=_int_var(
                env,
                "GROUP_WORLD_SIZE",
                max(1, world_size // _int_var(env, "LOCAL_WORLD_SIZE", 1, minimum=1)),
                minimum=1,
            ),
        )


def _int_var(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError as e:
        raise ConfigError(f"{name}: must be an integer, got {text!r}") from e
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _bool_var(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    text = env.get(name, "").strip()
    if not text:
        return default
    if text not in ("true", "false"):
        raise ConfigError(f'{name}: must be "true" or "false", got {text!r}')
    return text == "true"
