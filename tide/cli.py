"""The ``tide`` command: thin typer commands over keyword-only core functions."""

from __future__ import annotations

import importlib.metadata
import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperOption

from scheduler_policy.adapters.observation_file import (
    example_observation_path,
    example_policy_path,
    load_observation,
)
from scheduler_policy.decision.pipeline import Plan, decide
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.file import load_policy
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.errors import TideError
from scheduler_policy.vocabulary.state import Observation
from tide import (
    forecast_command,
    history_command,
    policy_commands,
    scaling_command,
    sim_commands,
    tune_command,
)
from tide.engine import command as engine_command
from tide.plan_view import plan_document, plan_renderable, queue_views
from tide.sim_options import error_lines

app = typer.Typer(
    name="tide",
    help="Elastic GPU autoscaling for Volcano: plan, validate and simulate scaling policies.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# What a value of each option is, in the help (`--duration HOURS`): typer would print each
# parameter's Python type instead (`<float>`, `<list[Path]>`, and `<bool>` after every flag).
METAVARS = {
    "--trace": "FILE", "--format": "FORMAT", "--member": "NAME", "--cluster": "FILE",
    "--policy": "FILE", "--policies": "LIST", "--seed": "N", "--seeds": "0,1,2",
    "--duration": "HOURS", "--load": "SHARE", "--start": "HOURS", "--end": "HOURS",
    "--horizon": "HOURS", "--node-mtbf": "HOURS", "--metrics-outage-every": "HOURS",
    "--quiet-interval": "SECONDS", "--workers": "N", "--out": "DIR", "--json": "PATH",
    "--observation": "FILE",
}  # fmt: skip


def _help_type(param: TyperArgument | TyperOption, ctx: object) -> str | None:
    """The help's type column: a flag has none, an argument's name says it (``PATH...``), an
    option shows what its value is (``METAVARS``)."""
    if isinstance(param, TyperArgument):
        return None
    if param.is_flag or param.count:
        return None
    long = next((o for o in param.opts if o.startswith("--")), "")
    return param.metavar or METAVARS.get(long) or (param.name or "value").upper()


# typer (0.29) has no setting for this; its two parameter classes take the column from here.
TyperArgument.display_type_rich = _help_type  # type: ignore[method-assign,assignment]
TyperOption.display_type_rich = _help_type  # type: ignore[method-assign,assignment]


def _version(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("tide")
        except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
            version = "unknown (not installed)"
        typer.echo(f"tide {version}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print tide's version and exit."
        ),
    ] = False,
) -> None:
    """Elastic GPU autoscaling for Volcano: plan, validate and simulate scaling policies."""


policy_commands.register(app)
sim_commands.register(app)
tune_command.register(app)
history_command.register(app)
scaling_command.register(app)
engine_command.register(app)
forecast_command.register(app)


def plan_observation(*, observation: Observation, policy: ElasticPolicy) -> Plan:
    """The decisions the engine would make for ``observation`` under ``policy``.

    Args:
        observation: the cluster as observed.
        policy: the policy in force.

    Returns:
        The plan: decisions and the writes they imply.
    """
    models = ModelCache(refit_s=policy.model_refit_s)
    return decide(observation, policy, fits=models.fit(observation, policy))


@app.command()
def plan(
    observation: Annotated[
        Path | None,
        typer.Option(
            "--observation",
            "-o",
            help="Observation file (YAML or JSON). Default: the built-in example.",
            show_default=False,
        ),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            "-p",
            help="ElasticPolicy file. Default: the built-in example policy.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON instead of a table: the decisions, and each managed queue's "
            "budget, headroom and forecast.",
        ),
    ] = False,
) -> None:
    """Print the decisions the engine would make for an observation, with their reasons."""
    try:
        loaded_policy = load_policy(policy or example_policy_path())
        loaded = load_observation(observation or example_observation_path())
        result = plan_observation(observation=loaded, policy=loaded_policy)
    except TideError as e:
        for line in error_lines(e):
            Console(stderr=True).print(line, highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from e
    if as_json:
        queues = queue_views(loaded, loaded_policy, result)
        typer.echo(json.dumps(plan_document(result, queues), indent=2))
        return
    Console().print(plan_renderable(result))


def main() -> None:
    """Entry point of the ``tide`` console script."""
    # Decisions already carry their reasons; log only what they cannot say.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    app()
