"""tide tune's search: which parameter sets it tries, and what an interrupt keeps."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import simulations.tune as tune_module
from simulations.api import default_policy_for, load_workload
from simulations.cluster_config import BUILTIN_CLUSTER
from simulations.run import RunOptions
from simulations.tune import SearchSpace, candidates, distinct_sets, tune
from tests.simulations.helpers import interrupt_after_first


def space(method: str = "random", trials: int = 8, **ranges: tuple[float, float]) -> SearchSpace:
    return SearchSpace(
        method=method,
        trials=trials,
        seed=3,
        objective="avg_jct_h",
        choices={"defaults.cooldown_s": (60.0, 300.0), "defaults.max_step_up": (1.0, 2.0, 4.0)},
        ranges=ranges,
    )


def test_random_draws_never_repeat_a_set() -> None:
    drawn = candidates(space(trials=5))
    assert len(drawn) == 5
    assert len({tuple(p.values()) for p in drawn}) == 5
    assert candidates(space(trials=5)) == drawn  # seeded


def test_random_search_asked_for_more_than_the_space_holds_runs_each_set_once() -> None:
    assert distinct_sets(space()) == 6
    drawn = candidates(space(trials=40))
    assert sorted(tuple(p.values()) for p in drawn) == sorted(
        tuple(p.values()) for p in candidates(space(method="grid"))
    )


def test_a_range_makes_the_space_endless() -> None:
    s = space(trials=20, **{"defaults.tolerance": (0.0, 0.2)})
    assert distinct_sets(s) == float("inf")
    assert len(candidates(s)) == 20


def test_an_interrupt_keeps_the_finished_trials_and_their_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        tune_module, "results_as_done", interrupt_after_first(tune_module.results_as_done)
    )
    workload = load_workload(seed=0, duration_s=3600.0)
    result = tune(
        space=space(method="grid"),
        base_policy=default_policy_for(BUILTIN_CLUSTER),
        workloads=[workload],
        cluster=BUILTIN_CLUSTER,
        options=RunOptions(),
        out_dir=tmp_path,
        workers=1,
    )
    assert result.interrupted and result.planned == 6
    assert len(result.trials) == 1  # the trial finished before the interrupt; the rest stopped
    with (tmp_path / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result.trials)
    best_params, _ = min(result.trials, key=lambda t: t[1])
    assert result.best.defaults.cooldown_s == best_params["defaults.cooldown_s"]
