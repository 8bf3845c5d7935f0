"""When to reconcile at once instead of at the next interval: the event-triggered reconcile.

tide decides on an interval, but two things cannot wait for it: a gang of non-elastic work that
appears pending (its GPUs must come from a graceful shrink before Volcano's reclaim kills
elastic pods for it), and the extender withholding pods from Volcano's reclaim (its grace window
is a few seconds; tide's shrink must run inside it). ``reconcile_trigger`` is the pure rule; the
engine service (``tide engine``) and the simulator's event loop both follow it, and neither
reconciles more often than ``MIN_GAP_S``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from scheduler_policy.vocabulary.state import Observation, PendingGang

__all__ = ["MIN_GAP_S", "reconcile_trigger", "seen_gangs"]

MIN_GAP_S = 1.0
"""Least seconds between the starts of two reconciles, so that a storm of triggers does not
spin (about one Volcano scheduling session)."""

_NAMED = 3
"""Gangs a trigger's sentence names; the rest are counted."""


def seen_gangs(observation: Observation | None) -> frozenset[str]:
    """The pending gangs a reconcile saw (they trigger nothing more).

    Args:
        observation: the last reconcile's observation; None before the first.

    Returns:
        Their keys.
    """
    if observation is None:
        return frozenset()
    return frozenset(gang.key for gang in observation.pending_gangs)


def reconcile_trigger(
    *, seen: Collection[str], pending_gangs: Sequence[PendingGang], withheld_pods: int = 0
) -> str | None:
    """Whether to reconcile now, and why.

    Args:
        seen: the pending gangs the last reconcile saw (``seen_gangs``).
        pending_gangs: the pending gangs now.
        withheld_pods: pods the extender withheld from an eviction since the last reconcile.

    Returns:
        One sentence naming what happened (new pending gangs, withheld pods), or None when
        nothing calls for a reconcile before the next interval.

    Raises:
        ValueError: ``withheld_pods`` is negative.
    """
    if withheld_pods < 0:
        raise ValueError(f"withheld_pods: must be >= 0, got {withheld_pods}")
    new = [gang.key for gang in pending_gangs if gang.key not in seen]
    parts = []
    if new:
        names = ", ".join(new[:_NAMED])
        if len(new) > _NAMED:
            names += f" and {len(new) - _NAMED} more"
        parts.append(f"{len(new)} new pending gang(s): {names}")
    if withheld_pods:
        parts.append(f"the extender withheld {withheld_pods} pod(s) from eviction")
    return "; ".join(parts) if parts else None
