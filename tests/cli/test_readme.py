"""The README's synopsis of each command names every option the command takes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tide.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


def _synopses() -> dict[str, str]:
    """Each ``tide <command>`` line of the README's CLI block, with the bracketed lines below."""
    text = README.read_text(encoding="utf-8")
    block = text.split("## The command-line tool", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    synopses: dict[str, str] = {}
    command = None
    for line in block.splitlines():
        if m := re.match(r"tide (\w+)", line):
            command = m.group(1)
            synopses[command] = line
        elif command and line.strip().startswith("["):
            synopses[command] += " " + line.strip()
        else:
            command = None
    return synopses


COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_readme_lists_every_option(name: str) -> None:
    synopses = _synopses()
    assert name in synopses, f"README.md has no synopsis of tide {name}"
    options = {
        opt
        for param in COMMANDS[name].params
        if param.param_type_name == "option"
        for opt in param.opts
        if opt.startswith("--") and opt != "--help"
    }
    missing = sorted(o for o in options if not re.search(re.escape(o) + r"\b", synopses[name]))
    assert not missing, f"README's synopsis of tide {name} lacks {missing}"


# ---------------------------------------------------------------- the Quickstart's two commands

REPO = README.parent
MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def quickstart_commands() -> list[str]:
    """The commands of the README's Quickstart block, comments dropped."""
    text = README.read_text(encoding="utf-8")
    block = text.split("## Quickstart", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def make_env(**extra: str) -> dict[str, str]:
    """This environment without a virtual environment or an outer make's flags, plus ``extra``."""
    drop = {"VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


def dry_run(target: str, env: dict[str, str]) -> list[str]:
    """The commands ``make TARGET`` would run from scratch (``-n -B``: print, run nothing)."""
    assert MAKE is not None
    done = subprocess.run(
        [MAKE, "-n", "-B", "--no-print-directory", "-C", str(REPO), target],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


RUNS_PYTHON = re.compile(r"(^|[\s/])(python3?|pip3?|tide|ruff|mypy|lint-imports|pytest)\b")


@pytest.mark.quickstart
@needs_make
def test_the_quickstart_is_make_demo_and_make_test() -> None:
    assert quickstart_commands() == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for command in quickstart_commands():
        target = command.removeprefix("make ")
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no target {target}"


@pytest.mark.quickstart
@needs_make
@pytest.mark.parametrize(
    ("target", "runs"),
    [
        ("demo", [".venv/bin/python3 -m pip install", ".venv/bin/tide simulate"]),
        (
            "test",
            [
                '.venv/bin/python3 -m pip install -q "torch==2.13.0"',
                ".venv/bin/ruff check .",
                ".venv/bin/mypy --strict",
                ".venv/bin/lint-imports",
                ".venv/bin/python3 -m pytest",
            ],
        ),
    ],
    ids=["demo", "test"],
)
def test_without_an_active_venv_make_creates_and_uses_dot_venv(
    target: str, runs: list[str]
) -> None:
    commands = dry_run(target, make_env())
    assert commands[0].startswith("python3 -m venv .venv"), commands
    for expected in runs:
        assert any(c.startswith(expected) for c in commands), (expected, commands)
    # Nothing else runs Python or its tools outside .venv: no system-wide pip install.
    others = [c for c in commands[1:] if RUNS_PYTHON.search(c) and ".venv/bin/" not in c]
    assert not [c for c in others if not c.startswith(("if ", "echo", "apt-get", "exit"))], others


@pytest.mark.quickstart
@needs_make
@pytest.mark.parametrize("target", ["demo", "test"])
def test_an_active_venv_is_used_and_none_is_created(target: str, tmp_path: Path) -> None:
    commands = dry_run(target, make_env(VIRTUAL_ENV=str(tmp_path)))
    assert not any("-m venv" in c for c in commands), commands
    assert not any(".venv/" in c for c in commands), commands
    assert any(c.startswith(f"{tmp_path}/bin/python3 -m pip install") for c in commands)
    last = {"demo": f"{tmp_path}/bin/tide simulate", "test": f"{tmp_path}/bin/python3 -m pytest"}
    assert commands[-1].startswith(last[target]), commands


def fake_bin(tmp_path: Path, scripts: dict[str, str]) -> Path:
    """A directory of tiny executables, to be the whole PATH of a make run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return bin_dir


@pytest.mark.quickstart
@needs_make
@pytest.mark.parametrize(
    ("scripts", "returncode", "message"),
    [
        ({}, 2, "only with apt-get (Debian/Ubuntu), which this machine lacks"),
        ({"apt-get": 'echo "$@" >> "$0.calls"', "id": "echo 1000"}, 2, "needs root"),
        ({"prometheus": "exit 0", "promtool": "exit 0", "apt-get": 'echo "$@" >> "$0.calls"'}, 0,
         ""),
    ],
    ids=["no-apt-get", "not-root", "already-installed"],
)  # fmt: skip
def test_make_test_says_what_installing_prometheus_needs(
    tmp_path: Path, scripts: dict[str, str], returncode: int, message: str
) -> None:
    assert MAKE is not None
    bin_dir = fake_bin(tmp_path, scripts)
    done = subprocess.run(
        [MAKE, "-s", "-C", str(REPO), "prometheus"],
        env=make_env(PATH=str(bin_dir)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == returncode, done.stderr
    assert message in done.stderr
    assert not (bin_dir / "apt-get.calls").exists(), "apt-get ran"


@pytest.mark.quickstart
@needs_make
def test_no_tests_collected_fails_make(tmp_path: Path) -> None:
    # pytest exits with 5 when it collects nothing; make, hence CI, must fail on it.
    assert MAKE is not None
    done = subprocess.run(
        [MAKE, "-C", str(REPO), "pytest", f"PYTHON={sys.executable}", f"PYTEST_ARGS={tmp_path}"],
        env=make_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "no tests ran" in done.stdout, done.stdout
    assert done.returncode != 0


@pytest.mark.quickstart
def test_ci_runs_both_quickstart_commands() -> None:
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert commands[-2:] == ["make demo", "make test"]
    assert "set -euo pipefail" in commands
