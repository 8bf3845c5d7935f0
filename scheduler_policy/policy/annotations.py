"""Per-job overrides of the policy, read from a Volcano Job's ``tide.io/*`` annotations.

A job's owner writes, for example::

    metadata:
      annotations:
        tide.io/elastic: "true"
        tide.io/task: worker
        tide.io/min-replicas: "2"
        tide.io/max-replicas: "16"
        tide.io/restart-cost: 45s

Annotations outside ``tide.io/`` are ignored; an unknown ``tide.io/`` annotation is an error, since
a misspelt override silently doing nothing is worse than a refused job.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler_policy.policy.fields import parse_duration, show
from scheduler_policy.vocabulary.errors import PolicyError

PREFIX = "tide.io/"
ELASTIC = "tide.io/elastic"
TASK = "tide.io/task"
MIN_REPLICAS = "tide.io/min-replicas"
MAX_REPLICAS = "tide.io/max-replicas"
RESTART_COST = "tide.io/restart-cost"
KNOWN = (ELASTIC, TASK, MIN_REPLICAS, MAX_REPLICAS, RESTART_COST)
MEMORY = "tide.io/memory"
"""Written by tide itself, not by the job's owner: the stabilizer's memory
(``scheduler_policy.adapters.memory_codec``). Not an override, and not an unknown annotation."""

_COUNT = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class JobOverrides:
    """What a job's annotations say; None where the job says nothing and the policy decides.

    Attributes:
        elastic: whether tide may change the job's replicas.
        task: the name of the task whose replicas scale.
        min_replicas: the fewest replicas of that task.
        max_replicas: the most replicas of that task.
        restart_cost_s: seconds of progress a membership change costs the job.
    """

    elastic: bool | None = None
    task: str | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    restart_cost_s: float | None = None


def annotation_path(key: str) -> str:
    """The path an error message names for annotation ``key``: ``metadata.annotations["key"]``."""
    return f'metadata.annotations["{key}"]'


def _count(annotations: Mapping[str, str], key: str, problems: list[str]) -> int | None:
    if key not in annotations:
        return None
    value = annotations[key]
    if _COUNT.fullmatch(value) is None:
        problems.append(
            f"{annotation_path(key)}: must be a non-negative integer, got {show(value)}"
        )
        return None
    return int(value)


def job_overrides(annotations: Mapping[str, str], *, source: str) -> JobOverrides:
    """Read a job's ``tide.io/*`` annotations.

    Args:
        annotations: the Volcano Job's ``metadata.annotations``.
        source: the job (``namespace/name``) or file, named in the error.

    Returns:
        The overrides; a field is None when its annotation is absent.

    Raises:
        PolicyError: listing every invalid or unknown ``tide.io/`` annotation with its value, and
            ``min-replicas`` above ``max-replicas``.
    """
    problems: list[str] = []
    for key in annotations:
        if key.startswith(PREFIX) and key not in KNOWN and key != MEMORY:
            # Compare what follows the prefix; the shared "tide.io/" would make anything close.
            suffixes = [k.removeprefix(PREFIX) for k in KNOWN]
            close = difflib.get_close_matches(key.removeprefix(PREFIX), suffixes, n=1, cutoff=0.6)
            hint = (
                f"did you mean {PREFIX + close[0]!r}?"
                if close
                else f"expected one of {', '.join(KNOWN)}"
            )
            problems.append(f"{annotation_path(key)}: unknown tide.io annotation; {hint}")

    elastic: bool | None = None
    if ELASTIC in annotations:
        value = annotations[ELASTIC]
        if value in ("true", "false"):
            elastic = value == "true"
        else:
            problems.append(
                f'{annotation_path(ELASTIC)}: must be "true" or "false", got {show(value)}'
            )

    task = annotations.get(TASK)
    if task is not None and not task.strip():
        problems.append(f"{annotation_path(TASK)}: must name a task, got {show(task)}")
        task = None

    min_replicas = _count(annotations, MIN_REPLICAS, problems)
    max_replicas = _count(annotations, MAX_REPLICAS, problems)
    if min_replicas is not None and max_replicas is not None and min_replicas > max_replicas:
        problems.append(
            f"{annotation_path(MIN_REPLICAS)}: must not exceed {MAX_REPLICAS} "
            f"({max_replicas}), got {show(annotations[MIN_REPLICAS])}"
        )

    restart_cost_s: float | None = None
    if RESTART_COST in annotations:
        try:
            restart_cost_s = parse_duration(
                annotations[RESTART_COST], path=annotation_path(RESTART_COST)
            )
        except ValueError as error:
            problems.append(str(error))

    if problems:
        raise PolicyError(source, problems)
    return JobOverrides(
        elastic=elastic,
        task=task,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        restart_cost_s=restart_cost_s,
    )
