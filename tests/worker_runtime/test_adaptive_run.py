"""ElasticRun with and without the adaptive batch, in one process (world size 1)."""

from __future__ import annotations

import itertools
import math
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from torch.utils.data import DataLoader

from worker_runtime import ConfigError, ElasticRun, ElasticSampler
from worker_runtime.adascale import gain

LABELS = {"volcano_job": "train", "namespace": "ml", "pod": "train-worker-0"}
ENV = {"VOLCANO_JOB_NAME": "train", "POD_NAMESPACE": "ml", "POD_NAME": "train-worker-0"}
ADAPTIVE_ENV = ENV | {
    "TIDE_ADAPTIVE_BATCH": "true",
    "TIDE_INITIAL_BATCH_SIZE": "8",
    "TIDE_MAX_BATCH_SIZE": "64",
    "TIDE_LOCAL_BATCH_MIN": "4",
    "TIDE_LOCAL_BATCH_MAX": "32",
    "TIDE_ACCUMULATION": "true",
}
DATASET = 384
# The metric families a job that does not opt in exports (the worker metrics before this
# feature): opting out must not add one.
PLAIN_METRICS = {
    "tide_worker_samples",
    "tide_worker_steps",
    "tide_worker_step_seconds",
    "tide_worker_world_size",
    "tide_worker_nodes",
    "tide_worker_checkpoint_blocked_seconds",
    "tide_worker_checkpoint_save_seconds",
    "tide_worker_checkpoint_load_seconds",
    "tide_worker_restarts",
    "tide_worker_rescales",
    "tide_worker_checkpoint_write_overlap_steps",
    "tide_worker_samples_lost",
    "tide_worker_consumed_samples",
    "tide_worker_planned_samples",
}
ADAPTIVE_METRICS = {
    "tide_worker_optim_step_seconds",
    "tide_worker_accumulation_step_seconds",
    "tide_worker_sync_seconds",
    "tide_worker_grad_sqr",
    "tide_worker_grad_var",
    "tide_worker_initial_batch_size",
    "tide_worker_max_batch_size",
    "tide_worker_batch_size",
    "tide_worker_local_batch_size",
    "tide_worker_accumulation_steps",
    "tide_worker_local_batch_min",
    "tide_worker_local_batch_max",
    "tide_worker_statistical_efficiency",
    "tide_worker_progress",
    "tide_worker_planned_progress",
}


def noisy_data() -> tuple[torch.Tensor, torch.Tensor]:
    # Labels with much noise: the gradient noise grows as the fit improves, so the run grows its
    # batch.
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(DATASET, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 3.0 * torch.randn(DATASET, 1, generator=gen)
    return x, y


class ComputeClock:
    """The clock the adaptive tests measure step times with: it moves only when the training loop
    says a micro batch was computed, by ``FIXED_S + PER_SAMPLE_S x samples``.

    The measured times, and so the batch the run chooses from them, are then the same on every
    machine at any load; with the real clock a test that needs the batch to change failed when
    the load made the step times noisy.
    """

    FIXED_S = 0.01  # launching a micro batch: larger ones pay it less often per sample
    PER_SAMPLE_S = 0.0002

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def compute(self, samples: int) -> None:
        self.now_s += self.FIXED_S + self.PER_SAMPLE_S * samples


def families(registry: CollectorRegistry) -> set[str]:
    return {m.name for m in registry.collect()}


StepHook = Callable[[ElasticRun, torch.optim.Optimizer], None]


def train(
    run: ElasticRun,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    loader: Any,
    before_step: StepHook | None = None,
    sigterm_at_step: int | None = None,
    epochs_of_steps: list[int] | None = None,
    clock: ComputeClock | None = None,
) -> list[list[int]]:
    """Train; returns the indices of every step (and their epochs in ``epochs_of_steps``)."""
    x, y = noisy_data()
    steps: list[list[int]] = []
    for epoch in run.epochs(epochs):
        for batches in run.steps(loader):
            seen: list[int] = []
            for idx in batches:
                seen += idx.tolist()
                if clock is not None:
                    clock.compute(len(idx))
                loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx]) * run.loss_scale
                loss.backward()
            if before_step is not None:
                before_step(run, optimizer)
            optimizer.step()
            optimizer.zero_grad()
            steps.append(seen)
            if epochs_of_steps is not None:
                epochs_of_steps.append(epoch)
            if run.step + 1 == sigterm_at_step:
                os.kill(os.getpid(), signal.SIGTERM)
    return steps


def make(
    tmp_path: Path, env: dict[str, str], *, adam: bool = False, **kwargs: Any
) -> tuple[ElasticRun, torch.nn.Module, torch.optim.Optimizer, CollectorRegistry]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer: torch.optim.Optimizer = (
        torch.optim.Adam(model.parameters(), lr=0.01)
        if adam
        else torch.optim.SGD(model.parameters(), lr=0.01)
    )
    registry = CollectorRegistry()
    settings: dict[str, Any] = {"micro_batch_size": 4, "global_batch_size": 8}
    settings.update(kwargs)
    run = ElasticRun(
        checkpoint_dir=tmp_path,
        model=model,
        optimizer=optimizer,
        registry=registry,
        environ=env,
        checkpoint_every_steps=None,
        **settings,
    )
    return run, model, optimizer, registry


def test_a_job_that_does_not_opt_in_trains_exactly_as_a_plain_loop(tmp_path: Path) -> None:
    run, model, optimizer, registry = make(tmp_path, ENV)
    lrs: list[float] = []
    with run:
        loader = DataLoader(range(DATASET), batch_size=4, sampler=run.make_sampler(range(DATASET)))
        steps = train(
            run,
            model,
            optimizer,
            epochs=2,
            loader=loader,
            before_step=lambda r, o: lrs.append(o.param_groups[0]["lr"]),
        )
    # Same samples: the sampler's order, 8 per step, each once per epoch.
    orders = []
    for epoch in range(2):
        sampler = ElasticSampler(range(DATASET), rank=0, world_size=1, seed=0)
        sampler.set_position(epoch=epoch, consumed_samples=0)
        orders += sampler.order()
    assert [i for s in steps for i in s] == orders
    assert {len(s) for s in steps} == {8}
    # Same learning rate: untouched.
    assert set(lrs) == {0.01}
    # Same metrics: today's families, none of the adaptive ones.
    assert families(registry) == PLAIN_METRICS
    assert run.progress is None
    # Same training: the parameters a plain loop over the same batches reaches.
    torch.manual_seed(0)
    reference = torch.nn.Linear(8, 1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.01)
    x, y = noisy_data()
    for indices in steps:
        for half in (indices[:4], indices[4:]):
            idx = torch.tensor(half)
            (torch.nn.functional.mse_loss(reference(x[idx]), y[idx]) * 0.5).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def adaptive_loader(run: ElasticRun) -> DataLoader[Any]:
    return DataLoader(range(DATASET), batch_sampler=run.make_batch_sampler(range(DATASET)))


def test_adaptive_sgd_lr_follows_adascale_and_every_sample_is_seen_once(tmp_path: Path) -> None:
    clock = ComputeClock()
    run, model, optimizer, registry = make(
        tmp_path, ADAPTIVE_ENV, rechoose_every_steps=5, clock=clock
    )
    records: list[tuple[float, float, float, float, float]] = []

    def record(r: ElasticRun, o: torch.optim.Optimizer) -> None:
        a = r.adaptive
        assert a is not None
        records.append(
            (o.param_groups[0]["lr"], a.stats.grad_sqr, a.stats.grad_var, a.scale, a.progress)
        )

    epochs: list[int] = []
    with run:
        steps = train(
            run,
            model,
            optimizer,
            epochs=2,
            loader=adaptive_loader(run),
            before_step=record,
            epochs_of_steps=epochs,
            clock=clock,
        )
    batches = [len(s) for s in steps]
    assert len(set(batches)) > 1, batches  # the batch changed without a restart
    # Every sample at most once per epoch, whatever the batch (the position is kept in samples),
    # and all but the tail that does not make a whole step.
    for epoch in (0, 1):
        samples = [i for s, e in zip(steps, epochs, strict=True) if e == epoch for i in s]
        assert len(samples) == len(set(samples))
        assert DATASET - len(samples) < max(batches)
    # SGD: lr = base x gain(grad_sqr, grad_var, scale) at every step with statistics.
    progress = 0.0
    for lr, sqr, var, scale, before in records:
        assert before == pytest.approx(progress)
        g = 1.0 if math.isnan(sqr) else gain(grad_sqr=sqr, grad_var=var, scale=scale)
        assert lr == pytest.approx(0.01 * g)
        progress += g
    assert run.progress == pytest.approx(progress)
    assert max(scale for *_, scale, _ in records) > 1  # some steps at a larger batch
    assert families(registry) == PLAIN_METRICS | ADAPTIVE_METRICS
    value = registry.get_sample_value
    assert value("tide_worker_batch_size", LABELS) == run.plan.global_batch_size
    assert value("tide_worker_progress", LABELS) == pytest.approx(progress)
    assert value("tide_worker_planned_progress", LABELS) == pytest.approx(2 * DATASET / 8)
    assert value("tide_worker_grad_var", LABELS) == pytest.approx(run.adaptive.stats.grad_var)  # type: ignore[union-attr]
    assert value("tide_worker_local_batch_max", LABELS) == 32
    shape = LABELS | {"nodes": "1", "replicas": "1", "local_batch": "4"}
    assert value("tide_worker_optim_step_seconds_count", shape)
    # Every step was timed with the injected clock, which moved only inside steps.
    assert value("tide_worker_step_seconds_sum", LABELS) == pytest.approx(clock.now_s)


def test_the_lr_schedule_is_keyed_on_progress(tmp_path: Path) -> None:
    def halve_after_20(progress: float) -> float:
        return 0.5 if progress >= 20 else 1.0

    clock = ComputeClock()
    run, model, optimizer, _ = make(
        tmp_path, ADAPTIVE_ENV, rechoose_every_steps=5, lr_schedule=halve_after_20, clock=clock
    )
    records: list[tuple[float, float, float]] = []

    def record(r: ElasticRun, o: torch.optim.Optimizer) -> None:
        assert r.adaptive is not None
        records.append((o.param_groups[0]["lr"], r.adaptive.progress, r.adaptive.last_gain))

    with run:
        train(
            run,
            model,
            optimizer,
            epochs=1,
            loader=adaptive_loader(run),
            before_step=record,
            clock=clock,
        )
    assert any(p >= 20 for _, p, _ in records) and any(p < 20 for _, p, _ in records)
    for lr, progress, g in records:
        assert lr == pytest.approx(0.01 * g * halve_after_20(progress))


def test_adaptive_adam_lr_is_the_root_of_the_scale_and_its_state_restarts(tmp_path: Path) -> None:
    clock = ComputeClock()
    run, model, optimizer, _ = make(
        tmp_path, ADAPTIVE_ENV, adam=True, rechoose_every_steps=5, clock=clock
    )
    records: list[tuple[float, float, int]] = []

    def record(r: ElasticRun, o: torch.optim.Optimizer) -> None:
        assert r.adaptive is not None
        state = o.state.get(next(iter(model.parameters())), {})
        records.append((o.param_groups[0]["lr"], r.adaptive.scale, int(state.get("step", 0))))

    with run:
        train(
            run,
            model,
            optimizer,
            epochs=1,
            loader=adaptive_loader(run),
            before_step=record,
            clock=clock,
        )
    scales = [s for _, s, _ in records]
    # The measured times (ComputeClock) make the run grow its batch at least twice, so the
    # restart of Adam's state is checked after more than one change.
    assert sum(a != b for a, b in itertools.pairwise(scales)) >= 2, scales
    for lr, scale, _ in records:
        assert lr == pytest.approx(0.01 * math.sqrt(scale))
    # Adam's step count restarts at every change of scale (0 before the optimizer's step).
    expected_step = 0
    for i, (_, scale, step) in enumerate(records):
        if i > 0 and scale != records[i - 1][1]:
            expected_step = 0
        assert step == expected_step, (i, records[max(0, i - 2) : i + 1])
        expected_step += 1


def test_adaptive_state_survives_a_restart(tmp_path: Path) -> None:
    run, model, optimizer, _ = make(tmp_path, ADAPTIVE_ENV, rechoose_every_steps=5)
    with pytest.raises(SystemExit), run:
        train(run, model, optimizer, epochs=1, loader=adaptive_loader(run), sigterm_at_step=20)
    assert run.adaptive is not None
    saved = (run.adaptive.progress, run.adaptive.stats, run.step)
    again, _, _, _ = make(tmp_path, ADAPTIVE_ENV, rechoose_every_steps=5)
    with again:
        assert again.adaptive is not None
        assert (again.adaptive.progress, again.adaptive.stats, again.step) == saved
        assert again.adaptive.base_lrs == [0.01]  # not the last scaled rate


def test_measured_steps_keep_their_sync_and_older_states_still_choose(tmp_path: Path) -> None:
    run, model, optimizer, _ = make(tmp_path, ADAPTIVE_ENV, rechoose_every_steps=5)
    with pytest.raises(SystemExit), run:
        train(run, model, optimizer, epochs=1, loader=adaptive_loader(run), sigterm_at_step=20)
    assert run.adaptive is not None
    kept = [m for v in run.adaptive.measured.values() for m in v]
    # [local batch, micro batches, step s, sync s]: one worker times no all-reduce (NaN).
    assert kept and all(len(m) == 4 and math.isnan(m[3]) for m in kept)
    again, _, _, _ = make(tmp_path, ADAPTIVE_ENV, rechoose_every_steps=5)
    with again:
        assert again.adaptive is not None
        # A state saved before syncs were kept has three entries per step: still a choice.
        again.adaptive.measured = {
            k: [m[:3] for m in v] for k, v in again.adaptive.measured.items()
        }
        assert again.adaptive.rechoose() in again.adaptive.options


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scheduler": "step"}, "scheduler: the adaptive batch"),
        ({"optimizer": "lbfgs"}, "optimizer: adaptive batch supports SGD and Adam-like"),
    ],
    ids=["scheduler", "unsupported-optimizer"],
)
def test_adaptive_refuses_what_it_cannot_drive(
    tmp_path: Path, kwargs: dict[str, str], message: str
) -> None:
    model = torch.nn.Linear(8, 1)
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if kwargs.get("optimizer") == "lbfgs":
        optimizer = torch.optim.LBFGS(model.parameters())
    scheduler = (
        torch.optim.lr_scheduler.StepLR(optimizer, step_size=1) if "scheduler" in kwargs else None
    )
    with pytest.raises(ConfigError, match=message):
        ElasticRun(
            checkpoint_dir=tmp_path,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            micro_batch_size=4,
            environ=ADAPTIVE_ENV,
        )


def test_adaptive_refuses_a_loader_with_a_fixed_batch_size(tmp_path: Path) -> None:
    run, model, optimizer, _ = make(tmp_path, ADAPTIVE_ENV)
    with run:
        loader = DataLoader(range(DATASET), batch_size=4, sampler=run.make_sampler(range(DATASET)))
        with pytest.raises(ConfigError, match=r"batch_sampler=run\.make_batch_sampler"):
            train(run, model, optimizer, epochs=1, loader=loader)


def test_no_batch_fits_the_bounds_at_this_world_size(tmp_path: Path) -> None:
    env = ADAPTIVE_ENV | {"WORLD_SIZE": "32", "RANK": "0", "TIDE_LOCAL_BATCH_MIN": "4"}
    with pytest.raises(
        ConfigError, match=r"no global batch in \[8, 64\] splits over world_size=32"
    ):
        make(tmp_path, env)
