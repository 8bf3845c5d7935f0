"""The extender's answer to Volcano: which proposed victims tide keeps while its own shrink runs.

Volcano's reclaim runs every scheduling session (about a second); tide decides on an interval, so
without help reclaim kills elastic pods abruptly before tide can shrink gracefully. Asked first
(the ``reclaimable``/``preemptable`` verbs), tide withholds an elastic job's pods for a bounded
grace window, a little longer than their save-and-exit time, and reconciles at once; its shrink
(of the jobs whose last replicas buy the least, which need not be the ones Volcano proposed)
frees the GPUs and Volcano places the gang in a following session; after the window Volcano
proceeds as without tide. The rules (DESIGN.md, "Graceful shrink"):

- abstain (``status 0``) when tide is not the leader, has no plan, or its plan is older than the
  staleness bound: Volcano then proceeds as if tide were absent;
- a pod is withheld when it is of the scaling task of an elastic job in tide's plan, from the
  first ask (before the plan shrinks that job: the reconcile the withholding triggers decides
  which jobs shrink), with a task index at or above the job's minimum (never below it), or when
  it is marked ``tide.io/elastic: "true"`` and its Job is not in tide's plan yet (submitted since
  the last reconcile: the reconcile the withholding triggers sees it; its minimum is not known
  before then, and Volcano's gang plugin keeps any job at its ``minAvailable`` whatever tide
  answers), never when the pod is not preemptable (not tide's to offer or protect), and only
  for the pod's ``terminationGracePeriodSeconds`` plus a margin, counted from the first time it
  was withheld for the same evictor's PodGroup (each pending gang Volcano reclaims for gets one
  window: a pod withheld for one gang, whose GPUs tide freed elsewhere, is not killed at once
  for the next gang before tide has reconciled for it); a window whose pod Volcano stopped
  asking about for twice its length is over and forgotten (that reclaim ended; a later one
  starts a new window);
- nothing withheld: abstain; otherwise ``status 1`` with the victims = the evictees minus the
  withheld, each the TaskInfo object Volcano sent (it matches victims by UID and evicts the
  objects it reads back).

``ExtenderView`` is pure data built after each reconcile; ``Extender`` is the one mutable object
(the engine thread swaps the view, the HTTP thread answers), guarded by a lock. The simulator's
reclaim asks the same ``Extender`` for a tide policy.
"""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from scheduler_policy.decision.pipeline import Plan
from scheduler_policy.extender.bodies import EvictionRequest, Task
from scheduler_policy.vocabulary.state import JobKey, Observation

__all__ = [
    "DEFAULT_GRACE_MARGIN_S",
    "VERBS",
    "Answer",
    "AnswerReason",
    "Extender",
    "ExtenderView",
    "ShrinkingJob",
]

VERBS = ("reclaimable", "preemptable")
"""The extender verbs tide answers."""

DEFAULT_GRACE_MARGIN_S = 15.0
"""Added to a pod's grace period: the time tide's reconcile and the pod deletion take."""

ABSTAIN = 0
AGREE = 1

VOLCANO_MAX_REPLY_BYTES = 10 << 20
"""The most of a reply Volcano's extender plugin reads (``maxBodySize`` in
``pkg/scheduler/plugins/extender/extender.go``, v1.15.1): past it the decode fails and, with
``extender.ignorable``, Volcano drops the whole first tier's victims. tide abstains instead."""
_NAMED = 5
"""Pods an answer's message names; the rest are counted."""
_REPLY_FRAME_BYTES = len(b'{"status":1,"victims":[]}')


class AnswerReason(str, enum.Enum):
    """Why the extender answered as it did: CamelCase, as the engine's decisions."""

    NOT_LEADER = "NotLeader"
    NO_PLAN = "NoPlan"
    PLAN_STALE = "PlanStale"
    NOTHING_TO_WITHHOLD = "NothingToWithhold"
    GRACE_WINDOW_OVER = "GraceWindowOver"
    WITHHOLD_FOR_SHRINK = "WithholdForShrink"
    REPLY_TOO_LARGE = "ReplyTooLarge"


@dataclass(frozen=True, slots=True)
class ShrinkingJob:
    """An elastic job in tide's plan, whose pods above its minimum tide may withhold.

    (The name is older than the rule: the view once held only the jobs tide was shrinking.)

    Attributes:
        key: the Volcano Job key ``namespace/name``.
        task: the scaling task's name; pods of other tasks are not tide's.
        target_replicas: replicas tide's plan sets (at most its current replicas): pods with
            task index >= this are the ones its own shrink deletes.
        min_replicas: the job's minimum (the minAvailable floor): pods below it are never tide's.
    """

    key: JobKey
    task: str
    target_replicas: int
    min_replicas: int


@dataclass(frozen=True, slots=True)
class ExtenderView:
    """What the extender knows of tide's plan: the elastic jobs, and whether to speak.

    Attributes:
        jobs: the plan's elastic jobs by key.
        leader: whether this engine is the leader (only the leader's plan is applied).
        made_s: when the plan was made, seconds since the epoch.
    """

    jobs: Mapping[JobKey, ShrinkingJob]
    leader: bool
    made_s: float

    @classmethod
    def from_plan(
        cls, plan: Plan, observation: Observation, *, leader: bool, now_s: float
    ) -> ExtenderView:
        """The view of one reconcile's plan.

        Every elastic job of the observation is in it, with its decision's target (at most its
        current replicas); non-elastic jobs never are.

        Args:
            plan: what ``decide`` returned for the observation.
            observation: the observation the plan was made from.
            leader: whether this engine is the leader.
            now_s: when the plan was made, seconds since the epoch (the view's age counts from it).

        Returns:
            The view.
        """
        targets = {d.job: d.target_replicas for d in plan.decisions}
        jobs: dict[JobKey, ShrinkingJob] = {}
        for job in observation.jobs:
            if not job.elastic:
                continue
            target = min(targets.get(job.key, job.current_replicas), job.current_replicas)
            jobs[job.key] = ShrinkingJob(
                key=job.key,
                task=job.task,
                target_replicas=max(target, 0),
                min_replicas=job.min_replicas,
            )
        return cls(jobs=MappingProxyType(jobs), leader=leader, made_s=now_s)


@dataclass(frozen=True, slots=True)
class Answer:
    """The extender's answer to one request.

    Attributes:
        status: 0 abstain, 1 the victims are the ones tide agrees to.
        victims: the evictees tide agrees to, in Volcano's order (empty when abstaining).
        withheld: the evictees tide keeps for its own shrink; non-empty means the engine should
            reconcile at once.
        reason: why, CamelCase.
        message: one sentence for people.
        until_s: when the earliest grace window of the withheld pods ends, seconds since the
            epoch (an ask from then on gets that pod as a victim); None when none is withheld.
    """

    status: int
    victims: tuple[Task, ...]
    withheld: tuple[Task, ...]
    reason: AnswerReason
    message: str = field(default="", compare=False)
    until_s: float | None = None

    def body(self) -> dict[str, Any]:
        """The JSON reply Volcano reads, as a dict.

        Returns:
            ``{"status": 0}``, or ``{"status": 1, "victims": [...]}`` with each victim the
            TaskInfo object Volcano sent.
        """
        if self.status == ABSTAIN:
            return {"status": ABSTAIN}
        return {"status": self.status, "victims": [task.raw for task in self.victims]}

    def body_bytes(self) -> bytes:
        """``body()`` as JSON, each victim's text echoed exactly as Volcano sent it."""
        if self.status == ABSTAIN:
            return json.dumps(self.body(), separators=(",", ":")).encode()
        victims = b",".join([task.text for task in self.victims])
        return b'{"status":%d,"victims":[%s]}' % (self.status, victims)


class Extender:
    """Answers Volcano's eviction verbs from the latest view; thread-safe.

    Args:
        stale_after_s: a view older than this is not trusted (abstain), seconds; e.g. three
            times the policy interval.
        grace_margin_s: added to a pod's grace period to make its window, seconds.

    Raises:
        ValueError: a bound that is not a finite number > 0 (margin: >= 0).
    """

    def __init__(
        self, *, stale_after_s: float, grace_margin_s: float = DEFAULT_GRACE_MARGIN_S
    ) -> None:
        if not grace_margin_s >= 0 or grace_margin_s == float("inf"):
            raise ValueError(f"grace_margin_s: must be a finite number >= 0, got {grace_margin_s}")
        self._stale_after_s = _check_bound(stale_after_s)
        self.grace_margin_s = grace_margin_s
        self._lock = threading.Lock()
        self._view: ExtenderView | None = None
        # (pod UID, the evictor's PodGroup, "" when none) -> (the pod's job, when it was first
        # withheld for that evictor, when it was last asked about, seconds since the epoch; the
        # window's length, seconds)
        self._first_withheld_s: dict[tuple[str, str], tuple[JobKey, float, float, float]] = {}

    @property
    def stale_after_s(self) -> float:
        """A view older than this is not trusted, seconds."""
        return self._stale_after_s

    @stale_after_s.setter
    def stale_after_s(self, value: float) -> None:
        """Change the bound (the policy's interval changed).

        Raises:
            ValueError: not a finite number > 0.
        """
        self._stale_after_s = _check_bound(value)

    @property
    def view(self) -> ExtenderView | None:
        """The view answered from; None before the first ``update``."""
        with self._lock:
            return self._view

    def update(self, view: ExtenderView) -> None:
        """Answer from ``view`` from now on.

        Grace windows of pods whose job is no longer in the plan are forgotten, and so are the
        windows Volcano stopped asking about for more than twice their length (over: the next
        ask starts a new one).

        Args:
            view: the view of the latest plan.
        """
        with self._lock:
            self._view = view
            self._first_withheld_s = {
                key: entry
                for key, entry in self._first_withheld_s.items()
                if entry[0] in view.jobs and view.made_s - entry[2] <= 2 * entry[3]
            }

    def answer(self, request: EvictionRequest, *, verb: str, now_s: float) -> Answer:
        """Answer one ``reclaimable`` or ``preemptable`` request.

        Args:
            request: the parsed body.
            verb: the verb it was posted to (one of ``VERBS``).
            now_s: the time now, seconds since the epoch.

        Returns:
            The answer; ``withheld`` non-empty means the engine should reconcile at once.

        Raises:
            ValueError: an unknown verb.
        """
        if verb not in VERBS:
            raise ValueError(f"verb: must be one of {', '.join(VERBS)}, got {verb!r}")
        with self._lock:
            view = self._view
            if view is None:
                return _abstain(AnswerReason.NO_PLAN, "tide has made no plan yet")
            if not view.leader:
                return _abstain(AnswerReason.NOT_LEADER, "this engine is not the leader")
            age_s = now_s - view.made_s
            if age_s > self.stale_after_s:
                return _abstain(
                    AnswerReason.PLAN_STALE,
                    f"tide's plan is {age_s:.1f} s old, more than {self.stale_after_s:g} s",
                )
            return self._withhold(request, view, now_s=now_s)

    def _withhold(self, request: EvictionRequest, view: ExtenderView, *, now_s: float) -> Answer:
        victims: list[Task] = []
        withheld: list[Task] = []
        expired = 0
        until_s = float("inf")
        windows = self._first_withheld_s
        seen: dict[tuple[str, str], tuple[JobKey, float, float, float]] = {}
        evictor = request.evictor.podgroup if request.evictor is not None else ""
        for task in request.evictees:
            job = _managed_job_of(task, view)
            if job is None:
                victims.append(task)
                continue
            window_s = task.grace_period_s + self.grace_margin_s
            key = (task.uid, evictor)
            entry = windows.get(key)
            if entry is None or entry[0] != job or now_s - entry[2] > 2 * window_s:
                since_s = now_s  # a new window: first ask, or that reclaim ended long ago
            else:
                since_s = entry[1]
            last_s = max(now_s, entry[2] if entry else now_s)
            seen[key] = (job, since_s, last_s, window_s)
            end_s = since_s + task.grace_period_s + self.grace_margin_s  # as the docs add it
            if now_s >= end_s:
                expired += 1
                victims.append(task)
            else:
                withheld.append(task)
                until_s = min(until_s, end_s)
        reply_bytes = _REPLY_FRAME_BYTES + sum(len(task.text) + 1 for task in victims)
        if withheld and reply_bytes > VOLCANO_MAX_REPLY_BYTES:  # no window starts: not withheld
            return _abstain(
                AnswerReason.REPLY_TOO_LARGE,
                f"the {len(victims)} victims' reply would be {reply_bytes} bytes, more than the "
                f"{VOLCANO_MAX_REPLY_BYTES} Volcano reads",
            )
        windows.update(seen)
        if not withheld:
            if expired:
                return _abstain(
                    AnswerReason.GRACE_WINDOW_OVER,
                    f"the grace window of {expired} pod(s) tide is shrinking is over",
                )
            return _abstain(AnswerReason.NOTHING_TO_WITHHOLD, "no evictee is tide's to withhold")
        names = ", ".join(task.name for task in withheld[:_NAMED])
        if len(withheld) > _NAMED:
            names += f" and {len(withheld) - _NAMED} more"
        return Answer(
            status=AGREE,
            victims=tuple(victims),
            withheld=tuple(withheld),
            reason=AnswerReason.WITHHOLD_FOR_SHRINK,
            message=f"tide withholds {names}: its own shrink frees GPUs gracefully",
            until_s=until_s,
        )


def _managed_job_of(task: Task, view: ExtenderView) -> JobKey | None:
    """The elastic job this pod is tide's to withhold for, or None.

    It is tide's when it is preemptable, of the scaling task of an elastic job in tide's plan,
    with a task index at or above the job's minimum; or preemptable and marked elastic
    (``Task.elastic``), of a Job tide's plan does not have yet.
    """
    if not task.preemptable or task.job is None or task.task_index is None:
        return None
    job = view.jobs.get(task.job)
    if job is None:
        return task.job if task.elastic else None
    if (task.role and task.role != job.task) or task.task_index < job.min_replicas:
        return None
    return job.key


def _check_bound(stale_after_s: float) -> float:
    if not stale_after_s > 0 or stale_after_s == float("inf"):
        raise ValueError(f"stale_after_s: must be a finite number > 0, got {stale_after_s}")
    return stale_after_s


def _abstain(reason: AnswerReason, message: str) -> Answer:
    return Answer(status=ABSTAIN, victims=(), withheld=(), reason=reason, message=message)
