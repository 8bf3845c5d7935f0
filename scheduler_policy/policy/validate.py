"""The checks behind ``tide validate``: ElasticPolicy files and elastic Volcano Job manifests.

Errors are what the engine or Volcano's admission webhook would refuse; warnings are what would be
accepted and then behave badly (a ``RestartJob`` policy that fires on every scale-down, a task that
cannot shrink).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scheduler_policy.policy.annotations import ELASTIC, TASK, annotation_path, job_overrides
from scheduler_policy.policy.fields import read_yaml_documents, show
from scheduler_policy.policy.file import API_VERSION, KIND, parse_policy
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.errors import PolicyError

VOLCANO_JOB = ("batch.volcano.sh/v1alpha1", "Job")
DEFAULT_TASK = "worker"
YAML_SUFFIXES = (".yaml", ".yml")

# Events that fire when tide shrinks a job: the controller deletes pods (PodEvicted) and the
# worker runtime exits 143 after its coordinated save (PodFailed).
_SCALE_DOWN_EVENTS = ("PodEvicted", "PodFailed", "*")


@dataclass(frozen=True, slots=True)
class FileReport:
    """What ``tide validate`` found in one file.

    Attributes:
        path: the file.
        errors: problems the engine or Volcano would refuse, each naming its path and value.
        warnings: settings that are accepted but work against elastic scaling.
    """

    path: Path
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the file has no errors (it may have warnings)."""
        return not self.errors


@dataclass
class _Findings:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _non_negative_int(value: object, *, path: str, found: _Findings) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        found.errors.append(f"{path}: must be a non-negative integer, got {show(value)}")
        return None
    return value


def _string_annotations(metadata: Mapping[object, object], found: _Findings) -> dict[str, str]:
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        found.errors.append(f"metadata.annotations: must be a mapping, got {show(annotations)}")
        return {}
    strings: dict[str, str] = {}
    for key, value in annotations.items():
        if isinstance(value, str):
            strings[str(key)] = value
        else:
            found.errors.append(
                f"{annotation_path(str(key))}: must be a string (quote it in YAML), "
                f"got {show(value)}"
            )
    return strings


def _check_policies(policies: object, *, path: str, found: _Findings) -> None:
    """Warn about each ``RestartJob`` policy that fires on a scale-down."""
    if not isinstance(policies, list):
        return
    for index, policy in enumerate(policies):
        if not isinstance(policy, Mapping) or policy.get("action") != "RestartJob":
            continue
        listed = policy.get("events")
        events = list(listed) if isinstance(listed, list) else []
        if policy.get("event") is not None:
            events.append(policy["event"])
        for event in events:
            if event in _SCALE_DOWN_EVENTS:
                found.warnings.append(
                    f"{path}[{index}]: {event} -> RestartJob restarts the whole job whenever tide "
                    "scales it down; remove it or choose another action"
                )


def check_job(document: Mapping[str, object]) -> tuple[list[str], list[str]]:
    """Check a Volcano Job manifest for what matters to elastic scaling.

    Every Job is checked for the constraints Volcano's webhook enforces
    (``tasks[i].minAvailable <= tasks[i].replicas``, ``spec.minAvailable <= sum(replicas)``) and
    for valid ``tide.io/*`` annotations. A Job annotated ``tide.io/elastic: "true"`` is also checked
    for its scaling task (``tide.io/task``, default ``worker``), that task's ``minAvailable``, and
    ``RestartJob`` policies that would fire on a scale-down.

    Args:
        document: the Job manifest as loaded from YAML.

    Returns:
        ``(errors, warnings)``, each message naming its path and value.
    """
    found = _Findings()
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        metadata = {}
    source = f"{metadata.get('namespace', 'default')}/{metadata.get('name', '?')}"
    annotations = _string_annotations(metadata, found)
    try:
        job_overrides(annotations, source=source)
    except PolicyError as error:
        found.errors.extend(error.problems)
    # Read these two directly, so that a bad annotation elsewhere does not hide the other checks.
    elastic = annotations.get(ELASTIC) == "true"
    named_task = bool(annotations.get(TASK, "").strip())
    task_name = annotations[TASK] if named_task else DEFAULT_TASK

    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        found.errors.append(f"spec: must be a mapping, got {show(spec)}")
        return found.errors, found.warnings
    tasks = spec.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        found.errors.append(f"spec.tasks: must be a non-empty list of tasks, got {show(tasks)}")
        return found.errors, found.warnings

    total_replicas: int | None = 0  # None once a task's replicas is invalid
    names: list[str] = []
    scaling: tuple[int, Mapping[object, object]] | None = None
    for index, task in enumerate(tasks):
        path = f"spec.tasks[{index}]"
        if not isinstance(task, Mapping):
            found.errors.append(f"{path}: must be a mapping, got {show(task)}")
            continue
        name = str(task.get("name", ""))
        names.append(name)
        if name == task_name and scaling is None:
            scaling = (index, task)
        replicas = _non_negative_int(task.get("replicas", 0), path=f"{path}.replicas", found=found)
        if replicas is None:
            total_replicas = None
        elif total_replicas is not None:
            total_replicas += replicas
        if task.get("minAvailable") is None:
            continue
        least = _non_negative_int(task["minAvailable"], path=f"{path}.minAvailable", found=found)
        if least is not None and replicas is not None and least > replicas:
            found.errors.append(
                f"{path}.minAvailable: must not exceed {path}.replicas ({replicas}), got {least}"
            )

    if spec.get("minAvailable") is not None:
        least = _non_negative_int(spec["minAvailable"], path="spec.minAvailable", found=found)
        if least is not None and total_replicas is not None and least > total_replicas:
            found.errors.append(
                "spec.minAvailable: must not exceed the sum of spec.tasks[*].replicas "
                f"({total_replicas}), got {least}"
            )

    if not elastic:
        return found.errors, found.warnings
    if scaling is None:
        listing = ", ".join(repr(n) for n in names)
        where = annotation_path(TASK) if named_task else "spec.tasks"
        hint = "" if named_task else f" (the default; name another with {TASK})"
        found.errors.append(f"{where}: no task named {task_name!r}{hint}; found {listing}")
    else:
        index, task = scaling
        if task.get("minAvailable") is None:
            found.warnings.append(
                f"spec.tasks[{index}].minAvailable: unset, so it defaults to replicas and the job "
                "cannot shrink; set it to the fewest workers the job can run with"
            )
        _check_policies(task.get("policies"), path=f"spec.tasks[{index}].policies", found=found)
    _check_policies(spec.get("policies"), path="spec.policies", found=found)
    return found.errors, found.warnings


def _policy_warnings(policy: ElasticPolicy) -> list[str]:
    warnings = []
    if not policy.queues:
        warnings.append("spec.queues: empty, so tide manages no queue")
    for index, queue in enumerate(policy.queues):
        if not queue.elastic and queue.borrow:
            warnings.append(
                f"spec.queues[{index}].borrowIdleGpus: has no effect on a queue with "
                "elastic: false, got true"
            )
    return warnings


def _kind(document: Mapping[str, object]) -> tuple[object, object]:
    return document.get("apiVersion"), document.get("kind")


def validate_file(path: Path) -> FileReport:
    """Validate one file: a single ElasticPolicy, or one or more Volcano Jobs (other Kubernetes
    kinds beside them are passed over; a file with nothing tide checks is an error).

    Args:
        path: the file.

    Returns:
        The file's report; an unreadable file or invalid YAML is an error in it.
    """
    try:
        documents = [d for d in read_yaml_documents(path) if d is not None]
    except PolicyError as error:
        return FileReport(path=path, errors=tuple(error.problems))
    if not documents:
        return FileReport(path=path, errors=("file holds no YAML document",))
    found = _Findings()
    checked = 0
    for number, document in enumerate(documents, start=1):
        prefix = f"document {number}: " if len(documents) > 1 else ""
        if not isinstance(document, Mapping):
            found.errors.append(f"document {number}: must be a mapping, got {show(document)}")
            continue
        errors: list[str] = []
        warnings: list[str] = []
        if _kind(document) == (API_VERSION, KIND):
            if len(documents) > 1:
                errors.append(
                    "an ElasticPolicy file must hold exactly one YAML document, "
                    f"found {len(documents)}"
                )
            try:
                warnings = _policy_warnings(parse_policy(document, source=str(path)))
            except PolicyError as error:
                errors.extend(error.problems)
        elif _kind(document) == VOLCANO_JOB:
            errors, warnings = check_job(document)
        else:
            api_version, kind = _kind(document)
            if not (isinstance(api_version, str) and isinstance(kind, str)):
                found.errors.append(
                    f"document {number}: not a Kubernetes object (no apiVersion and kind); "
                    f"tide validates {API_VERSION} {KIND} and {VOLCANO_JOB[0]} {VOLCANO_JOB[1]}"
                )
            # Other kinds (a PVC or ConfigMap next to the Job) are not tide's to check.
            continue
        checked += 1
        found.errors.extend(prefix + e for e in errors)
        found.warnings.extend(prefix + w for w in warnings)
    if checked == 0 and not found.errors:
        found.errors.append(
            f"holds no {API_VERSION} {KIND} and no {VOLCANO_JOB[0]} {VOLCANO_JOB[1]} to validate"
        )
    return FileReport(path=path, errors=tuple(found.errors), warnings=tuple(found.warnings))


def validate_paths(paths: Sequence[Path]) -> list[FileReport]:
    """Validate ElasticPolicy files and Volcano Job manifests.

    Args:
        paths: files, or directories whose ``*.yaml`` and ``*.yml`` files are validated (not
            recursively).

    Returns:
        One report per file, in the order given; a directory without YAML files is an error.
    """
    reports: list[FileReport] = []
    for path in paths:
        if not path.is_dir():
            reports.append(validate_file(path))
            continue
        files = sorted(p for p in path.iterdir() if p.suffix in YAML_SUFFIXES and p.is_file())
        if not files:
            reports.append(FileReport(path=path, errors=("directory holds no .yaml or .yml file",)))
        reports.extend(validate_file(file) for file in files)
    return reports
