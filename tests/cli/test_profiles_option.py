"""``--profiles DIR`` on simulate, compare and tune: Pollux traces whose profiles lie elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tide import sim_commands, tune_command

app = typer.Typer()
sim_commands.register(app)
tune_command.register(app)
runner = CliRunner()

PLACEMENTS = (
    "placement,local_bsz,step_time,sync_time\n"
    "1,4,1.0,0.0\n1,8,1.5,0.0\n4,4,1.2,0.2\n4,8,1.7,0.2\n14,4,2.0,1.0\n14,8,3.0,1.0\n"
)
SCALABILITY = "num_nodes,num_replicas,local_bsz,step_time,sync_time\n2,8,4,2.5,1.5\n"
# One bert job of batch 40 on 4 replicas: 200 iterations of 2.45 s (one accumulated micro-step).
WORKLOAD = "name,time,application,num_replicas,batch_size\nbert-0,0,bert,4,40\n"
CLUSTER = "kind: Cluster\nname: eight\nnodes: 2\ngpusPerNode: 4\nqueues: [{name: a}]\n"


def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A Pollux workload in ``w/``, its profiles in ``elsewhere/profiles`` (not at
    ``w/../../traces``), and a cluster file. Returns (workload, profiles, cluster)."""
    profiles = tmp_path / "elsewhere" / "profiles"
    bert = profiles / "bert"
    bert.mkdir(parents=True)
    (bert / "placements.csv").write_text(PLACEMENTS)
    (bert / "scalability.csv").write_text(SCALABILITY)
    for batch in (8, 40):
        (bert / f"validation-{batch}.csv").write_text(
            "progress,iteration,grad_sqr,grad_var\n100,100,1,0\n200,200,1,0\n"
        )
    workload = tmp_path / "w" / "workload.csv"
    workload.parent.mkdir()
    workload.write_text(WORKLOAD)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER)
    return workload, profiles, cluster


def simulate(tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    workload, _, cluster = layout(tmp_path)
    report = tmp_path / "r.json"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(workload),
            "--cluster",
            str(cluster),
            "--policies",
            "static",
            "--no-bound",
            "--out",
            str(tmp_path / "out"),
            "--json",
            str(report),
            *args,
        ],
    )
    return result.exit_code, " ".join(result.output.split()), report


def test_simulate_reads_the_profiles_from_the_folder_given(tmp_path: Path) -> None:
    code, output, report = simulate(tmp_path, "--profiles", str(tmp_path / "elsewhere/profiles"))
    assert code == 0, output
    (summary,) = json.loads(report.read_text())["summaries"]
    assert summary["finished"] == 1
    # 200 iterations x 2.45 s, plus the job's start-up: the toy profile was read.
    assert 200 * 2.45 / 3600 <= summary["avg_jct_h"] < (200 * 2.45 + 300) / 3600


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "(the default, <trace>/../../traces; --profiles DIR names another): does not exist"),
        (("--profiles", "{tmp}/nowhere"), "profiles folder {tmp}/nowhere: does not exist"),
        (("--profiles", "{tmp}/c.yaml"), "profiles folder {tmp}/c.yaml: is not a directory"),
        (("--profiles", "{tmp}/w"), "profiles folder {tmp}/w: holds no application profile"),
    ],
    ids=["default-absent", "missing", "a-file", "no-application"],
)
def test_a_missing_or_invalid_profiles_folder_is_named(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    code, output, _ = simulate(tmp_path, *(a.format(tmp=tmp_path) for a in args))
    assert code == 1
    assert message.format(tmp=tmp_path) in output, output


def test_profiles_for_a_trace_that_is_not_pollux_is_an_error(tmp_path: Path) -> None:
    layout(tmp_path)
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,replicas,duration_s\nns/a,0,1,60\n")
    result = runner.invoke(
        app,
        ["simulate", "--trace", str(trace), "--profiles", str(tmp_path / "elsewhere/profiles"),
         "--policies", "static", "--no-bound", "--out", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "only Pollux traces read application profiles" in " ".join(result.output.split())


def test_compare_and_tune_take_the_profiles(tmp_path: Path) -> None:
    workload, profiles, cluster = layout(tmp_path)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nmetadata: {name: p}\n"
        "spec:\n  queues:\n    - {name: a, elastic: true}\n"
    )
    base = ["--trace", str(workload), "--cluster", str(cluster), "--no-bound"]
    compared = runner.invoke(
        app,
        ["compare", str(policy), *base, "--profiles", str(profiles),
         "--out", str(tmp_path / "c"), "--json", str(tmp_path / "c.json")],
    )  # fmt: skip
    assert compared.exit_code == 0, compared.output
    (summary,) = json.loads((tmp_path / "c.json").read_text())["summaries"]
    assert summary["finished"] == 1
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [1m]\n")
    tune = ["tune", str(space), *base, "--workers", "1", "--out", str(tmp_path / "t")]
    tuned = runner.invoke(app, [*tune, "--profiles", str(profiles)])
    assert tuned.exit_code == 0, tuned.output
    assert (tmp_path / "t" / "trials.json").exists()
    refused = runner.invoke(app, [*tune, "--profiles", str(tmp_path / "nowhere")])
    assert refused.exit_code == 1
    assert f"profiles folder {tmp_path / 'nowhere'}: does not exist" in " ".join(
        refused.output.split()
    )
