"""Plots of a comparison: JCT CDF, utilization over time, replicas of some jobs (Agg backend);
and of headroom forecasts against the actual demand (``plot_forecasts``).

Six policies on one workload often draw the same line (a baseline that never rescales matches
``static`` where nothing waits), and the last one drawn hides the others. So every policy has
its own colour and dash, the first (tide in ``tide simulate``) is drawn thicker and on top, a
policy whose curve repeats an earlier one's says so in the legend, and utilization is one panel
per policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from scheduler_policy.models.forecast_eval import ForecastTrace
from simulations.report import summarize
from simulations.run import SimResult

_DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)))


def _style(index: int) -> dict[str, Any]:
    """Colour, dash, width and layer of the ``index``-th policy: the first is bold and on top."""
    return {
        "color": f"C{index % 10}",
        "linestyle": _DASHES[index % len(_DASHES)],
        "linewidth": 2.2 if index == 0 else 1.4,
        "zorder": 3 if index == 0 else 2,
    }


def _completion_times_h(result: SimResult) -> np.ndarray:
    return np.sort([(j.end_s - j.submit_s) / 3600 for j in result.jobs if j.end_s is not None])


def plot_all(
    results: Sequence[SimResult],
    out_dir: Path,
    *,
    seeds: Sequence[int] = (0,),
    jobs_to_show: int = 4,
    subject: str = "",
) -> list[Path]:
    """Write ``jct_cdf.png``, ``utilization.png`` and ``replicas.png`` into ``out_dir``.

    With several seeds, the JCT CDF pools every job of every seed under each policy (one seed's
    workload is small, and its curve misleads as its average does); utilization and replicas,
    which are over time, are the first seed's.

    Args:
        results: one run per policy and seed: the first seed's policies in order, then the next
            seed's.
        out_dir: where to write.
        seeds: the seeds, in the order ``results`` has them.
        jobs_to_show: how many jobs' replicas to draw (those rescaled most by the first run).
        subject: what ran, at the top of every plot (``builtin-seed0 on small-mixed, 32 GPUs``);
            empty: the first run's workload.

    Returns:
        The files written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    policies = len(results) // max(1, len(seeds))
    first = results[:policies]
    pooled = [results[p::policies] for p in range(policies)]
    subject = subject or (results[0].workload if results else "")
    title = (
        subject if len(seeds) < 2 else f"{subject}: every job of seeds {','.join(map(str, seeds))}"
    )
    written = [_jct_cdf(pooled, out_dir / "jct_cdf.png", title=title)]
    written.append(_utilization(first, out_dir / "utilization.png", subject=subject))
    if first:
        written.append(_replicas(first[0], out_dir / "replicas.png", jobs_to_show, subject))
    return written


def cdf_curves(groups: Sequence[Sequence[SimResult]]) -> list[tuple[int, str, np.ndarray]]:
    """The JCT CDF's curves: each policy's runs (one per seed) with finished jobs, as (its
    index, its legend label, the sorted completion times in hours of all its runs' jobs). A
    curve equal to an earlier one says whose."""
    curves: list[tuple[int, str, np.ndarray]] = []
    for i, runs in enumerate(groups):
        jct = np.sort(np.concatenate([_completion_times_h(r) for r in runs] or [np.zeros(0)]))
        if not len(jct):
            continue
        label = f"{runs[0].policy}: avg {jct.mean():.2f} h"
        same = next(
            (groups[j][0].policy for j, _, other in curves if np.array_equal(other, jct)), None
        )
        if same is not None:
            label += f" (same curve as {same})"
        curves.append((i, label, jct))
    return curves


def _jct_cdf(groups: Sequence[Sequence[SimResult]], path: Path, *, title: str | None) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    curves = cdf_curves(groups)
    if title is not None:
        ax.set_title(title, fontsize="small")
    for i, label, jct in curves:
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=label,
                **_style(i))  # fmt: skip
    ax.set_xscale("log")
    # Plain hours on the log axis (0.1, 1, 10), not powers of ten.
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs finished within")
    if curves:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _utilization(results: Sequence[SimResult], path: Path, *, subject: str) -> Path:
    panels = max(1, len(results))
    fig, axes = plt.subplots(
        panels, 1, figsize=(7, 1.0 + 1.4 * panels), sharex=True, sharey=True, squeeze=False
    )
    for i, (ax, r) in enumerate(zip(axes[:, 0], results, strict=False)):
        t = [p.time_s / 3600 for p in r.timeline]
        allocated = [p.allocated_gpus / r.total_gpus for p in r.timeline]
        useful = [p.effective_gpus / r.total_gpus for p in r.timeline]
        color = _style(i)["color"]
        ax.fill_between(t, useful, step="post", color=color, alpha=0.35, linewidth=0)
        ax.step(t, allocated, where="post", color=color, linewidth=1.0)
        s = summarize(r)
        ax.set_title(f"{r.policy}: allocated {s.gpu_allocation:.2f}, useful "
                     f"{s.useful_utilization:.2f}", loc="left", fontsize="small")  # fmt: skip
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time (h)")
    fig.supylabel("share of the cluster's GPUs")
    fig.suptitle(f"{subject}\nline: GPUs allocated; shaded: useful (speedup-weighted) — time "
                 "averages in each panel", fontsize="small")  # fmt: skip
    return _save(fig, path)


def _replicas(first: SimResult, path: Path, jobs_to_show: int, subject: str) -> Path:
    chosen = sorted(first.jobs, key=lambda j: -j.rescales)[:jobs_to_show]
    fig, ax = plt.subplots(figsize=(7, 4))
    labelled = False
    for job in chosen:
        log = list(job.replica_log)
        if job.end_s is not None:
            log.append((job.end_s, 0))
        if log:
            ax.step([t / 3600 for t, _ in log], [n for _, n in log], where="post", label=job.key)
            labelled = True
    ax.set_title(f"{subject}: the jobs {first.policy} rescaled most", fontsize="small")
    ax.set_xlabel("time (h)")
    ax.set_ylabel(f"placed replicas ({first.policy})")
    if labelled:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_FORECASTS_SHOWN = ("tide", "recent_peak", "persistence_residual")


def plot_forecasts(traces: Sequence[ForecastTrace], path: Path) -> None:
    """One panel per trace: the actual target, tide's forecast and the two naive quantile ones.

    Args:
        traces: what to draw, one panel each (at least one).
        path: the image to write (its suffix picks the format).

    Raises:
        OSError: the image cannot be written.
    """
    figure, axes = plt.subplots(len(traces), 1, figsize=(11, 2.6 * len(traces)), squeeze=False)
    for ax, trace in zip(axes[:, 0], traces, strict=True):
        hours = (trace.times_s - trace.times_s[0]) / 3600.0
        ax.plot(hours, trace.actual, color="black", linewidth=1.0, label="actual")
        for index, model in enumerate(_FORECASTS_SHOWN):
            ax.plot(
                hours,
                trace.forecasts[model],
                color=f"C{index}",
                linewidth=1.6 if model == "tide" else 0.9,
                linestyle="-" if model == "tide" else "--",
                label=model,
            )
        ax.set_title(
            f"{trace.series}: {trace.target} demand over {trace.horizon_s / 60:.0f} min",
            fontsize=9,
        )
        ax.set_ylabel("GPUs")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("hours into the test window")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
