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
