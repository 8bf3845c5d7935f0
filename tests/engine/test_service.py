"""The engine service on a FakeCluster: pacing and triggers, dry run, policy reloads, leadership,
probes and a clean stop. Waits are bounded; no assertion depends on how fast the machine is."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.registry import CollectorRegistry

from metrics_collector.engine_metrics import EngineMetrics
from scheduler_policy.policy.file import policy_yaml
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.errors import TemporaryError
from scheduler_policy.vocabulary.state import JobKey, JobState, PendingGang, QueueName
from tests.scheduler_policy.builders import make_job, make_observation, make_policy
from tide.engine.policy_watch import PolicyWatcher
from tide.engine.service import Alone, EngineService, Round

WAIT_S = 20.0  # the most any test waits for the loop; a pass never comes near it
JOB = JobKey("ns/a")


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT_S:.0f} s for {what}")
        time.sleep(0.01)


def policy(name: str = "first", *, interval_s: float = 3600.0, **defaults: float) -> ElasticPolicy:
    return dataclasses.replace(make_policy(**defaults), name=name, interval_s=interval_s)


def write_policy(path: Path, value: ElasticPolicy) -> Path:
    path.write_text(policy_yaml(value))
    return path


def growing_cluster() -> FakeCluster:
    """One job at 2 replicas that the policy grows into 4 idle GPUs."""
    return FakeCluster(make_observation(make_job("a", current=2), free=4))


@dataclasses.dataclass
class Setup:
    service: EngineService
    cluster: FakeCluster
    registry: CollectorRegistry
    rounds: list[Round]

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
def make_service(tmp_path: Path) -> Callable[..., Setup]:
    services: list[EngineService] = []

    def make(
        *,
        cluster: FakeCluster | None = None,
        value: ElasticPolicy | None = None,
        on_round: Callable[[Round], None] | None = None,
        **kwargs: object,
    ) -> Setup:
        cluster = cluster if cluster is not None else growing_cluster()
        path = write_policy(tmp_path / "policy.yaml", value or policy())
        registry = CollectorRegistry()
        rounds: list[Round] = []

        def record(outcome: Round) -> None:
            rounds.append(outcome)
            if on_round is not None:
                on_round(outcome)

        service = EngineService(
            cluster=cluster,
            make_metrics=lambda _policy: cluster,
            policy_path=path,
            engine_metrics=EngineMetrics(registry),
            on_round=record,
            **kwargs,  # type: ignore[arg-type]
        )
        services.append(service)
        return Setup(service, cluster, registry, rounds)

    yield make  # type: ignore[misc]
    for service in services:
        service.stop(timeout_s=WAIT_S)


def test_the_loop_reconciles_at_the_interval(make_service: Callable[..., Setup]) -> None:
    setup = make_service(value=policy(interval_s=0.02), min_gap_s=0.0)
    setup.service.start()
    wait_for(lambda: setup.service.rounds >= 3, "three rounds with no trigger")
    assert setup.cluster.writes  # the first round grew the job
    assert setup.value("tide_reconcile_duration_seconds_count") >= 3  # type: ignore[operator]


def test_a_trigger_reconciles_at_once(make_service: Callable[..., Setup]) -> None:
    # The interval is an hour: without the trigger the second round would not come in the wait.
    setup = make_service(min_gap_s=0.0)
    setup.service.start()
    wait_for(lambda: setup.service.rounds >= 1, "the first round")
    setup.service.trigger("a pending gang appeared")
    wait_for(lambda: setup.service.rounds >= 2, "the triggered round")


NOTICES = [
    ("nothing new", (), 0, None),
    ("a gang the last round saw", ("ns/seen",), 0, None),
    ("a new pending gang", ("ns/seen", "ns/new"), 0, "1 new pending gang(s): ns/new"),
    ("withheld pods", (), 2, "the extender withheld 2 pod(s) from eviction"),
]


@pytest.mark.parametrize(
    ("gangs", "withheld", "why"), [n[1:] for n in NOTICES], ids=[n[0] for n in NOTICES]
)
def test_notice_reconciles_at_once_on_a_new_pending_gang_or_withheld_pods(
    make_service: Callable[..., Setup], gangs: tuple[str, ...], withheld: int, why: str | None
) -> None:
    cluster = growing_cluster()
    seen = PendingGang(key="ns/seen", queue=QueueName("default"), min_member=2, gpus=2.0)
    cluster.pending_gangs = [seen]
    setup = make_service(cluster=cluster, min_gap_s=0.0)  # an hour's interval
    setup.service.start()
    wait_for(lambda: setup.service.rounds >= 1, "the first round")
    now = [
        PendingGang(key=key, queue=QueueName("default"), min_member=2, gpus=2.0) for key in gangs
    ]

    assert setup.service.notice(pending_gangs=now, withheld_pods=withheld) == why

    if why is not None:
        wait_for(lambda: setup.service.rounds >= 2, "the triggered round")
    else:
        time.sleep(0.2)
        assert setup.service.rounds == 1


def test_a_storm_of_triggers_during_a_round_makes_one_more_round(
    make_service: Callable[..., Setup],
) -> None:
    gate = threading.Event()
    setup = make_service(on_round=lambda _r: gate.wait(WAIT_S), min_gap_s=0.0)
    setup.service.start()
    wait_for(lambda: len(setup.rounds) >= 1, "the first round to block")
    for i in range(50):
        setup.service.trigger(f"withheld pod {i}")
    gate.set()
    wait_for(lambda: setup.service.rounds >= 2, "the round the storm asked for")
    assert setup.service.stop(timeout_s=WAIT_S)
    assert setup.service.rounds == 2  # fifty triggers, one round


class VirtualClock:
    """The loop's monotonic clock, moved only by the loop's own waits for the floor (and by a
    round's work), so the gaps between rounds do not depend on how busy the machine is."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class FloorWait(threading.Event):
    """The service's stop event: waiting on it for the floor passes that much virtual time at
    once (a stop still ends the wait, as on the real event)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.clock.now_s += timeout
        return self.is_set()


class TimedService(EngineService):
    """Notes when each round begins, on the loop's clock; each round then takes ``work_s``."""

    starts: list[float]
    work_s = 0.05

    def run_round(self) -> Round:
        self.starts.append(self._monotonic())
        clock = self._monotonic
        assert isinstance(clock, VirtualClock)
        clock.now_s += self.work_s
        return super().run_round()


def test_rounds_are_never_closer_than_the_floor(tmp_path: Path) -> None:
    # Each trigger comes at once after a round: only the floor spaces the rounds, start to
    # start (a round's own work counts towards it).
    cluster, clock = growing_cluster(), VirtualClock()
    service = TimedService(
        cluster=cluster, make_metrics=lambda _p: cluster, min_gap_s=0.2, monotonic=clock,
        policy_path=write_policy(tmp_path / "policy.yaml", policy()),
    )  # fmt: skip
    service.starts = []
    service._stop = FloorWait(clock)  # the loop waits for the floor on its stop event
    count = 0  # read before the start: the first round may end before this thread runs again
    service.start()
    try:
        for _ in range(4):
            wait_for(lambda c=count: service.rounds > c, "a round")  # type: ignore[misc]
            count = service.rounds
            service.trigger("again")
    finally:
        assert service.stop(timeout_s=WAIT_S)
    gaps = [b - a for a, b in itertools.pairwise(service.starts)]
    assert len(gaps) >= 3
    assert gaps == pytest.approx([0.2] * len(gaps))  # the floor, and no more


def test_dry_run_writes_nothing_and_logs_each_decision(
    make_service: Callable[..., Setup], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster(
        make_observation(make_job("a", current=2), make_job("b", current=1), free=4)
    )
    annotations = json.dumps(cluster.annotations, sort_keys=True)
    setup = make_service(cluster=cluster, dry_run=True)
    caplog.set_level(logging.INFO)
    first = setup.service.run_round()
    second = setup.service.run_round()
    assert cluster.writes == []
    assert json.dumps(cluster.annotations, sort_keys=True) == annotations
    assert not first.wrote and first.result.applied == ()
    assert {c.job for c in first.would_write} == {JOB, JobKey("ns/b")}  # it would grow both
    moves = [
        [(c.job, c.from_replicas, c.to_replicas) for c in r.would_write] for r in (first, second)
    ]
    assert moves[0] == moves[1]  # nothing moved, so it would again
    lines = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "tide.engine.decisions"
    ]
    assert len(lines) == 4  # two jobs, two rounds
    grown = next(line for line in lines if line["job"] == JOB)
    assert grown["current"] == 2 and grown["target"] > 2
    assert grown["queue"] == "q" and grown["reason"] and grown["message"]
    assert grown["throughput_points"] == 3 and grown["stale_reason"] is None
    assert grown["budget_gpus"] is not None and "queue_allocated_gpus" in grown
    rounds = [json.loads(r.getMessage()) for r in caplog.records if r.name == "tide.engine.rounds"]
    assert rounds[0]["dry_run"] and rounds[0]["applied"] == 0 and rounds[0]["would_apply"] == 2
    assert {"duration_s", "failed", "passes"} <= set(rounds[0])
    assert setup.value("tide_replica_writes_total", outcome="applied") == 0
    assert setup.value("tide_leader") is None  # a dry run holds no Lease


def test_a_valid_edit_takes_effect_and_an_invalid_one_is_refused(
    make_service: Callable[..., Setup], tmp_path: Path
) -> None:
    setup = make_service(value=policy("first"))
    assert setup.service.run_round().policy.name == "first"
    assert setup.value("tide_policy_valid") == 1
    write_policy(tmp_path / "policy.yaml", policy("second", interval_s=30.0))
    assert setup.service.run_round().policy.name == "second"
    assert setup.service.interval_s == 30.0
    (tmp_path / "policy.yaml").write_text("spec:\n  interval: soon\n")
    outcome = setup.service.run_round()  # refused: the round runs under the old policy
    assert outcome.policy.name == "second"
    assert setup.value("tide_policy_valid") == 0
    assert setup.value("tide_policy_reload_failures_total") == 1
    setup.service.run_round()  # the same invalid file is refused once, not each round
    assert setup.value("tide_policy_reload_failures_total") == 1
    assert setup.service.ready()[0]
    write_policy(tmp_path / "policy.yaml", policy("third"))
    assert setup.service.run_round().policy.name == "third"
    assert setup.value("tide_policy_valid") == 1


def configmap_mount(folder: Path, value: ElasticPolicy, version: str) -> Path:
    """Write ``value`` as a kubelet writes a ConfigMap volume: a new folder, ``..data`` swapped
    to it in one rename, and ``policy.yaml`` a symlink through ``..data``."""
    (folder / version).mkdir()
    write_policy(folder / version / "policy.yaml", value)
    (folder / "..data_tmp").symlink_to(version)
    os.replace(folder / "..data_tmp", folder / "..data")
    link = folder / "policy.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/policy.yaml")
    return link


def edit_in_place(path: Path, value: ElasticPolicy) -> None:
    write_policy(path, value)


# (name, the second file's writer, its policy name or None for an invalid file, expected name
# in force after it)
RELOADS: list[tuple[str, Callable[[Path], None], str]] = [
    ("edited in place to a valid file",
     lambda p: edit_in_place(p, policy("second")), "second"),
    ("the same bytes written again",
     lambda p: edit_in_place(p, policy("first")), "first"),
    ("edited in place to invalid YAML",
     lambda p: p.write_text("spec: [unclosed\n"), "first"),
    ("edited to an unknown field",
     lambda p: p.write_text(policy_yaml(policy("x")).replace("interval:", "intervall:")), "first"),
    ("removed",
     lambda p: p.unlink(), "first"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "in_force"), [r[1:] for r in RELOADS], ids=[r[0] for r in RELOADS]
)
def test_policy_watcher(tmp_path: Path, change: Callable[[Path], None], in_force: str) -> None:
    path = write_policy(tmp_path / "policy.yaml", policy("first"))
    watcher = PolicyWatcher(path)
    first = watcher.poll()
    assert first is not None and first.valid and watcher.poll() is None
    change(path)
    read = watcher.poll()
    assert watcher.policy is not None and watcher.policy.name == in_force
    if in_force == "first" and read is not None:
        assert not read.valid and str(path) in (read.error or "")
    assert watcher.poll() is None  # nothing new: nothing read, nothing refused again


def test_a_configmap_symlink_swap_is_a_change(tmp_path: Path) -> None:
    link = configmap_mount(tmp_path, policy("first"), "..2026_12_01_v1")
    watcher = PolicyWatcher(link)
    assert watcher.poll() is not None and watcher.policy.name == "first"  # type: ignore[union-attr]
    configmap_mount(tmp_path, policy("second"), "..2026_12_01_v2")
    read = watcher.poll()
    assert read is not None and read.valid and watcher.policy.name == "second"  # type: ignore[union-attr]


def test_a_service_with_no_valid_policy_is_not_ready(
    make_service: Callable[..., Setup], tmp_path: Path
) -> None:
    setup = make_service()
    (tmp_path / "policy.yaml").write_text("kind: Nonsense\n")
    setup.service.start()
    wait_for(lambda: "no valid policy" in setup.service.ready()[1], "the refusal")
    assert not setup.service.ready()[0]
    assert setup.cluster.writes == []
    assert setup.value("tide_policy_valid") == 0


@dataclasses.dataclass
class FakeElector:
    leader: bool

    def is_leader(self) -> bool:
        return self.leader


def test_only_the_leader_writes(make_service: Callable[..., Setup]) -> None:
    elector = FakeElector(leader=False)
    setup = make_service(elector=elector)
    follower = setup.service.run_round()
    assert setup.cluster.writes == [] and not follower.wrote
    assert follower.result.decisions and follower.would_write  # decided, warm, but silent
    assert setup.value("tide_leader") == 0
    elector.leader = True
    leader = setup.service.run_round()
    assert leader.wrote and [c.job for c in setup.cluster.writes] == [JOB]
    assert setup.value("tide_leader") == 1
    assert setup.value("tide_replica_writes_total", outcome="applied") == 1


class FlakyCluster(FakeCluster):
    """Unreachable for its first ``failures`` listings."""

    def __init__(self, failures: int) -> None:
        super().__init__(make_observation(make_job("a", current=2), free=4))
        self.failures = failures

    def list_jobs(self) -> tuple[JobState, ...]:
        if self.failures > 0:
            self.failures -= 1
            raise TemporaryError("the API server did not answer")
        return super().list_jobs()


def test_a_failed_round_does_not_stop_the_loop(make_service: Callable[..., Setup]) -> None:
    setup = make_service(cluster=FlakyCluster(failures=1), min_gap_s=0.0)
    setup.service.start()
    wait_for(lambda: setup.value("tide_reconcile_failures_total") == 1, "the failed round")
    assert not setup.service.ready()[0]
    setup.service.trigger("retry")
    wait_for(lambda: setup.service.ready()[0], "a successful round")
    assert setup.cluster.writes


def test_liveness_follows_the_loop_and_readiness_the_first_success(tmp_path: Path) -> None:
    clock = [100.0]
    cluster = growing_cluster()
    service = EngineService(
        cluster=cluster, make_metrics=lambda _p: cluster, elector=Alone(),
        policy_path=write_policy(tmp_path / "p.yaml", policy(interval_s=10.0)),
        monotonic=lambda: clock[0],
    )  # fmt: skip
    assert service.ready() == (False, "no reconcile has succeeded yet")
    service.run_round()
    assert service.ready()[0] and service.alive()
    clock[0] += 29.0
    assert service.alive()
    clock[0] += 1.0  # three intervals since the loop last ran
    assert not service.alive()


def test_stop_is_clean_and_abandons_a_stuck_round(make_service: Callable[..., Setup]) -> None:
    setup = make_service()
    setup.service.start()
    wait_for(lambda: setup.service.rounds >= 1, "the first round")
    assert setup.service.stop(timeout_s=WAIT_S)
    assert not setup.service.running
    gate = threading.Event()
    stuck = make_service(on_round=lambda _r: gate.wait(WAIT_S))
    stuck.service.start()
    wait_for(lambda: len(stuck.rounds) >= 1, "the round to block")
    assert not stuck.service.stop(timeout_s=0.05)  # abandoned, and says so
    gate.set()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "bad-yaml", "bad-field"]), min_size=1, max_size=8))
def test_the_policy_in_force_is_the_last_valid_file_and_each_refusal_counts_once(
    writes: list[str],
) -> None:
    contents = {
        "a": policy_yaml(policy("a")),
        "b": policy_yaml(policy("b")),
        "bad-yaml": "spec: [unclosed\n",
        "bad-field": policy_yaml(policy("c")).replace("interval:", "intervall:"),
    }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "policy.yaml"
        watcher = PolicyWatcher(path)
        in_force: str | None = None
        previous: str | None = None
        refusals = counted = 0
        for name in writes:
            path.write_text(contents[name])
            read = watcher.poll()
            counted += 1 if read is not None and not read.valid else 0
            if name.startswith("bad"):
                refusals += 1 if name != previous else 0
            else:
                in_force = name
            previous = name
            assert (watcher.policy.name if watcher.policy else None) == in_force
        assert counted == refusals
