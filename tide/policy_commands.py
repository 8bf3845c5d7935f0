"""``tide validate``: check the files tide reads before they are used: ElasticPolicy files,
elastic Volcano Jobs, cluster files and tune search spaces."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from scheduler_policy.policy.fields import read_yaml_documents
from scheduler_policy.policy.validate import YAML_SUFFIXES, FileReport, validate_file
from scheduler_policy.vocabulary.errors import PolicyError
from simulations.cluster_config import KIND as CLUSTER_KIND
from simulations.cluster_config import load_cluster
from simulations.errors import ClusterFileError, SearchSpaceError
from simulations.tune_space import KIND as SPACE_KIND
from simulations.tune_space import load_search_space


def print_reports(reports: list[FileReport], *, console: Console) -> None:
    """Print each file's errors and warnings, or ``OK path`` for a clean file.

    Args:
        reports: what ``validate_all`` found.
        console: where to print.
    """
    for report in reports:
        if report.skipped is not None:
            console.print(Text.assemble(("SKIP", "bold"), f" {report.path} ({report.skipped})"))
            continue
        if not report.errors and not report.warnings:
            console.print(Text.assemble(("OK", "bold green"), f" {report.path}"))
            continue
        for error in report.errors:
            console.print(Text.assemble((f"{report.path}: ", "bold"), ("error: ", "red"), error))
        for warning in report.warnings:
            console.print(
                Text.assemble((f"{report.path}: ", "bold"), ("warning: ", "yellow"), warning)
            )


def _tide_file(path: Path) -> str | None:
    """``cluster`` or ``space`` for a simulator file (by its ``kind``, or, without one, by its
    shape: a cluster's ``nodes`` and ``queues``, a search space's ``parameters``); None for a
    file ``validate_file`` checks (a policy, Volcano Jobs) or one it reports unreadable."""
    try:
        documents = [d for d in read_yaml_documents(path) if d is not None]
    except PolicyError:
        return None
    if len(documents) != 1 or not isinstance(documents[0], Mapping):
        return None
    document = documents[0]
    if "apiVersion" in document:
        return None  # a Kubernetes object, or a policy
    kind = document.get("kind")
    if kind == CLUSTER_KIND or (kind is None and {"nodes", "queues"} <= set(document)):
        return "cluster"
    if kind == SPACE_KIND or (kind is None and "parameters" in document):
        return "space"
    return None


def validate_one(path: Path, *, other_kinds_ok: bool = False) -> FileReport:
    """Validate one file tide reads: a policy, Volcano Jobs, a cluster file or a search space.

    Args:
        path: the file.
        other_kinds_ok: see ``validate_file``: true for the files found in a directory.

    Returns:
        Its report.
    """
    what = _tide_file(path)
    if what == "cluster":
        try:
            load_cluster(path)
        except ClusterFileError as e:
            return FileReport(path=path, errors=tuple(e.problems))
        return FileReport(path=path)
    if what == "space":
        try:
            load_search_space(path)
        except SearchSpaceError as e:
            problem = str(e).removeprefix(f"{path}: ")
            return FileReport(path=path, errors=(problem,))
        return FileReport(path=path)
    return validate_file(path, other_kinds_ok=other_kinds_ok)


def validate_all(paths: list[Path]) -> list[FileReport]:
    """Validate files, and every ``*.yaml``/``*.yml`` file under each directory, recursively
    (sorted by path; a directory holding none is an error).

    Args:
        paths: files and directories, in the order given.

    Returns:
        One report per file.
    """
    reports: list[FileReport] = []
    for path in paths:
        if not path.is_dir():
            reports.append(validate_one(path))
            continue
        files = sorted(p for p in path.rglob("*") if p.suffix in YAML_SUFFIXES and p.is_file())
        if not files:
            reports.append(FileReport(path=path, errors=("directory holds no .yaml or .yml file",)))
        reports.extend(validate_one(file, other_kinds_ok=True) for file in files)
    return reports


def exit_code(reports: list[FileReport], *, strict: bool) -> int:
    """1 when any file has errors, or warnings under ``strict``; else 0.

    Args:
        reports: what ``validate_all`` found.
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
            help="ElasticPolicy files, Volcano Job manifests, cluster files, tune search spaces, "
            "or directories, searched recursively for *.yaml and *.yml files.",
            metavar="PATH",
            show_default=False,
        ),
    ],
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit with code 1 on warnings too, not only errors.")
    ] = False,
) -> None:
    """Check policy files, elastic Volcano Jobs, cluster files and search spaces; exit 1 when any
    has errors."""
    # soft_wrap: a message is one line however narrow the terminal, so it stays greppable.
    console = Console(soft_wrap=True, highlight=False)
    reports = validate_all(paths)
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
