"""Read the ElasticPolicy file a cluster admin writes (``apiVersion: tide.io/v1alpha1``).

Parsing collects every problem in a file, each naming its path and value
(``spec.queues[1].headroom.forecastQuantile: must be between 0 and 1, got 1.5``), and raises them
together as one ``PolicyError``, so an admin fixes a file in one pass.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

from scheduler_policy.errors import PolicyError
from scheduler_policy.model import QueueName
from scheduler_policy.policy import Defaults, ElasticPolicy, Headroom, Objective, QueuePolicy

API_VERSION = "tide.io/v1alpha1"
KIND = "ElasticPolicy"

_TOP_KEYS = ("apiVersion", "kind", "metadata", "spec")
_METADATA_KEYS = ("name", "labels", "annotations")
_SPEC_KEYS = ("interval", "modelRefitInterval", "objective", "defaults", "queues")
_OBJECTIVES = {o.value: o for o in Objective}
_DEFAULTS_KEYS = ("tolerance", "restartCost", "cooldown", "maxStepUp", "maxStepDown")
_DEFAULTS_KEYS_MORE = ("stabilizationWindow", "assumedRemaining")
_WINDOW_KEYS = ("up", "down")
_QUEUE_KEYS = ("name", "elastic", "borrowIdleGpus", "maxElasticGpus", "headroom")
_HEADROOM_KEYS = ("gpus", "forecastQuantile", "horizon")

# Units in descending order, each at most once: "1h30m", "2m30s", "1s500ms". Python's regex
# backtracks, so "500ms" is not taken for "500m" followed by a stray "s".
_NUMBER = r"\d+(?:\.\d+)?"
_DURATION = re.compile(
    rf"(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s)?(?:(?P<ms>{_NUMBER})ms)?"
)
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

T = TypeVar("T")
Converter = Callable[[object, str], T]
"""Turns the value found at a path into a field, or raises ValueError naming path and value."""


def show(value: object) -> str:
    """``value`` as an error message quotes it: its ``repr`` (``'four'``, ``1.5``), cut to 60."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_duration(value: object, *, path: str) -> float:
    """Parse a duration string such as ``30s``, ``5m``, ``1h30m``, ``500ms`` or ``0s``.

    Args:
        value: the value found in the file; only strings are durations.
        path: where the value was found, for the error message.

    Returns:
        The duration in seconds, never negative.

    Raises:
        ValueError: ``value`` is not a string, is malformed or is negative; the message names
            ``path`` and ``value``.
    """
    if not isinstance(value, str):
        # A bare number is most likely seconds; suggest that spelling.
        example = "30s"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            example = f"{value:g}s"
        raise ValueError(
            f"{path}: must be a duration string such as {example!r}, got {show(value)}"
        )
    text = value.strip()
    if text.startswith("-"):
        raise ValueError(f"{path}: must not be negative, got {show(value)}")
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(
            f"{path}: must be a duration such as '30s', '5m', '1h30m' or '500ms', got {show(value)}"
        )
    return sum(
        float(amount) * _UNIT_S[unit] for unit, amount in match.groupdict().items() if amount
    )


def unknown_key_problem(key: str, *, path: str, allowed: Collection[str]) -> str:
    """The problem for an unknown key, suggesting the nearest valid key.

    Args:
        key: the unknown key.
        path: the key's full path.
        allowed: the valid keys at that place.

    Returns:
        ``path: unknown key; did you mean 'x'?``, or the list of valid keys when none is close.
    """
    # Compare case-insensitively: `quantile` should find `forecastQuantile`.
    by_lower = {k.lower(): k for k in allowed}
    close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    if close:
        return f"{path}: unknown key; did you mean {by_lower[close[0]]!r}?"
    expected = ", ".join(repr(k) for k in allowed)
    return f"{path}: unknown key; expected one of {expected}"


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


@dataclass(frozen=True)
class _Section:
    """One mapping of the file, its path, and the shared list of problems."""

    mapping: Mapping[str, object]
    path: str
    problems: list[str]

    def get(self, key: str, default: T, convert: Converter[T]) -> T:
        """``convert(value)``, or ``default`` when the key is absent or its value is invalid."""
        if key not in self.mapping:
            return default
        try:
            return convert(self.mapping[key], _join(self.path, key))
        except ValueError as error:
            self.problems.append(str(error))
            return default

    def section(self, key: str, allowed: Collection[str]) -> _Section | None:
        """The nested mapping at ``key``, or None when it is absent or not a mapping."""
        if key not in self.mapping:
            return None
        return _section(
            self.mapping[key], path=_join(self.path, key), allowed=allowed, problems=self.problems
        )


def _section(
    value: object, *, path: str, allowed: Collection[str], problems: list[str]
) -> _Section | None:
    """The value as a section, unknown keys reported; None (and a problem) if not a mapping."""
    if not isinstance(value, Mapping):
        problems.append(f"{path or 'document'}: must be a mapping, got {show(value)}")
        return None
    for key in value:
        if key not in allowed:
            problems.append(
                unknown_key_problem(str(key), path=_join(path, str(key)), allowed=allowed)
            )
    return _Section({str(k): v for k, v in value.items()}, path, problems)


def _number(value: object, path: str) -> float:
    # bool is a subclass of int; `maxStepUp: yes` must not read as 1.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path}: must be a number, got {show(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{path}: must be a finite number, got {show(value)}")
    return float(value)


def _non_negative(value: object, path: str) -> float:
    number = _number(value, path)
    if number < 0:
        raise ValueError(f"{path}: must not be negative, got {show(value)}")
    return number


def _optional_non_negative(value: object, path: str) -> float | None:
    return None if value is None else _non_negative(value, path)


def _tolerance(value: object, path: str) -> float:
    number = _number(value, path)
    if not 0 <= number < 1:
        raise ValueError(f"{path}: must be at least 0 and less than 1, got {show(value)}")
    return number


def _optional_quantile(value: object, path: str) -> float | None:
    if value is None:
        return None
    number = _number(value, path)
    if not 0 < number < 1:
        raise ValueError(f"{path}: must be between 0 and 1, got {show(value)}")
    return number


def _step(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: must be an integer, got {show(value)}")
    if value < 1:
        raise ValueError(f"{path}: must be at least 1, got {show(value)}")
    return value


def _positive_duration(value: object, path: str) -> float:
    seconds = parse_duration(value, path=path)
    if seconds <= 0:
        raise ValueError(f"{path}: must be longer than 0s, got {show(value)}")
    return seconds


def _duration(value: object, path: str) -> float:
    return parse_duration(value, path=path)


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: must be true or false, got {show(value)}")
    return value


def _name(value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}: must be a non-empty string, got {show(value)}")
    return value


def _objective(value: object, path: str) -> Objective:
    if not isinstance(value, str) or value not in _OBJECTIVES:
        expected = " or ".join(repr(o) for o in _OBJECTIVES)
        raise ValueError(f"{path}: must be {expected}, got {show(value)}")
    return _OBJECTIVES[value]


def _constant(top: _Section, key: str, expected: str) -> None:
    if key not in top.mapping:
        top.problems.append(f"{key}: is required; expected {expected!r}")
    elif top.mapping[key] != expected:
        top.problems.append(f"{key}: must be {expected!r}, got {show(top.mapping[key])}")


def _parse_defaults(spec: _Section) -> Defaults:
    base = Defaults()
    defaults = spec.section("defaults", _DEFAULTS_KEYS + _DEFAULTS_KEYS_MORE)
    if defaults is None:
        return base
    window = defaults.section("stabilizationWindow", _WINDOW_KEYS)
    return Defaults(
        tolerance=defaults.get("tolerance", base.tolerance, _tolerance),
        restart_cost_s=defaults.get("restartCost", base.restart_cost_s, _duration),
        cooldown_s=defaults.get("cooldown", base.cooldown_s, _duration),
        max_step_up=defaults.get("maxStepUp", base.max_step_up, _step),
        max_step_down=defaults.get("maxStepDown", base.max_step_down, _step),
        window_up_s=window.get("up", base.window_up_s, _duration) if window else base.window_up_s,
        window_down_s=(
            window.get("down", base.window_down_s, _duration) if window else base.window_down_s
        ),
        assumed_remaining_s=defaults.get(
            "assumedRemaining", base.assumed_remaining_s, _positive_duration
        ),
    )


def _parse_headroom(queue: _Section) -> Headroom:
    base = Headroom()
    headroom = queue.section("headroom", _HEADROOM_KEYS)
    if headroom is None:
        return base
    return Headroom(
        gpus=headroom.get("gpus", base.gpus, _non_negative),
        forecast_quantile=headroom.get(
            "forecastQuantile", base.forecast_quantile, _optional_quantile
        ),
        horizon_s=headroom.get("horizon", base.horizon_s, _positive_duration),
    )


def _parse_queue(value: object, *, path: str, problems: list[str]) -> QueuePolicy | None:
    """One queue, or None when it has no valid name (its other problems are still reported)."""
    queue = _section(value, path=path, allowed=_QUEUE_KEYS, problems=problems)
    if queue is None:
        return None
    if "name" not in queue.mapping:
        problems.append(f"{path}.name: is required")
    name = queue.get("name", "", _name)
    base = QueuePolicy(name=QueueName(name))
    parsed = QueuePolicy(
        name=base.name,
        elastic=queue.get("elastic", base.elastic, _boolean),
        borrow=queue.get("borrowIdleGpus", base.borrow, _boolean),
        headroom=_parse_headroom(queue),
        max_elastic_gpus=queue.get("maxElasticGpus", base.max_elastic_gpus, _optional_non_negative),
    )
    return parsed if name else None


def _parse_queues(spec: _Section) -> tuple[QueuePolicy, ...]:
    if "queues" not in spec.mapping:
        return ()
    value = spec.mapping["queues"]
    if not isinstance(value, list):
        spec.problems.append(f"spec.queues: must be a list of queues, got {show(value)}")
        return ()
    queues: list[QueuePolicy] = []
    first_path: dict[str, str] = {}
    for index, item in enumerate(value):
        path = f"spec.queues[{index}]"
        queue = _parse_queue(item, path=path, problems=spec.problems)
        if queue is None:
            continue
        if queue.name in first_path:
            spec.problems.append(
                f"{path}.name: duplicate queue name {queue.name!r}, "
                f"first defined at {first_path[queue.name]}"
            )
            continue
        first_path[queue.name] = path
        queues.append(queue)
    return tuple(queues)


def parse_policy(data: object, *, source: str) -> ElasticPolicy:
    """Turn a loaded YAML document into an ``ElasticPolicy``.

    Every field but ``apiVersion``, ``kind`` and each queue's ``name`` is optional and takes the
    dataclass default.

    Args:
        data: the document as ``yaml.safe_load`` returns it.
        source: where it came from (a file path), named in the error.

    Returns:
        The policy.

    Raises:
        PolicyError: listing every problem in the document, each naming its path and value.
    """
    problems: list[str] = []
    top = _section(data, path="", allowed=_TOP_KEYS, problems=problems)
    if top is None:
        raise PolicyError(source, problems)
    _constant(top, "apiVersion", API_VERSION)
    _constant(top, "kind", KIND)
    base = ElasticPolicy()
    metadata = top.section("metadata", _METADATA_KEYS)
    name = metadata.get("name", base.name, _name) if metadata else base.name
    spec = top.section("spec", _SPEC_KEYS)
    policy = ElasticPolicy(name=name)
    if spec is not None:
        policy = ElasticPolicy(
            name=name,
            interval_s=spec.get("interval", base.interval_s, _positive_duration),
            model_refit_s=spec.get("modelRefitInterval", base.model_refit_s, _duration),
            objective=spec.get("objective", base.objective, _objective),
            defaults=_parse_defaults(spec),
            queues=_parse_queues(spec),
        )
    if problems:
        raise PolicyError(source, problems)
    return policy


def read_yaml_documents(path: str | Path) -> list[object]:
    """Read every YAML document in a file.

    Args:
        path: the file.

    Returns:
        The documents in order, as ``yaml.safe_load_all`` yields them (an empty one is None).

    Raises:
        PolicyError: the file cannot be read, or is not valid YAML; the problem names the line
            and column (counted from 1).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise PolicyError(source, [f"cannot read file: {error}"]) from error
    try:
        return list(yaml.safe_load_all(text))
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = error.problem or error.context or "syntax error"
        raise PolicyError(source, [f"{where}invalid YAML: {what}"]) from error
    except yaml.YAMLError as error:
        raise PolicyError(source, [f"invalid YAML: {error}"]) from error


def load_policy(path: str | Path) -> ElasticPolicy:
    """Read and parse an ElasticPolicy file holding exactly one YAML document.

    Args:
        path: the file.

    Returns:
        The policy.

    Raises:
        PolicyError: the file cannot be read, is not valid YAML, holds other than one document,
            or the document is not a valid ElasticPolicy; the error names the file.
    """
    source = str(path)
    documents = [d for d in read_yaml_documents(path) if d is not None]
    if len(documents) != 1:
        raise PolicyError(source, [f"must hold exactly one YAML document, found {len(documents)}"])
    return parse_policy(documents[0], source=source)
