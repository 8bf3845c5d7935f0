"""A plot of headroom forecasts against the actual demand target (the ``plots`` extra, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from scheduler_policy.models.forecast_eval import ForecastTrace

_SHOWN = ("tide", "recent_peak", "persistence_residual")


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
        for index, model in enumerate(_SHOWN):
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
