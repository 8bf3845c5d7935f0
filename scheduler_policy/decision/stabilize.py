"""Damping of the allocator's targets: tolerance → bounds → rate limit → cooldown → windows.

Each step is a small pure function over numpy arrays (one entry per job), so the whole chain runs
on 10,000 jobs at once. A step returns the new desired replicas; ``stabilize`` records which step
last changed each job's target, so the reason says what held it back.

A *forced* shrink (a budget the job's queue must fit, because pending work or headroom needs GPUs
back) skips tolerance, cooldown, the down window and the rate limit: waiting would only let
Volcano's reclaim kill the same pods abruptly instead (a shrink of 2 replicas a decision left the
rest for the reclaim to kill once the extender's grace window ran out). It still obeys bounds.

No job moves twice within one decision interval, with one exception: a forced shrink of a job
whose pending need is still unmet (``unmet``: pending work needs more than the idle and releasing
GPUs, so what the last shrinks free does not cover it). A reconcile the withheld pods trigger a
second after a shrink sees a new need (a new gang, or a second one), and holding the job would
let the extender's window end and reclaim kill. A second reconcile on the cluster a first one
left sees the first one's shrinks releasing: the need it served is covered, and nothing moves.

The memory (recent recommendations and the last rescale) is data in and data out, so the engine can
store it on the Volcano Job and survive its own restarts (STYLE.md 12; HPA keeps it in memory).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from scheduler_policy.policy.spec import Defaults
from scheduler_policy.vocabulary.state import JobMemory, Reason, Recommendation

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# What ``tails`` reads for a job with no recommendation (its figures then mean nothing).
_NO_RECOMMENDATION = Recommendation(math.inf, 0)


def within_tolerance(
    *,
    current: IntArray,
    desired: IntArray,
    gains: FloatArray,
    forced: BoolArray,
    tolerance: float,
) -> IntArray:
    """Hold jobs whose predicted relative throughput change is smaller than the tolerance.

    Args:
        current: replicas now.
        desired: proposed replicas.
        gains: predicted relative throughput change of the move (X(desired)/X(current) − 1).
        forced: moves that must happen whatever they gain.
        tolerance: the least relative change worth a restart (0.05 = 5%).

    Returns:
        ``current`` where the move is unforced and ``|gain| < tolerance``, else ``desired``.
    """
    small = np.abs(gains) < tolerance
    return np.where(~forced & (desired != current) & small, current, desired)


def clamp_to_bounds(
    *, desired: IntArray, min_replicas: IntArray, max_replicas: IntArray
) -> IntArray:
    """Keep every target within the job's [min, max] replicas."""
    return np.minimum(np.maximum(desired, min_replicas), np.maximum(max_replicas, min_replicas))


def limit_rate(
    *, current: IntArray, desired: IntArray, max_step_up: int, max_step_down: int
) -> IntArray:
    """Move at most ``max_step_up`` replicas up or ``max_step_down`` down in one decision."""
    return np.clip(desired, current - max_step_down, current + max_step_up)


def hold_in_cooldown(
    *,
    current: IntArray,
    desired: IntArray,
    last_rescale_s: FloatArray,
    forced: BoolArray,
    now_s: float,
    cooldown_s: float,
    interval_s: float,
    unmet: BoolArray | None = None,
) -> IntArray:
    """Hold unforced moves of jobs rescaled less than ``cooldown_s`` ago, and every move of a
    job rescaled less than one decision interval ago (so the rate limit is per interval, and a
    second reconcile at the same time moves nothing), but a forced shrink of a job whose pending
    need is still unmet (module docstring).

    Args:
        last_rescale_s: when each job was last rescaled; NaN for never.
        interval_s: the policy's decision interval.
        unmet: per job, whether the pending need a forced shrink of it serves is still unmet
            (pending work needs more than the idle and releasing GPUs); None for none.
    """
    since = now_s - last_rescale_s  # NaN compares False below: never rescaled
    cooling = (since < cooldown_s) & ~forced
    recent = since < interval_s
    if unmet is not None:
        recent &= ~(forced & unmet & (desired < current))
    return np.where(cooling | recent, current, desired)


def apply_windows(
    *,
    current: IntArray,
    desired: IntArray,
    window_up_min: IntArray,
    window_down_max: IntArray,
    forced: BoolArray,
) -> IntArray:
    """Scale up only as far as every recent recommendation agrees; down likewise.

    Args:
        window_up_min: the lowest recommendation in each job's up window (this one included).
        window_down_max: the highest recommendation in each job's down window (this one included).
        forced: shrinks that skip the down window.

    Returns:
        Up: ``max(current, min(desired, window_up_min))``; down: ``min(current, max(desired,
        window_down_max))``; holds stay.
    """
    up = np.maximum(current, np.minimum(desired, window_up_min))
    down = np.where(forced, desired, np.minimum(current, np.maximum(desired, window_down_max)))
    return np.where(desired > current, up, np.where(desired < current, down, desired))


class Tails(NamedTuple):
    """Each job's number of stored recommendation changes and its last one, as columns.

    ``replicas`` and ``since_s`` mean nothing where ``lengths`` is 0.
    """

    lengths: IntArray
    replicas: IntArray
    since_s: FloatArray


def tails(recommendations: Sequence[tuple[Recommendation, ...]]) -> Tails:
    """The last recommendation change of every job, read once for all the steps that need it."""
    count = len(recommendations)
    lengths = np.fromiter(map(len, recommendations), dtype=np.int64, count=count)
    if lengths.all():  # the steady state: every job holds a recommendation; read them in C
        last = list(map(itemgetter(-1), recommendations))
    else:
        last = [recs[-1] if recs else _NO_RECOMMENDATION for recs in recommendations]
    return Tails(
        lengths=lengths,
        replicas=np.fromiter(map(itemgetter(1), last), dtype=np.int64, count=count),
        since_s=np.fromiter(map(itemgetter(0), last), dtype=np.float64, count=count),
    )


def window_extremes(
    recommendations: Sequence[tuple[Recommendation, ...]],
    recommended: IntArray,
    *,
    now_s: float,
    window_up_s: float,
    window_down_s: float,
    last: Tails | None = None,
) -> tuple[IntArray, IntArray]:
    """The lowest recommendation in each up window and the highest in each down window.

    Recommendations are stored as changes: each holds from its time until the next one, so the
    one in force when a window opens counts too.

    Args:
        recommendations: each job's recommendation changes, oldest first.
        recommended: this round's recommendation for each job (always in both windows).
        now_s: the reconcile time.
        window_up_s: length of the up window.
        window_down_s: length of the down window.
        last: ``tails(recommendations)``, when the caller has it already.

    Returns:
        ``(window_up_min, window_down_max)``.
    """
    up_min = recommended.copy()
    down_max = recommended.copy()
    up_from, down_from = now_s - window_up_s, now_s - window_down_s
    # The last change is in force until now: inside any window longer than zero. Most jobs hold
    # one change only, so that one is taken for all jobs at once, the rest one by one.
    lengths, last_replicas, _ = tails(recommendations) if last is None else last
    if window_up_s > 0:
        up_min = np.where(lengths > 0, np.minimum(up_min, last_replicas), up_min)
    if window_down_s > 0:
        down_max = np.where(lengths > 0, np.maximum(down_max, last_replicas), down_max)
    for i in np.flatnonzero(lengths > 1).tolist():
        recs = recommendations[i]
        for k, (_, replicas) in enumerate(recs[:-1]):
            # In force until the next change: inside a window that opened before then.
            until = recs[k + 1][0]
            if until > up_from and replicas < up_min[i]:
                up_min[i] = replicas
            if until > down_from and replicas > down_max[i]:
                down_max[i] = replicas
    return up_min, down_max


DAMPING_STEPS = (
    Reason.WITHIN_TOLERANCE,
    Reason.LIMITED_BY_BOUNDS,
    Reason.LIMITED_BY_RATE,
    Reason.COOLDOWN,
    Reason.STABILIZATION_WINDOW,
)
"""The damping chain's steps, in their order (``Stabilized.held_step`` indexes it)."""


@dataclass(frozen=True, slots=True)
class Stabilized:
    """The damped targets, why each step held them, and the memory to store.

    Attributes:
        targets: replicas per job after every step.
        held_step: the last step that changed each job's target, as its index in
            ``DAMPING_STEPS``; -1 where none did.
        last_rescale_s: when each job was last rescaled after this round; NaN for never.
        recommendations: each job's recommendations after this round.
        memory_changed: where the memory differs from what was passed in (a write is due).
    """

    targets: IntArray
    held_step: IntArray
    last_rescale_s: FloatArray
    recommendations: tuple[tuple[Recommendation, ...], ...]
    memory_changed: BoolArray

    @property
    def held_by(self) -> tuple[Reason | None, ...]:
        """The last step that changed each job's target, or None if none did."""
        return tuple(DAMPING_STEPS[step] if step >= 0 else None for step in self.held_step.tolist())

    def memories(self, indices: Sequence[int]) -> list[JobMemory]:
        """The memories of jobs ``indices`` after this round, as stored on the jobs."""
        lasts = self.last_rescale_s[list(indices)].tolist()
        recs = self.recommendations
        return [
            JobMemory(None if math.isnan(last) else last, recs[i])
            for i, last in zip(indices, lasts, strict=True)
        ]

    def memory(self, index: int) -> JobMemory:
        """Job ``index``'s memory after this round, as stored on the job."""
        return self.memories([index])[0]


def stabilize(
    *,
    current: IntArray,
    recommended: IntArray,
    gains: FloatArray,
    forced: BoolArray,
    min_replicas: IntArray,
    max_replicas: IntArray,
    last_rescale_s: FloatArray,
    recommendations: Sequence[tuple[Recommendation, ...]],
    defaults: Defaults,
    interval_s: float,
    now_s: float,
    rate_limited: BoolArray | None = None,
    unmet: BoolArray | None = None,
) -> Stabilized:
    """Run the damping chain over every job.

    Args:
        current: replicas now.
        recommended: the allocator's targets.
        gains: predicted relative throughput change of each recommended move.
        forced: shrinks a budget requires.
        min_replicas: each job's minimum.
        max_replicas: each job's maximum.
        last_rescale_s: when each job was last rescaled; NaN for never.
        recommendations: each job's stored recommendations, oldest first.
        defaults: tolerance, step limits, cooldown and windows.
        interval_s: the decision interval; no job moves twice within one.
        now_s: the reconcile time.
        rate_limited: the jobs the rate limit applies to; None for all.
        unmet: per job, whether the pending need a forced shrink of it serves is still unmet:
            such a shrink may move a job rescaled within the interval (``hold_in_cooldown``);
            None for none.

    Returns:
        The final targets, the step that held each back, and the new memories.
    """
    limited_jobs = np.ones(len(current), dtype=bool) if rate_limited is None else rate_limited
    last = tails(recommendations)
    up_min, down_max = window_extremes(
        recommendations,
        recommended,
        last=last,
        now_s=now_s,
        window_up_s=defaults.window_up_s,
        window_down_s=defaults.window_down_s,
    )

    def tolerance(d: IntArray) -> IntArray:
        return within_tolerance(
            current=current, desired=d, gains=gains, forced=forced, tolerance=defaults.tolerance
        )

    def bounds(d: IntArray) -> IntArray:
        return clamp_to_bounds(desired=d, min_replicas=min_replicas, max_replicas=max_replicas)

    def rate(d: IntArray) -> IntArray:
        limited = limit_rate(
            current=current,
            desired=d,
            max_step_up=defaults.max_step_up,
            max_step_down=defaults.max_step_down,
        )
        # A job outside its bounds goes straight into them: bounds win over the rate. A forced
        # shrink is not rate-limited (module docstring).
        return bounds(np.where(limited_jobs & ~(forced & (d < current)), limited, d))

    def cooldown(d: IntArray) -> IntArray:
        return hold_in_cooldown(
            current=current,
            desired=d,
            last_rescale_s=last_rescale_s,
            forced=forced,
            now_s=now_s,
            cooldown_s=defaults.cooldown_s,
            interval_s=interval_s,
            unmet=unmet,
        )

    def windows(d: IntArray) -> IntArray:
        return apply_windows(
            current=current,
            desired=d,
            window_up_min=up_min,
            window_down_max=down_max,
            forced=forced,
        )

    steps: tuple[Callable[[IntArray], IntArray], ...] = (tolerance, bounds, rate, cooldown, windows)
    desired = recommended
    held_step = np.full(len(current), -1, dtype=np.int64)
    for code, step in enumerate(steps):  # in the order of ``DAMPING_STEPS``
        after = step(desired)
        held_step[after != desired] = code
        desired = after
    moved = desired != current
    # Within one interval of its last rescale a job cannot move (``hold_in_cooldown``), and its
    # memory stays as it is: the move changed what the allocator recommends for it (a rate
    # limit plans from the replicas now), and a second reconcile at the same time must write
    # nothing. What is recommended then is recorded once the job may move again.
    kept, changed = remember(
        recommendations,
        recommended,
        now_s=now_s,
        keep_s=max(defaults.window_up_s, defaults.window_down_s),
        last=last,
        frozen=(now_s - last_rescale_s) < interval_s,  # NaN (never rescaled) compares False
    )
    return Stabilized(
        targets=desired,
        held_step=held_step,
        last_rescale_s=np.where(moved, now_s, last_rescale_s),
        recommendations=kept,
        memory_changed=changed | moved,
    )


def remember(
    recommendations: Sequence[tuple[Recommendation, ...]],
    recommended: IntArray,
    *,
    now_s: float,
    keep_s: float,
    last: Tails | None = None,
    frozen: BoolArray | None = None,
) -> tuple[tuple[tuple[Recommendation, ...], ...], BoolArray]:
    """Each job's recommendation changes after this round.

    Only changes are stored (a recommendation holds until the next), so a job whose
    recommendation stays the same keeps the same memory and costs no write. Changes that stopped
    being in force before the longest window opened are dropped. A change recorded earlier at
    the same ``now_s`` is replaced, so reconciling twice on one observation writes nothing the
    second time.

    Args:
        recommendations: each job's stored recommendation changes, oldest first.
        recommended: this round's recommendation for each job.
        now_s: the reconcile time.
        keep_s: the longest stabilization window; 0 keeps nothing.
        last: ``tails(recommendations)``, when the caller has it already.
        frozen: the jobs whose recommendations stay as they are this round; None for none.

    Returns:
        The new recommendation changes, and where they differ from the old.
    """
    out = list(recommendations)
    count = len(recommendations)
    changed = np.zeros(count, dtype=bool)
    oldest = now_s - keep_s
    wanted = recommended.tolist()
    # The steady state, found for all jobs at once: one change, still in force.
    lengths, last_replicas, since = tails(recommendations) if last is None else last
    if keep_s > 0:
        steady = (lengths == 1) & (last_replicas == recommended) & (since <= now_s)
    else:
        steady = lengths == 0
    if frozen is not None:
        steady |= frozen
    if keep_s > 0:
        # The usual change, found for all jobs at once: one recommendation, older than now, and
        # a new one. It is kept with the new one after it (which is in force from now, inside
        # every window).
        simple = ~steady & (lengths == 1) & (since < now_s) & (last_replicas != recommended)
        rows = np.flatnonzero(simple).tolist()
        for i in rows:
            out[i] = (recommendations[i][0], Recommendation(now_s, wanted[i]))
        changed[rows] = True
        steady |= simple
    for i in np.flatnonzero(~steady).tolist():
        recs = recommendations[i]
        replicas = wanted[i]
        if keep_s <= 0:
            kept: tuple[Recommendation, ...] = ()
        elif recs and recs[-1][1] == replicas and recs[-1][0] <= now_s:
            if len(recs) == 1:
                continue  # the steady state: one change, still in force
            kept = recs
        else:
            kept = (*(r for r in recs if r[0] < now_s), Recommendation(now_s, replicas))
        # Drop changes superseded before the window opened.
        start = 0
        while start + 1 < len(kept) and kept[start + 1][0] <= oldest:
            start += 1
        if start:
            kept = kept[start:]
        if kept != recs:
            changed[i] = True
            out[i] = kept
    return tuple(out), changed
