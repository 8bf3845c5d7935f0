"""The ``tide`` command: thin typer commands over keyword-only core functions."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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
from tide import policy_commands, sim_commands, tune_command

app = typer.Typer(
    name="tide",
    help="Elastic GPU autoscaling for Volcano: plan, validate and simulate scaling policies.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
policy_commands.register(app)
sim_commands.register(app)
tune_command.register(app)


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


def _plan_table(plan: Plan) -> Table:
    table = Table(title="tide plan", show_lines=False)
    table.add_column("job", no_wrap=True)
    table.add_column("replicas", justify="right", no_wrap=True)
    table.add_column("reason", no_wrap=True)
    table.add_column("message", ratio=1, min_width=30)
    for d in plan.decisions:
        arrow = f"{d.current_replicas} → {d.target_replicas}"
        style = (
            "green"
            if d.target_replicas > d.current_replicas
            else ("yellow" if d.target_replicas < d.current_replicas else "")
        )
        table.add_row(d.job, f"[{style}]{arrow}[/]" if style else arrow, d.reason.value, d.message)
    return table


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
        bool, typer.Option("--json", help="Print the decisions as JSON instead of a table.")
    ] = False,
) -> None:
    """Print the decisions the engine would make for an observation, with their reasons."""
    try:
        loaded_policy = load_policy(policy or example_policy_path())
        loaded = load_observation(observation or example_observation_path())
        result = plan_observation(observation=loaded, policy=loaded_policy)
    except TideError as e:
        Console(stderr=True).print(f"[red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from e
    if as_json:
        decisions = [
            {
                "job": d.job,
                "current_replicas": d.current_replicas,
                "target_replicas": d.target_replicas,
                "reason": d.reason.value,
                "message": d.message,
            }
            for d in result.decisions
        ]
        typer.echo(json.dumps(decisions, indent=2))
        return
    Console().print(_plan_table(result))


def main() -> None:
    """Entry point of the ``tide`` console script."""
    # Decisions already carry their reasons; log only what they cannot say.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    app()
