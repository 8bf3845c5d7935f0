"""Properties of the extender's answer over random views, evictees and times."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_policy.extender import EvictionRequest, Extender, ExtenderView, ShrinkingJob, Task
from scheduler_policy.vocabulary.state import JobKey

KEYS = [JobKey("ns/a"), JobKey("ns/b"), JobKey("other/a")]
MARGIN_S = 15.0

shrinking_jobs = st.builds(
    lambda key, target, minimum, task: ShrinkingJob(
        key=key, task=task, target_replicas=target, min_replicas=minimum
    ),
    st.sampled_from(KEYS),
    st.integers(0, 6),
    st.integers(0, 6),
    st.sampled_from(["worker", "master"]),
)
views = st.builds(
    lambda jobs, leader, made_s: ExtenderView(
        jobs={j.key: j for j in jobs}, leader=leader, made_s=made_s
    ),
    st.lists(shrinking_jobs, max_size=3),
    st.booleans(),
    st.floats(0.0, 100.0),
)


@st.composite
def evictees(draw: st.DrawFn) -> tuple[Task, ...]:
    count = draw(st.integers(0, 8))
    tasks = []
    for i in range(count):
        tasks.append(
            Task(
                uid=f"uid-{i}",
                podgroup="ns/pg",
                name=f"pod-{i}",
                namespace="ns",
                role=draw(st.sampled_from(["worker", "master", ""])),
                node="gpu-1",
                gpus=1.0,
                preemptable=draw(st.booleans()),
                job=draw(st.sampled_from([*KEYS, None])),
                task_index=draw(st.integers(0, 8) | st.none()),
                grace_period_s=draw(st.sampled_from([0.0, 5.0, 30.0])),
                text=json.dumps({"UID": f"uid-{i}"}).encode(),
            )
        )
    return tuple(tasks)


@settings(max_examples=300)
@given(
    view=views,
    tasks=evictees(),
    offsets_s=st.lists(st.floats(0.0, 200.0), min_size=1, max_size=6).map(sorted),
)
def test_answers_keep_volcanos_victims_and_withhold_only_tides_pods(
    view: ExtenderView, tasks: tuple[Task, ...], offsets_s: list[float]
) -> None:
    extender = Extender(stale_after_s=120.0, grace_margin_s=MARGIN_S)
    extender.update(view)
    request = EvictionRequest(evictor=None, evictees=tasks)
    # pod UID -> (its window's start, when it was last asked about)
    windows: dict[str, tuple[float, float]] = {}

    for offset_s in offsets_s:
        now_s = view.made_s + offset_s
        answer = extender.answer(request, verb="reclaimable", now_s=now_s)

        uids = [t.uid for t in tasks]
        assert {t.uid for t in answer.victims} <= set(uids)
        assert (answer.status == 1) == bool(answer.withheld)
        if not view.leader or offset_s > 120.0:
            assert answer.status == 0
        if answer.status == 1:
            # the victims are the evictees minus the withheld, in Volcano's order
            kept = [t for t in tasks if t not in answer.withheld]
            assert list(answer.victims) == kept
            assert answer.body()["victims"] == [t.raw for t in kept]
            assert json.loads(answer.body_bytes()) == answer.body()
        else:
            assert answer.body() == {"status": 0}
            assert answer.body_bytes() == b'{"status":0}'
        for task in answer.withheld:
            assert task.job is not None and task.task_index is not None
            job = view.jobs[task.job]
            assert task.preemptable
            assert task.task_index >= job.min_replicas
            assert task.role in ("", job.task)
            window_s = task.grace_period_s + MARGIN_S
            since_s, last_s = windows.get(task.uid, (now_s, now_s))
            if now_s - last_s > 2 * window_s:  # Volcano stopped asking: a new window
                since_s = now_s
            windows[task.uid] = (since_s, now_s)
            assert now_s - since_s < window_s
        if answer.status == 1:
            assert answer.until_s == min(
                windows[t.uid][0] + t.grace_period_s + MARGIN_S for t in answer.withheld
            )
        for task in answer.victims:
            if task.uid in windows:
                windows[task.uid] = (windows[task.uid][0], now_s)
