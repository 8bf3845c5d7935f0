"""``tide tune``: search policy parameters over workloads, in parallel worker processes.

The search space, its file and the policies it makes are ``simulations.tune_space``.
Trials are appended to ``trials.csv`` as they finish, so an interrupted search keeps them.
The base policy runs too, first, on the same workloads: the reference every trial is measured
against, and the best policy when no trial beats it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler_policy.policy.spec import ElasticPolicy
from simulations.api import PolicyRun, Seeded, run_one
from simulations.cluster_config import ClusterSpec
from simulations.parallel import results_as_done
from simulations.report import Summary, summarize
from simulations.run import Progress
from simulations.tune_space import (
    SearchSpace,
    apply_params,
    candidates,
    check_values,
    param_text,
    param_value,
)


def _trial(
    policy: ElasticPolicy,
    seeded: Sequence[Seeded],
    cluster: ClusterSpec,
    progress: Callable[[float], None] | None = None,
) -> list[Summary]:
    """One trial: the policy on every workload; ``progress`` is told the share of the trial's
    jobs finished so far (all workloads together) while it runs."""
    run = PolicyRun("tide", "tide", policy)
    total = sum(len(one.workload.jobs) for one in seeded) or 1
    before = 0
    summaries = []
    for one in seeded:
        tell = None if progress is None else _share_of(progress, before=before, total=total)
        result = run_one(
            run, workload=one.workload, cluster=cluster, options=one.options, progress=tell
        )
        summaries.append(summarize(result))
        before += len(one.workload.jobs)
    return summaries


def _share_of(progress: Callable[[float], None], *, before: int, total: int) -> Progress:
    """A run's progress callback telling ``progress`` the share of a trial's ``total`` jobs
    finished, ``before`` of them in its earlier workloads."""

    def tell(done: int, jobs: int, now_s: float) -> None:
        progress((before + done) / total)

    return tell


def objective_of(summaries: Sequence[Summary], objective: str) -> float:
    """The mean of ``objective`` over workloads; NaN if a workload lacks it (``SearchSpace.loss``
    ranks that last)."""
    values = [float(getattr(s, objective)) for s in summaries]
    return math.nan if any(math.isnan(v) for v in values) else float(np.mean(values))


def figure_of(summaries: Sequence[Summary], figure: str) -> float:
    """The mean of ``figure`` over the workloads that have it (a workload without non-elastic
    jobs has no non-elastic queueing delay); NaN when none has it."""
    values = [v for s in summaries if not math.isnan(v := float(getattr(s, figure)))]
    return float(np.mean(values)) if values else math.nan


# The index of the base policy's run, which sets no parameter.
BASE = -1


@dataclass(frozen=True, slots=True)
class Trial:
    """One finished trial, or the base policy's run (``index`` ``BASE``, no ``params``).

    Attributes:
        index: its place among the planned trials (``candidates``); ``BASE`` for the base.
        params: the parameters it set.
        objective: the objective, averaged over workloads (``objective_of``).
        figures: each constrained figure, averaged over workloads (``figure_of``).
        meets: whether every figure is within its constraint (a NaN figure is not).
        by_workload: the objective on each workload, in the order they were given.
    """

    index: int
    params: dict[str, float]
    objective: float
    figures: dict[str, float]
    meets: bool
    by_workload: tuple[float, ...] = ()

    @property
    def is_base(self) -> bool:
        """Whether this is the base policy's run."""
        return self.index == BASE


def _judge(
    index: int, params: dict[str, float], summaries: Sequence[Summary], space: SearchSpace
) -> Trial:
    figures = {name: figure_of(summaries, name) for name in space.constraints}
    meets = all(
        low <= figures[name] <= high for name, (low, high) in space.constraints.items()
    )  # NaN compares False: a figure no workload has meets no constraint
    by_workload = tuple(float(getattr(one, space.objective)) for one in summaries)
    return Trial(
        index, params, objective_of(summaries, space.objective), figures, meets, by_workload
    )


def tune(
    *,
    space: SearchSpace,
    base_policy: ElasticPolicy,
    seeded: Sequence[Seeded],
    cluster: ClusterSpec,
    out_dir: Path,
    workers: int = 2,
    on_trial: Callable[[int, int, int], None] | None = None,
    on_progress: Callable[[int, float], None] | None = None,
) -> TuneResult:
    """Run the base policy and every candidate; append each finished run to
    ``out_dir/trials.csv`` (the base's row says ``base`` and gives its values).

    An interrupt (Ctrl-C) stops every trial not finished at once, and returns what finished,
    marked ``interrupted``.

    Args:
        space: the search space.
        base_policy: the policy whose parameters are varied.
        seeded: the workloads each trial runs on, each with its run options (a workload
            drawn with a seed runs with that seed's measurement noise, as ``tide simulate
            --seed`` runs it, so a trial's figures are the ones a simulation would show).
        cluster: the cluster.
        out_dir: where ``trials.csv`` goes.
        workers: worker processes.
        on_trial: called with (finished, total, the trial's index) after each run, the
            base's included (index ``BASE``; ``total`` counts it).
        on_progress: called with (trial index, share of its jobs finished) while trials run
            (at most every ``run.PROGRESS_EVERY_S`` per workload).

    Returns:
        The best run that meets the space's constraints (the base policy's when no trial
        beats it), the base's run, and every finished trial.

    Raises:
        SearchSpaceError: a value the policy file would refuse (``check_values``); nothing runs.
    """
    check_values(space, base_policy)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = candidates(space)
    names = sorted({n for c in todo for n in c})
    bounded = [n for n in space.constraints if n != space.objective]
    finished: list[Trial] = []
    base: Trial | None = None
    interrupted = False
    # The base runs first (call 0): the reference is there early, even if the search is
    # interrupted; trial i is call i + 1.
    plans = [{}, *todo]
    calls = [(apply_params(base_policy, p), seeded, cluster) for p in plans]
    base_values = {n: param_value(base_policy, n) for n in names}

    def progress(call: int, share: float) -> None:
        if on_progress is not None:
            on_progress(call - 1, share)

    with (out_dir / "trials.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        met = ["meets_constraints"] if space.constraints else []
        writer.writerow(["trial", *names, space.objective, *bounded, *met])
        f.flush()
        try:
            for call, summaries in results_as_done(
                _trial, calls, workers=workers, on_progress=progress
            ):
                trial = _judge(call - 1, plans[call], summaries, space)
                if trial.is_base:
                    base = trial
                    row: list[object] = [
                        "base",
                        *("" if v is None else param_text(n, v) for n, v in base_values.items()),
                    ]
                else:
                    finished.append(trial)
                    row = [
                        trial.index,
                        *(
                            param_text(n, trial.params[n]) if n in trial.params else ""
                            for n in names
                        ),
                    ]
                writer.writerow(
                    [*row, trial.objective]
                    + [trial.figures[n] for n in bounded]
                    + ([trial.meets] if space.constraints else [])
                )
                f.flush()
                if on_trial is not None:
                    on_trial(len(finished) + (base is not None), len(calls), trial.index)
        except KeyboardInterrupt:
            interrupted = True  # the workers are already stopped; the finished trials count
    # In planned order, not the order the workers finished in: a tie then goes to the trial
    # planned first, whatever the timing, and to the base policy before any trial.
    finished.sort(key=lambda t: t.index)
    eligible = [t for t in ([base] if base is not None else []) + finished if t.meets]
    best = min(eligible, key=lambda t: space.loss(t.objective)) if eligible else None
    policy = apply_params(base_policy, best.params) if best is not None else base_policy
    return TuneResult(policy, best, finished, len(todo), interrupted, base)


@dataclass(frozen=True, slots=True)
class TuneResult:
    """What ``tune`` found.

    Attributes:
        best: the base policy with the best trial's parameters (the base policy itself when
            the best is the base's run, or no finished run meets the constraints).
        best_trial: the finished run with the best objective among those that meet the
            constraints (of equal ones, the base's, then the first planned); None when there
            is none. It is ``base`` when no trial beats the base policy.
        trials: every finished trial, in the order they were planned (``candidates``).
        planned: how many trials were to run (the base's run not counted).
        interrupted: whether an interrupt stopped the search before every trial finished.
        base: the base policy's run; None if an interrupt stopped it first.
    """

    best: ElasticPolicy
    best_trial: Trial | None
    trials: list[Trial]
    planned: int
    interrupted: bool = False
    base: Trial | None = None
