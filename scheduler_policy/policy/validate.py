"""The checks behind ``tide validate``: ElasticPolicy files and elastic Volcano Job manifests.

Errors are what the engine or Volcano's admission webhook would refuse; warnings are what would be
accepted and then behave badly (a ``RestartJob`` policy that fires on every scale-down, a task that
cannot shrink).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scheduler_policy.adapters.volcano_job import API_VERSION as JOB_API_VERSION
from scheduler_policy.adapters.volcano_job import KIND as JOB_KIND
from scheduler_policy.adapters.volcano_job import UnreadJob, read_job
from scheduler_policy.policy.adaptive_env import check_adaptive_env
from scheduler_policy.policy.fields import read_yaml_documents, show
from scheduler_policy.policy.file import API_VERSION, KIND, parse_policy
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.errors import PolicyError

VOLCANO_JOB = (JOB_API_VERSION, JOB_KIND)
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
        skipped: why nothing in the file was checked (only other Kubernetes kinds, found while
            searching a directory), or None.
    """

    path: Path
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        """True when the file has no errors (it may have warnings)."""
        return not self.errors


@dataclass
class _Findings:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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

    The Job is read as the engine reads it (``adapters.volcano_job.read_job``: valid
    ``tide.io/*`` annotations, tasks, replicas, GPU requests, and for a Job annotated
    ``tide.io/elastic: "true"`` its scaling task, ``tide.io/task``, default ``worker``), so
    what it finds is what would make the engine hold the job with ``InvalidJobSpec``. It is
    also checked for the constraints Volcano's webhook enforces
    (``tasks[i].minAvailable <= tasks[i].replicas``, ``spec.minAvailable <= sum(replicas)``),
    an elastic Job for its scaling task's ``minAvailable`` and ``RestartJob`` policies
    that would fire on a scale-down, and every Job for whether its workers read the
    adaptive-batch settings its annotations declare (``policy.adaptive_env``).

    Args:
        document: the Job manifest as loaded from YAML.

    Returns:
        ``(errors, warnings)``, each message naming its path and value.
    """
    found = _Findings()
    read = read_job(document)
    if isinstance(read, UnreadJob):
        return [read.problem], []
    found.errors.extend(read.state.read_problems)
    spec = document.get("spec")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("tasks"), list) or not read.tasks:
        return found.errors, found.warnings  # what is there to check is already an error

    total_replicas: int | None = 0  # None once a task's replicas is invalid
    for task in read.tasks:
        path = f"spec.tasks[{task.index}]"
        if task.replicas is None:
            total_replicas = None
            continue
        if total_replicas is not None:
            total_replicas += task.replicas
        if task.min_available is not None and task.min_available > task.replicas:
            found.errors.append(
                f"{path}.minAvailable: must not exceed {path}.replicas ({task.replicas}), "
                f"got {task.min_available}"
            )
    if len(read.tasks) != len(spec.get("tasks") or ()):
        total_replicas = None  # a task that is not a mapping has no replicas to add

    if spec.get("minAvailable") is not None:
        least = spec["minAvailable"]
        if isinstance(least, bool) or not isinstance(least, int) or least < 0:
            found.errors.append(
                f"spec.minAvailable: must be a non-negative integer, got {show(least)}"
            )
        elif total_replicas is not None and least > total_replicas:
            found.errors.append(
                "spec.minAvailable: must not exceed the sum of spec.tasks[*].replicas "
                f"({total_replicas}), got {least}"
            )

    metadata = document.get("metadata")
    found.errors.extend(
        check_adaptive_env(
            (metadata.get("annotations") if isinstance(metadata, Mapping) else None) or {},
            spec["tasks"],
            scaling_task=read.task_index if read.state.elastic else None,
        )
    )
    if not read.state.elastic or read.task_index is None:
        return found.errors, found.warnings
    scaling = next(t for t in read.tasks if t.index == read.task_index)
    if scaling.spec.get("minAvailable") is None:
        found.warnings.append(
            f"spec.tasks[{scaling.index}].minAvailable: unset, so it defaults to replicas and "
            "the job cannot shrink; set it to the fewest workers the job can run with"
        )
    _check_policies(
        scaling.spec.get("policies"), path=f"spec.tasks[{scaling.index}].policies", found=found
    )
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


def _prometheus_rules(document: Mapping[str, object]) -> bool:
    """Whether a document is a plain Prometheus rules file: only ``groups``, each with ``rules``."""
    groups = document.get("groups")
    return (
        set(document) == {"groups"}
        and isinstance(groups, list)
        and all(isinstance(g, Mapping) and "rules" in g for g in groups)
    )


def validate_file(path: Path, *, other_kinds_ok: bool = False) -> FileReport:
    """Validate one file: a single ElasticPolicy, or one or more Volcano Jobs (other Kubernetes
    kinds beside them are passed over; a file with nothing tide checks is an error, unless
    ``other_kinds_ok``).

    Args:
        path: the file.
        other_kinds_ok: a file of other Kubernetes kinds only (a PodMonitor found while searching
            a directory) is reported as skipped, not as an error.

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
    others: list[str] = []
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
            if _prometheus_rules(document):
                others.append("Prometheus rule groups")  # `promtool check rules` checks them
            elif not (isinstance(api_version, str) and isinstance(kind, str)):
                found.errors.append(
                    f"document {number}: not a Kubernetes object (no apiVersion and kind); "
                    f"tide validates {API_VERSION} {KIND} and {VOLCANO_JOB[0]} {VOLCANO_JOB[1]}"
                )
            else:
                others.append(kind)
            # Other kinds (a PVC or ConfigMap next to the Job) are not tide's to check.
            continue
        checked += 1
        found.errors.extend(prefix + e for e in errors)
        found.warnings.extend(prefix + w for w in warnings)
    if checked == 0 and not found.errors and other_kinds_ok:
        return FileReport(
            path=path, skipped=f"only {', '.join(sorted(set(others)))}: not tide's to check"
        )
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
