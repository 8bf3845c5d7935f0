"""The comparison's plots: every policy stays visible when curves coincide."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from simulations.api import PolicyRun, load_workload, run_one
from simulations.cluster_config import BUILTIN_CLUSTER
from simulations.plots import cdf_curves, plot_all
from simulations.run import RunOptions, SimResult


@pytest.fixture(scope="module")
def static_run() -> SimResult:
    workload = load_workload(seed=0, duration_s=3 * 3600.0)
    return run_one(
        PolicyRun("static", "static"), workload=workload, cluster=BUILTIN_CLUSTER,
        options=RunOptions(),
    )  # fmt: skip


def test_a_curve_equal_to_an_earlier_one_says_whose(static_run: SimResult) -> None:
    twin = dataclasses.replace(static_run, policy="twin")
    slower = dataclasses.replace(
        static_run,
        policy="slower",
        jobs=tuple(
            dataclasses.replace(j, end_s=j.end_s + 600.0) if j.end_s is not None else j
            for j in static_run.jobs
        ),
    )
    labels = [label for _, label, _ in cdf_curves([[static_run], [slower], [twin]])]
    assert labels[0].startswith("static: avg ")
    assert "same curve" not in labels[1]
    assert labels[2].endswith("(same curve as static)")


def test_a_run_without_finished_jobs_draws_no_curve(static_run: SimResult) -> None:
    unfinished = dataclasses.replace(
        static_run,
        policy="stuck",
        jobs=tuple(dataclasses.replace(j, end_s=None) for j in static_run.jobs),
    )
    assert [i for i, _, _ in cdf_curves([[unfinished], [static_run]])] == [1]


def test_with_several_seeds_a_curve_pools_every_seed_s_jobs(static_run: SimResult) -> None:
    other_seed = dataclasses.replace(
        static_run,
        jobs=tuple(
            dataclasses.replace(j, end_s=j.end_s + 3600.0) if j.end_s is not None else j
            for j in static_run.jobs
        ),
    )
    ((_, label, jct),) = cdf_curves([[static_run, other_seed]])
    finished = [j for j in static_run.jobs if j.end_s is not None]
    assert len(jct) == 2 * len(finished)
    assert list(jct) == sorted(jct)
    one = np.array([(j.end_s - j.submit_s) / 3600 for j in finished])
    assert jct.mean() == pytest.approx(one.mean() + 0.5)
    assert label == f"static: avg {one.mean() + 0.5:.2f} h"


def test_utilization_has_one_panel_per_policy(static_run: SimResult, tmp_path: Path) -> None:
    heights = []
    for count in (1, 3):
        out = tmp_path / str(count)
        runs = [dataclasses.replace(static_run, policy=f"p{i}") for i in range(count)]
        written = plot_all(runs, out)
        assert [p.name for p in written] == ["jct_cdf.png", "utilization.png", "replicas.png"]
        heights.append(matplotlib.image.imread(out / "utilization.png").shape[0])
    # Each panel adds the same height: three panels are much taller than one.
    assert heights[1] > 2 * heights[0]


def test_every_plot_names_what_ran_and_the_cdf_reads_in_plain_hours(
    static_run: SimResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import simulations.plots as plots

    figures: dict[str, object] = {}
    real = plots._save

    def keep(fig: object, path: Path) -> Path:
        fig.canvas.draw()  # type: ignore[attr-defined]
        figures[path.name] = {
            "titles": [ax.get_title() for ax in fig.axes]  # type: ignore[attr-defined]
            + [fig._suptitle.get_text() if fig._suptitle else ""],  # type: ignore[attr-defined]
            "xticks": [t.get_text() for t in fig.axes[0].get_xticklabels()],  # type: ignore[attr-defined]
        }
        return real(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    plot_all([static_run], tmp_path, subject="w on c, 32 GPUs")
    for name in ("jct_cdf.png", "utilization.png", "replicas.png"):
        assert any("w on c, 32 GPUs" in t for t in figures[name]["titles"]), name  # type: ignore[index]
    ticks = [t for t in figures["jct_cdf.png"]["xticks"] if t]  # type: ignore[index]
    # "0.1", "1", "10": not matplotlib's mathtext powers of ten ("$\\mathdefault{10^{0}}$").
    assert ticks and all(re.fullmatch(r"[0-9.]+", t) for t in ticks), ticks
