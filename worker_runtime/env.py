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
