"""``tide tune``'s search space: the parameters, their values, and the policies they make.

A search space (YAML) names the parameters and their values::

    kind: SearchSpace       # optional
    method: random          # or grid
    trials: 20              # random only
    seed: 0
    objective: avg_jct_h    # a Summary field: lower is better, but for the utilizations,
                            # finished jobs and work done (``MAXIMISED``)
    parameters:             # named as in the policy file, durations as strings
      interval: [30s, 1m, 2m]
      defaults.cooldown: [1m, 5m, 10m]
      defaults.tolerance: {min: 0.01, max: 0.2}   # random: uniform; grid: not allowed
      queues.research.headroom.gpus: [0, 2, 4]     # a queue of the base policy
    constraints:            # optional: the best trial must keep these figures within bounds
      p95_queue_nonelastic_h: {max: 1.5}

Parameters take the policy file's names and spellings (``PARAMETERS``); the old snake_case
names (``defaults.cooldown_s``) are refused with the new one. Random draws are rounded as a
person would write them (durations to the second, counts to integers, other numbers to three
significant digits), so that best-policy.yaml reads ``tolerance: 0.0735``, not 16 digits.
Every value must be one the policy file accepts (``check_values``), so that every trial runs a
policy tide could write, and the best one is written as a file that reads back to it.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scheduler_policy.policy.fields import (
    format_duration,
    load_yaml,
    parse_duration,
    section,
    show,
    yaml_problem,
)
from scheduler_policy.policy.file import parse_policy, policy_yaml
from scheduler_policy.policy.spec import ElasticPolicy, QueuePolicy
from scheduler_policy.vocabulary.errors import PolicyError
from scheduler_policy.vocabulary.state import QueueName
from simulations.errors import SearchSpaceError
from simulations.report import Summary

KIND = "SearchSpace"
"""A search space file's ``kind`` (optional; ``tide validate`` tells the file by it or by its
``parameters``)."""

_DURATION, _INT, _NUMBER = "duration", "integer", "number"


@dataclass(frozen=True, slots=True)
class Parameter:
    """A policy field a search may vary.

    Attributes:
        owner: where the field lives: ``policy``, ``defaults``, ``queue`` or ``headroom``.
        field: the dataclass field.
        unit: ``duration`` (seconds; written as a duration string), ``integer`` or ``number``.
    """

    owner: str
    field: str
    unit: str


PARAMETERS = {
    "interval": Parameter("policy", "interval_s", _DURATION),
    "modelRefitInterval": Parameter("policy", "model_refit_s", _DURATION),
    "defaults.tolerance": Parameter("defaults", "tolerance", _NUMBER),
    "defaults.restartCost": Parameter("defaults", "restart_cost_s", _DURATION),
    "defaults.cooldown": Parameter("defaults", "cooldown_s", _DURATION),
    "defaults.maxStepUp": Parameter("defaults", "max_step_up", _INT),
    "defaults.maxStepDown": Parameter("defaults", "max_step_down", _INT),
    "defaults.stabilizationWindow.up": Parameter("defaults", "window_up_s", _DURATION),
    "defaults.stabilizationWindow.down": Parameter("defaults", "window_down_s", _DURATION),
    "defaults.assumedRemaining": Parameter("defaults", "assumed_remaining_s", _DURATION),
}
"""The policy-wide parameters, by the policy file's name for them."""

QUEUE_PARAMETERS = {
    "headroom.gpus": Parameter("headroom", "gpus", _INT),
    "headroom.forecastQuantile": Parameter("headroom", "forecast_quantile", _NUMBER),
    "headroom.horizon": Parameter("headroom", "horizon_s", _DURATION),
    "maxElasticGpus": Parameter("queue", "max_elastic_gpus", _INT),
}
"""A queue's parameters, as ``queues.<queue>.<name>``: the queue is any the base policy has."""

RENAMED = {
    "interval_s": "interval",
    "model_refit_s": "modelRefitInterval",
    "defaults.restart_cost_s": "defaults.restartCost",
    "defaults.cooldown_s": "defaults.cooldown",
    "defaults.max_step_up": "defaults.maxStepUp",
    "defaults.max_step_down": "defaults.maxStepDown",
    "defaults.window_up_s": "defaults.stabilizationWindow.up",
    "defaults.window_down_s": "defaults.stabilizationWindow.down",
    "defaults.assumed_remaining_s": "defaults.assumedRemaining",
    "headroom.forecast_quantile": "headroom.forecastQuantile",
    "headroom.horizon_s": "headroom.horizon",
    "max_elastic_gpus": "maxElasticGpus",
}
"""The old snake_case parameter names (a queue's without their ``queues.<queue>.``), and what
they are called now."""

_TOP_KEYS = ("kind", "method", "trials", "seed", "objective", "parameters", "constraints")
# Report figures a search may minimise or bound: the numbers of a run's Summary, but its wall
# time (a figure of the machine, not of the policy).
FIGURES = tuple(
    f.name for f in dataclasses.fields(Summary) if f.type in ("float", "int") and f.name != "wall_s"
)
# Objectives a search maximises: every other figure is minimised.
MAXIMISED = frozenset({"finished", "gpu_allocation", "useful_utilization", "work_done_ratio"})
# Figures of the workload or of the injected faults, the same for every policy: no objective.
_NOT_OBJECTIVES = frozenset(
    {
        "jobs",
        "skipped_rows",
        "node_failures",
        "node_down_hours",
        "metrics_outages",
        "metrics_outage_minutes",
    }
)


def _queue_param(name: str) -> tuple[str, str] | None:
    """``(queue, field name)`` of a ``queues.<queue>.<name>`` parameter; None for others."""
    if not name.startswith("queues."):
        return None
    rest = name.removeprefix("queues.")
    for field in QUEUE_PARAMETERS:
        if rest.endswith(f".{field}") and len(rest) > len(field) + 1:
            return rest[: -len(field) - 1], field
    return None


def parameter(name: str) -> Parameter | None:
    """The policy field a parameter name stands for; None for a name that is not one."""
    queue = _queue_param(name)
    if queue is not None:
        return QUEUE_PARAMETERS[queue[1]]
    return PARAMETERS.get(name)


def _is_param(name: str) -> bool:
    return parameter(name) is not None


def param_text(name: str, value: float | None) -> str:
    """A parameter's value as a space or policy file writes it: ``5m`` for a duration, ``4``
    for a count, ``0.05`` for a number; ``none`` for an unset field."""
    if value is None:
        return "none"
    param = parameter(name)
    if param is not None and param.unit == _DURATION:
        return format_duration(value)
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _rounded(name: str, value: float) -> float:
    """A random draw as a person would write it: a duration to the second, a count to an
    integer, another number to three significant digits."""
    param = parameter(name)
    unit = param.unit if param is not None else _NUMBER
    if unit == _DURATION:
        return float(round(value))
    if unit == _INT:
        return float(round(value))
    return float(f"{value:.3g}")


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """What to search.

    Attributes:
        method: ``grid`` or ``random``.
        trials: how many random trials.
        seed: the random search's seed.
        objective: the Summary field to minimise (averaged over workloads), or to maximise
            if it is one of ``MAXIMISED`` (utilization, finished jobs, work done).
        choices: per parameter, a list of values.
        ranges: per parameter, ``(low, high)`` for uniform random draws.
        source: the file it was read from, named in errors.
        constraints: per report figure, ``(min, max)`` (either may be infinite) that the best
            trial's figure (its mean over the workloads that have it) must keep within.
    """

    method: str
    trials: int
    seed: int
    objective: str
    choices: Mapping[str, tuple[float, ...]]
    ranges: Mapping[str, tuple[float, float]]
    source: str = "search space"
    constraints: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    @property
    def parameters(self) -> list[str]:
        """The parameters the space varies, sorted."""
        return sorted({*self.choices, *self.ranges})

    @property
    def maximise(self) -> bool:
        """Whether a higher objective is better."""
        return self.objective in MAXIMISED

    def loss(self, objective: float) -> float:
        """What the search minimises: the objective, negated when it is maximised; a NaN
        objective (a workload without the figure) is the worst there is."""
        if math.isnan(objective):
            return math.inf
        return -objective if self.maximise else objective


def load_search_space(path: Path) -> SearchSpace:
    """Read a search space file (the policy file's conventions: its parameter names, durations
    as strings, a did-you-mean for a misspelt key, no key given twice).

    Raises:
        SearchSpaceError: unreadable, or a problem naming the file and parameter.
    """
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise SearchSpaceError(f"{path}: cannot read: {e}") from e
    except yaml.YAMLError as e:
        raise SearchSpaceError(f"{path}: {yaml_problem(e)}") from e
    problems: list[str] = []
    top = section(data, path="", allowed=_TOP_KEYS, problems=problems)
    if top is not None and "kind" in top.mapping and top.mapping["kind"] != KIND:
        kind = top.mapping["kind"]
        close = isinstance(kind, str) and kind.lower() == KIND.lower()
        hint = f"; did you mean {KIND!r}?" if close else ""
        problems.append(f"kind: must be {KIND!r}, got {show(kind)}{hint}")
    if problems:
        raise SearchSpaceError(f"{path}: {problems[0]}")
    assert top is not None
    raw_parameters = top.mapping.get("parameters")
    if not isinstance(raw_parameters, dict):
        raise SearchSpaceError(f"{path}: needs a 'parameters' mapping")
    method = top.mapping.get("method", "random")
    if method not in ("grid", "random"):
        raise SearchSpaceError(f"{path}: method: must be grid or random, got {show(method)}")
    objective = top.mapping.get("objective", "avg_jct_h")
    if objective not in FIGURES:
        raise SearchSpaceError(f"{path}: objective: {_not_a_figure(objective)}")
    if objective in _NOT_OBJECTIVES:
        raise SearchSpaceError(
            f"{path}: objective: {objective} is a figure of the workload or of the injected "
            "faults, the same for every policy; choose one the policy changes, e.g. avg_jct_h"
        )
    counts = {}
    for key, default, least in (("trials", 20, 1), ("seed", 0, 0)):
        value = top.mapping.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise SearchSpaceError(
                f"{path}: {key}: must be an integer >= {least}, got {show(value)}"
            )
        counts[key] = value
    constraints = _load_constraints(top.mapping.get("constraints"), path)
    choices, ranges = _load_parameters(raw_parameters, method, path)
    return SearchSpace(
        method,
        counts["trials"],
        counts["seed"],
        str(objective),
        choices,
        ranges,
        source=str(path),
        constraints=constraints,
    )


def _value(name: str, value: object, path: Path) -> float:
    """One value of parameter ``name``: a duration string for a duration, else a number."""
    param = parameter(name)
    where = f"parameters.{name}"
    if param is not None and param.unit == _DURATION:
        try:
            return parse_duration(value, path=where)
        except ValueError as e:
            raise SearchSpaceError(f"{path}: {e}") from e
    if not _is_number(value):
        raise SearchSpaceError(f"{path}: {where}: need numbers, got {show(value)}")
    assert isinstance(value, int | float)
    if not math.isfinite(value):
        raise SearchSpaceError(f"{path}: {where}: {value} is not a finite number")
    return float(value)


def _load_parameters(
    raw: dict[object, object], method: str, path: Path
) -> tuple[dict[str, tuple[float, ...]], dict[str, tuple[float, float]]]:
    """The ``parameters`` section: each a list of values, or (random search) ``{min, max}``;
    durations as strings, other values as numbers."""
    choices: dict[str, tuple[float, ...]] = {}
    ranges: dict[str, tuple[float, float]] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not _is_param(name):
            raise SearchSpaceError(f"{path}: parameters.{name}: {_not_a_parameter(name)}")
        if isinstance(spec, list) and spec:
            choices[name] = tuple(_value(name, v, path) for v in spec)
        elif isinstance(spec, dict) and set(spec) == {"min", "max"} and method == "random":
            low, high = _value(name, spec["min"], path), _value(name, spec["max"], path)
            if not low <= high:
                raise SearchSpaceError(
                    f"{path}: parameters.{name}: min {param_text(name, low)} > max "
                    f"{param_text(name, high)}"
                )
            ranges[name] = (low, high)
        else:
            raise SearchSpaceError(
                f"{path}: parameters.{name}: need a list of values"
                + (" or {min, max}" if method == "random" else "")
                + f", got {show(spec)}"
            )
    return choices, ranges


def _not_a_parameter(name: object) -> str:
    """Why ``name`` is refused: the new spelling of an old name, else the closest parameter
    (a queue's field: of that queue)."""
    text = str(name)
    parts = text.split(".")
    queue = parts[1] if parts[0] == "queues" and len(parts) > 2 else "QUEUE"
    field = ".".join(parts[2:]) if queue != "QUEUE" else text
    if field in RENAMED:
        new = RENAMED[field]
        full = f"queues.{queue}.{new}" if queue != "QUEUE" else new
        unit = parameter(full)
        hint = " (durations as strings, e.g. '5m')" if unit and unit.unit == _DURATION else ""
        return f"is now spelled {full!r}, as in the policy file{hint}"
    known = sorted([*PARAMETERS, *(f"queues.{queue}.{f}" for f in QUEUE_PARAMETERS)])
    close = difflib.get_close_matches(text, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; one of {', '.join(known)}"
    return f"not a policy parameter{hint}"


def _not_a_figure(name: object) -> str:
    close = difflib.get_close_matches(str(name), FIGURES, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"one of {', '.join(FIGURES)}"
    return f"{name!r} is not a report figure; {hint}"


def _load_constraints(raw: object, path: Path) -> dict[str, tuple[float, float]]:
    """The ``constraints`` section: report figure -> ``{min: N, max: N}`` (either or both)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SearchSpaceError(
            f"{path}: constraints: need a mapping of report figures to {{min, max}}, "
            f"got {show(raw)}"
        )
    out: dict[str, tuple[float, float]] = {}
    for name, bound in raw.items():
        if name not in FIGURES:
            raise SearchSpaceError(f"{path}: constraints: {_not_a_figure(name)}")
        if (
            not isinstance(bound, dict)
            or not bound
            or set(bound) - {"min", "max"}
            or not all(_is_number(v) and math.isfinite(v) for v in bound.values())
        ):
            raise SearchSpaceError(
                f"{path}: constraints.{name}: need {{min: N}}, {{max: N}} or both, with finite "
                f"numbers, got {show(bound)}"
            )
        low, high = float(bound.get("min", -math.inf)), float(bound.get("max", math.inf))
        if low > high:
            raise SearchSpaceError(f"{path}: constraints.{name}: min {low:g} > max {high:g}")
        out[name] = (low, high)
    return out


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_values(space: SearchSpace, base_policy: ElasticPolicy) -> None:
    """Refuse, before any trial runs, a value the policy file would refuse.

    Each value of each parameter (both ends of a range) is set alone on ``base_policy``, written
    as a policy file (``policy_yaml``) and read back (``parse_policy``): a trial then runs a
    policy tide can write, and best-policy.yaml is one that ``tide validate`` accepts. (No
    policy field limits another, so values that pass one at a time pass together.)

    Raises:
        SearchSpaceError: naming the file, the parameter, its value and what is wrong, or a
            ``queues.<queue>.`` parameter whose queue the base policy lacks.
    """
    queues = [q.name for q in base_policy.queues]
    for name, values in [*space.choices.items(), *space.ranges.items()]:
        queue = _queue_param(name)
        if queue is not None and queue[0] not in queues:
            raise SearchSpaceError(
                f"{space.source}: parameters.{name}: policy {base_policy.name} has no queue "
                f"{queue[0]!r} (it has {', '.join(queues) or 'none'})"
            )
        for value in sorted(set(values)):
            text = policy_yaml(apply_params(base_policy, {name: value}))
            try:
                parse_policy(load_yaml(text), source=name)
            except PolicyError as e:
                raise SearchSpaceError(
                    f"{space.source}: parameters.{name}: {param_text(name, value)} is refused: "
                    + "; ".join(e.problems)
                ) from e


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
        params.update(
            {
                n: min(hi, max(lo, _rounded(n, float(rng.uniform(lo, hi)))))
                for n, (lo, hi) in space.ranges.items()
            }
        )
        key = tuple(params.values())
        if key not in seen:
            seen.add(key)
            out.append(params)
    return out


def apply_params(policy: ElasticPolicy, params: Mapping[str, float]) -> ElasticPolicy:
    """``policy`` with ``params`` (``interval``, ``defaults.cooldown``,
    ``queues.<queue>.headroom.gpus``, ...; durations in seconds) set."""
    top: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    per_queue: dict[QueueName, dict[str, float]] = {}
    for name, value in params.items():
        queue = _queue_param(name)
        if queue is not None:
            per_queue.setdefault(QueueName(queue[0]), {})[queue[1]] = value
            continue
        param = PARAMETERS[name]
        cast: Any = round(value) if param.unit == _INT else value
        (defaults if param.owner == "defaults" else top)[param.field] = cast
    queues = tuple(_queue_with(q, per_queue.get(q.name, {})) for q in policy.queues)
    return dataclasses.replace(
        policy, defaults=dataclasses.replace(policy.defaults, **defaults), queues=queues, **top
    )


def _queue_with(queue: QueuePolicy, fields: Mapping[str, float]) -> QueuePolicy:
    """``queue`` with ``fields`` (``headroom.gpus``, ``maxElasticGpus``, ...) set."""
    if not fields:
        return queue
    headroom: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for name, value in fields.items():
        param = QUEUE_PARAMETERS[name]
        (headroom if param.owner == "headroom" else own)[param.field] = value
    return dataclasses.replace(
        queue, headroom=dataclasses.replace(queue.headroom, **headroom), **own
    )


def param_value(policy: ElasticPolicy, name: str) -> float | None:
    """The value ``policy`` has for the parameter ``name`` (None: a field left unset, such as a
    queue's forecast quantile); durations in seconds."""
    queue = _queue_param(name)
    owner: Any
    if queue is not None:
        param = QUEUE_PARAMETERS[queue[1]]
        found = next(q for q in policy.queues if q.name == queue[0])
        owner = found.headroom if param.owner == "headroom" else found
    else:
        param = PARAMETERS[name]
        owner = policy.defaults if param.owner == "defaults" else policy
    value = getattr(owner, param.field)
    return None if value is None else float(value)
