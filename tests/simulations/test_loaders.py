"""Trace loaders on small files made here, and on the shared public traces when present."""

from __future__ import annotations

import io
import math
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from simulations.api import detect_format, load_workload
from simulations.cluster_config import BUILTIN_CLUSTER, load_cluster
from simulations.errors import ClusterFileError, SimulationError, TraceError
from simulations.pollux import load_pollux_workload
from simulations.traces import load_itp, load_philly, load_tide_trace
from simulations.workload import Workload, _clipped_lognormal_mean, generate_workload

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
POLLUX = SHARED / "pollux-osdi21"
ITP = SHARED / "elasticflow-itp" / "raw-traces.tar.gz"
TIDE_HEADER = (
    "job_id,submit_s,queue,elastic,replicas,min_replicas,max_replicas,duration_s,job_type\n"
)


@pytest.mark.parametrize(
    ("body", "bad_line", "message"),
    [
        (
            "a,0,research,true,2,1,4,600,vision-cnn\nb,5,research,true,2,3,4,600,vision-cnn\n",
            3,
            "min_replicas",
        ),
        ("a,0,research,true,2,1,4,-1,vision-cnn\n", 2, "duration_s"),
        ("a,0,research,maybe,2,1,4,600,vision-cnn\n", 2, "elastic"),
        ("a,0,research,true,2,1,4,600,gpt9\n", 2, "unknown job type"),
        ("a,x,research,true,2,1,4,600,vision-cnn\n", 2, "submit_s: 'x' is not a number"),
        ("a,0,research,true,2.5,1,4,600,vision-cnn\n", 2, "replicas: '2.5' is not a whole number"),
    ],
    ids=[
        "min-above-requested",
        "negative-duration",
        "bad-bool",
        "unknown-type",
        "bad-number",
        "bad-whole-number",
    ],
)
def test_tide_csv_bad_row_names_file_and_line(
    tmp_path: Path, body: str, bad_line: int, message: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(TIDE_HEADER + body)
    with pytest.raises(TraceError, match=message) as info:
        load_tide_trace(path)
    assert info.value.line == bad_line and str(path) in str(info.value)
    skipped = load_tide_trace(path, skip_bad_rows=True)
    assert skipped.skipped_rows == 1


def test_tide_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"job_id": "a", "submit_s": 10, "replicas": 2, "duration_s": 600, "elastic": true,'
        ' "min_replicas": 1, "max_replicas": 8, "queue": "research"}\n\nnot json\n'
    )
    with pytest.raises(TraceError) as info:
        load_tide_trace(path)
    assert info.value.line == 3
    workload = load_tide_trace(path, skip_bad_rows=True)
    (job,) = workload.jobs
    assert (job.min_replicas, job.max_replicas, job.elastic, job.queue) == (1, 8, True, "research")
    assert job.work_units / job.profile.rate(2) == pytest.approx(600.0)
    assert detect_format(path) == "tide"


def test_philly_and_itp_small_files(tmp_path: Path) -> None:
    philly = tmp_path / "philly.csv"
    philly.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,c\n2017-10-09 07:00:55,100.0,4,400.0,c\n"
        "2017-10-09 07:02:55,0,4,0,c\n"
    )
    with pytest.raises(TraceError, match="duration") as info:
        load_philly(philly)
    assert info.value.line == 4
    (tmp_path / "p2.csv").write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,1m,1,66.0,c\n"
    )
    with pytest.raises(TraceError, match=re.escape("p2.csv:2: duration: '1m' is not a number")):
        load_philly(tmp_path / "p2.csv")
    w = load_philly(philly, skip_bad_rows=True)
    assert [j.submit_s for j in w.jobs] == [0.0, 60.0] and w.skipped_rows == 1
    data = b"job_id,submission_time,duration,num_gpu\nj1,5,100,2\nj2,7,50,zero\n"
    archive = tmp_path / "raw.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info_ = tarfile.TarInfo("raw/clusterX.csv")
        info_.size = len(data)
        tar.addfile(info_, io.BytesIO(data))
    with pytest.raises(TraceError, match=r"clusterX\.csv:3: num_gpu: 'zero' is not a whole"):
        load_itp(archive, member="clusterX.csv")
    assert len(load_itp(archive, member="clusterX.csv", skip_bad_rows=True).jobs) == 1
    expected = f"{archive}:nope.csv: no such member in the archive (--member): it has clusterX.csv"
    with pytest.raises(TraceError, match=re.escape(expected)):  # a whole-file problem: no line
        load_itp(archive, member="nope.csv")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nodes: 0\ngpusPerNode: 4\nqueues: [{name: a}]\n", "nodes: must be an integer from 1"),
        (
            "nodes: 1\ngpusPerNode: 4\nqueues: [{name: a, guaranteeGpus: 9}]\n",
            "queues: guarantees sum to 9 GPUs, above the cluster's 4",
        ),
        ("nodes: 1\ngpusPerNode: 4\nqueues: [{name: a}, {name: a}]\n", "duplicate queue 'a'"),
        (
            "nodes: 1\ngpusPerNode: 4\nqueues: [{name: a, wieght: 2}]\n",
            "queues[0].wieght: unknown key; did you mean 'weight'?",
        ),
        (
            "nodes: 1000000000\ngpusPerNode: 8\nqueues: [{name: a}]\n",
            "nodes: must be an integer from 1 to 100,000, got 1000000000",
        ),
        ("nodes: 2\ngpusPerNode: 4096\nqueues: [{name: a}]\n", "gpusPerNode: must be an"),
        (
            "nodes: 2\ngpus_per_node: 4\nqueues: [{name: a}]\n",
            "gpus_per_node: is now spelled 'gpusPerNode'",
        ),
        (
            "nodes: 2\ngpusPerNode: 4\nrestart_cost_s: 30\nqueues: [{name: a}]\n",
            "restart_cost_s: is now spelled 'restartCost' (a duration such as '30s')",
        ),
        (
            "nodes: 2\ngpusPerNode: 4\nqueues: [{name: a, guarantee_gpus: 2}]\n",
            "queues[0].guarantee_gpus: is now spelled 'guaranteeGpus'",
        ),
        (
            "nodes: 2\ngpusPerNode: 4\nrestartCost: 30\nqueues: [{name: a}]\n",
            "restartCost: must be a duration string such as '30s', got 30",
        ),
        (
            "nodes: 2\ngpusPerNode: 4\nnodes: 3\nqueues: [{name: a}]\n",
            "line 3, column 1: invalid YAML: key 'nodes' is given twice (first on line 1)",
        ),
        (
            "kind: cluster\nnodes: 2\ngpusPerNode: 4\nqueues: [{name: a}]\n",
            "kind: must be 'Cluster', got 'cluster'; did you mean 'Cluster'?",
        ),
        (
            "nodes: 2\ngpusPerNode: 4\nqueues: [{name: a, capabilityGpus: 1.5}]\n",
            "queues[0].capabilityGpus: must be a whole number of GPUs, got 1.5",
        ),
        ("nodes: 2\nqueues: [{name: a}]\n", "gpusPerNode: is required"),
    ],
    ids=[
        "zero-nodes", "over-guaranteed", "duplicate-queue", "typo", "too-many-nodes",
        "huge-node", "old-top-key", "old-duration-key", "old-queue-key", "bare-seconds",
        "key-twice", "kind-case", "fractional-gpus", "missing",
    ],
)  # fmt: skip
def test_cluster_file_problems(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ClusterFileError, match=re.escape(problem)):
        load_cluster(path)


def test_example_cluster_files_load() -> None:
    folder = Path(__file__).resolve().parents[2] / "manifests" / "clusters"
    specs = {p.stem: load_cluster(p) for p in folder.glob("*.yaml")}
    assert specs["small-mixed"] == BUILTIN_CLUSTER
    assert specs["pollux-64"].total_gpus == 64


def test_builtin_generator_is_seeded_and_mixed() -> None:
    a, b = generate_workload(seed=3), generate_workload(seed=3)
    assert a == b and a != generate_workload(seed=4)
    assert {j.elastic for j in a.jobs} == {True, False}
    assert all(not j.problems() for j in a.jobs)


def _offered_load(workload: Workload, gpus: int, window_s: float) -> float:
    asked = sum(
        j.work_units / j.profile.rate(j.requested_replicas) * j.requested_replicas
        for j in workload.jobs
    )
    return asked / (gpus * window_s)


@pytest.mark.parametrize(("load", "gpus", "hours"), [(0.7, 32, 24.0), (1.5, 64, 8.0)])
def test_builtin_generator_offers_the_load_asked_for(load: float, gpus: int, hours: float) -> None:
    # Heavy-tailed durations make one seed's load noisy (a few 8-h jobs dominate); the mean
    # over 40 seeds has a standard error of about 4% of the load.
    window = hours * 3600
    offered = [
        _offered_load(
            generate_workload(seed=s, load=load, cluster_gpus=gpus, duration_s=window),
            gpus,
            window,
        )
        for s in range(40)
    ]
    assert float(np.mean(offered)) == pytest.approx(load, rel=0.15)


def test_clipped_lognormal_mean_matches_sampling() -> None:
    rng = np.random.default_rng(0)
    samples = np.clip(np.exp(rng.normal(9.11, 1.6, 400_000)), 300.0, 28_800.0)
    assert _clipped_lognormal_mean(9.11, 1.6, 300.0, 28_800.0) == pytest.approx(
        float(samples.mean()), rel=0.01
    )


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"load": 0.0}, "load must be a finite number > 0, got 0"),
        ({"load": math.nan}, "load must be a finite number > 0, got nan"),
        ({"load": math.inf}, "load must be a finite number > 0, got inf"),
        ({"cluster_gpus": 0}, "cluster_gpus must be >= 1, got 0"),
        ({"duration_s": math.inf}, "duration must be a finite number > 0, got inf h"),
        ({"duration_s": -3600.0}, "duration must be a finite number > 0, got -1 h"),
        ({"seed": -1}, "seed must be >= 0, got -1"),
        (
            {"duration_s": 3.6e9},
            "1e+06 h at load 0.7 on 32 GPUs would draw about 2,181,738 jobs, more than the "
            "generator's 1,000,000",
        ),
    ],
)
def test_builtin_generator_refuses_what_it_cannot_draw(bad: dict[str, float], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        generate_workload(**bad)  # type: ignore[arg-type]


@pytest.mark.skipif(not POLLUX.exists(), reason=f"shared Pollux traces absent at {POLLUX}")
def test_real_pollux_workload() -> None:
    w = load_pollux_workload(POLLUX / "workloads" / "workload-1.csv", traces_dir=POLLUX / "traces")
    assert len(w.jobs) == 160 and w.skipped_rows == 0
    cifar = next(j for j in w.jobs if j.key == "pollux/cifar10-0")
    assert cifar.requested_replicas == 6 and cifar.profile.samples_per_unit == 2048
    assert cifar.profile.speedup(4) > 2.0  # measured: ~3.6x


def test_pollux_bad_rows_name_the_column(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\nc-0,0,cifar10,two,128\n")
    with pytest.raises(
        TraceError, match=re.escape("w.csv:2: num_replicas: 'two' is not a whole number")
    ):
        load_pollux_workload(path, traces_dir=tmp_path)
    path.write_text("name,time,application,num_replicas\nc-0,0,cifar10,2\n")
    with pytest.raises(TraceError, match=re.escape("w.csv:2: missing column 'batch_size'")):
        load_pollux_workload(path, traces_dir=tmp_path)


def test_pollux_lists_every_bad_row_and_skips_them_by_line(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text(
        "name,time,application,num_replicas,batch_size\n"
        "a,0,cifar10,two,128\nb,0,nosuchapp,2,128\nc,-1,cifar10,2,128\n"
    )
    with pytest.raises(TraceError) as caught:
        load_pollux_workload(path, traces_dir=tmp_path)
    text = str(caught.value)
    assert "w.csv:2: num_replicas: 'two' is not a whole number" in text
    assert "w.csv:3: unknown application 'nosuchapp'" in text
    assert "w.csv:4: bad num_replicas/batch_size/time" in text
    assert "3 bad rows in all" in text
    workload = load_pollux_workload(path, traces_dir=tmp_path, skip_bad_rows=True)
    assert workload.jobs == () and workload.skipped_rows == 3
    assert [line for line, _ in workload.skipped] == [2, 3, 4]


@pytest.mark.skipif(not ITP.exists(), reason=f"shared ITP traces absent at {ITP}")
def test_real_itp_cluster04() -> None:
    w = load_workload(trace=ITP, member="cluster04.csv")
    assert len(w.jobs) == 15802


PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


@pytest.mark.parametrize(
    ("text", "skip", "says"),
    [
        ("", False, "empty.csv: empty file (a trace starts with its header line)"),
        (PHILLY_HEADER, False, "empty.csv: no jobs to replay"),
        (PHILLY_HEADER + "x,1,1,1,a\n", True, "empty.csv: no jobs to replay, 1 bad row(s) skipped"),
    ],
    ids=["empty-file", "header-only", "every-row-bad"],
)
def test_a_trace_with_no_jobs_is_refused(tmp_path: Path, text: str, skip: bool, says: str) -> None:
    path = tmp_path / "empty.csv"
    path.write_text(text)
    with pytest.raises(SimulationError, match=re.escape(says)):
        load_workload(trace=path, skip_bad_rows=skip)


def test_a_philly_timestamp_that_is_not_a_date_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(PHILLY_HEADER + "2017-10-09 07:01:55,66.0,1,66.0,a\nnot-a-date,5,1,5,a\n")
    with pytest.raises(
        TraceError, match=re.escape("p.csv:3: timestamp must be YYYY-MM-DD HH:MM:SS, got 'not-a")
    ):
        load_philly(path)
