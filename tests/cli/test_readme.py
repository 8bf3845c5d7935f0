"""The README's synopsis of each command names every option the command takes."""

from __future__ import annotations

import re
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
