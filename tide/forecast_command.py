"""``tide forecast evaluate``: a thin command over ``scheduler_policy.models.forecast_eval``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from scheduler_policy.models.demand_grid import DemandGrid, Target
from scheduler_policy.models.forecast_eval import (
    MODELS,
    Evaluation,
    ForecastScore,
    ForecastTrace,
    evaluate_series,
)
from scheduler_policy.vocabulary.errors import ModelFitError
from simulations.demand_series import read_helios, read_trace_demand
from simulations.errors import SimulationError
from tide.sim_options import console, print_error

FORMATS = ("helios", "tide")


def parse_horizons(text: str) -> list[float]:
    """``600,1800,3600`` → seconds, each > 0.

    Raises:
        typer.BadParameter: not a comma-separated list of numbers > 0.
    """
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"must be seconds separated by commas, got {text!r}") from None
    if not values or any(not (v > 0 and v < float("inf")) for v in values):
        raise typer.BadParameter(f"every horizon must be > 0 seconds, got {text!r}")
    return values


def read_series(paths: Sequence[Path], *, fmt: str) -> list[tuple[str, DemandGrid]]:
    """Every series in `paths`, in the given format.

    Raises:
        TraceError: a file cannot be read or has bad rows (file and line).
    """
    out: list[tuple[str, DemandGrid]] = []
    for path in paths:
        if fmt == "helios":
            out.append(read_helios(path))
        else:
            out.extend(read_trace_demand(path))
    return out


def evaluate_files(
    *,
    paths: Sequence[Path],
    fmt: str,
    horizons_s: Sequence[float],
    quantile: float,
    test_days: float,
) -> list[Evaluation]:
    """Evaluate each series of each file.

    Raises:
        TraceError: a bad file or row.
        ValueError: a series too short for the test window, or a bad setting.
        ModelFitError: a forecaster fit failed.
    """
    return [
        evaluate_series(
            grid, name=name, horizons_s=horizons_s, quantile=quantile, test_s=test_days * 86400.0
        )
        for name, grid in read_series(paths, fmt=fmt)
    ]


def score_table(scores: Sequence[ForecastScore]) -> Table:
    """Rows (series, target, horizon, metric), a column per model; the best pinball in bold."""
    table = Table(box=box.SIMPLE_HEAD, title="Rolling-origin forecast accuracy (test window)")
    for column in ("series", "target", "horizon", "metric"):
        table.add_column(column)
    for model in MODELS:
        table.add_column(model, justify="right")
    rows: dict[tuple[str, str, float, str], dict[str, float]] = {}
    for s in scores:
        rows.setdefault((s.series, s.target, s.horizon_s, s.metric), {})[s.model] = s.value
    for (series, target, horizon_s, metric), values in rows.items():
        best = min(values.values()) if metric != "coverage" else None
        cells = []
        for model in MODELS:
            value = values.get(model)
            text = "" if value is None else f"{value:.3f}"
            cells.append(f"[bold]{text}[/bold]" if value is not None and value == best else text)
        table.add_row(series, target, f"{horizon_s / 60:.0f} min", metric, *cells)
    return table


def register(app: typer.Typer) -> None:
    """Add ``forecast evaluate`` to the ``tide`` app."""
    forecast = typer.Typer(help="Headroom forecasts: how accurate they are.", no_args_is_help=True)
    app.add_typer(forecast, name="forecast")

    @forecast.command("evaluate")
    def evaluate(
        series: Annotated[
            list[Path],
            typer.Argument(help="Helios cluster_sequence_vc.csv files, or tide traces."),
        ],
        fmt: Annotated[
            str,
            typer.Option(
                "--format",
                help="helios (per-queue sequence; demand = running + pending GPUs) or tide "
                "(trace format: each queue's non-elastic jobs).",
            ),
        ] = "helios",
        horizons: Annotated[
            str, typer.Option("--horizons", help="Seconds ahead, comma-separated.")
        ] = "600,1800,3600",
        quantile: Annotated[
            float, typer.Option("--quantile", help="The forecast quantile q, in (0, 1).")
        ] = 0.9,
        test_days: Annotated[
            float,
            typer.Option("--test-days", help="Days at each series' end scored, rolling origin."),
        ] = 10.0,
        plot: Annotated[
            Path | None,
            typer.Option(
                "--plot",
                help="Write a plot of forecasts against the actual peak (needs the plots extra).",
            ),
        ] = None,
        json_path: Annotated[
            Path | None, typer.Option("--json", help="Write every score as a JSON record list.")
        ] = None,
    ) -> None:
        """Score tide's headroom forecast against naive ones: MAE, pinball loss and coverage."""
        if fmt not in FORMATS:
            raise typer.BadParameter(f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if not 0.0 < quantile < 1.0:
            raise typer.BadParameter(f"--quantile must be in (0, 1), got {quantile}")
        horizons_s = parse_horizons(horizons)
        plot_forecasts: Callable[[Sequence[ForecastTrace], Path], None] | None = None
        if plot is not None:
            try:
                from simulations.plots import plot_forecasts
            except ImportError as e:
                print_error(ValueError(f"--plot needs matplotlib: pip install 'tide[plots]' ({e})"))
                raise typer.Exit(1) from e
        try:
            evaluations = evaluate_files(
                paths=series,
                fmt=fmt,
                horizons_s=horizons_s,
                quantile=quantile,
                test_days=test_days,
            )
        except (SimulationError, ValueError, ModelFitError) as e:
            print_error(e)
            raise typer.Exit(1) from e
        scores = [s for ev in evaluations for s in ev.scores]
        console.print(score_table(scores))
        if json_path is not None:
            json_path.write_text(json.dumps([s.record() for s in scores], indent=1) + "\n")
        if plot_forecasts is not None and plot is not None:
            chosen = [
                t
                for ev in evaluations
                for t in ev.traces
                if t.target == Target.PEAK.value and t.horizon_s == horizons_s[0]
            ]
            plot_forecasts(chosen, plot)
