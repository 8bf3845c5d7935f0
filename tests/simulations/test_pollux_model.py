"""Pollux's application model, rule by rule, on hand-computed cases and on its measured traces."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simulations.errors import TraceError
from simulations.pollux import application_profile, load_pollux_workload
from simulations.pollux_model import (
    StepPlan,
    application_table,
    iteration_rate_per_s,
    iteration_time_s,
    packed_placement,
    placement_id,
    step_plan,
    training_iterations,
)

SHARED_TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
POLLUX_TRACES = SHARED_TRACES / "pollux-osdi21" / "traces"
needs_pollux = pytest.mark.skipif(
    not POLLUX_TRACES.exists(), reason=f"shared Pollux traces absent at {POLLUX_TRACES}"
)

# A toy application: placements "1", "4" and "14" (4 GPUs + 1 GPU) measured at local batch 4 and
# 8, one scalability row, validated at global batch 8 and 40.
TOY_PLACEMENTS = (
    "placement,local_bsz,step_time,sync_time\n"
    "1,4,1.0,0.0\n1,8,1.5,0.0\n"
    "4,4,1.2,0.2\n4,8,1.7,0.2\n"
    "14,4,2.0,1.0\n14,8,3.0,1.0\n"
)
TOY_SCALABILITY = "num_nodes,num_replicas,local_bsz,step_time,sync_time\n2,8,4,2.5,1.5\n"


def write_app(
    traces: Path, app: str, *, batches: tuple[int, ...] = (8, 40), epochs: int = 2
) -> None:
    """Write a toy application folder under ``traces``."""
    base = traces / app
    base.mkdir(parents=True)
    (base / "placements.csv").write_text(TOY_PLACEMENTS)
    (base / "scalability.csv").write_text(TOY_SCALABILITY)
    for b in batches:  # gain 1 (no gradient noise): the work is the progress
        rows = "".join(f"{100 * (e + 1)},{100 * (e + 1)},1,0\n" for e in range(epochs))
        (base / f"validation-{b}.csv").write_text("progress,iteration,grad_sqr,grad_var\n" + rows)


@pytest.mark.parametrize(
    ("batch", "replicas", "init", "max_batch", "max_local", "plan"),
    [
        # local = ceil(384/6) = 64; accum = ceil(64/12) - 1 = 5; atomic = ceil(64/6) = 11,
        # capped at int(384 / (6 x 6)) = 10.
        (384, 6, 12, 384, 12, StepPlan(accum_steps=5, atomic_bsz=10)),
        # yolov3 at Pollux's cap 8: local 16 -> one extra micro-step of 8.
        (64, 4, 8, 512, 8, StepPlan(accum_steps=1, atomic_bsz=8)),
        # the same job with the measured 16: no accumulation.
        (64, 4, 8, 512, 16, StepPlan(accum_steps=0, atomic_bsz=16)),
        # one replica above the initial batch always accumulates at least once.
        (32768, 1, 256, 32768, 32768, StepPlan(accum_steps=1, atomic_bsz=16384)),
        # one replica at the initial batch does not.
        (256, 1, 256, 32768, 32768, StepPlan(accum_steps=0, atomic_bsz=256)),
        # ceil(2048/6) = 342 fits in 1024: no accumulation.
        (2048, 6, 128, 4096, 1024, StepPlan(accum_steps=0, atomic_bsz=342)),
    ],
    ids=[
        "bert-384-on-6",
        "yolov3-capped-at-8",
        "yolov3-uncapped",
        "one-replica-accumulates",
        "one-replica-at-init-batch",
        "fits-without-accumulation",
    ],
)
def test_step_plan_follows_pollux(
    batch: int, replicas: int, init: int, max_batch: int, max_local: int, plan: StepPlan
) -> None:
    got = step_plan(
        batch_size=batch,
        replicas=replicas,
        init_batch_size=init,
        max_batch_size=max_batch,
        max_local_bsz=max_local,
    )
    assert got == plan


@pytest.mark.parametrize(
    ("step", "sync", "accum", "seconds"),
    [(2.0, 1.5, 0, 2.0), (2.0, 1.5, 5, 4.5), (1.0, 0.0, 3, 4.0)],
    ids=["no-accumulation", "sync-paid-once-over-6-micro-steps", "no-sync-time"],
)
def test_synchronisation_is_paid_once_per_optimizer_step(
    step: float, sync: float, accum: int, seconds: float
) -> None:
    assert iteration_time_s(step_s=step, sync_s=sync, accum_steps=accum) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("placement", "name"),
    [((4, 1), "14"), ((4, 2), "24"), ((4, 4, 2), "244"), ((2, 4, 4), "244"), ((4,), "4"),
     ((3, 1, 3, 1), "1313"), ((0, 4, 1), "14")],
    ids=["5-gpus", "6-gpus", "10-gpus", "already-smallest", "one-node", "repeating", "empty-node"],
)  # fmt: skip
def test_placement_id_is_the_smallest_rotation(placement: tuple[int, ...], name: str) -> None:
    assert placement_id(placement) == name


def test_placement_id_rejects_what_digits_cannot_name() -> None:
    with pytest.raises(ValueError, match="placement"):
        placement_id((0, 0))
    with pytest.raises(ValueError, match="placement"):
        placement_id((12,))


@pytest.mark.parametrize(
    ("batch", "replicas", "seconds"),
    [
        # local 8 fits; "14" measured at 8: step 3.0.
        (40, 5, 3.0),
        # local 40 -> 4 extra micro-steps of 8 on "1": 1.5 + 4 x (1.5 - 0) = 7.5.
        (40, 1, 7.5),
        # local 10 -> 1 extra micro-step of 5 on "4": step 1.325, sync 0.2: 1.325 + 1.125.
        (40, 4, 2.45),
        # one replica at the initial batch: 1.5.
        (8, 1, 1.5),
    ],
    ids=["measured-14", "accumulate-on-one", "accumulate-interpolated", "init-batch"],
)
def test_toy_rates_are_hand_computed(
    tmp_path: Path, batch: int, replicas: int, seconds: float
) -> None:
    write_app(tmp_path, "toy")
    table = application_table(tmp_path, "toy")
    rate = iteration_rate_per_s(table, batch_size=batch, replicas=replicas, gpus_per_node=4)
    assert rate == pytest.approx(1.0 / seconds)
    assert application_profile(tmp_path, "toy", batch).rate(replicas) == pytest.approx(rate)


def test_toy_size_below_the_smallest_local_batch_holds_the_previous_rate(tmp_path: Path) -> None:
    write_app(tmp_path, "toy")
    table = application_table(tmp_path, "toy")
    # 40 on 20 replicas is local batch 2, below the measured 4: Pollux never runs it.
    assert math.isnan(iteration_rate_per_s(table, batch_size=40, replicas=20, gpus_per_node=4))
    profile = application_profile(tmp_path, "toy", 40)
    assert profile.rate(20) == profile.rate(19)


def test_yolov3_local_batch_is_capped_at_8(tmp_path: Path) -> None:
    body = "placement,local_bsz,step_time,sync_time\n1,4,1.0,0.0\n1,16,2.0,0.0\n"
    for app in ("yolov3", "other"):
        write_app(tmp_path, app)
        (tmp_path / app / "placements.csv").write_text(body)
    assert application_table(tmp_path, "yolov3").max_local_bsz == 8
    assert application_table(tmp_path, "other").max_local_bsz == 16


def test_ncf_is_pinned_to_one_replica_at_batch_32768(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_app(traces, "ncf", batches=(256, 32768), epochs=10)
    workload = tmp_path / "w.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\nncf-0,0,ncf,4,1024\n")
    (job,) = load_pollux_workload(workload, traces_dir=traces).jobs
    assert (job.min_replicas, job.max_replicas, job.requested_replicas) == (1, 1, 1)
    assert job.profile.samples_per_unit == 32768
    assert job.work_units == 1000  # 10 epochs of 100 progress, gain 1


def test_work_is_pollux_progress_over_the_gain(tmp_path: Path) -> None:
    base = tmp_path / "toy"
    base.mkdir()
    head = "progress,iteration,grad_sqr,grad_var\n"
    (base / "validation-8.csv").write_text(head + "100,100,1,4\n200,200,1,4\n")
    # Batch 40 made less progress by epoch 1 (90): epoch 1 ends there; by epoch 2, batch 8 made
    # less (200). At batch 40 (scale 5) with sqr 1, var 4 a step gains (4+1)/(4/5+1) = 25/9:
    # (90 + 110) x 9/25 = 72 steps (its own file says 130).
    (base / "validation-40.csv").write_text(head + "90,60,1,4\n210,130,1,4\n")
    assert training_iterations(tmp_path, "toy", 40, 2) == pytest.approx(72.0)
    # At the initial batch the gain is 1: 200 steps.
    assert training_iterations(tmp_path, "toy", 8, 2) == pytest.approx(200.0)
    with pytest.raises(TraceError, match="fewer than 3 epochs"):
        training_iterations(tmp_path, "toy", 40, 3)
    with pytest.raises(TraceError, match="no such validated batch"):
        training_iterations(tmp_path, "toy", 16, 2)


@needs_pollux
def test_every_measured_size_reads_its_measured_packed_placement() -> None:
    for app in ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"):
        table = application_table(POLLUX_TRACES, app)
        for n in range(1, 17):
            placement = packed_placement(n, gpus_per_node=4)
            rows = table.by_placement.get(placement_id(placement))
            assert rows, f"{app}: {n} GPUs ({placement}) not measured"
            for local, step, sync in rows:
                got = table.step_and_sync_s(placement, local)
                assert got == pytest.approx((step, sync), rel=1e-12), (app, n, local)


@needs_pollux
def test_bert_at_384_on_6_gpus_runs_at_pollux_speed() -> None:
    # Pollux's model: 384 / (2.385 + 5 x (2.385 - 1.642)) = 63 samples/s (tide used to say 26).
    profile = application_profile(POLLUX_TRACES, "bert", 384)
    assert profile.rate(6) * profile.samples_per_unit == pytest.approx(63.0, abs=0.5)
