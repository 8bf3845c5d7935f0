"""Reading YAML documents field by field, collecting every problem with its path and value.

The policy file and the observation file both read through ``Section``: each field is converted
by a small function that raises ``ValueError`` naming the path and value, and the section records
the problem and goes on, so a file's problems are all reported at once.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import yaml

from scheduler_policy.vocabulary.errors import PolicyError

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


_YAML_WORDS = {True: "true", False: "false", None: "null"}


def show(value: object) -> str:
    """``value`` as an error message quotes it: its ``repr`` (``'four'``, ``1.5``), but YAML's
    words for booleans and null (``true``, not Python's ``True``), cut to 60 characters."""
    if value is None or isinstance(value, bool):
        return _YAML_WORDS[value]
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


def format_duration(seconds: float) -> str:
    """``seconds`` as a duration string that ``parse_duration`` reads back exactly: the largest
    units first (``300`` is ``5m``, ``5400`` is ``1h30m``, ``0.5`` is ``500ms``, ``0`` is
    ``0s``); a duration that is not a whole number of milliseconds keeps every digit of its
    seconds (never an exponent).

    Args:
        seconds: a duration, at least 0.

    Returns:
        The duration string.
    """
    exact = f"{np.format_float_positional(seconds, trim='-')}s"
    millis = round(seconds * 1000)
    if millis < 0 or abs(millis - seconds * 1000) > 1e-6:
        return exact
    if millis == 0:
        return "0s" if seconds == 0 else exact
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole_s, ms = divmod(rest, 1000)
    parts = [(hours, "h"), (minutes, "m"), (whole_s, "s"), (ms, "ms")]
    text = "".join(f"{amount}{unit}" for amount, unit in parts if amount)
    # Seconds that a sum of whole milliseconds does not give back bit for bit keep every digit.
    return text if parse_duration(text, path="") == seconds else exact


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


def join_path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


@dataclass(frozen=True)
class Section:
    """One mapping of the file, its path, and the shared list of problems."""

    mapping: Mapping[str, object]
    path: str
    problems: list[str]

    def get(self, key: str, default: T, convert: Converter[T]) -> T:
        """``convert(value)``, or ``default`` when the key is absent or its value is invalid."""
        if key not in self.mapping:
            return default
        try:
            return convert(self.mapping[key], join_path(self.path, key))
        except ValueError as error:
            self.problems.append(str(error))
            return default

    def require(self, *keys: str) -> None:
        """Note ``path.key: is required`` for each of ``keys`` the mapping lacks."""
        for key in keys:
            if key not in self.mapping:
                self.problems.append(f"{join_path(self.path, key)}: is required")

    def section(self, key: str, allowed: Collection[str]) -> Section | None:
        """The nested mapping at ``key``, or None when it is absent or not a mapping."""
        if key not in self.mapping:
            return None
        return section(
            self.mapping[key],
            path=join_path(self.path, key),
            allowed=allowed,
            problems=self.problems,
        )


def section(
    value: object, *, path: str, allowed: Collection[str], problems: list[str]
) -> Section | None:
    """The value as a section, unknown keys reported; None (and a problem) if not a mapping."""
    if not isinstance(value, Mapping):
        problems.append(f"{path or 'document'}: must be a mapping, got {show(value)}")
        return None
    for key in value:
        if key not in allowed:
            problems.append(
                unknown_key_problem(str(key), path=join_path(path, str(key)), allowed=allowed)
            )
    return Section({str(k): v for k, v in value.items()}, path, problems)


def finite_number(value: object, path: str) -> float:
    # bool is a subclass of int; `maxStepUp: yes` must not read as 1.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path}: must be a number, got {show(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{path}: must be a finite number, got {show(value)}")
    return float(value)


def non_negative(value: object, path: str) -> float:
    number = finite_number(value, path)
    if number < 0:
        raise ValueError(f"{path}: must not be negative, got {show(value)}")
    return number


def whole_gpus(value: object, path: str) -> float:
    """A count of GPUs: a whole number, at least 0 (``1.5`` is refused: GPUs are whole)."""
    number = non_negative(value, path)
    if not number.is_integer():
        raise ValueError(f"{path}: must be a whole number of GPUs, got {show(value)}")
    return number


def optional_whole_gpus(value: object, path: str) -> float | None:
    return None if value is None else whole_gpus(value, path)


def optional_non_negative(value: object, path: str) -> float | None:
    return None if value is None else non_negative(value, path)


def positive_duration(value: object, path: str) -> float:
    seconds = parse_duration(value, path=path)
    if seconds <= 0:
        raise ValueError(f"{path}: must be longer than 0s, got {show(value)}")
    return seconds


def duration(value: object, path: str) -> float:
    return parse_duration(value, path=path)


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{path}: must be true or false, got {show(value)}")
    return value


def nonempty_string(value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}: must be a non-empty string, got {show(value)}")
    return value


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: PyYAML keeps the last
    (``interval: 60s`` then ``interval: 30s`` reads as 30s), hiding an edit that was meant to
    replace the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice (first on line {first.start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _UniqueKeyLoader.construct_mapping
)


def load_yaml(text: str) -> object:
    """Parse one YAML document as ``yaml.safe_load`` does, but refuse a key given twice.

    Args:
        text: the document.

    Returns:
        The parsed document (None for an empty one).

    Raises:
        yaml.YAMLError: invalid YAML, or a key given twice in one mapping (marked at the
            second; ``yaml_problem`` says where).
    """
    return yaml.load(text, Loader=_UniqueKeyLoader)


def load_yaml_all(text: str) -> list[object]:
    """Every YAML document in ``text``, as ``load_yaml`` parses one.

    Raises:
        yaml.YAMLError: as ``load_yaml``.
    """
    return list(yaml.load_all(text, Loader=_UniqueKeyLoader))


def read_yaml_documents(path: str | Path) -> list[object]:
    """Read every YAML document in a file.

    Args:
        path: the file.

    Returns:
        The documents in order, as ``yaml.safe_load_all`` yields them (an empty one is None).
        A key given twice in one mapping is invalid YAML here (``load_yaml``).

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
        return load_yaml_all(text)
    except yaml.YAMLError as error:
        problem = yaml_problem(error)
        if Path(path).suffix.lower() == ".json":  # read as YAML, which JSON is; named as written
            problem = problem.replace("invalid YAML", "invalid JSON", 1)
        raise PolicyError(source, [problem]) from error


def yaml_problem(error: yaml.YAMLError) -> str:
    """One line saying where a YAML text is invalid and why.

    Args:
        error: what the YAML parser raised.

    Returns:
        ``line L, column C: invalid YAML: <problem>`` (counted from 1) when the parser marked a
        place, else ``invalid YAML: <error>``.
    """
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}invalid YAML: {error.problem or error.context or 'syntax error'}"
    return f"invalid YAML: {error}"
