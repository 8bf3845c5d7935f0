"""ElasticRun in one process (world size 1): SIGTERM save, resume, metrics, learning rate."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import DataLoader

from worker_runtime import ElasticRun, ScalingMode

LABELS = {"volcano_job": "train", "namespace": "ml", "pod": "train-worker-0"}
ENV = {
    "VOLCANO_JOB_NAME": "train",
    "POD_NAMESPACE": "ml",
    "POD_NAME": "train-worker-0",
    "LOCAL_WORLD_SIZE": "1",
}


def make_run(
    ckpt: Path, registry: CollectorRegistry, **kwargs: object
) -> tuple[ElasticRun, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings: dict[str, object] = {
        "micro_batch_size": 2,
        "global_batch_size": 4,
        "checkpoint_every_steps": 2,
    }
    settings.update(kwargs)
    run = ElasticRun(
        checkpoint_dir=ckpt,
        model=model,
        optimizer=optimizer,
        registry=registry,
        environ=ENV,
        **settings,  # type: ignore[arg-type]
    )
    return run, optimizer


def train(
    run: ElasticRun,
    seen: list[int],
    *,
    sigterm_at_step: int | None = None,
    crash_after_step: int | None = None,
) -> None:
    data = torch.arange(40, dtype=torch.float32).reshape(20, 2).repeat(1, 2)
    loader = DataLoader(list(range(20)), batch_size=2, sampler=run.make_sampler(range(20)))
    for _ in run.epochs(1):
        for batches in run.steps(loader):
            for idx in batches:
                seen += idx.tolist()
                run.state.model(data[idx]).sum().backward()
            run.state.optimizer.step()
            if run.step == crash_after_step:
                raise RuntimeError("crash")
            if run.step + 1 == sigterm_at_step:
                os.kill(os.getpid(), signal.SIGTERM)


def value(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, LABELS)


def test_sigterm_saves_exits_143_and_resumes_with_metrics(tmp_path: Path) -> None:
    first = CollectorRegistry()
    run, _ = make_run(tmp_path, first)
    seen: list[int] = []
    with pytest.raises(SystemExit) as exit_info, run:
        train(run, seen, sigterm_at_step=3)
    assert exit_info.value.code == 143
    assert run.store.tracked_step() == 3
    assert value(first, "tide_worker_steps_total") == 3
    assert value(first, "tide_worker_samples_total") == 12
    assert value(first, "tide_worker_step_seconds_count") == 3
    assert value(first, "tide_worker_world_size") == 1
    assert value(first, "tide_worker_checkpoint_blocked_seconds_count") == 2  # steps 2 and 3

    second = CollectorRegistry()
    resumed, _ = make_run(tmp_path, second)
    with resumed:
        assert resumed.resume_info is not None and resumed.resume_info.resumed
        assert (resumed.resume_info.step, resumed.resume_info.lost_steps) == (3, 0)
        train(resumed, seen)
    assert sorted(seen) == list(range(20))
    assert value(second, "tide_worker_steps_total") == 5
    assert value(second, "tide_worker_restarts_total") == 1
    assert value(second, "tide_worker_rescales_total") == 0
    assert value(second, "tide_worker_samples_lost_total") == 0
    assert value(second, "tide_worker_checkpoint_load_seconds") is not None


def test_crash_between_checkpoints_counts_lost_samples(tmp_path: Path) -> None:
    run, _ = make_run(tmp_path, CollectorRegistry(), checkpoint_every_steps=2)
    with pytest.raises(RuntimeError, match="crash"), run:
        train(run, [], crash_after_step=3)  # steps 1-3 completed, checkpoint at step 2
    registry = CollectorRegistry()
    again, _ = make_run(tmp_path, registry)
    with again:
        assert again.resume_info is not None
        info = again.resume_info
        assert (info.step, info.lost_steps, info.lost_samples) == (2, 1, 4)
    assert value(registry, "tide_worker_samples_lost_total") == 4
    assert value(registry, "tide_worker_restarts_total") == 1


@pytest.mark.parametrize(
    ("scaling", "base_world_size", "lr"),
    [
        (ScalingMode.FIXED_GLOBAL_BATCH, None, 0.1),
        (ScalingMode.LINEAR_LR, 4, 0.025),
        (ScalingMode.SQRT_LR, 4, 0.05),
    ],
    ids=["fixed-batch-keeps-lr", "linear", "sqrt"],
)
def test_learning_rate_follows_the_mode(
    tmp_path: Path, scaling: ScalingMode, base_world_size: int | None, lr: float
) -> None:
    run, optimizer = make_run(
        tmp_path, CollectorRegistry(), scaling=scaling, base_world_size=base_world_size
    )
    with run:
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr)
