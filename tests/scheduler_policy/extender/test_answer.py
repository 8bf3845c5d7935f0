"""The extender's answer on the recorded reclaimable body, edited: what tide withholds and when."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import msgspec
import pytest

from scheduler_policy.decision.pipeline import Plan
from scheduler_policy.extender import (
    AnswerReason,
    EvictionRequest,
    Extender,
    ExtenderView,
    ShrinkingJob,
    parse_eviction,
)
from scheduler_policy.vocabulary.state import (
    JobKey,
    Observation,
    PodPlacement,
    Reason,
    ScalingDecision,
    Sentence,
)
from tests.scheduler_policy.builders import make_job, make_queue
from tests.scheduler_policy.extender.recorded import (
    NOW_S,
    RECORDED_INDICES,
    Edit,
    annotate,
    encode,
    grace,
    label,
    make_view,
    needs_wire,
    recorded_body,
    set_field,
)

STALE_AFTER_S = 90.0


@dataclass(frozen=True)
class Case:
    name: str
    view: ExtenderView | None = field(default_factory=make_view)
    edits: tuple[Edit, ...] = ()
    now_s: float = NOW_S + 5.0
    withheld: tuple[int, ...] = ()
    reason: AnswerReason = AnswerReason.NOTHING_TO_WITHHOLD


# Every pod of the elastic job's scaling task at or above its minimum (2) is withheld from the
# first ask, whatever the plan's target: the reconcile the withholding triggers decides which
# jobs shrink (the view once held only the jobs being shrunk; issue 17 withholds before that).
ALL = (5, 10, 12, 17)

CASES = [
    Case(
        "every pod at or above the minimum is withheld",
        withheld=ALL,
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "before the plan shrinks the job (target above every evictee)",
        view=make_view(target=18),
        withheld=ALL,
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "the minimum, not the target, is the floor",
        view=make_view(target=5, minimum=1),
        withheld=(1, *ALL),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case("another job's pods are not in the plan", view=make_view(job=JobKey("default/other"))),
    Case("same job name in another namespace", view=make_view(job=JobKey("team-a/elastic"))),
    Case("another task of the job is its scaling task", view=make_view(task="master")),
    Case("not the leader", view=make_view(leader=False), reason=AnswerReason.NOT_LEADER),
    Case("no plan yet", view=None, reason=AnswerReason.NO_PLAN),
    Case(
        "plan older than the bound",
        now_s=NOW_S + STALE_AFTER_S + 0.5,
        reason=AnswerReason.PLAN_STALE,
    ),
    Case(
        "plan exactly at the bound is still trusted",
        now_s=NOW_S + STALE_AFTER_S,
        withheld=ALL,
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "never below the minimum, even for a lower target",
        view=make_view(target=0, minimum=12),
        withheld=(12, 17),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "a pod annotated preemptable false stays a victim",
        edits=(annotate(17, "volcano.sh/preemptable", "false"),),
        withheld=(5, 10, 12),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "a pod labelled preemptable false stays a victim",
        edits=(label(10, "volcano.sh/preemptable", "false"),),
        withheld=(5, 12, 17),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "a pod Volcano says is not preemptable stays a victim",
        edits=(set_field(12, "Preemptable", False),),
        withheld=(5, 10, 17),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "only non-preemptable pods at or above the minimum: abstain",
        view=make_view(minimum=17),
        edits=(annotate(17, "volcano.sh/preemptable", "false"),),
    ),
    Case(
        "a pod of another task of the job stays a victim",
        edits=(set_field(12, "TaskRole", "master"),),
        withheld=(5, 10, 17),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "a pod with no job name stays a victim",
        edits=(label(10, "volcano.sh/job-name", None),),
        withheld=(5, 12, 17),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "a pod with no task index stays a victim",
        edits=(label(17, "volcano.sh/task-index", None),),
        withheld=(5, 10, 12),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    # A Job submitted since the last reconcile is not in the plan: a pod marked elastic is
    # withheld (the reconcile it triggers sees the Job), whatever its index (its minimum is not
    # known before then).
    Case(
        "a pod marked elastic of a Job not in the plan yet is withheld",
        view=make_view(job=JobKey("default/other")),
        edits=(label(1, "tide.io/elastic", "true"), annotate(10, "tide.io/elastic", "true")),
        withheld=(1, 10),
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
    Case(
        "a pod marked elastic but not preemptable stays a victim",
        view=make_view(job=JobKey("default/other")),
        edits=(
            label(10, "tide.io/elastic", "true"),
            annotate(10, "volcano.sh/preemptable", "false"),
        ),
    ),
    Case(
        'a pod marked elastic other than "true" stays a victim',
        view=make_view(job=JobKey("default/other")),
        edits=(label(10, "tide.io/elastic", "True"), label(12, "tide.io/elastic", "false")),
    ),
    Case(
        "the mark does not lower the minimum of a Job in the plan",
        edits=(label(1, "tide.io/elastic", "true"),),
        withheld=ALL,
        reason=AnswerReason.WITHHOLD_FOR_SHRINK,
    ),
]


@needs_wire
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_answer_on_the_recorded_body(case: Case) -> None:
    extender = Extender(stale_after_s=STALE_AFTER_S)
    if case.view is not None:
        extender.update(case.view)
    body = recorded_body(*case.edits)
    request = parse_eviction(encode(body))

    answer = extender.answer(request, verb="reclaimable", now_s=case.now_s)

    assert answer.reason is case.reason
    assert tuple(t.task_index for t in answer.withheld) == case.withheld
    if case.withheld:
        kept = [
            info
            for info, t in zip(body["evictees"], request.evictees, strict=True)
            if t.task_index not in case.withheld
        ]
        assert answer.status == 1
        assert answer.body() == {"status": 1, "victims": kept}
        assert answer.message.startswith("tide withholds elastic-worker-")
    else:
        assert answer.status == 0
        assert answer.body() == {"status": 0}


@needs_wire
def test_preemptable_is_answered_as_reclaimable() -> None:
    extender = Extender(stale_after_s=STALE_AFTER_S)
    extender.update(make_view())
    request = parse_eviction(encode(recorded_body()))
    reclaim = extender.answer(request, verb="reclaimable", now_s=NOW_S)
    preempt = extender.answer(request, verb="preemptable", now_s=NOW_S)
    assert preempt == reclaim


def test_an_unknown_verb_is_refused_naming_the_known_ones() -> None:
    extender = Extender(stale_after_s=STALE_AFTER_S)
    with pytest.raises(
        ValueError, match="verb: must be one of reclaimable, preemptable, got 'predicate'"
    ):
        extender.answer(parse_eviction(b"{}"), verb="predicate", now_s=NOW_S)


@pytest.mark.parametrize(
    ("stale_after_s", "margin_s", "message"),
    [
        (0.0, 15.0, "stale_after_s: must be a finite number > 0, got 0.0"),
        (float("nan"), 15.0, "stale_after_s: must be a finite number > 0, got nan"),
        (float("inf"), 15.0, "stale_after_s: must be a finite number > 0, got inf"),
        (90.0, -1.0, "grace_margin_s: must be a finite number >= 0, got -1.0"),
    ],
    ids=["zero bound", "nan bound", "infinite bound", "negative margin"],
)
def test_bad_bounds_are_refused(stale_after_s: float, margin_s: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Extender(stale_after_s=stale_after_s, grace_margin_s=margin_s)


@needs_wire
def test_the_staleness_bound_follows_the_policy_interval() -> None:
    extender = Extender(stale_after_s=STALE_AFTER_S)
    extender.update(make_view())
    request = parse_eviction(encode(recorded_body()))
    assert extender.answer(request, verb="reclaimable", now_s=NOW_S + 60).status == 1

    extender.stale_after_s = 30.0  # the interval went from 30 s to 10 s

    assert extender.answer(request, verb="reclaimable", now_s=NOW_S + 60).reason is (
        AnswerReason.PLAN_STALE
    )
    with pytest.raises(ValueError, match="stale_after_s: must be a finite number > 0, got -1"):
        extender.stale_after_s = -1
    assert extender.stale_after_s == 30.0


# The grace window: a pod's terminationGracePeriodSeconds (30 s in the recording) plus the margin
# (15 s by default), from the first time it was withheld.

WINDOWS = [
    ("just inside the default window", 30.0, 15.0, 44.9, ALL),
    ("at the end of the default window", 30.0, 15.0, 45.0, ()),
    ("a longer grace period", 120.0, 15.0, 134.0, ALL),
    ("a longer grace period, over", 120.0, 15.0, 135.0, ()),
    ("no margin", 30.0, 0.0, 30.0, ()),
    ("a zero grace period and the margin", 0.0, 15.0, 14.0, ALL),
]


@needs_wire
@pytest.mark.parametrize(
    ("grace_s", "margin_s", "later_s", "withheld"),
    [w[1:] for w in WINDOWS],
    ids=[w[0] for w in WINDOWS],
)
def test_a_pod_is_withheld_only_for_its_grace_window(
    grace_s: float, margin_s: float, later_s: float, withheld: tuple[int, ...]
) -> None:
    extender = Extender(stale_after_s=1000.0, grace_margin_s=margin_s)
    extender.update(make_view())
    body = recorded_body(*(grace(i, grace_s) for i in RECORDED_INDICES))
    request = parse_eviction(encode(body))
    first = extender.answer(request, verb="reclaimable", now_s=NOW_S)
    assert tuple(t.task_index for t in first.withheld) == ALL
    assert first.until_s == NOW_S + grace_s + margin_s

    later = extender.answer(request, verb="reclaimable", now_s=NOW_S + later_s)

    assert tuple(t.task_index for t in later.withheld) == withheld
    if not withheld:
        assert later.reason is AnswerReason.GRACE_WINDOW_OVER
        assert later.body() == {"status": 0}
        assert later.until_s is None


def _only(request: EvictionRequest, *indices: int) -> EvictionRequest:
    return EvictionRequest(
        evictor=request.evictor,
        evictees=tuple(t for t in request.evictees if t.task_index in indices),
    )


@needs_wire
def test_each_window_counts_from_the_first_time_that_pod_was_withheld() -> None:
    extender = Extender(stale_after_s=1000.0)
    extender.update(make_view())
    request = parse_eviction(encode(recorded_body()))
    first = extender.answer(_only(request, 12, 17), verb="reclaimable", now_s=NOW_S)
    assert [t.task_index for t in first.withheld] == [12, 17]

    # 40 s later Volcano also proposes workers 5 and 10: their windows start now, 12's and
    # 17's do not.
    at_40 = extender.answer(request, verb="reclaimable", now_s=NOW_S + 40)
    at_50 = extender.answer(request, verb="reclaimable", now_s=NOW_S + 50)
    at_85 = extender.answer(request, verb="reclaimable", now_s=NOW_S + 85)

    assert tuple(t.task_index for t in at_40.withheld) == ALL
    assert at_40.until_s == NOW_S + 45
    assert [t.task_index for t in at_50.withheld] == [5, 10]
    assert at_50.until_s == NOW_S + 85
    assert [t.task_index for t in at_50.victims] == [1, 12, 17]
    assert at_85.reason is AnswerReason.GRACE_WINDOW_OVER


# Each gang Volcano reclaims for (the evictor's PodGroup) gets its own window: a pod withheld
# for one gang, whose GPUs tide then freed elsewhere, is not killed at once when the next gang
# asks for it (the overloaded built-in seed 2 kill); each gang's own window still ends.
NEXT_GANGS = [
    ("the same gang after its window: Volcano proceeds", "", 50.0, ()),
    ("the next gang after the first one's window: a window of its own", "default/next", 50.0, ALL),
    ("the next gang after its own window: Volcano proceeds", "default/next", 50.0 + 46.0, ()),
]


@needs_wire
@pytest.mark.parametrize(
    ("evictor", "at_s", "withheld"), [n[1:] for n in NEXT_GANGS], ids=[n[0] for n in NEXT_GANGS]
)
def test_each_gang_volcano_reclaims_for_gets_a_window_of_its_own(
    evictor: str, at_s: float, withheld: tuple[int, ...]
) -> None:
    extender = Extender(stale_after_s=1000.0)
    extender.update(make_view())
    request = parse_eviction(encode(recorded_body()))
    assert request.evictor is not None
    first = extender.answer(request, verb="reclaimable", now_s=NOW_S)
    assert tuple(t.task_index for t in first.withheld) == ALL  # a window of 30 + 15 s
    if evictor:
        evictor_task = msgspec.structs.replace(request.evictor, podgroup=evictor)
        request = replace(request, evictor=evictor_task)
        extender.answer(request, verb="reclaimable", now_s=NOW_S + 50.0)

    later = extender.answer(request, verb="reclaimable", now_s=NOW_S + at_s)

    assert tuple(t.task_index for t in later.withheld) == withheld


@needs_wire
def test_windows_are_forgotten_once_the_job_leaves_the_plan() -> None:
    extender = Extender(stale_after_s=1000.0)
    extender.update(make_view())
    request = parse_eviction(encode(recorded_body()))
    extender.answer(request, verb="reclaimable", now_s=NOW_S)
    assert extender.answer(request, verb="reclaimable", now_s=NOW_S + 60).withheld == ()

    extender.update(ExtenderView(jobs={}, leader=True, made_s=NOW_S + 65))
    extender.update(make_view(made_s=NOW_S + 66))  # the job is back (a new plan names it)

    again = extender.answer(request, verb="reclaimable", now_s=NOW_S + 70)
    assert tuple(t.task_index for t in again.withheld) == ALL


# A window whose pods Volcano stopped asking about (its reclaim ended) for more than twice the
# window (45 s here) is forgotten: the next reclaim starts a new one.
FORGETS = [
    ("asked again within twice the window: still over", 45.0 + 90.0, ()),
    ("not asked for more than twice the window: a new window", 45.0 + 90.5, ALL),
]


@needs_wire
@pytest.mark.parametrize(
    ("again_s", "withheld"), [f[1:] for f in FORGETS], ids=[f[0] for f in FORGETS]
)
def test_a_window_volcano_stopped_asking_about_is_forgotten(
    again_s: float, withheld: tuple[int, ...]
) -> None:
    extender = Extender(stale_after_s=10_000.0)
    extender.update(make_view())
    request = parse_eviction(encode(recorded_body()))
    extender.answer(request, verb="reclaimable", now_s=NOW_S)
    assert extender.answer(request, verb="reclaimable", now_s=NOW_S + 45).withheld == ()

    later = extender.answer(request, verb="reclaimable", now_s=NOW_S + again_s)

    assert tuple(t.task_index for t in later.withheld) == withheld


@needs_wire
def test_an_abstaining_answer_starts_no_window() -> None:
    extender = Extender(stale_after_s=1000.0)
    extender.update(make_view(leader=False))
    request = parse_eviction(encode(recorded_body()))
    extender.answer(request, verb="reclaimable", now_s=NOW_S)

    extender.update(make_view(made_s=NOW_S + 100))
    assert len(extender.answer(request, verb="reclaimable", now_s=NOW_S + 100).withheld) == 4


# The view of a plan.


def _decision(key: str, current: int, target: int) -> ScalingDecision:
    reason = Reason.SHRINK_FOR_PENDING_WORK if target < current else Reason.AT_TARGET
    return ScalingDecision(JobKey(key), current, target, reason, Sentence("test"))


def _pods(*indices: int) -> tuple[PodPlacement, ...]:
    return tuple(PodPlacement(index=i, node="gpu-1", gpus=1.0) for i in indices)


# Every elastic job is in the view (its pods may be withheld before a plan shrinks it), with its
# target capped at its current replicas; ``ns/b`` (elastic, 2 replicas, at target) always is.
B = {"ns/b": (2, 1)}
VIEWS = [
    ("a shrink", dict(current=8), 5, None, {"ns/a": (5, 1)} | B),
    ("a shrink to the minimum", dict(current=8, min_replicas=3), 3, None, {"ns/a": (3, 3)} | B),
    ("at target", dict(current=8), 8, None, {"ns/a": (8, 1)} | B),
    ("a growth: the target is capped at the replicas", dict(current=4), 8, None,
     {"ns/a": (4, 1)} | B),
    (
        "just shrunk: pods above the replicas",
        dict(current=5),
        5,
        _pods(*range(8)),
        {"ns/a": (5, 1)} | B,
    ),
    ("not elastic", dict(current=8, elastic=False), 5, None, B),
    ("no decision: its current replicas", dict(current=8), None, None, {"ns/a": (8, 1)} | B),
]  # fmt: skip


@pytest.mark.parametrize(
    ("job_fields", "target", "pods", "expected"),
    [v[1:] for v in VIEWS],
    ids=[v[0] for v in VIEWS],
)
def test_the_view_of_a_plan_holds_every_elastic_job(
    job_fields: dict, target: int | None, pods: tuple[PodPlacement, ...] | None, expected: dict
) -> None:
    job = make_job("a", max_replicas=8, **job_fields)
    if pods is not None:
        job = replace(job, pods=pods)
    other = make_job("b", current=2)
    observation = Observation(
        time_s=NOW_S, queues=(make_queue(),), jobs=(job, other), cluster_free_gpus=0.0
    )
    decisions = [_decision("ns/b", 2, 2)]
    if target is not None:
        decisions.append(_decision("ns/a", job.current_replicas, target))
    plan = Plan(decisions=tuple(sorted(decisions)), changes=())

    view = ExtenderView.from_plan(plan, observation, leader=True, now_s=NOW_S + 1)

    assert view.leader is True
    assert view.made_s == NOW_S + 1
    assert {k: (j.target_replicas, j.min_replicas) for k, j in view.jobs.items()} == expected
    for key, shrinking in view.jobs.items():
        assert shrinking == ShrinkingJob(
            key=key, task="worker", target_replicas=expected[key][0], min_replicas=expected[key][1]
        )


def test_the_view_says_who_leads() -> None:
    observation = Observation(time_s=NOW_S, queues=(), jobs=(), cluster_free_gpus=0.0)
    view = ExtenderView.from_plan(
        Plan(decisions=(), changes=()), observation, leader=False, now_s=NOW_S
    )
    assert (view.leader, dict(view.jobs)) == (False, {})


@needs_wire
def test_a_reply_larger_than_volcano_reads_abstains_and_starts_no_window() -> None:
    # Volcano reads at most 10 MiB of a reply; past it the decode fails and, with
    # extender.ignorable, Volcano drops its first tier's victims. tide abstains instead, so
    # Volcano proceeds as without tide, and a later ask that fits starts the windows afresh.
    request = parse_eviction(encode(recorded_body()))
    victim = next(t for t in request.evictees if t.task_index == 1)  # below the minimum (2)
    huge = msgspec.structs.replace(victim, text=b" " * (10 << 20))
    oversized = replace(
        request, evictees=tuple(huge if t is victim else t for t in request.evictees)
    )
    extender = Extender(stale_after_s=1000.0)
    extender.update(make_view())

    refused = extender.answer(oversized, verb="reclaimable", now_s=NOW_S)
    later = extender.answer(request, verb="reclaimable", now_s=NOW_S + 40)

    assert refused.reason is AnswerReason.REPLY_TOO_LARGE
    assert refused.body() == {"status": 0} and refused.withheld == ()
    assert "more than the 10485760 Volcano reads" in refused.message
    assert tuple(t.task_index for t in later.withheld) == ALL
    assert later.until_s == NOW_S + 40 + 45  # the windows start at the ask that was answered
