"""Whether a Volcano Job's workers get the adaptive-batch settings its annotations declare.

The engine reads a Job's ``tide.io/adaptive-batch`` annotations (:mod:`.annotations`); the worker
runtime reads the same values from its environment (``TIDE_ADAPTIVE_BATCH`` and the names in
:data:`~.annotations.ADAPTIVE_ENV`). Volcano does not copy a Job's own annotations to the pods it
creates: the recorded pod of a Job annotated ``tide.io/elastic: "true"`` carries only Volcano's
annotations (``/work/shared/volcano-wire/v1.15.1/``: ``vcjob-running.json`` and its pod
``pod-of-vcjob.json``; the pods in ``extender-reclaimable-request.json`` likewise). A pod gets its
task template's annotations, as any pod made from a template does, so a Job passes each value to
its workers either as a literal ``value`` or, with the annotations repeated on the pod template,
through the Downward API (``fieldRef: metadata.annotations['tide.io/...']``).

Which containers are checked: every container that sets one of the variables, and every container
that runs the scaling task's trainer (same image and command) in another task, such as the master
pod of the example Jobs, which is a torchrun agent of the same membership: a worker that does not
opt in while the others do would leave them waiting in a collective it never joins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_policy.policy.annotations import (
    ACCUMULATION,
    ADAPTIVE_BATCH,
    ADAPTIVE_ENV,
    ADAPTIVE_KEYS,
    LOCAL_BATCH_MIN,
)
from scheduler_policy.policy.fields import show

_DEFAULTS = {ADAPTIVE_BATCH: "false", LOCAL_BATCH_MIN: "1", ACCUMULATION: "false"}
"""What the worker takes for an unset or empty variable (``worker_runtime.env``)."""
_KEY_OF_ENV = {env: key for key, env in ADAPTIVE_ENV.items()}
_ANNOTATION_FIELD = re.compile(r"""metadata\.annotations\[(['"])(?P<key>[^'"]+)\1\]""")


@dataclass(frozen=True, slots=True)
class _Container:
    """One container of a task's template and the adaptive variables it sets, resolved.

    Attributes:
        path: ``spec.tasks[i].template.spec.containers[j]``.
        task_index: ``i``.
        image: its image (``None`` when unset).
        command: its command (``None`` when unset).
        values: each adaptive variable it sets, as the worker would read it.
    """

    path: str
    task_index: int
    image: object
    command: object
    values: Mapping[str, str]


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: object) -> Sequence[object]:
    return value if isinstance(value, list) else ()


def _normal(key: str, value: str | None) -> str:
    """A value as the worker takes it: stripped, and unset or empty as the worker's default."""
    text = (value or "").strip()
    return text or _DEFAULTS.get(key, "")


def _resolve(
    entry: Mapping[str, object],
    *,
    key: str,
    pod_annotations: Mapping[str, object],
    path: str,
    problems: list[str],
) -> str:
    """The value of one ``env`` entry in the pod, as far as the manifest tells it."""
    if "value" in entry:
        return str(entry["value"])
    value_from = _mapping(entry.get("valueFrom"))
    if not value_from:
        return ""  # an entry without value or valueFrom is the empty string
    field_path = _mapping(value_from.get("fieldRef")).get("fieldPath")
    match = _ANNOTATION_FIELD.fullmatch(field_path) if isinstance(field_path, str) else None
    if match is None:
        problems.append(
            f"{path}.valueFrom: cannot be checked against the Job's {key} annotation; pass a "
            f"value, or fieldRef metadata.annotations['{key}'] with the annotation on the pod "
            "template"
        )
        return ""
    if match["key"] != key:
        problems.append(
            f"{path}.valueFrom.fieldRef.fieldPath: must read metadata.annotations['{key}'], "
            f"got {show(field_path)}"
        )
    # A missing annotation reads as the empty string.
    return str(pod_annotations.get(match["key"], ""))


def _containers(tasks: Sequence[object], problems: list[str]) -> list[_Container]:
    found = []
    for i, task in enumerate(tasks):
        template = _mapping(_mapping(task).get("template"))
        pod_annotations = _mapping(_mapping(template.get("metadata")).get("annotations"))
        containers = _sequence(_mapping(template.get("spec")).get("containers"))
        for j, container in enumerate(containers):
            path = f"spec.tasks[{i}].template.spec.containers[{j}]"
            values = {}
            for k, entry in enumerate(_sequence(_mapping(container).get("env"))):
                name = _mapping(entry).get("name")
                if not isinstance(name, str) or name not in _KEY_OF_ENV:
                    continue
                values[name] = _resolve(
                    _mapping(entry),
                    key=_KEY_OF_ENV[name],
                    pod_annotations=pod_annotations,
                    path=f"{path}.env[{k}]",
                    problems=problems,
                )
            found.append(
                _Container(
                    path=path,
                    task_index=i,
                    image=_mapping(container).get("image"),
                    command=_mapping(container).get("command"),
                    values=values,
                )
            )
    return found


def _mismatches(container: _Container, declared: Mapping[str, str]) -> list[str]:
    """What the container passes differently from the Job's annotations."""
    problems = []
    for key in ADAPTIVE_KEYS:
        env = ADAPTIVE_ENV[key]
        want = _normal(key, declared.get(key))
        got = _normal(key, container.values.get(env))
        if got == want:
            continue
        if key in declared:
            said = f"the Job says {key}: {show(declared[key])}"
        elif want:
            said = f"the Job does not set {key} (its default is {show(want)})"
        else:
            said = f"the Job does not set {key}"
        if env not in container.values:
            problems.append(f"{container.path}.env: {env} unset; {said}")
        else:
            problems.append(f"{container.path}.env: {env} is {show(got)} in the pod; {said}")
    return problems


def check_adaptive_env(
    annotations: Mapping[str, object], tasks: Sequence[object], *, scaling_task: int | None
) -> list[str]:
    """Check that a Job's workers read the adaptive-batch settings its annotations declare.

    Args:
        annotations: the Job's ``metadata.annotations``.
        tasks: the Job's ``spec.tasks``, as in the manifest.
        scaling_task: the index of the task whose replicas tide scales, ``None`` when the Job
            has none (not elastic, or its ``tide.io/task`` names no task).

    Returns:
        One message per problem, naming the container path and both values: an adaptive Job
        whose scaling task passes no adaptive variable, a container of it that passes a value
        other than the Job's (or none), one that runs the scaling task's trainer without them,
        and a Job that does not opt in whose pods would (the engine would not follow their batch).
    """
    problems: list[str] = []
    declared = {k: str(v) for k, v in annotations.items() if k in ADAPTIVE_KEYS}
    containers = _containers(tasks, problems)
    carrying = [c for c in containers if c.values]
    if _normal(ADAPTIVE_BATCH, declared.get(ADAPTIVE_BATCH)) != "true":
        for c in carrying:
            problems.extend(_mismatches(c, declared))
        return problems
    if not any(scaling_task in (None, c.task_index) for c in carrying):
        where = "spec.tasks[*]" if scaling_task is None else f"spec.tasks[{scaling_task}]"
        problems.append(
            f"{where}.template.spec.containers: no container passes the "
            f'adaptive batch to the workers: the Job says {ADAPTIVE_BATCH}: "true", but Volcano '
            "does not copy a Job's annotations to its pods; set "
            + ", ".join(ADAPTIVE_ENV[k] for k in ADAPTIVE_KEYS if k in declared)
            + " in the trainer's env, each a value or a fieldRef to "
            "metadata.annotations['tide.io/...'] with the annotations on the pod template"
        )
    trainers = {
        (repr(c.image), repr(c.command))
        for c in carrying
        if c.task_index == scaling_task and c.image is not None
    }
    for c in containers:
        if c.values:
            problems.extend(_mismatches(c, declared))
        elif (repr(c.image), repr(c.command)) in trainers:
            problems.append(
                f"{c.path}.env: runs the scaling task's trainer without "
                f"{ADAPTIVE_ENV[ADAPTIVE_BATCH]}: its workers would keep their batch while the "
                "others change theirs; pass it the same variables"
            )
    return problems
