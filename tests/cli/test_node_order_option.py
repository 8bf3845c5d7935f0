"""``--node-order`` on simulate, compare and tune, and the reports saying which one ran."""

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

CLUSTER = "kind: Cluster\nname: four\nnodes: 4\ngpusPerNode: 8\n%squeues: [{name: a}]\n"
# A 4-pod job of one GPU each starts first; a one-pod job of 8 GPUs arrives a minute later.
# Spread puts the 4 pods on 4 nodes, so no node has 8 free GPUs until the first job ends (at
# 1 h and its 30 s start-up); binpack puts them on node 0, and the second job starts at once.
TRACE = (
    "job_id,submit_s,replicas,duration_s,queue,gpus_per_replica\n"
    "ns/small,0,4,3600,a,1\n"
    "ns/whole-node,60,1,3600,a,8\n"
)


def simulate(tmp_path: Path, *args: str, cluster_line: str = "") -> tuple[str, dict[str, object]]:
    """Run ``tide simulate --policies static`` on the trace above; its output and JSON report."""
    (tmp_path / "c.yaml").write_text(CLUSTER % cluster_line)
    (tmp_path / "t.csv").write_text(TRACE)
    report = tmp_path / "r.json"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(tmp_path / "t.csv"),
            "--cluster",
            str(tmp_path / "c.yaml"),
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
    assert result.exit_code == 0, result.output
    doc: dict[str, object] = json.loads(report.read_text())
    return " ".join(result.output.split()), doc


@pytest.mark.parametrize(
    ("args", "cluster_line", "order", "whole_node_wait_h"),
    [
        ((), "", "spread", (3630 - 60) / 3600),
        (("--node-order", "binpack"), "", "binpack", 0.0),
        ((), "nodeOrder: binpack\n", "binpack", 0.0),
        (("--node-order", "spread"), "nodeOrder: binpack\n", "spread", (3630 - 60) / 3600),
    ],
    ids=["default-spread", "flag-binpack", "file-binpack", "flag-overrides-file"],
)
def test_the_node_order_changes_the_figures_and_the_report_names_it(
    tmp_path: Path,
    args: tuple[str, ...],
    cluster_line: str,
    order: str,
    whole_node_wait_h: float,
) -> None:
    words, doc = simulate(tmp_path, *args, cluster_line=cluster_line)
    meta = doc["meta"]
    assert isinstance(meta, dict)
    assert meta["node_order"] == order
    assert meta["cluster_spec"]["nodeOrder"] == order
    (summary,) = doc["summaries"]  # type: ignore[misc]
    assert summary["node_order"] == order
    assert summary["queue_delay_by_queue_h"]["a"] == pytest.approx(whole_node_wait_h / 2)
    assert f"(32 GPUs, {order} placement, 2 jobs)" in words


def test_an_unknown_node_order_is_refused_naming_it(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--node-order", "fill", "--out", str(tmp_path)])
    assert result.exit_code == 2
    words = " ".join(result.output.split())
    assert "--node-order" in words and "must be one of spread, binpack, got 'fill'" in words


def test_compare_and_tune_take_the_node_order(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nmetadata: {name: p}\n"
        "spec:\n  queues:\n    - {name: research, elastic: true}\n"
    )
    base = ["--duration", "1", "--no-bound", "--node-order", "binpack"]
    compared = runner.invoke(
        app,
        [
            "compare",
            str(policy),
            *base,
            "--out",
            str(tmp_path / "c"),
            "--json",
            str(tmp_path / "c.json"),
        ],
    )
    assert compared.exit_code == 0, compared.output
    assert json.loads((tmp_path / "c.json").read_text())["meta"]["node_order"] == "binpack"
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [1m]\n")
    tuned = runner.invoke(
        app, ["tune", str(space), *base, "--workers", "1", "--out", str(tmp_path / "t")]
    )
    assert tuned.exit_code == 0, tuned.output
    assert "binpack placement" in " ".join(tuned.output.split())
    records = json.loads((tmp_path / "t" / "trials.json").read_text())
    assert [r["node_order"] for r in records] == ["binpack", "binpack"]
