"""An observation file's adaptive-batch parts of a job: ``batchBounds`` and ``batchStatistics``.

The keys mirror ``BatchBounds``, ``BatchStatistics`` and ``StepTimes``; times in seconds::

    batchBounds: {initialBatchSize: 64, maxBatchSize: 4096, localBatchMin: 8,
                  localBatchMax: 256, accumulation: true}
    batchStatistics:
      batchSize: 128             # the workers' current global batch
      gradSqr: 1.0
      gradVar: 50.0
      progress: 100              # scale-invariant iterations done
      plannedProgress: 10000     # ... in all
      stepTimes:
        - {nodes: 1, replicas: 4, localBatchSize: 32, optimStepS: 0.08,
           accumulationStepS: 0.04, syncS: 0.03}

The bounds are checked as the ``tide.io/adaptive-batch`` annotations are (a job's annotations,
when given, override them). Every problem names its path and value.
"""

from __future__ import annotations

from scheduler_policy.policy.fields import boolean, finite_number, section, show
from scheduler_policy.vocabulary.state import BatchBounds, BatchStatistics, StepTimes

_BOUNDS = ("initialBatchSize", "maxBatchSize", "localBatchMin", "localBatchMax", "accumulation")
_STATISTICS = ("batchSize", "gradSqr", "gradVar", "progress", "plannedProgress", "stepTimes")
_STEP = ("nodes", "replicas", "localBatchSize", "optimStepS", "accumulationStepS", "syncS")


def _at_least_one(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: must be an integer >= 1, got {show(value)}")
    return value


def _seconds(value: object, path: str) -> float:
    number = finite_number(value, path)
    if number <= 0:
        raise ValueError(f"{path}: must be a positive number of seconds, got {show(value)}")
    return number


def _optional_seconds(value: object, path: str) -> float | None:
    return None if value is None else _seconds(value, path)


def _optional_number(value: object, path: str) -> float | None:
    return None if value is None else finite_number(value, path)


def read_bounds(value: object, path: str, problems: list[str]) -> BatchBounds | None:
    """``batchBounds`` of one job; None (with problems) when it is invalid."""
    b = section(value, path=path, allowed=_BOUNDS, problems=problems)
    if b is None:
        return None
    before = len(problems)
    b.require("initialBatchSize", "maxBatchSize", "localBatchMax")
    initial = b.get("initialBatchSize", 1, _at_least_one)
    largest = b.get("maxBatchSize", 1, _at_least_one)
    low = b.get("localBatchMin", 1, _at_least_one)
    high = b.get("localBatchMax", 1, _at_least_one)
    accumulation = b.get("accumulation", False, boolean)
    if len(problems) == before:
        if largest < initial:
            problems.append(
                f"{path}.maxBatchSize: must be at least initialBatchSize ({initial}), got {largest}"
            )
        if high < low:
            problems.append(
                f"{path}.localBatchMax: must be at least localBatchMin ({low}), got {high}"
            )
        if low > largest:
            problems.append(
                f"{path}.localBatchMin: must not exceed maxBatchSize ({largest}), got {low}"
            )
    if len(problems) > before:
        return None
    return BatchBounds(
        initial_batch_size=initial,
        max_batch_size=largest,
        local_batch_min=low,
        local_batch_max=high,
        accumulation=accumulation,
    )


def _step(value: object, path: str, problems: list[str]) -> StepTimes | None:
    s = section(value, path=path, allowed=_STEP, problems=problems)
    if s is None:
        return None
    before = len(problems)
    s.require("replicas", "localBatchSize", "optimStepS")
    step = StepTimes(
        nodes=s.get("nodes", 1, _at_least_one),
        replicas=s.get("replicas", 1, _at_least_one),
        local_batch_size=s.get("localBatchSize", 1, _at_least_one),
        optim_step_s=s.get("optimStepS", 1.0, _seconds),
        accumulation_step_s=s.get("accumulationStepS", None, _optional_seconds),
        sync_s=s.get("syncS", None, _optional_seconds),
    )
    return step if len(problems) == before else None


def read_statistics(value: object, path: str, problems: list[str]) -> BatchStatistics | None:
    """``batchStatistics`` of one job; None (with problems) when it is invalid."""
    s = section(value, path=path, allowed=_STATISTICS, problems=problems)
    if s is None:
        return None
    before = len(problems)
    if "batchSize" not in s.mapping:
        problems.append(f"{path}.batchSize: is required (the workers' current global batch)")
    raw = s.mapping.get("stepTimes", [])
    steps: list[StepTimes | None] = []
    if not isinstance(raw, list):
        problems.append(f"{path}.stepTimes: must be a list, got {show(raw)}")
    else:
        steps = [_step(v, f"{path}.stepTimes[{i}]", problems) for i, v in enumerate(raw)]
    statistics = BatchStatistics(
        batch_size=s.get("batchSize", 1, _at_least_one),
        grad_sqr=s.get("gradSqr", None, _optional_number),
        grad_var=s.get("gradVar", None, _optional_number),
        progress=s.get("progress", None, _optional_number),
        planned_progress=s.get("plannedProgress", None, _optional_number),
        step_times=tuple(p for p in steps if p is not None),
    )
    return statistics if len(problems) == before else None
