"""The simulate/compare/tune commands through typer's CliRunner."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from simulations.api import Seeded
from simulations.cluster_config import BUILTIN_CLUSTER, parse_cluster
from tests.simulations.helpers import interrupt_after
from tide import sim_commands, tune_command

app = typer.Typer()
sim_commands.register(app)
tune_command.register(app)
runner = CliRunner()
POLICY = """apiVersion: tide.io/v1alpha1
kind: ElasticPolicy
metadata: {name: %s}
spec:
  interval: %s
  queues:
    - {name: research, elastic: true, borrowIdleGpus: true}
    - {name: production, elastic: false}
"""


def test_simulate_writes_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--policies",
            "tide,static",
            "--duration",
            "3",
            "--out",
            str(out),
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [s["policy"] for s in doc["summaries"]] == ["tide", "static"]
    bound = doc["meta"]["avg_jct_lower_bound_h"]
    assert 0 < bound <= min(s["avg_jct_h"] for s in doc["summaries"])
    words = " ".join(result.output.split())
    assert f"below {bound:.2f} h" in words
    tide = doc["summaries"][0]
    assert tide["finished"] == tide["jobs"]
    assert f"tide's average is {tide['avg_jct_h'] / bound:.2f} times it" in words
    kills = ", ".join(f"{s['policy']} {s['kills']}" for s in doc["summaries"])
    assert f"pods killed abruptly by Volcano's reclaim: {kills}" in words
    assert {p.name for p in out.iterdir()} == {
        "report.json",
        "jobs.csv",
        "jct_cdf.png",
        "utilization.png",
        "replicas.png",
    }
    with (out / "jobs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    jobs = doc["meta"]["jobs"]
    assert [r["policy"] for r in rows] == ["tide"] * jobs + ["static"] * jobs
    for summary in doc["summaries"]:
        mine = [r for r in rows if r["policy"] == summary["policy"]]
        jct = [float(r["jct_h"]) for r in mine if r["jct_h"]]
        assert len(jct) == summary["finished"]
        assert sum(jct) / len(jct) == pytest.approx(summary["avg_jct_h"], abs=1e-3)
        assert sum(int(r["rescales"]) for r in mine) == summary["rescales"]
        for r in mine:
            if r["start_h"]:
                assert float(r["queueing_h"]) == pytest.approx(
                    float(r["start_h"]) - float(r["submit_h"]), abs=2e-4
                )


def test_simulate_bad_trace_row_exits_1_naming_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,replicas,duration_s\na,0,2,600\nb,1,two,600\n")
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "t.csv:3" in result.output.replace("\n", "")
    ok = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            str(trace),
            "--skip-bad-rows",
            "--policies",
            "static",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert "skipped 1 bad trace row" in ok.output


def test_unknown_policy_is_an_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--policies", "tide,magic", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "magic" in result.output


def test_compare_two_policy_files(tmp_path: Path) -> None:
    slow = "slow-research-and-production"  # a long name must not push columns off 80 columns
    for name, interval in (("fast", "30s"), (slow, "5m")):
        (tmp_path / f"{name}.yaml").write_text(POLICY % (name, interval))
    result = runner.invoke(
        app,
        [
            "compare",
            str(tmp_path / "fast.yaml"),
            str(tmp_path / f"{slow}.yaml"),
            "--duration",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--json",
            str(tmp_path / "c.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [s["policy"] for s in doc["summaries"]] == ["fast", slow]
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["policy"])
    assert lines[header - 2].split()[-1] == "guar."  # the last column is there, whole
    assert lines[header].split()[-1] == "min"
    words = " ".join(result.output.split())
    assert "useful util: GPU time that made progress." in words  # the caption loses nothing
    names: list[str] = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        cells = line.split()
        if len(cells) > 1:
            names.append(cells[0])
        else:
            names[-1] += cells[0]  # a long name folds onto the next line
    assert names == ["fast", slow]


def test_tune_writes_trials_and_best_policy(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "method: grid\nobjective: avg_jct_h\nparameters:\n  defaults.cooldown: [1m, 10m]\n"
    )
    out = tmp_path / "tune"
    result = runner.invoke(
        app, ["tune", str(space), "--duration", "2", "--workers", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    with (out / "trials.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    # In the order the runs finished (two workers): the base first or second.
    assert sorted((r["trial"], r["defaults.cooldown"]) for r in rows) == [
        ("0", "1m"), ("1", "10m"), ("base", "2m")
    ]  # fmt: skip
    seconds = {"1m": 60.0, "10m": 600.0, "2m": 120.0}
    objective = {seconds[r["defaults.cooldown"]]: float(r["avg_jct_h"]) for r in rows}
    from scheduler_policy.policy.file import load_policy

    best = load_policy(out / "best-policy.yaml")
    assert objective[best.defaults.cooldown_s] == min(objective.values())
    text = " ".join(result.output.split())
    if best.defaults.cooldown_s == 120.0:  # the base's run: no trial beats it
        assert "no trial beats the base policy" in text and best.name == "default"
    else:
        change = (objective[best.defaults.cooldown_s] / objective[120.0] - 1) * 100
        assert f"avg_jct_h {objective[best.defaults.cooldown_s]:.4g}; the base policy " in text
        assert f"{objective[120.0]:.4g}, {change:+.1f}%)" in text
    # How far any policy could go: the same lower bound simulate prints for this workload.
    from simulations.api import load_workload
    from simulations.bounds import jct_lower_bound_h

    bound = jct_lower_bound_h(load_workload(duration_s=2 * 3600.0), BUILTIN_CLUSTER)
    assert f"no policy can bring avg_jct_h below {bound:.4g} on these workloads" in text
    assert bound <= min(objective.values())
    records = json.loads((out / "trials.json").read_text())
    assert [r["trial"] for r in records] == ["base", 0, 1]
    assert records[0]["params"] == {"defaults.cooldown": "2m"}
    for r in records:  # one workload: its figure is the objective
        assert [w["avg_jct_h"] for w in r["by_workload"]] == [r["objective"]]
        assert [(w["workload"], w["seed"]) for w in r["by_workload"]] == [
            (records[0]["by_workload"][0]["workload"], 0)
        ]


def test_tune_gives_the_jct_bound_only_for_an_average_jct_objective(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "method: grid\nobjective: useful_utilization\nparameters:\n  defaults.cooldown: [1m]\n"
    )
    out = tmp_path / "tune"
    result = runner.invoke(app, ["tune", str(space), "--duration", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "no policy can bring" not in result.output


def test_tune_bad_space_exits_1(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  defaults.cooldwn: [1s, 2s]\n")
    result = runner.invoke(app, ["tune", str(space), "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "defaults.cooldwn: not a policy parameter; did you mean 'defaults.cooldown'?" in (
        " ".join(result.output.split())
    )


def test_tune_refuses_a_value_the_policy_file_would_refuse_before_writing(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.tolerance: [0.05, -1]\n")
    out = tmp_path / "o"
    result = runner.invoke(app, ["tune", str(space), "--out", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "parameters.defaults.tolerance: -1 is refused: spec.defaults.tolerance: must be" in text
    assert not out.exists()


def test_tune_with_constraints_no_trial_meets_writes_no_policy_and_exits_1(
    tmp_path: Path,
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "method: grid\nparameters:\n  defaults.cooldown: [1m, 10m]\n"
        "constraints:\n  useful_utilization: {min: 0.999}\n"
    )
    out = tmp_path / "o"
    out.mkdir()
    (out / "best-policy.yaml").write_text("from an earlier search")
    result = runner.invoke(app, ["tune", str(space), "--duration", "1", "--out", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert (
        "neither the base policy nor any finished trial meets the constraints "
        "(useful_utilization >= 0.999)" in text
    )
    assert "–: misses a constraint" in text and "base –" in text
    assert not (out / "best-policy.yaml").exists()
    trials = json.loads((out / "trials.json").read_text())
    assert [t["meets_constraints"] for t in trials] == [False, False, False]
    assert all(0 < t["figures"]["useful_utilization"] < 0.999 for t in trials)


def test_tune_says_when_no_workload_has_a_constrained_figure(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"  # every job elastic: no non-elastic queueing delay
    trace.write_text("job_id,submit_s,replicas,duration_s,elastic\na,0,2,600,true\n")
    space = tmp_path / "space.yaml"
    space.write_text(
        "method: grid\nparameters:\n  defaults.cooldown: [1m]\n"
        "constraints:\n  p95_queue_nonelastic_h: {max: 1}\n"
    )
    args = ["tune", str(space), "--trace", str(trace), "--out", str(tmp_path / "o")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert (
        "(p95_queue_nonelastic_h: no workload has this figure, e.g. no non-elastic jobs)"
        in " ".join(result.output.split())
    )


def test_simulate_refuses_a_load_that_is_not_positive(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--load", "0", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "load must be a finite number > 0, got 0" in " ".join(result.output.split())
    assert not (tmp_path / "o").exists()  # refused before anything ran or was written


def test_tune_names_a_seed_that_is_not_a_non_negative_integer(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  defaults.cooldown: [1m, 10m]\n")
    for bad in ("0,x", "-1"):
        result = runner.invoke(app, ["tune", str(space), "--seeds", bad, "--out", str(tmp_path)])
        assert result.exit_code == 2, result.output
        assert "--seeds" in result.output and "is not a non-negative integer" in result.output
    assert not (tmp_path / "trials.csv").exists()


def test_a_tuning_trial_shows_what_simulate_shows_for_its_policy(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [2m]\n")  # the default
    common = ["--seeds", "1,2", "--duration", "6"]
    tuned = runner.invoke(app, ["tune", str(space), *common, "--out", str(tmp_path / "t")])
    assert tuned.exit_code == 0, tuned.output
    base, trial = json.loads((tmp_path / "t" / "trials.json").read_text())
    assert base["trial"] == "base" and base["objective"] == trial["objective"]  # one policy
    report = tmp_path / "s.json"
    simulated = runner.invoke(
        app, ["simulate", "--policies", "tide", *common, "--out", str(tmp_path / "s"),
              "--json", str(report)],
    )  # fmt: skip
    assert simulated.exit_code == 0, simulated.output
    jct = [s["avg_jct_h"] for s in json.loads(report.read_text())["summaries"]]
    assert trial["objective"] == pytest.approx(sum(jct) / len(jct), rel=1e-12)
    assert [w["avg_jct_h"] for w in trial["by_workload"]] == pytest.approx(jct, rel=1e-12)
    assert [w["seed"] for w in trial["by_workload"]] == [1, 2]


def test_the_report_records_the_cluster_the_policies_and_the_run_options(tmp_path: Path) -> None:
    args = ["simulate", "--policies", "tide,static", "--duration", "2", "--node-mtbf", "30"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "report.json").read_text())["meta"]
    assert meta["cluster_spec"]["overcommitFactor"] == 1.2
    assert parse_cluster(meta["cluster_spec"], source="report") == BUILTIN_CLUSTER
    assert [q["name"] for q in meta["cluster_spec"]["queues"]] == ["research", "production"]
    assert meta["policies"]["static"] == "static"
    assert meta["policies"]["tide"]["spec"]["interval"] == "1m"
    assert meta["run_options"]["faults"]["node_mtbf_s"] == 30 * 3600.0


def test_tune_refuses_a_seed_or_a_trace_given_twice(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  defaults.cooldown: [1m, 10m]\n")
    result = runner.invoke(app, ["tune", str(space), "--seeds", "0,1,0", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "seed 0 is given twice" in result.output
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,replicas,duration_s\na,0,2,600\n")
    again = [str(trace), str(tmp_path / "." / "t.csv")]  # one file, two spellings
    args = ["tune", str(space), "--trace", again[0], "--trace", again[1], "--out", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "--trace:" in text and "is given twice" in text
    assert not (tmp_path / "trials.csv").exists()


def test_simulate_refuses_a_negative_seed(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "--seed", "-1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--seed" in result.output
    assert not (tmp_path / "o").exists()


def test_yaml_errors_in_cluster_and_space_files_name_line_and_column(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nqueues: [a\n  b: c\n")
    for args in (["simulate", "--cluster", str(broken)], ["tune", str(broken)]):
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "o")])
        text = " ".join(result.output.split())
        assert result.exit_code == 1, result.output
        assert f"{broken}" in text and "line 3, column " in text and "invalid YAML:" in text


def test_tune_table_names_every_parameter_whole_in_80_columns(tmp_path: Path) -> None:
    names = {
        "interval": "[1m, 2m]",
        "defaults.cooldown": "[1m, 2m]",
        "defaults.tolerance": "[0.1, 0.2]",
        "defaults.maxStepUp": "[1, 2]",
        "defaults.maxStepDown": "[1, 2]",
        "defaults.stabilizationWindow.down": "[1m, 2m]",
        "defaults.assumedRemaining": "[1h, 2h]",
    }
    space = tmp_path / "space.yaml"
    space.write_text(
        "method: random\ntrials: 2\nparameters:\n"
        + "".join(f"  {n}: {values}\n" for n, values in names.items())
    )
    result = runner.invoke(app, ["tune", str(space), "--duration", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in result.output
    # The table may be split over several (each repeating the trial column); each header is
    # its name's lines, right-aligned in its column: read them column by column.
    shown: list[str] = []
    for rule in (i for i, line in enumerate(lines) if line.lstrip().startswith("───")):
        top = rule
        while lines[top - 1].strip():
            top -= 1
        header = lines[top:rule]
        ends = [m.end() for m in re.finditer(r"\S+", header[-1])]
        starts = [0, *ends[:-1]]
        part = [
            "".join(line[a:b].strip() for line in header) for a, b in zip(starts, ends, strict=True)
        ]
        shown += part if not shown else part[1:]
    assert shown == ["trial", *(n.removeprefix("defaults.") for n in sorted(names)), "avg_jct_h"]
    assert "defaults.* parameters are shown without the prefix" in " ".join(result.output.split())


def test_an_interrupted_tune_writes_the_best_of_the_finished_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import simulations.tune as tune_module

    monkeypatch.setattr(
        tune_module, "results_as_done", interrupt_after(tune_module.results_as_done, 2)
    )
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [1m, 2m, 5m, 10m]\n")
    out = tmp_path / "tune"
    result = runner.invoke(
        app, ["tune", str(space), "--duration", "1", "--workers", "1", "--out", str(out)]
    )
    assert result.exit_code == 130, result.output
    text = " ".join(result.output.split())
    assert "1 of 4 trials (interrupted)" in text
    from scheduler_policy.policy.file import load_policy

    base, first = (out / "trials.csv").read_text().splitlines()[1:]  # base, then trial 0
    cooldown = load_policy(out / "best-policy.yaml").defaults.cooldown_s
    if float(first.split(",")[-1]) < float(base.split(",")[-1]):
        assert "best policy of the finished trials" in text and cooldown == 60.0
    else:
        assert "no trial beats the base policy" in text and cooldown == 120.0


def test_tune_says_when_the_space_holds_fewer_sets_than_trials(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("method: random\ntrials: 5\nparameters:\n  defaults.cooldown: [1m, 10m]\n")
    result = runner.invoke(app, ["tune", str(space), "--duration", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "holds 2 parameter sets, fewer than the 5 trials asked for: each runs once" in text
    assert "tide tune: 2 trials" in text


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--horizon", "nan"),
        ("--horizon", "-1"),
        ("--quiet-interval", "-5"),  # once looped forever
        ("--quiet-interval", "0"),
        ("--node-mtbf", "nan"),  # once drew failures until the memory ran out
        ("--node-mtbf", "0"),
        ("--metrics-outage-every", "nan"),
        ("--metrics-outage-every", "-1"),
    ],
)
def test_simulate_refuses_a_time_option_that_is_not_positive(
    tmp_path: Path, flag: str, value: str
) -> None:
    out = tmp_path / "o"
    result = runner.invoke(
        app, ["simulate", flag, value, "--policies", "static", "--out", str(out)]
    )
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {flag}: must be a finite number of" in text
    assert not out.exists()


def test_tune_refuses_zero_workers(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  defaults.cooldown: [1m, 10m]\n")
    result = runner.invoke(app, ["tune", str(space), "--workers", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--workers" in result.output


def test_simulate_says_what_faults_it_injected(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["simulate", "--duration", "2", "--policies", "tide,static", "--node-mtbf", "6",
         "--metrics-outage-every", "1", "--seed", "4", "--out", str(tmp_path / "o"),
         "--json", str(tmp_path / "r.json")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "faults injected (seed 4) during the longest run" in text
    doc = json.loads((tmp_path / "r.json").read_text())
    assert all(s["node_failures"] > 0 and s["metrics_outages"] > 0 for s in doc["summaries"])


def test_compare_injects_the_same_faults_as_simulate(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY % ("p", "60s"))
    faults = ["--duration", "2", "--node-mtbf", "6", "--metrics-outage-every", "1", "--seed", "4"]
    compared = runner.invoke(
        app, ["compare", str(policy), *faults, "--out", str(tmp_path / "c"),
              "--json", str(tmp_path / "c.json")],
    )  # fmt: skip
    assert compared.exit_code == 0, compared.output
    assert "faults injected (seed 4)" in " ".join(compared.output.split())
    simulated = runner.invoke(
        app, ["simulate", "--policies", "tide", "--policy", str(policy), *faults,
              "--out", str(tmp_path / "s"), "--json", str(tmp_path / "s.json")],
    )  # fmt: skip
    assert simulated.exit_code == 0, simulated.output
    (c,) = json.loads((tmp_path / "c.json").read_text())["summaries"]
    (s,) = json.loads((tmp_path / "s.json").read_text())["summaries"]
    assert c["node_failures"] > 0 and c["metrics_outages"] > 0
    assert {k: v for k, v in c.items() if k not in ("policy", "wall_s")} == {
        k: v for k, v in s.items() if k not in ("policy", "wall_s")
    }


def test_simulate_gives_the_same_report_in_one_process_and_in_two(tmp_path: Path) -> None:
    docs = []
    for workers in ("1", "2"):
        result = runner.invoke(
            app,
            ["simulate", "--duration", "2", "--policies", "tide,static,hpa", "--workers", workers,
             "--out", str(tmp_path / workers), "--json", str(tmp_path / f"{workers}.json")],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        doc = json.loads((tmp_path / f"{workers}.json").read_text())
        docs.append([{k: v for k, v in s.items() if k != "wall_s"} for s in doc["summaries"]])
    assert docs[0] == docs[1]
    result = runner.invoke(app, ["simulate", "--workers", "0", "--out", str(tmp_path / "0")])
    assert result.exit_code == 2 and "--workers" in result.output


def test_a_long_trace_without_quiet_interval_gets_the_tip(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,replicas,duration_s\na,0,1,600\nb,864000,1,600\n")
    args = ["simulate", "--trace", str(trace), "--policies", "static", "--out", str(tmp_path)]
    tipped = runner.invoke(app, args)
    assert tipped.exit_code == 0, tipped.output
    assert "arrivals span 10 days; --quiet-interval 600" in " ".join(tipped.output.split())
    quiet = runner.invoke(app, [*args, "--quiet-interval", "600"])
    assert quiet.exit_code == 0, quiet.output
    assert "tip:" not in quiet.output
    short = tmp_path / "s.csv"
    short.write_text("job_id,submit_s,replicas,duration_s\na,0,1,600\nb,3600,1,600\n")
    plain = runner.invoke(app, ["simulate", "--trace", str(short), "--policies", "static",
                                "--out", str(tmp_path)])  # fmt: skip
    assert "tip:" not in plain.output


def test_compare_takes_the_quiet_interval(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY % ("p", "60s"))
    args = ["compare", str(policy), "--duration", "2", "--out", str(tmp_path)]
    ok = runner.invoke(app, [*args, "--quiet-interval", "600"])
    assert ok.exit_code == 0, ok.output
    refused = runner.invoke(app, [*args, "--quiet-interval", "0"])
    assert refused.exit_code == 2
    assert "must be a finite number of seconds > 0" in " ".join(refused.output.split())


def test_simulate_over_seeds_reports_each_seed_and_their_medians(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["simulate", "--policies", "tide,static", "--duration", "3", "--out", str(out)]
    result = runner.invoke(app, [*args, "--seeds", "0,2"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "seeds 0,2" in text
    assert "3 plots (the JCT CDF of every seed's jobs, the others of seed 0)" in text
    doc = json.loads((out / "report.json").read_text())
    assert doc["meta"]["seeds"] == [0, 2]
    got = [(s["policy"], s["seed"]) for s in doc["summaries"]]
    assert got == [("tide", 0), ("static", 0), ("tide", 2), ("static", 2)]
    with (out / "jobs.csv").open(newline="") as f:
        seeds = {(r["policy"], r["seed"]) for r in csv.DictReader(f)}
    assert seeds == {("tide", "0"), ("static", "0"), ("tide", "2"), ("static", "2")}
    # Each seed is the run --seed would give.
    for seed in (0, 2):
        single = runner.invoke(
            app, [*args, "--seed", str(seed), "--json", str(tmp_path / "1.json")]
        )
        assert single.exit_code == 0, single.output
        one = json.loads((tmp_path / "1.json").read_text())["summaries"]
        mine = [s for s in doc["summaries"] if s["seed"] == seed]
        for a, b in zip(one, mine, strict=True):
            assert {k: v for k, v in a.items() if k != "wall_s"} == {
                k: v for k, v in b.items() if k != "wall_s"
            }
    ratios = [s["avg_jct_h"] for s in doc["summaries"]]
    per_seed = f"{ratios[0] / ratios[1]:.2f} {ratios[2] / ratios[3]:.2f}"
    assert "tide ÷ static, average JCT: median" in text and f"(per seed: {per_seed})" in text
    bounds = doc["meta"]["avg_jct_lower_bound_h_by_seed"]
    to_bound = statistics.median(
        s["avg_jct_h"] / b for s, b in zip(doc["summaries"][::2], bounds, strict=True)
    )
    assert f"tide's average is {to_bound:.2f} times it (median over the seeds)" in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seed", "3", "--seeds", "0,1"], "give --seed or --seeds, not both"),
        (["--seeds", "0,1,0"], "seed 0 is given twice"),
        (["--seeds", "0,x"], "'x' is not a non-negative integer"),
    ],
    ids=["both", "twice", "not-a-number"],
)
def test_bad_seeds_are_refused_before_anything_runs(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["simulate", "--out", str(out), *flags])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not out.exists()


@pytest.mark.parametrize(
    ("header", "row", "reads"),
    [
        ("timestamp,duration,num_gpus,gpu_time,cluster", "2017-10-09 07:01:55,600.0,2,1200.0,c", 3),
        ("job_id,submit_s,replicas,duration_s", "a,0,2,600", 1),
    ],
    ids=["philly-drawn-per-seed", "tide-trace-read-once"],
)
def test_tune_runs_a_trace_at_every_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, header: str, row: str, reads: int
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(f"{header}\n{row}\n")
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [1m]\n")
    seen: list[Seeded] = []

    class Stop(Exception):
        pass

    def fake_tune(**kwargs: object) -> None:
        seen.extend(kwargs["seeded"])  # type: ignore[arg-type]
        raise Stop

    monkeypatch.setattr(tune_command, "tune", fake_tune)
    args = ["tune", str(space), "--trace", str(trace), "--seeds", "0,1,2", "--node-mtbf", "50"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "o")])
    assert isinstance(result.exception, Stop)
    # Every seed runs with its own measurement noise and faults, as simulate --seeds runs it;
    # only Philly and ITP traces draw their jobs again for each seed.
    assert [one.seed for one in seen] == [0, 1, 2]
    assert [one.options.metrics.seed for one in seen] == [0, 1, 2]
    assert [one.options.faults.seed for one in seen] == [0, 1, 2]
    assert len({id(one.workload) for one in seen}) == reads


def test_tune_takes_the_replay_options_of_simulate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_s,replicas,duration_s\na,0,2,600\nb,oops,1,60\n")
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [1m]\n")
    args = ["tune", str(space), "--trace", str(trace), "--out", str(tmp_path / "o")]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1
    assert f"{trace}:3: error: submit_s: 'oops' is not a number" in " ".join(refused.output.split())
    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def fake_tune(**kwargs: object) -> None:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(tune_command, "tune", fake_tune)
    more = ["--skip-bad-rows", "--quiet-interval", "600", "--horizon", "2", "--node-mtbf", "50"]
    more += ["--metrics-outage-every", "6"]
    result = runner.invoke(app, [*args, *more])
    assert isinstance(result.exception, Stop), result.output
    (one,) = seen["seeded"]  # type: ignore[misc]
    assert one.workload.skipped_rows == 1 and len(one.workload.jobs) == 1
    assert one.options.quiet_interval_s == 600.0 and one.options.horizon_s == 7200.0
    assert one.options.faults.node_mtbf_s == 50 * 3600.0
    assert one.options.faults.outage_every_s == 6 * 3600.0


def test_compare_tells_apart_two_files_of_one_name(tmp_path: Path) -> None:
    for folder, interval in (("a", "60s"), ("b", "120s")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "p.yaml").write_text(POLICY % ("p", interval))
    first, second = tmp_path / "a" / "p.yaml", tmp_path / "b" / "p.yaml"
    out = tmp_path / "out"
    args = ["compare", str(first), str(second), "--duration", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "report.json").read_text())
    assert [s["policy"] for s in doc["summaries"]] == [str(first), str(second)]
    again = runner.invoke(app, ["compare", str(first), str(first), "--out", str(out)])
    assert again.exit_code == 1
    assert "given twice" in again.output


def test_simulate_refuses_a_policy_given_twice(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["simulate", "--policies", "tide,static,tide", "--out", str(tmp_path)]
    )
    assert result.exit_code == 1
    assert "--policies: tide is given twice" in result.output


WIDE = {"COLUMNS": "300"}  # an error box as wide as the long temporary paths in it


@pytest.mark.parametrize("command", ["simulate", "compare", "tune"])
def test_an_output_that_cannot_be_written_is_refused_before_anything_runs(
    tmp_path: Path, command: str
) -> None:
    a_file = tmp_path / "report"
    a_file.write_text("not a folder")
    first = {
        "simulate": [],
        "compare": [str(tmp_path / "p.yaml")],
        "tune": [str(tmp_path / "s.yaml")],
    }
    (tmp_path / "p.yaml").write_text(POLICY % ("p", "60s"))
    (tmp_path / "s.yaml").write_text("parameters:\n  defaults.cooldown: [1m]\n")
    args = [command, *first[command], "--duration", "1"]
    for out in (a_file, a_file / "below"):  # once ran the whole replay, then a traceback
        result = runner.invoke(app, [*args, "--out", str(out)], env=WIDE)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '--out': {a_file} is a file, not a folder" in " ".join(
            result.output.split()
        )
    if command != "tune":
        result = runner.invoke(
            app, [*args, "--out", str(tmp_path / "o"), "--json", str(tmp_path)], env=WIDE
        )
        assert result.exit_code == 2, result.output
        assert f"{tmp_path} is a folder, not a file" in " ".join(result.output.split())
        assert not (tmp_path / "o").exists()


def test_tune_runs_one_process_per_cpu_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [1m, 2m, 3m, 4m]\n")
    calls: list[tuple[int | None, int]] = []
    real = tune_command.worker_count

    def spy(asked: int | None, runs: int) -> int:
        calls.append((asked, runs))
        return real(asked, runs)

    monkeypatch.setattr(tune_command, "worker_count", spy)
    for extra in ([], ["--workers", "1"]):
        result = runner.invoke(
            app, ["tune", str(space), "--duration", "1", *extra, "--out", str(tmp_path / "o")]
        )
        assert result.exit_code == 0, result.output
    # Four trials and the base policy's run: at most five processes, one per CPU by default.
    assert calls == [(None, 5), (1, 5)]


def test_tune_shows_the_best_trial_against_the_base_on_each_workload(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.cooldown: [1m, 10m]\n")
    out = tmp_path / "o"
    result = runner.invoke(
        app, ["tune", str(space), "--seeds", "0,1", "--duration", "3", "--out", str(out)], env=WIDE
    )
    assert result.exit_code == 0, result.output
    runs = json.loads((out / "trials.json").read_text())
    base = runs[0]
    best = min(runs[1:], key=lambda r: r["objective"])
    words = " ".join(result.output.split())  # the table's title wraps
    if best["objective"] >= base["objective"]:  # the base is best: nothing to compare
        assert "against the base policy, avg_jct_h per workload" not in words
        return
    assert "best trial against the base policy, avg_jct_h per workload" in words
    for before, after in zip(base["by_workload"], best["by_workload"], strict=True):
        lines = result.output.splitlines()
        row = next(line.split() for line in lines if line.split()[:1] == [before["workload"]])
        assert row[:4] == [
            before["workload"], str(before["seed"]), f"{before['avg_jct_h']:.3f}",
            f"{after['avg_jct_h']:.3f}",
        ]  # fmt: skip
