"""``tide tune``: search policy parameters over workloads, in parallel worker processes.

A search space (YAML) names the parameters and their values::

    method: random          # or grid
    trials: 20              # random only
    seed: 0
    objective: avg_jct_h    # any Summary field; lower is better
    parameters:
      interval_s: [30, 60, 120]
      defaults.cooldown_s: [60, 300, 600]
      defaults.tolerance: {min: 0.01, max: 0.2}   # random: uniform; grid: not allowed

Trials are appended to ``trials.csv`` as they finish, so an interrupted search keeps them.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scheduler_policy.fields import yaml_problem
from scheduler_policy.policy import Defaults, ElasticPolicy
from simulations.api import PolicyRun, run_one
from simulations.cluster_config import ClusterSpec
from simulations.errors import SearchSpaceError
from simulations.parallel import results_as_done
from simulations.report import Summary, summarize
from simulations.run import RunOptions
from simulations.workload import Workload

# Numeric policy fields only (the objective is a choice of words, not a number to search).
_TOP = {f.name for f in dataclasses.fields(ElasticPolicy)} - {
    "name",
    "defaults",
    "queues",
    "objective",
}
_DEFAULTS = {f.name for f in dataclasses.fields(Defaults)}
_INTS = {"max_step_up", "max_step_down"}


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """What to search.

    Attributes:
        method: ``grid`` or ``random``.
        trials: how many random trials.
        seed: the random search's seed.
        objective: the Summary field to minimize (averaged over workloads).
        choices: per parameter, a list of values.
        ranges: per parameter, ``(low, high)`` for uniform random draws.
    """

    method: str
    trials: int
    seed: int
    objective: str
    choices: Mapping[str, tuple[float, ...]]
    ranges: Mapping[str, tuple[float, float]]


def load_search_space(path: Path) -> SearchSpace:
    """Read a search space file.

    Raises:
        SearchSpaceError: unreadable, or a problem naming the file and parameter.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise SearchSpaceError(f"{path}: cannot read: {e}") from e
    except yaml.YAMLError as e:
        raise SearchSpaceError(f"{path}: {yaml_problem(e)}") from e
    if not isinstance(data, dict) or not isinstance(data.get("parameters"), dict):
        raise SearchSpaceError(f"{path}: needs a 'parameters' mapping")
    method = data.get("method", "random")
    if method not in ("grid", "random"):
        raise SearchSpaceError(f"{path}: method must be grid or random, got {method!r}")
    objective = data.get("objective", "avg_jct_h")
    if objective not in Summary.__dataclass_fields__:
        raise SearchSpaceError(f"{path}: objective {objective!r} is not a report figure")
    choices: dict[str, tuple[float, ...]] = {}
    ranges: dict[str, tuple[float, float]] = {}
    for name, spec in data["parameters"].items():
        field = name.removeprefix("defaults.")
        if (name.startswith("defaults.") and field not in _DEFAULTS) or (
            not name.startswith("defaults.") and name not in _TOP
        ):
            known = sorted([*_TOP, *(f"defaults.{d}" for d in _DEFAULTS)])
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; one of {', '.join(known)}"
            raise SearchSpaceError(f"{path}: parameters.{name}: not a policy parameter{hint}")
        if isinstance(spec, list) and spec and all(isinstance(v, int | float) for v in spec):
            choices[name] = tuple(float(v) for v in spec)
        elif isinstance(spec, dict) and set(spec) == {"min", "max"} and method == "random":
            low, high = float(spec["min"]), float(spec["max"])
            if not low <= high:
                raise SearchSpaceError(f"{path}: parameters.{name}: min {low} > max {high}")
            ranges[name] = (low, high)
        else:
            raise SearchSpaceError(
                f"{path}: parameters.{name}: need a list of numbers"
                + (" or {min, max}" if method == "random" else "")
                + f", got {spec!r}"
            )
    trials = int(data.get("trials", 20))
    return SearchSpace(method, trials, int(data.get("seed", 0)), objective, choices, ranges)


def distinct_sets(space: SearchSpace) -> float:
    """How many different parameter sets the space holds (infinite with a range)."""
    if space.ranges:
        return math.inf
    return float(math.prod(len(set(v)) for v in space.choices.values()))


def candidates(space: SearchSpace) -> list[dict[str, float]]:
    """Every parameter set to try (grid: the product; random: ``trials`` seeded draws).

    Random draws never repeat a set: a repeat would cost a whole trial to learn nothing. When
    the space holds fewer sets than ``trials``, each runs once, in a seeded random order.
    """
    if space.method == "grid":
        names = list(space.choices)
        return [
            dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(space.choices[n] for n in names))
        ]
    rng = np.random.default_rng(space.seed)
    if distinct_sets(space) <= space.trials:
        names = list(space.choices)
        grid = list(itertools.product(*(sorted(set(space.choices[n])) for n in names)))
        return [dict(zip(names, grid[i], strict=True)) for i in rng.permutation(len(grid))]
    out: list[dict[str, float]] = []
    seen: set[tuple[float, ...]] = set()
    while len(out) < space.trials:
        params = {n: float(rng.choice(v)) for n, v in space.choices.items()}
        params.update({n: float(rng.uniform(lo, hi)) for n, (lo, hi) in space.ranges.items()})
        key = tuple(params.values())
        if key not in seen:
            seen.add(key)
            out.append(params)
    return out


def apply_params(policy: ElasticPolicy, params: Mapping[str, float]) -> ElasticPolicy:
    """``policy`` with ``params`` (``interval_s``, ``defaults.cooldown_s``, ...) set."""
    top: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for name, value in params.items():
        field = name.removeprefix("defaults.")
        cast: Any = round(value) if field in _INTS else value
        (defaults if name.startswith("defaults.") else top)[field] = cast
    return dataclasses.replace(
        policy, defaults=dataclasses.replace(policy.defaults, **defaults), **top
    )


def _trial(
    policy: ElasticPolicy, workloads: Sequence[Workload], cluster: ClusterSpec, options: RunOptions
) -> list[Summary]:
    return [
        summarize(
            run_one(PolicyRun("tide", "tide", policy), workload=w, cluster=cluster, options=options)
        )
        for w in workloads
    ]


def objective_of(summaries: Sequence[Summary], objective: str) -> float:
    """The mean of ``objective`` over workloads (NaN counts as infinitely bad)."""
    values = [float(getattr(s, objective)) for s in summaries]
    return math.inf if any(math.isnan(v) for v in values) else float(np.mean(values))


def tune(
    *,
    space: SearchSpace,
    base_policy: ElasticPolicy,
    workloads: Sequence[Workload],
    cluster: ClusterSpec,
    options: RunOptions,
    out_dir: Path,
    workers: int = 2,
    on_trial: Callable[[int, int], None] | None = None,
) -> TuneResult:
    """Run every candidate; append each finished trial to ``out_dir/trials.csv``.

    An interrupt (Ctrl-C) stops every trial not finished at once, and returns what finished,
    marked ``interrupted``.

    Args:
        space: the search space.
        base_policy: the policy whose parameters are varied.
        workloads: workloads each trial runs on.
        cluster: the cluster.
        options: run options.
        out_dir: where ``trials.csv`` goes.
        workers: worker processes.
        on_trial: called with (finished, total) after each trial.

    Returns:
        The best policy and every finished trial.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = candidates(space)
    names = sorted({n for c in todo for n in c})
    trials: list[tuple[dict[str, float], float]] = []
    interrupted = False
    calls = [(apply_params(base_policy, p), workloads, cluster, options) for p in todo]
    with (out_dir / "trials.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", *names, space.objective])
        f.flush()
        try:
            for index, summaries in results_as_done(_trial, calls, workers=workers):
                params = todo[index]
                value = objective_of(summaries, space.objective)
                trials.append((params, value))
                writer.writerow([index, *(params.get(n, "") for n in names), value])
                f.flush()
                if on_trial is not None:
                    on_trial(len(trials), len(todo))
        except KeyboardInterrupt:
            interrupted = True  # the workers are already stopped; the finished trials count
    best = min(trials, key=lambda t: t[1])[0] if trials else {}
    return TuneResult(apply_params(base_policy, best), trials, len(todo), interrupted)


@dataclass(frozen=True, slots=True)
class TuneResult:
    """What ``tune`` found.

    Attributes:
        best: the base policy with the best finished trial's parameters (the base policy
            itself when no trial finished).
        trials: every finished trial, ``(params, objective)``, in the order they finished.
        planned: how many trials were to run.
        interrupted: whether an interrupt stopped the search before every trial finished.
    """

    best: ElasticPolicy
    trials: list[tuple[dict[str, float], float]]
    planned: int
    interrupted: bool = False


def policy_yaml(policy: ElasticPolicy) -> str:
    """``policy`` as an ElasticPolicy file ``load_policy`` reads back."""
    d = policy.defaults
    spec: dict[str, Any] = {
        "interval": f"{policy.interval_s:g}s",
        "modelRefitInterval": f"{policy.model_refit_s:g}s",
        "objective": policy.objective.value,
        "defaults": {
            "tolerance": d.tolerance,
            "restartCost": f"{d.restart_cost_s:g}s",
            "cooldown": f"{d.cooldown_s:g}s",
            "maxStepUp": d.max_step_up,
            "maxStepDown": d.max_step_down,
            "stabilizationWindow": {"up": f"{d.window_up_s:g}s", "down": f"{d.window_down_s:g}s"},
            "assumedRemaining": f"{d.assumed_remaining_s:g}s",
        },
        "queues": [
            {
                "name": q.name,
                "elastic": q.elastic,
                "borrowIdleGpus": q.borrow,
                "headroom": {
                    "gpus": q.headroom.gpus,
                    **(
                        {"forecastQuantile": q.headroom.forecast_quantile}
                        if q.headroom.forecast_quantile is not None
                        else {}
                    ),
                    "horizon": f"{q.headroom.horizon_s:g}s",
                },
                **(
                    {"maxElasticGpus": q.max_elastic_gpus} if q.max_elastic_gpus is not None else {}
                ),
            }
            for q in policy.queues
        ],
    }
    doc = {
        "apiVersion": "tide.io/v1alpha1",
        "kind": "ElasticPolicy",
        "metadata": {"name": policy.name},
        "spec": spec,
    }
    return yaml.safe_dump(doc, sort_keys=False)
