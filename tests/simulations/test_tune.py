"""tide tune's search: which parameter sets it tries, and what an interrupt keeps."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import simulations.tune as tune_module
from scheduler_policy.policy.spec import Headroom
from simulations.api import Seeded, default_policy_for, load_workload
from simulations.cluster_config import BUILTIN_CLUSTER
from simulations.errors import SearchSpaceError
from simulations.run import RunOptions
from simulations.tune import (
    TuneResult,
    figure_of,
    tune,
)
from simulations.tune_space import (
    SearchSpace,
    apply_params,
    candidates,
    distinct_sets,
    load_search_space,
)
from tests.simulations.helpers import interrupt_after


def space(method: str = "random", trials: int = 8, **ranges: tuple[float, float]) -> SearchSpace:
    return SearchSpace(
        method=method,
        trials=trials,
        seed=3,
        objective="avg_jct_h",
        choices={"defaults.cooldown": (60.0, 300.0), "defaults.maxStepUp": (1.0, 2.0, 4.0)},
        ranges=ranges,
    )


def _tune_on_builtin(searched: SearchSpace, out_dir: Path) -> TuneResult:
    """``tune`` of the built-in cluster's default policy, with no workloads: for tests whose
    trials' results are faked, or refused before any runs."""
    return tune(
        space=searched,
        base_policy=default_policy_for(BUILTIN_CLUSTER),
        seeded=[],
        cluster=BUILTIN_CLUSTER,
        out_dir=out_dir,
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
        tune_module, "results_as_done", interrupt_after(tune_module.results_as_done, 2)
    )
    workload = load_workload(seed=0, duration_s=3600.0)
    base_policy = default_policy_for(BUILTIN_CLUSTER)
    result = tune(
        space=space(method="grid"),
        base_policy=base_policy,
        seeded=[Seeded(0, workload, RunOptions())],
        cluster=BUILTIN_CLUSTER,
        out_dir=tmp_path,
        workers=1,
    )
    assert result.interrupted and result.planned == 6
    # The base ran first, then one trial; the rest stopped.
    assert result.base is not None and len(result.trials) == 1
    with (tmp_path / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["trial"] for r in rows] == ["base", "0"]
    assert rows[0]["defaults.cooldown"] == "2m" and base_policy.defaults.cooldown_s == 120.0
    trial = result.trials[0]
    if trial.objective < result.base.objective:
        assert result.best_trial == trial
        assert result.best.defaults.cooldown_s == trial.params["defaults.cooldown"]
    else:
        assert result.best_trial == result.base and result.best == base_policy


def test_of_equal_trials_the_first_planned_is_best_whatever_finishes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def last_first(fn: object, calls: list[object], **_: object) -> Iterator[tuple[int, list]]:
        for call in reversed(range(len(calls))):  # call 0 is the base policy's run: worse
            yield call, [SimpleNamespace(avg_jct_h=2.0 if call == 0 else 1.0)]

    monkeypatch.setattr(tune_module, "results_as_done", last_first)
    grid = space(method="grid")
    result = _tune_on_builtin(grid, tmp_path)
    planned = candidates(grid)
    assert [t.params for t in result.trials] == planned
    assert result.best.defaults.cooldown_s == planned[0]["defaults.cooldown"]
    assert result.best.defaults.max_step_up == planned[0]["defaults.maxStepUp"]


def _space_file(tmp_path: Path, text: str) -> SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return load_search_space(path)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ("interval: [1m, 0s]", "parameters.interval: 0s is refused: spec.interval: must be"),
        (
            "defaults.tolerance: {min: 0.0, max: 1.5}",
            "parameters.defaults.tolerance: 1.5 is refused: spec.defaults.tolerance: must be "
            "at least 0 and less than 1",
        ),
        ("defaults.maxStepUp: [0]", "parameters.defaults.maxStepUp: 0 is refused"),
        (
            "queues.research.headroom.gpus: [1.5]",
            "parameters.queues.research.headroom.gpus: "
            "1.5 is refused: spec.queues[0].headroom.gpus: must be a whole number of GPUs",
        ),
        (
            "queues.research.headroom.forecastQuantile: [0.5, 1]",
            "parameters.queues.research.headroom.forecastQuantile: 1 is refused: "
            "spec.queues[0].headroom.forecastQuantile: must be between 0 and 1",
        ),
        (
            "queues.gpu-pool.headroom.gpus: [1]",
            "parameters.queues.gpu-pool.headroom.gpus: policy default has no queue "
            "'gpu-pool' (it has research, production)",
        ),
    ],
)
def test_a_value_the_policy_file_would_refuse_is_refused_before_any_trial(
    tmp_path: Path, parameters: str, expected: str
) -> None:
    searched = _space_file(tmp_path, f"method: random\nparameters:\n  {parameters}\n")
    with pytest.raises(SearchSpaceError) as refused:
        _tune_on_builtin(searched, tmp_path / "out")
    assert str(refused.value).startswith(f"{tmp_path / 'space.yaml'}: {expected}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ("defaults.tolerance: [0.1, .nan]", "parameters.defaults.tolerance: nan is not a finite"),
        ("defaults.tolerance: {min: 0, max: .inf}", "tolerance: inf is not a finite number"),
        (
            "defaults.tolerance: [0.1, true]",
            "parameters.defaults.tolerance: need numbers, got true",
        ),
        (
            "defaults.cooldown: [60]",
            "parameters.defaults.cooldown: must be a duration string such as '60s', got 60",
        ),
        ("defaults.cooldown: [-5s]", "parameters.defaults.cooldown: must not be negative"),
        ("queues.research.headroom.gpu: [1]", "did you mean 'queues.research.headroom.gpus'?"),
        (
            "defaults.cooldown_s: [60]",
            "parameters.defaults.cooldown_s: is now spelled "
            "'defaults.cooldown', as in the policy file (durations as strings, e.g. '5m')",
        ),
        (
            "queues.research.max_elastic_gpus: [8]",
            "parameters.queues.research.max_elastic_gpus: "
            "is now spelled 'queues.research.maxElasticGpus'",
        ),
        (
            "defaults.cooldown: [1m]\n  defaults.cooldown: [2m]",
            "line 4, column 3: invalid YAML: "
            "key 'defaults.cooldown' is "
            "given twice (first on line 3)",
        ),
    ],
)
def test_a_space_file_names_a_value_that_is_not_a_number(
    tmp_path: Path, parameters: str, expected: str
) -> None:
    with pytest.raises(SearchSpaceError, match=re.escape(expected)):
        _space_file(tmp_path, f"method: random\nparameters:\n  {parameters}\n")


def test_queue_parameters_set_that_queue_and_nothing_else() -> None:
    base = default_policy_for(BUILTIN_CLUSTER)
    tuned = apply_params(
        base,
        {
            "queues.research.headroom.gpus": 2.0,
            "queues.research.headroom.forecastQuantile": 0.9,
            "queues.research.maxElasticGpus": 12.0,
            "defaults.cooldown": 120.0,
        },
    )
    research, production = tuned.queues
    assert research.headroom == Headroom(gpus=2.0, forecast_quantile=0.9)
    assert research.max_elastic_gpus == 12.0
    assert production == base.queues[1]
    assert tuned.defaults.cooldown_s == 120.0


def _fake_results(
    figures: list[dict[str, float]],
) -> Callable[..., Iterator[tuple[int, list[SimpleNamespace]]]]:
    """``results_as_done`` that gives call i (0: the base policy, then the trials) one
    workload's summary with ``figures[i]``."""

    def fake(fn: object, calls: list[object], **_: object) -> Iterator[tuple[int, list]]:
        for index in range(len(calls)):
            yield index, [SimpleNamespace(**figures[index])]

    return fake


def test_the_best_trial_is_the_lowest_objective_among_those_that_meet_the_constraints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    searched = _space_file(
        tmp_path,
        "method: grid\nparameters:\n  defaults.cooldown: [1m, 2m, 3m, 4m]\n"
        "constraints:\n  p95_queue_nonelastic_h: {max: 1.0}\n  useful_utilization: {min: 0.5}\n",
    )
    figures = [
        {"avg_jct_h": 2.5, "p95_queue_nonelastic_h": 0.5, "useful_utilization": 0.6},  # base
        {"avg_jct_h": 1.0, "p95_queue_nonelastic_h": 2.0, "useful_utilization": 0.9},  # p95 high
        {"avg_jct_h": 2.0, "p95_queue_nonelastic_h": 0.5, "useful_utilization": 0.6},  # meets
        {"avg_jct_h": 1.5, "p95_queue_nonelastic_h": 0.5, "useful_utilization": 0.4},  # util low
        {"avg_jct_h": 3.0, "p95_queue_nonelastic_h": 1.0, "useful_utilization": 0.5},  # meets
    ]
    monkeypatch.setattr(tune_module, "results_as_done", _fake_results(figures))
    result = _tune_on_builtin(searched, tmp_path / "out")
    assert [t.meets for t in result.trials] == [False, True, False, True]
    assert result.best_trial is result.trials[1]
    assert result.best.defaults.cooldown_s == 120.0
    with (tmp_path / "out" / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["trial"] for r in rows] == ["base", "0", "1", "2", "3"]
    assert [r["meets_constraints"] for r in rows] == ["True", "False", "True", "False", "True"]
    assert [float(r["p95_queue_nonelastic_h"]) for r in rows] == [0.5, 2.0, 0.5, 0.5, 1.0]


@pytest.mark.parametrize(
    ("base_figures", "best"),
    [
        ({"avg_jct_h": 0.5, "useful_utilization": 0.6}, "base"),  # better than every trial
        ({"avg_jct_h": 1.0, "useful_utilization": 0.6}, "base"),  # a tie goes to the base
        ({"avg_jct_h": 0.5, "useful_utilization": 0.1}, 0),  # better, but misses a constraint
        ({"avg_jct_h": 1.5, "useful_utilization": 0.6}, 0),
    ],
)
def test_the_base_policy_is_best_when_no_trial_beats_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    base_figures: dict[str, float],
    best: object,
) -> None:
    searched = _space_file(
        tmp_path,
        "method: grid\nparameters:\n  defaults.cooldown: [1m, 2m]\n"
        "constraints:\n  useful_utilization: {min: 0.5}\n",
    )
    trials = [
        {"avg_jct_h": 1.0, "useful_utilization": 0.6},
        {"avg_jct_h": 2.0, "useful_utilization": 0.6},
    ]
    monkeypatch.setattr(tune_module, "results_as_done", _fake_results([base_figures, *trials]))
    result = _tune_on_builtin(searched, tmp_path / "out")
    assert result.base is not None and result.base.is_base
    assert [t.index for t in result.trials] == [0, 1]
    if best == "base":
        assert result.best_trial is result.base
        assert result.best == default_policy_for(BUILTIN_CLUSTER)
    else:
        assert result.best_trial is result.trials[0]
        assert result.best.defaults.cooldown_s == 60.0


def test_a_figure_no_workload_has_meets_no_constraint() -> None:
    no_nonelastic = SimpleNamespace(p95_queue_nonelastic_h=math.nan, avg_jct_h=1.0)
    some = SimpleNamespace(p95_queue_nonelastic_h=0.25)
    assert figure_of([no_nonelastic, some], "p95_queue_nonelastic_h") == 0.25
    assert math.isnan(figure_of([no_nonelastic], "p95_queue_nonelastic_h"))
    searched = SearchSpace(
        "grid", 1, 0, "avg_jct_h", {}, {}, constraints={"p95_queue_nonelastic_h": (0.0, 1.0)}
    )
    judged = tune_module._judge(0, {}, [no_nonelastic], searched)
    assert not judged.meets


@pytest.mark.parametrize(
    ("constraints", "expected"),
    [
        ("  p95_queue_nonelastic: {max: 1}", "did you mean 'p95_queue_nonelastic_h'?"),
        ("  avg_jct_h: {below: 1}", "constraints.avg_jct_h: need {min: N}, {max: N} or both"),
        ("  avg_jct_h: {max: .nan}", "constraints.avg_jct_h: need {min: N}"),
        ("  avg_jct_h: 3", "constraints.avg_jct_h: need {min: N}"),
        ("  avg_jct_h: {min: 2, max: 1}", "constraints.avg_jct_h: min 2 > max 1"),
        ("  wall_s: {max: 1}", "constraints: 'wall_s' is not a report figure"),
    ],
)
def test_a_bad_constraint_is_named(tmp_path: Path, constraints: str, expected: str) -> None:
    text = f"parameters:\n  defaults.cooldown: [1m]\nconstraints:\n{constraints}\n"
    with pytest.raises(SearchSpaceError, match=re.escape(expected)):
        _space_file(tmp_path, text)


def test_a_trial_tells_the_share_of_its_jobs_finished_over_all_its_workloads(
    tmp_path: Path,
) -> None:
    workloads = [load_workload(seed=s, duration_s=2 * 3600.0) for s in (0, 1)]
    seeded = [Seeded(s, w, RunOptions()) for s, w in enumerate(workloads)]
    shares: list[tuple[int, float]] = []
    ended: list[int] = []
    result = tune(
        space=space(method="grid"),
        base_policy=default_policy_for(BUILTIN_CLUSTER),
        seeded=seeded,
        cluster=BUILTIN_CLUSTER,
        out_dir=tmp_path,
        workers=2,
        on_trial=lambda done, total, index: ended.append(index),
        on_progress=lambda index, share: shares.append((index, share)),
    )
    assert sorted(ended) == [tune_module.BASE, *range(result.planned)]
    assert shares and all(0.0 <= share <= 1.0 for _, share in shares)
    for index in [tune_module.BASE, *range(result.planned)]:  # each run's reports only grow
        mine = [share for i, share in shares if i == index]
        assert mine == sorted(mine)


@pytest.mark.parametrize(
    ("objective", "values", "best"),
    [
        ("avg_jct_h", [2.0, 1.0, 3.0, math.nan], 1),
        ("useful_utilization", [0.5, 0.6, 0.8, math.nan], 2),  # higher is better
        ("useful_utilization", [0.9, 0.6, 0.8, 0.7], "base"),
    ],
)
def test_the_objective_is_minimised_or_maximised_and_nan_is_never_best(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    objective: str,
    values: list[float],
    best: object,
) -> None:
    searched = _space_file(
        tmp_path,
        f"method: grid\nobjective: {objective}\nparameters:\n  defaults.cooldown: [1m, 2m, 3m]\n",
    )
    assert searched.maximise == (objective == "useful_utilization")
    # Call 0 is the base policy's run; a NaN objective (last trial) must rank last either way.
    figures = [{objective: v} for v in values]
    monkeypatch.setattr(tune_module, "results_as_done", _fake_results(figures))
    result = _tune_on_builtin(searched, tmp_path / "out")
    assert result.best_trial is not None
    expected = result.base if best == "base" else result.trials[int(best) - 1]
    assert result.best_trial is expected


@pytest.mark.parametrize("figure", ["jobs", "skipped_rows", "node_failures"])
def test_a_figure_no_policy_changes_is_no_objective(tmp_path: Path, figure: str) -> None:
    with pytest.raises(SearchSpaceError, match=f"objective: {figure} is a figure of the workload"):
        _space_file(tmp_path, f"objective: {figure}\nparameters:\n  defaults.cooldown: [1m]\n")
