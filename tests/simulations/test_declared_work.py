"""Remaining work reaches the engine as production would know it: only for jobs that declare
their planned samples (planned minus consumed), never for the others, none when a run hides it."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from scheduler_policy.vocabulary.state import JobKey
from simulations.cluster import MetricsOptions, SimulatedCluster
from simulations.errors import TraceError
from simulations.pollux import load_pollux_workload
from simulations.report import policy_label, remaining_work_known_share
from simulations.run import RunOptions
from simulations.trace_rows import TraceRow, read_trace_row, write_tide_trace
from simulations.traces import load_tide_trace
from simulations.volcano import run_session
from simulations.workload import Workload, generate_workload
from tests.simulations.helpers import make_cluster, make_job

POLLUX = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "pollux-osdi21"


def _sim(*, declares: tuple[bool, ...], declared_work: bool = True) -> SimulatedCluster:
    jobs = [
        dataclasses.replace(
            make_job(f"j{i}", replicas=1, min_r=1, max_r=2, work=1000.0, ckpt_s=60.0),
            declares_planned_samples=d,
        )
        for i, d in enumerate(declares)
    ]
    sim = SimulatedCluster(
        spec=make_cluster(gpus=4),
        workload=Workload("t", tuple(jobs)),
        metrics=MetricsOptions(throughput_noise=0.0, declared_work=declared_work),
    )
    for job in sim.order:
        sim.submit(job)
    run_session(sim)
    return sim


@pytest.mark.parametrize(
    ("declares", "declared_work", "reported"),
    [
        ((True, False), True, {"ns/j0"}),
        ((False, False), True, set()),
        ((True, True), True, {"ns/j0", "ns/j1"}),
        ((True, True), False, set()),
    ],
    ids=[
        "only-the-declaring-job",
        "no-job-declares",
        "every-job-declares",
        "run-hides-declared-work",
    ],
)
def test_remaining_samples_only_for_declaring_jobs(
    declares: tuple[bool, ...], declared_work: bool, reported: set[str]
) -> None:
    sim = _sim(declares=declares, declared_work=declared_work)
    sim.advance(100.0)
    sample = sim.sample(now_s=100.0)
    assert set(sample.job_remaining_samples) == reported
    assert set(sample.job_throughput) == {"ns/j0", "ns/j1"}  # throughput is always measured


def test_remaining_is_planned_minus_consumed_and_regains_what_a_kill_lost() -> None:
    sim = _sim(declares=(True,))
    job = sim.jobs[JobKey("ns/j0")]
    sim.advance(130.0)  # 1 unit/s, checkpoints every 60 s: 10 s since the last one
    assert sim.sample(now_s=130.0).job_remaining_samples["ns/j0"] == pytest.approx(870.0)
    sim.remove_pods(job, 1, graceful=False)  # an abrupt kill: back to its checkpoint
    assert sim.sample(now_s=130.0).job_remaining_samples == {}  # no longer running
    assert job.done_units == pytest.approx(120.0)
    run_session(sim)
    assert sim.sample(now_s=130.0).job_remaining_samples["ns/j0"] == pytest.approx(880.0)


def test_the_engine_sees_when_a_job_first_ran() -> None:
    sim = _sim(declares=(False,))
    sim.advance(50.0)
    (view,) = sim.list_jobs()
    assert view.running_since_s == 0.0 and view.remaining_samples is None


@pytest.mark.parametrize(
    ("share", "expected"),
    [(0.0, 0.0), (1.0, 1.0)],
    ids=["none-declare", "all-declare"],
)
def test_generator_declares_for_the_share_asked(share: float, expected: float) -> None:
    workload = generate_workload(seed=3, declared_share=share)
    assert remaining_work_known_share(workload, RunOptions()) == expected


def test_generator_default_share_is_about_half_and_changes_no_other_draw() -> None:
    default = generate_workload(seed=3)
    none = generate_workload(seed=3, declared_share=0.0)
    share = remaining_work_known_share(default, RunOptions())
    assert 0.3 < share < 0.7
    strip = [dataclasses.replace(j, declares_planned_samples=False) for j in default.jobs]
    assert tuple(strip) == none.jobs


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan], ids=["negative", "above-one", "nan"])
def test_generator_refuses_a_share_outside_zero_one(bad: float) -> None:
    with pytest.raises(ValueError, match=re.escape("declared_share must be in [0, 1]")):
        generate_workload(seed=0, declared_share=bad)


def test_a_run_that_hides_declared_work_knows_none() -> None:
    workload = generate_workload(seed=3, declared_share=1.0)
    hidden = RunOptions(metrics=MetricsOptions(declared_work=False))
    assert remaining_work_known_share(workload, hidden) == 0.0
    fixed_only = Workload("f", tuple(j for j in workload.jobs if not j.elastic))
    assert math.isnan(remaining_work_known_share(fixed_only, RunOptions()))


HEADER = "job_id,submit_s,replicas,duration_s,elastic,min_replicas,max_replicas"


@pytest.mark.parametrize(
    ("column", "declares"),
    [("", False), (",true", True), (",false", False), (",1", True), (",", False)],
    ids=["column-absent", "true", "false", "one", "empty-cell"],
)
def test_tide_trace_declares_only_where_its_column_says(column: str, declares: bool) -> None:
    header = HEADER + (",declares_planned_samples" if column else "")
    row = dict(zip(header.split(","), ("ns/a,0,2,600,true,1,4" + column).split(","), strict=True))
    assert read_trace_row(row).workload_job(source="t").declares_planned_samples is declares


def test_a_bad_declares_value_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        f"{HEADER},declares_planned_samples\nns/a,0,2,600,true,1,4,yes\nns/b,0,2,600,true,1,4,maybe\n"
    )
    with pytest.raises(
        TraceError, match=re.escape("declares_planned_samples must be true or false")
    ) as info:
        load_tide_trace(path)
    assert info.value.line == 3 and str(path) in str(info.value)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"], ids=["csv", "jsonl"])
def test_declares_survives_a_write_and_read(tmp_path: Path, suffix: str) -> None:
    rows = [
        TraceRow(job_id="ns/a", submit_s=0.0, replicas=2, duration_s=600.0, elastic=True,
                 min_replicas=1, max_replicas=4, declares_planned_samples=True),
        TraceRow(job_id="ns/b", submit_s=5.0, replicas=2, duration_s=600.0, elastic=True,
                 min_replicas=1, max_replicas=4),
    ]  # fmt: skip
    path = tmp_path / f"t{suffix}"
    write_tide_trace(path, rows)
    jobs = load_tide_trace(path).jobs
    assert [j.declares_planned_samples for j in jobs] == [True, False]


@pytest.mark.skipif(not POLLUX.exists(), reason=f"shared Pollux traces absent at {POLLUX}")
def test_pollux_jobs_declare_their_fixed_epochs() -> None:
    path = POLLUX / "workloads" / "workload-1.csv"
    workload = load_pollux_workload(path, traces_dir=POLLUX / "traces")
    assert remaining_work_known_share(workload, RunOptions()) == 1.0


@pytest.mark.parametrize(
    ("policy", "label"),
    [("optimus", "optimus (oracle)"), ("tide", "tide"), ("static", "static")],
    ids=["oracle-says-so", "tide", "baseline"],
)
def test_tables_label_the_oracle(policy: str, label: str) -> None:
    assert policy_label(policy) == label
