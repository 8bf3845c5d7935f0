"""tide's worker runtime: restarts caused by rescaling a torchrun job lose nothing.

See :class:`ElasticRun` for the training-loop API; torch is imported only in this package.
"""

from worker_runtime.batching import BatchPlan, ScalingMode, plan_batch
from worker_runtime.checkpoint import AsyncCheckpointer, SaveResult
from worker_runtime.device import Placement
from worker_runtime.env import AdaptiveBatchSettings, WorkerEnv
from worker_runtime.errors import (
    BatchConfigError,
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    WorkerRuntimeError,
)
from worker_runtime.metrics import WorkerMetrics
from worker_runtime.resume import Position, ResumeInfo
from worker_runtime.run import EXIT_CODE_TERMINATED, ElasticRun
from worker_runtime.sampler import ElasticBatchSampler, ElasticSampler
from worker_runtime.storage import CheckpointManifest, CheckpointStore

__all__ = [
    "EXIT_CODE_TERMINATED",
    "AdaptiveBatchSettings",
    "AsyncCheckpointer",
    "BatchConfigError",
    "BatchPlan",
    "CheckpointError",
    "CheckpointManifest",
    "CheckpointStore",
    "ConfigError",
    "CorruptCheckpointError",
    "ElasticBatchSampler",
    "ElasticRun",
    "ElasticSampler",
    "Placement",
    "Position",
    "ResumeInfo",
    "SaveResult",
    "ScalingMode",
    "WorkerEnv",
    "WorkerMetrics",
    "WorkerRuntimeError",
    "plan_batch",
]
