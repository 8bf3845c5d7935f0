"""``tide scaling evaluate``: how well the scaling model extrapolates, beside naive baselines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from simulations.errors import TraceError
from tide.scaling_evaluate import MODELS, SIZES, Score, evaluate_all, medians


def scores_table(scores: Sequence[Score]) -> Table:
    """One row per application and n, one column per model; then the median and worst per n."""
    table = Table(title="Scaling model MAPE (%): fit on sizes <= n, predict the sizes in (n, 2n]")
    table.add_column("app")
    table.add_column("n", justify="right")
    for model in MODELS:
        table.add_column(model, justify="right")
    table.add_column("test points", justify="right")
    by = {(s.app, s.n, s.model): s for s in scores}
    sizes = sorted({s.n for s in scores})
    for app in sorted({s.app for s in scores}):
        for n in sizes:
            row = [by.get((app, n, m)) for m in MODELS]
            if not any(row):
                continue
            points = max(s.points for s in row if s is not None)
            table.add_row(
                app, str(n), *(f"{s.mape_percent:.1f}" if s else "-" for s in row), str(points)
            )
    summary = medians(scores)
    for label, which in (("median", 0), ("worst", 1)):
        table.add_section()
        for n in sizes:
            cells = [summary.get((m, n)) for m in MODELS]
            table.add_row(label, str(n), *(f"{c[which]:.1f}" if c else "-" for c in cells), "")
    return table


def register(app: typer.Typer) -> None:
    """Add ``scaling evaluate`` to the ``tide`` app."""
    scaling = typer.Typer(
        help="Judge the scaling model on measured profiles.", no_args_is_help=True
    )
    app.add_typer(scaling, name="scaling")

    @scaling.command("evaluate")
    def evaluate(
        profiles: Annotated[
            Path,
            typer.Argument(
                help="Folder of <app>/placements.csv and scalability.csv (Pollux's format).",
                metavar="PROFILES",
                show_default=False,
            ),
        ],
        json_path: Annotated[
            Path | None,
            typer.Option(
                "--json",
                help='Write the scores as JSON records {"metric": "mape", "unit": "percent", ...}.',
                show_default=False,
            ),
        ] = None,
        apps: Annotated[
            list[str] | None,
            typer.Option(
                "--apps",
                metavar="NAME",
                help="Application to evaluate (repeat for more); default: every one.",
            ),
        ] = None,
        sizes: Annotated[
            str,
            typer.Option(
                "--sizes", metavar="1,2,4,8", help="Training sizes n, comma-separated (replicas)."
            ),
        ] = ",".join(map(str, SIZES)),
        gpus_per_node: Annotated[
            int,
            typer.Option(
                "--gpus-per-node", metavar="N", help="GPUs per node of the profiles' cluster."
            ),
        ] = 4,
    ) -> None:
        """Fit each model on sizes <= n and score it on the measured sizes in (n, 2n]."""
        try:
            try:
                ns = [int(v) for v in sizes.split(",") if v.strip()]
            except ValueError as e:
                raise ValueError(f"--sizes: must be whole numbers, got {sizes!r}") from e
            scores = evaluate_all(profiles, apps=apps or (), sizes=ns, gpus_per_node=gpus_per_node)
        except (TraceError, ValueError) as e:
            Console(stderr=True).print(str(e), highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(1) from e
        Console().print(scores_table(scores))
        if json_path is not None:
            json_path.write_text(json.dumps([s.record() for s in scores], indent=2) + "\n")
