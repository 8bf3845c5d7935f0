"""Tests for the ``tide validate`` command through Typer's CliRunner."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tide.policy_commands import register

POLICIES_DIR = Path(__file__).resolve().parents[2] / "manifests" / "policies"

CLEAN = """\
apiVersion: tide.io/v1alpha1
kind: ElasticPolicy
metadata: {name: clean}
spec:
  queues: [{name: research}]
"""
BROKEN = """\
apiVersion: tide.io/v1alpha1
kind: ElasticPolicy
spec:
  defaults: {toleranse: 0.1, maxStepUp: four}
  queues: [{name: research}]
"""
# Valid, but the worker task's minAvailable is unset: a warning, not an error.
WARNS = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: bert
  annotations: {tide.io/elastic: "true"}
spec:
  minAvailable: 1
  tasks:
    - {name: worker, replicas: 4, template: {spec: {}}}
"""
WARNING = (
    "warning: spec.tasks[0].minAvailable: unset, so it defaults to replicas and the job cannot "
    "shrink; set it to the fewest workers the job can run with"
)


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Keeps ``validate`` a named subcommand (a one-command Typer would drop the name)."""

    register(app)
    return app


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(make_app(), ["validate", *args])
    return result.exit_code, result.output


def write(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return [str(tmp_path / name) for name in files]


@pytest.mark.parametrize(
    ("files", "flags", "code", "lines"),
    [
        ({"clean.yaml": CLEAN}, [], 0, ["OK <clean.yaml>"]),
        ({"broken.yaml": BROKEN}, [], 1, [
            "<broken.yaml>: error: spec.defaults.toleranse: unknown key; did you mean "
            "'tolerance'?",
            "<broken.yaml>: error: spec.defaults.maxStepUp: must be an integer, got 'four'",
        ]),
        ({"job.yaml": WARNS}, [], 0, [f"<job.yaml>: {WARNING}"]),
        ({"job.yaml": WARNS}, ["--strict"], 1, [f"<job.yaml>: {WARNING}"]),
        ({"clean.yaml": CLEAN}, ["--strict"], 0, ["OK <clean.yaml>"]),
        ({"clean.yaml": CLEAN, "broken.yaml": BROKEN, "job.yaml": WARNS}, [], 1, [
            "OK <clean.yaml>",
            "<broken.yaml>: error: spec.defaults.toleranse: unknown key; did you mean "
            "'tolerance'?",
            "<broken.yaml>: error: spec.defaults.maxStepUp: must be an integer, got 'four'",
            f"<job.yaml>: {WARNING}",
        ]),
    ],
    ids=["clean", "errors-fail", "warnings-pass", "strict-warnings-fail", "strict-clean-passes",
         "several-files-in-order"],
)  # fmt: skip
def test_validate_command(
    tmp_path: Path, files: dict[str, str], flags: list[str], code: int, lines: list[str]
) -> None:
    paths = write(tmp_path, files)
    exit_code, output = run(*paths, *flags)
    expected = []
    for line in lines:
        for name in files:
            line = line.replace(f"<{name}>", str(tmp_path / name))
        expected.append(line)
    assert output.splitlines() == expected
    assert exit_code == code


def test_validate_command_missing_file_is_an_error(tmp_path: Path) -> None:
    exit_code, output = run(str(tmp_path / "absent.yaml"))
    assert exit_code == 1
    assert output.startswith(f"{tmp_path / 'absent.yaml'}: error: cannot read file: [Errno 2]")


def test_validate_command_requires_a_path() -> None:
    exit_code, _ = run()
    assert exit_code == 2


def test_validate_command_passes_the_example_policies() -> None:
    exit_code, output = run(str(POLICIES_DIR), "--strict")
    assert output.splitlines() == [f"OK {p}" for p in sorted(POLICIES_DIR.glob("*.yaml"))]
    assert exit_code == 0


MANIFESTS = POLICIES_DIR.parent


def test_every_shipped_manifest_passes_strict_validation_recursively() -> None:
    exit_code, output = run(str(MANIFESTS), "--strict")
    files = sorted(p for p in MANIFESTS.rglob("*") if p.suffix in (".yaml", ".yml"))
    assert {p.parent.name for p in files} >= {"clusters", "examples", "policies", "tune"}
    monitoring = {p for p in files if p.parent.name == "monitoring"}
    assert monitoring, "the monitoring manifests are searched too"
    # Kubernetes objects that are not tide's to check: the monitoring manifests, the deployment
    # base (all but its policy) and the example Queues.
    deploy = {p for p in files if p.parent.name == "deploy" and p.name != "policy.yaml"}
    assert deploy, "the deployment base is searched too"
    others = monitoring | deploy | {MANIFESTS / "examples" / "queues.yaml"}
    expected = [f"SKIP {p} (only " if p in others else f"OK {p}" for p in files]
    lines = output.splitlines()
    assert [line[: len(want)] for line, want in zip(lines, expected, strict=True)] == expected
    assert exit_code == 0


def test_a_file_of_other_kinds_is_an_error_when_named_and_skipped_in_a_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "pm.yaml").write_text(
        "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: x}\n"
    )
    exit_code, output = run(str(tmp_path / "pm.yaml"))
    assert exit_code == 1 and "holds no tide.io/v1alpha1 ElasticPolicy" in output
    exit_code, output = run(str(tmp_path))
    assert exit_code == 0
    assert output.strip() == f"SKIP {tmp_path / 'pm.yaml'} (only PodMonitor: not tide's to check)"


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("cluster.yaml", "kind: Cluster\nnodes: 2\ngpus_per_node: 4\nqueues: [{name: a}]\n",
         "<f>: error: gpus_per_node: is now spelled 'gpusPerNode'"),
        ("cluster.yaml", "nodes: 2\ngpusPerNode: 4\nqueues: [{name: a, wieght: 1}]\n",
         "<f>: error: queues[0].wieght: unknown key; did you mean 'weight'?"),
        ("space.yaml", "parameters:\n  defaults.cooldown_s: [60]\n",
         "<f>: error: parameters.defaults.cooldown_s: is now spelled 'defaults.cooldown', as in "
         "the policy file (durations as strings, e.g. '5m')"),
        ("space.yaml", "kind: SearchSpace\nmethod: grid\nparameters:\n  interval: [1m]\n",
         "OK <f>"),
    ],
    ids=["cluster-old-key", "cluster-typo", "space-old-name", "space-clean"],
)  # fmt: skip
def test_validate_checks_cluster_files_and_search_spaces_by_their_shape(
    tmp_path: Path, name: str, text: str, line: str
) -> None:
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (nested / name).write_text(text)
    exit_code, output = run(str(tmp_path))  # found below the folder given
    assert output.splitlines() == [line.replace("<f>", str(nested / name))]
    assert exit_code == (0 if line.startswith("OK") else 1)


def test_what_tune_writes_passes_strict_validation(tmp_path: Path) -> None:
    from tide import tune_command

    app = make_app()
    tune_command.register(app)
    space = tmp_path / "space.yaml"
    space.write_text("method: grid\nparameters:\n  defaults.tolerance: [0.1]\n")
    out = tmp_path / "tide-tune-out"
    tuned = CliRunner().invoke(
        app, ["tune", str(space), "--duration", "1", "--no-bound", "--out", str(out)]
    )
    assert tuned.exit_code == 0, tuned.output
    text = (out / "best-policy.yaml").read_text()
    assert "120s" not in text and "cooldown: 2m" in text
    exit_code, output = run(str(out), "--strict")
    assert output.splitlines() == [f"OK {out / 'best-policy.yaml'}"]
    assert exit_code == 0
