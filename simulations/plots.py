"""Plots of a comparison: JCT CDF, utilization over time, replicas of some jobs (Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from simulations.run import SimResult


def plot_all(results: Sequence[SimResult], out_dir: Path, *, jobs_to_show: int = 4) -> list[Path]:
    """Write ``jct_cdf.png``, ``utilization.png`` and ``replicas.png`` into ``out_dir``.

    Args:
        results: one run per policy, same workload.
        out_dir: where to write.
        jobs_to_show: how many jobs' replicas to draw (those rescaled most by the first run).

    Returns:
        The files written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        jct = np.sort([(j.end_s - j.submit_s) / 3600 for j in r.jobs if j.end_s is not None])
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "jct_cdf.png"))
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        t = [p.time_s / 3600 for p in r.timeline]
        ax.plot(t, [p.allocated_gpus / r.total_gpus for p in r.timeline], label=f"{r.policy}")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs allocated / total")
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "utilization.png"))
    if results:
        first = results[0]
        chosen = sorted(first.jobs, key=lambda j: -j.rescales)[:jobs_to_show]
        fig, ax = plt.subplots(figsize=(7, 4))
        for job in chosen:
            log = list(job.replica_log)
            if job.end_s is not None:
                log.append((job.end_s, 0))
            if log:
                ax.step(
                    [t / 3600 for t, _ in log], [n for _, n in log], where="post", label=job.key
                )
        ax.set_xlabel("time (h)")
        ax.set_ylabel(f"placed replicas ({first.policy})")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
        written.append(_save(fig, out_dir / "replicas.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
