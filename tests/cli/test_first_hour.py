"""What a new user trips over in the first hour: each mistake gets a clear error, up front."""

from __future__ import annotations

import csv
import json
import re
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


TRACE_HEADER = "job_id,submit_s,replicas,duration_s\n"


def test_a_trace_reports_every_bad_row_up_to_twenty_then_counts(tmp_path: Path) -> None:
    rows = ["a,0,2,600"] + [f"b{i},{i},two,600" for i in range(25)] + ["c,5,1,-1"]
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE_HEADER + "\n".join(rows) + "\n")
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith(f"{trace}:")]
    # Lines 3 to 22: the first twenty bad rows (the header is line 1, the good row line 2).
    assert [int(line.split(":")[1]) for line in lines] == list(range(3, 23))
    assert "replicas: 'two' is not a whole number" in lines[0]
    text = " ".join(result.output.split())
    assert "and 6 more bad rows" in text
    assert "26 bad rows in all; --skip-bad-rows replays the others" in text


def test_skip_bad_rows_lists_each_skipped_row_in_the_report_and_on_screen(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE_HEADER + "a,0,2,600\nb,1,two,600\nc,2,1,-1\nd,3,1,600\n")
    result = runner.invoke(
        app,
        [
            *("simulate", "--trace", str(trace), "--skip-bad-rows", "--policies", "static"),
            *("--no-bound", "--out", str(tmp_path / "o")),
        ],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    assert "skipped 2 bad trace row(s): line(s) 3, 4 (each with its reason in report.json" in (
        words(result.output)
    )
    meta = json.loads((tmp_path / "o" / "report.json").read_text())["meta"]
    assert meta["skipped_rows"] == 2
    assert [s["line"] for s in meta["skipped"]] == [3, 4]
    assert "'two' is not a whole number" in meta["skipped"][0]["problem"]
    assert "duration" in meta["skipped"][1]["problem"]


def test_every_command_prints_errors_as_file_colon_error(tmp_path: Path) -> None:
    from tide.cli import app as tide_app

    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: 2\ngpus_per_node: 4\nqueues: [{name: a, wieght: 1}]\n")
    observation = tmp_path / "o.json"
    observation.write_text('{"time": 5,, }')
    cases = [
        (["simulate", "--cluster", str(cluster)], [
            f"{cluster}: error: gpus_per_node: is now spelled 'gpusPerNode'",
            f"{cluster}: error: queues[0].wieght: unknown key; did you mean 'weight'?",
        ]),
        (["tune", str(cluster)], [
            f"{cluster}: error: nodes: unknown key; expected one of 'kind', 'method', 'trials', "
            "'seed', 'objective', 'parameters', 'constraints'"
        ]),
        (["plan", "--observation", str(observation)], [
            f"{observation}: error: line 1, column 12: invalid JSON: expected the node content, "
            "but found ','"
        ]),
    ]  # fmt: skip
    for args, lines in cases:
        out = [] if args[0] == "plan" else ["--out", str(tmp_path / "o")]
        result = runner.invoke(tide_app, [*args, *out], env=WIDE)
        assert result.exit_code == 1, result.output
        assert result.output.splitlines() == lines


def test_start_and_end_replay_a_window_of_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = [f"j{h},{h * 3600},1,600" for h in range(10)]  # one job submitted each hour
    trace.write_text(TRACE_HEADER + "\n".join(rows) + "\n")
    out = tmp_path / "o"
    args = ["simulate", "--trace", str(trace), "--policies", "static", "--no-bound"]
    result = runner.invoke(app, [*args, "--start", "2", "--end", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    with (out / "jobs.csv").open() as f:
        jobs = list(csv.DictReader(f))
    # Hours 2, 3 and 4, shifted so that the window starts at 0.
    assert [(r["job"], float(r["submit_h"])) for r in jobs] == [
        ("j2", 0.0), ("j3", 1.0), ("j4", 2.0)
    ]  # fmt: skip
    meta = json.loads((out / "report.json").read_text())["meta"]
    assert meta["workload"] == "t[2-5h]" and meta["jobs"] == 3


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (["--start", "5", "--end", "3"], "--end 3 h must be after --start 5 h"),
        (["--start", "20"], "t: no job is submitted in the window 20-h (--start/--end); its "
         "submissions span 0-9.0 h"),
    ],
    ids=["end-before-start", "empty-window"],
)  # fmt: skip
def test_a_window_that_holds_nothing_is_an_error(
    tmp_path: Path, window: list[str], message: str
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE_HEADER + "\n".join(f"j{h},{h * 3600},1,600" for h in range(10)))
    result = runner.invoke(
        app, ["simulate", "--trace", str(trace), *window, "--out", str(tmp_path / "o")], env=WIDE
    )
    assert result.exit_code == 1, result.output
    assert message in words(result.output)


def test_a_window_needs_a_trace(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--end", "5", "--out", str(tmp_path / "o")], env=WIDE)
    assert result.exit_code == 1
    assert "--start/--end select a window of a --trace" in words(result.output)


def test_tide_version() -> None:
    from tide.cli import app as tide_app

    result = runner.invoke(tide_app, ["--version"])
    assert result.exit_code == 0
    assert re.fullmatch(r"tide \S+\n", result.output)


@pytest.mark.parametrize("command", ["simulate", "compare", "tune", "plan", "validate"])
def test_help_shows_what_values_are_not_python_types(command: str) -> None:
    from tide.cli import app as tide_app

    result = runner.invoke(tide_app, [command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"<(bool|int|float|str|path|list\[\w+\])[^>]*>", result.output)
    if command == "simulate":
        assert re.search(r"--duration\s+HOURS", result.output)


def test_simulate_without_matplotlib_writes_the_report_and_says_plots_were_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    # A None entry makes `import matplotlib` (and simulations.plots, which needs it) fail.
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "simulations.plots", raising=False)
    out = tmp_path / "o"
    result = runner.invoke(
        app,
        ["simulate", "--policies", "static", "--duration", "1", "--no-bound", "--out", str(out)],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"report.json", "jobs.csv"}
    assert "no plots: matplotlib is not installed (pip install 'tide[plots]')" in words(
        result.output
    )


def test_output_to_a_file_starts_with_the_table_not_a_blank_line(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = runner.invoke(
        app,
        ["simulate", "--policies", "static", "--duration", "1", "--no-bound", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].strip().startswith("builtin-seed0")


def test_static_says_its_rescales_are_volcano_placing_pods_late(tmp_path: Path) -> None:
    # Elastic jobs asking for more pods than the free GPUs: Volcano starts each gang at its
    # minimum and places the rest as GPUs free up, a restart each time, under static too.
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_s,replicas,duration_s,elastic,min_replicas,max_replicas,queue\n"
        "a/1,0,24,3600,true,4,24,research\na/2,0,16,1800,true,4,16,research\n"
    )
    result = runner.invoke(
        app,
        [
            *("simulate", "--trace", str(trace), "--policies", "static", "--no-bound"),
            *("--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json")),
        ],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    (static,) = json.loads((tmp_path / "r.json").read_text())["summaries"]
    assert static["rescales"] == static["late_pods"] > 0 and static["kills"] == 0
    assert (
        f"static resizes no job: its {static['rescales']} rescales are Volcano placing jobs' "
        f"pods above minAvailable as GPUs free up ({static['late_pods']}, each a restart"
    ) in words(result.output)


def test_every_output_folder_of_tide_is_ignored_by_git() -> None:
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().split()
    assert "tide-*-out/" in ignored  # tide-sim-out, tide-compare-out, tide-tune-out
