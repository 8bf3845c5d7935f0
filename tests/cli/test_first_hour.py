"""What a new user trips over in the first hour: each mistake gets a clear error, up front."""

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
WIDE = {"COLUMNS": "300"}
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ("", "--policies: no policy given; name one or more of tide, static"),
        (",", "--policies: no policy given"),
        (" , ,", "--policies: no policy given"),
        ("tide,statik", "--policies: unknown policy 'statik'; did you mean 'static'?"),
        ("magic", "--policies: unknown policy 'magic'; known: tide, static, threshold"),
        ("tide,static,tide", "--policies: tide is given twice"),
    ],
    ids=["empty", "only-a-comma", "blanks", "misspelt", "unknown", "twice"],
)
def test_a_bad_policy_list_is_refused_before_anything_runs(
    tmp_path: Path, policies: str, message: str
) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["simulate", "--policies", policies, "--out", str(out)], env=WIDE)
    assert result.exit_code == 1, result.output
    assert message in words(result.output)
    assert "Traceback" not in result.output
    assert not out.exists()  # refused before the run, which would have made it


@pytest.mark.parametrize("command", ["simulate", "compare", "tune"])
def test_an_out_folder_that_cannot_be_made_is_refused_before_anything_runs(
    tmp_path: Path, command: str
) -> None:
    # /proc passes os.access for root, but refuses any new folder.
    (tmp_path / "p.yaml").write_text(
        "apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\nmetadata: {name: p}\n"
    )
    (tmp_path / "s.yaml").write_text("parameters:\n  defaults.cooldown: [1m]\n")
    first = {
        "simulate": [],
        "compare": [str(tmp_path / "p.yaml")],
        "tune": [str(tmp_path / "s.yaml")],
    }
    args = [command, *first[command], "--duration", "1", "--out", "/proc/nope"]
    result = runner.invoke(app, args, env=WIDE)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--out': cannot create /proc/nope: /proc is not writable" in words(
        result.output
    )


def test_a_json_file_that_cannot_be_made_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["simulate", "--out", str(tmp_path / "o"), "--json", "/proc/nope.json"], env=WIDE
    )
    assert result.exit_code == 2, result.output
    assert "cannot create /proc/nope.json" in words(result.output)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cluster", sorted(p.name for p in (MANIFESTS / "clusters").glob("*.yaml")))
def test_the_builtin_workload_fits_every_shipped_cluster(tmp_path: Path, cluster: str) -> None:
    result = runner.invoke(
        app,
        [
            "simulate",
            "--cluster",
            str(MANIFESTS / "clusters" / cluster),
            "--policies",
            "tide",
            "--duration",
            "1",
            "--load",
            "0.3",
            "--no-bound",
            "--out",
            str(tmp_path / "o"),
            "--json",
            str(tmp_path / "r.json"),
        ],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["meta"]["cluster"] == cluster.removesuffix(".yaml")
    assert doc["summaries"][0]["jobs"] > 0


@pytest.mark.parametrize("seeds", [["--seed", "0"], ["--seeds", "0,1"]], ids=["one-seed", "seeds"])
def test_no_bound_skips_the_bound_and_says_so(tmp_path: Path, seeds: list[str]) -> None:
    result = runner.invoke(
        app,
        [
            *("simulate", "--policies", "static", "--duration", "1", *seeds, "--no-bound"),
            *("--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json")),
        ],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    assert "lower bound on the average JCT: skipped (--no-bound)" in result.output
    assert "no policy can bring" not in result.output
    meta = json.loads((tmp_path / "r.json").read_text())["meta"]
    assert meta["avg_jct_lower_bound_h"] is None
    assert meta["avg_jct_lower_bound_h_by_seed"] == [None] * (len(seeds[1].split(",")))


def test_the_bound_of_a_few_jobs_uses_a_grid_of_a_few_cells_per_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from simulations import bounds
    from simulations.cluster_config import BUILTIN_CLUSTER
    from simulations.workload import generate_workload

    workload = generate_workload(duration_s=3 * 3600.0)
    sizes: list[int] = []
    real = bounds._solve

    def spy(jobs, steps, submit, fastest, edges, pools, limit_s):  # type: ignore[no-untyped-def]
        sizes.append(sum((len(edges) - 1) * len(s) for s in steps))
        return real(jobs, steps, submit, fastest, edges, pools, limit_s)

    monkeypatch.setattr(bounds, "_solve", spy)
    assert bounds.jct_lower_bound_h(workload, BUILTIN_CLUSTER) > 0
    # A few thousand cells per job: the whole 50,000-cell grid took seconds on a few jobs.
    assert sizes and sizes[0] <= 3_000 * len(workload.jobs)
