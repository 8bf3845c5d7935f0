"""What a checkpoint holds besides model and optimizer, and the progress marker.

The progress marker (``progress.json`` in the checkpoint directory) is rewritten by rank 0 after
every step, without fsync: it survives the death of the process (the page cache keeps it), so the
next start can tell how much work was done after its checkpoint, i.e. how many samples were lost.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PROGRESS_NAME = "progress.json"


@dataclass(frozen=True, slots=True)
class Position:
    """Where training stands.

    Attributes:
        step: Optimizer steps completed since the job began.
        epoch: Current epoch.
        consumed_samples: Samples of the current epoch's order already trained on.
        samples_total: Samples trained on since the job began.
    """

    step: int = 0
    epoch: int = 0
    consumed_samples: int = 0
    samples_total: int = 0


@dataclass(frozen=True, slots=True)
class ResumeInfo:
    """What the start found.

    Attributes:
        resumed: Whether a checkpoint was loaded.
        step: Step resumed from (0 on a fresh start).
        checkpoint_world_size: World size that wrote the checkpoint, ``None`` on a fresh start.
        world_size: Current world size.
        lost_steps: Steps completed after the checkpoint by the previous incarnation.
        lost_samples: Samples trained on after the checkpoint by the previous incarnation.
        load_s: Seconds spent finding, verifying and loading the checkpoint.
    """

    resumed: bool
    step: int
    checkpoint_world_size: int | None
    world_size: int
    lost_steps: int
    lost_samples: int
    load_s: float

    @property
    def rescaled(self) -> bool:
        """Whether the world size differs from the checkpoint's (a membership change)."""
        return self.resumed and self.checkpoint_world_size != self.world_size


def write_progress(directory: Path, position: Position) -> None:
    """Record the position reached (atomic rename, no fsync).

    Args:
        directory: Checkpoint directory.
        position: Position after the step just completed.
    """
    path = directory / PROGRESS_NAME
    tmp = directory / (PROGRESS_NAME + ".tmp")
    try:
        tmp.write_text(json.dumps({"step": position.step, "samples_total": position.samples_total}))
        os.replace(tmp, path)
    except OSError as e:
        logger.warning("cannot write progress marker %s: %s", path, e)


def read_progress(directory: Path) -> tuple[int, int] | None:
    """The ``(step, samples_total)`` last recorded, or ``None`` when absent or unreadable.

    Args:
        directory: Checkpoint directory.

    Returns:
        The recorded step and total samples.
    """
    try:
        data = json.loads((directory / PROGRESS_NAME).read_text())
        step, samples = int(data["step"]), int(data["samples_total"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step, samples
