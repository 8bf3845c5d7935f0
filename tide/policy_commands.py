"""``tide validate``: check ElasticPolicy files and elastic Volcano Jobs before deploying them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from scheduler_policy.policy.validate import FileReport, validate_paths


def print_reports(reports: list[FileReport], *, console: Console) -> None:
    """Print each file's errors and warnings, or ``OK path`` for a clean file.

    Args:
        reports: what ``validate_paths`` found.
        console: where to print.
    """
    for report in reports:
        if not report.errors and not report.warnings:
            console.print(Text.assemble(("OK", "bold green"), f" {report.path}"))
            continue
        for error in report.errors:
            console.print(Text.assemble((f"{report.path}: ", "bold"), ("error: ", "red"), error))
        for warning in report.warnings:
            console.print(
                Text.assemble((f"{report.path}: ", "bold"), ("warning: ", "yellow"), warning)
            )


def exit_code(reports: list[FileReport], *, strict: bool) -> int:
    """1 when any file has errors, or warnings under ``strict``; else 0.

    Args:
        reports: what ``validate_paths`` found.
        strict: whether warnings fail too.

    Returns:
        The process exit code.
    """
    failed = any(r.errors or (strict and r.warnings) for r in reports)
    return 1 if failed else 0


def validate(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="ElasticPolicy files, Volcano Job manifests, or directories of *.yaml files.",
            metavar="PATH",
            show_default=False,
        ),
    ],
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit with code 1 on warnings too, not only errors.")
    ] = False,
) -> None:
    """Check policy files and elastic Volcano Jobs; exit 1 when any has errors."""
    # soft_wrap: a message is one line however narrow the terminal, so it stays greppable.
    console = Console(soft_wrap=True, highlight=False)
    reports = validate_paths(paths)
    print_reports(reports, console=console)
    code = exit_code(reports, strict=strict)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command to ``app``.

    Args:
        app: the ``tide`` Typer application.
    """
    app.command("validate")(validate)
