"""``EngineService``: the engine as a long-running service, one reconcile per round.

A round re-reads the policy file if it changed, observes, fits and decides, and, only when this
engine is the leader and not in dry-run, applies. A follower still observes and decides, so its
plan (and its models) are warm when it takes over; what it must remember comes from the Jobs'
annotations, which the leader wrote.

Rounds run at the policy's ``interval_s``, and at once when ``trigger`` is called (a pending
gang appeared, the extender withheld a pod, this engine became the leader), never closer than
``min_gap_s`` so a storm of triggers does not spin. ``notice`` applies the engine's rule
(``scheduler_policy.engine.trigger.reconcile_trigger``, the one the simulator follows) to what
was seen: a pending gang the last round did not see, or pods the extender withheld. The loop
waits on a ``threading.Event``: ``stop`` wakes it at once.

Logs: one JSON line per decision (logger ``tide.engine.decisions``) and one per round (logger
``tide.engine.rounds``), at INFO; each record also carries its fields as a dict in the
attribute ``tide``, which ``tide engine``'s JSON log formatter merges into the line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from metrics_collector.engine_metrics import EngineMetrics
from metrics_collector.sampling import SampleReport
from scheduler_policy.engine.reconcile import (
    ReconcileResult,
    decide,
    observe,
    reconcile,
)
from scheduler_policy.engine.trigger import MIN_GAP_S, reconcile_trigger, seen_gangs
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.models.forecast_fit import BackgroundFitter, ForecastFitter
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.protocols import ClusterClient, MetricsSource, ReplicaChange
from scheduler_policy.vocabulary.state import JobState, NodeState, PendingGang, QueueState
from tide.engine.policy_watch import PolicyRead, PolicyWatcher

logger = logging.getLogger(__name__)
decision_log = logging.getLogger("tide.engine.decisions")
round_log = logging.getLogger("tide.engine.rounds")

DEFAULT_INTERVAL_S = 60.0  # the loop's pace before any valid policy is in force


class Elector(Protocol):
    """Who may write: the Lease elector in production, a fixed answer in tests and dry-run."""

    def is_leader(self) -> bool:
        """True while this engine may write."""
        ...


@dataclass(frozen=True, slots=True)
class Alone:
    """An elector for an engine that runs alone (or never writes): a fixed answer.

    Attributes:
        leader: what ``is_leader`` answers.
    """

    leader: bool = True

    def is_leader(self) -> bool:
        """See base class."""
        return self.leader


class DryRunCluster:
    """A ``ClusterClient`` that reads through and, instead of writing, logs and records.

    Args:
        cluster: the real client, read from only.
    """

    def __init__(self, cluster: ClusterClient) -> None:
        self.cluster = cluster
        self.recorded: list[ReplicaChange] = []

    def list_queues(self) -> Sequence[QueueState]:
        """See base class."""
        return self.cluster.list_queues()

    def list_jobs(self) -> Sequence[JobState]:
        """See base class."""
        return self.cluster.list_jobs()

    def list_nodes(self) -> Sequence[NodeState]:
        """See base class."""
        return self.cluster.list_nodes()

    def list_pending_gangs(self) -> Sequence[PendingGang]:
        """See base class."""
        return self.cluster.list_pending_gangs()

    def releasing_gpus(self) -> float:
        """See base class."""
        return self.cluster.releasing_gpus()

    def apply(self, change: ReplicaChange) -> None:
        """See base class. Writes nothing: logs the change and records it."""
        self.recorded.append(change)
        logger.info(
            "dry run: would set %s task %s replicas %d -> %d (%s)",
            change.job, change.task, change.from_replicas, change.to_replicas, change.reason.value,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Round:
    """One round's outcome.

    Attributes:
        result: what was observed, decided, written and refused (a follower's and a dry run's
            writes are empty).
        wrote: whether this round was allowed to write (leader, not dry run).
        duration_s: how long it took.
        policy: the policy it ran under.
        report: the metrics source's report of its sample, when it gives one.
        would_write: the writes a dry run or a follower left out.
    """

    result: ReconcileResult
    wrote: bool
    duration_s: float
    policy: ElasticPolicy
    report: SampleReport | None = None
    would_write: tuple[ReplicaChange, ...] = ()


class NoValidPolicy(Exception):
    """No valid policy has been read yet; the message says why."""


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def decision_lines(result: ReconcileResult) -> list[dict[str, Any]]:
    """One log record per decision, with the inputs it rests on.

    Args:
        result: one round's result.

    Returns:
        For each decision: job, queue, current, target, reason, message, the queue's budget
        (elastic GPUs, None when unbounded or unmanaged), the queue's allocated GPUs, how many
        throughput points the job has, and why its metrics are stale (None when fresh).
    """
    observation = result.observation
    jobs = {job.key: job for job in observation.jobs}
    allocated = {queue.name: queue.allocated_gpus for queue in observation.queues}
    budgets = result.plan.budgets if result.plan is not None else {}
    lines = []
    for d in result.decisions:
        job = jobs.get(d.job)
        queue = job.queue if job is not None else None
        budget = budgets.get(queue) if queue is not None else None
        lines.append(
            {
                "job": d.job,
                "queue": queue,
                "current": d.current_replicas,
                "target": d.target_replicas,
                "reason": d.reason.value,
                "message": d.message,
                "budget_gpus": _finite(budget.elastic_gpus) if budget is not None else None,
                "queue_allocated_gpus": _finite(allocated.get(queue)) if queue else None,
                "throughput_points": len(job.throughput_history) if job is not None else 0,
                "stale_reason": job.stale_reason if job is not None else None,
            }
        )
    return lines


class EngineService:
    """The reconcile loop of a deployed engine.

    Args:
        cluster: queues, jobs and writes (the Volcano client).
        make_metrics: builds the metrics source for a policy (its settings and interval);
            called for the first valid policy and again when either changes.
        policy_path: the policy file, re-read when it changes.
        elector: who may write; ``Alone()`` when none is given.
        engine_metrics: where each round is recorded (``EngineMetrics``).
        dry_run: decide and log, never write.
        min_gap_s: least time between the starts of two rounds, seconds.
        wall: the clock decisions are made at, seconds since the epoch.
        monotonic: the clock the loop paces itself on.
        on_round: called after each successful round (the extender's view is updated here).
        forecast_fitter: where queues' forecasters are fitted; a ``BackgroundFitter`` (one
            worker thread, so a reconcile never waits for a fit) when none is given.
    """

    def __init__(
        self,
        *,
        cluster: ClusterClient,
        make_metrics: Callable[[ElasticPolicy], MetricsSource],
        policy_path: Path,
        elector: Elector | None = None,
        engine_metrics: EngineMetrics | None = None,
        dry_run: bool = False,
        min_gap_s: float = MIN_GAP_S,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_round: Callable[[Round], None] | None = None,
        forecast_fitter: ForecastFitter | None = None,
    ) -> None:
        if not math.isfinite(min_gap_s) or min_gap_s < 0:
            raise ValueError(f"min_gap_s: must be a non-negative number, got {min_gap_s}")
        self.cluster = cluster
        self.dry_run = dry_run
        self.elector: Elector = elector if elector is not None else Alone()
        self.engine_metrics = engine_metrics
        self.min_gap_s = min_gap_s
        self.policies = PolicyWatcher(policy_path)
        # Forecaster fits take seconds per queue: on a worker, the previous fit (or the recent
        # peak, before the first) serving meanwhile. The simulator fits inline (deterministic).
        self._fitter = forecast_fitter if forecast_fitter is not None else BackgroundFitter()
        self.models = ModelCache(fitter=self._fitter)
        self._make_metrics = make_metrics
        self._metrics: MetricsSource | None = None
        self._metrics_for: tuple[object, float] | None = None
        self._wall = wall
        self._monotonic = monotonic
        self._on_round = on_round
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._triggers: list[str] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_tick = monotonic()
        self._ready: tuple[bool, str] = (False, "no reconcile has succeeded yet")
        self._seen_gangs: frozenset[str] = frozenset()  # the last round's pending gangs
        self.rounds = 0  # successful rounds so far
        self.last_round: Round | None = None  # the last successful round

    # -- the policy --------------------------------------------------------------------------

    def reload_policy(self) -> PolicyRead | None:
        """Re-read the policy file if it changed; log and export what happened.

        Returns:
            What was read, or None when nothing changed.
        """
        read = self.policies.poll()
        if read is None:
            return None
        if self.engine_metrics is not None:
            self.engine_metrics.record_policy(valid=read.valid)
        if read.policy is not None:
            logger.info("policy %s in force (from %s)", read.policy.name, self.policies.path)
        elif self.policies.policy is None:
            logger.error("policy refused, no policy in force: %s", read.error)
        else:
            logger.error(
                "policy refused, %s stays in force: %s", self.policies.policy.name, read.error
            )
        return read

    def _metrics_source(self, policy: ElasticPolicy) -> MetricsSource:
        wanted = (policy.metrics, policy.interval_s)
        if self._metrics is None or self._metrics_for != wanted:
            old, self._metrics = self._metrics, self._make_metrics(policy)
            self._metrics_for = wanted
            close = getattr(old, "close", None)
            if callable(close):
                close()
        return self._metrics

    @property
    def interval_s(self) -> float:
        """The decision interval of the policy in force."""
        policy = self.policies.policy
        return policy.interval_s if policy is not None else DEFAULT_INTERVAL_S

    # -- one round ---------------------------------------------------------------------------

    def run_round(self) -> Round:
        """Reload the policy if it changed, then observe, decide and (as leader) apply once.

        Returns:
            The round's outcome.

        Raises:
            NoValidPolicy: no valid policy has been read yet.
            TideError: the cluster could not be read (the client's own errors).
        """
        self._last_tick = self._monotonic()
        self.reload_policy()
        policy = self.policies.policy
        if policy is None:
            raise NoValidPolicy(f"no valid policy in {self.policies.path} yet")
        self.models.refit_s = policy.model_refit_s
        metrics = self._metrics_source(policy)
        leader = self.elector.is_leader()
        if self.engine_metrics is not None and not self.dry_run:
            self.engine_metrics.record_leader(leader)
        started = self._monotonic()
        now_s = self._wall()
        wrote = leader and not self.dry_run
        would: tuple[ReplicaChange, ...] = ()
        try:
            if wrote:
                result = reconcile(
                    metrics=metrics, cluster=self.cluster, policy=policy, now_s=now_s,
                    models=self.models,
                )  # fmt: skip
            elif self.dry_run:
                dry = DryRunCluster(self.cluster)
                result = reconcile(
                    metrics=metrics, cluster=dry, policy=policy, now_s=now_s, models=self.models
                )
                would = tuple(dry.recorded)
                result = dataclasses.replace(result, applied=())
            else:  # a follower: observe and decide, so its plan is warm, and write nothing
                observation = observe(metrics=metrics, cluster=self.cluster, now_s=now_s)
                plan = decide(observation, policy, fits=self.models.fit(observation, policy))
                self.models.forget({job.key for job in observation.jobs})
                result = ReconcileResult(observation, plan.decisions, (), (), plan)
                would = plan.changes
        except Exception:
            if self.engine_metrics is not None:
                self.engine_metrics.record_failure(duration_s=self._monotonic() - started)
            raise
        duration_s = self._monotonic() - started
        report = getattr(metrics, "last_report", None)
        report = report if isinstance(report, SampleReport) else None
        outcome = Round(result, wrote, duration_s, policy, report, would)
        if self.engine_metrics is not None:
            self.engine_metrics.record(
                result, models=self.models, duration_s=duration_s,
                finished_s=now_s + duration_s, report=report,
            )  # fmt: skip
        self._log(outcome)
        self.rounds += 1
        self.last_round = outcome
        self._seen_gangs = seen_gangs(result.observation)
        self._ready = (True, f"last reconcile succeeded under policy {policy.name}")
        if self._on_round is not None:
            self._on_round(outcome)
        return outcome

    def _log(self, outcome: Round) -> None:
        result = outcome.result
        if decision_log.isEnabledFor(logging.INFO):
            for line in decision_lines(result):
                decision_log.info("%s", json.dumps(line, sort_keys=True), extra={"tide": line})
        if round_log.isEnabledFor(logging.INFO):
            record = {
                "duration_s": round(outcome.duration_s, 6),
                "decisions": len(result.decisions),
                "applied": len(result.applied),
                "failed": len(result.failed),
                "failures": [f"{change.job}: {why}" for change, why in result.failed],
                "would_apply": len(outcome.would_write),
                "passes": result.plan.passes if result.plan is not None else 0,
                "leader": outcome.wrote or (not self.dry_run and self.elector.is_leader()),
                "dry_run": self.dry_run,
                "metrics_fresh": result.observation.metrics_fresh,
                "policy": outcome.policy.name,
            }
            round_log.info("%s", json.dumps(record, sort_keys=True), extra={"tide": record})

    # -- the loop ----------------------------------------------------------------------------

    def trigger(self, why: str) -> None:
        """Ask for a round at once (no sooner than ``min_gap_s`` after the last one began).

        Args:
            why: what happened, for the log.
        """
        with self._lock:
            self._triggers.append(why)
        self._wake.set()

    def notice(
        self, *, pending_gangs: Sequence[PendingGang] = (), withheld_pods: int = 0
    ) -> str | None:
        """Trigger a round when the engine's rule says so (``reconcile_trigger``): a pending
        gang the last round did not see, or pods the extender withheld.

        Args:
            pending_gangs: the pending gangs now (those the last round saw trigger nothing).
            withheld_pods: pods the extender just withheld from an eviction.

        Returns:
            Why a round was triggered, or None.

        Raises:
            ValueError: ``withheld_pods`` is negative.
        """
        why = reconcile_trigger(
            seen=self._seen_gangs, pending_gangs=pending_gangs, withheld_pods=withheld_pods
        )
        if why is not None:
            self.trigger(why)
        return why

    def _take_triggers(self) -> list[str]:
        self._wake.clear()  # first: a trigger that lands after the take wakes the next wait
        with self._lock:
            taken, self._triggers = self._triggers, []
        return taken

    def _loop(self) -> None:
        last_start: float | None = None
        while not self._stop.is_set():
            if last_start is not None:
                due = last_start + self.interval_s
                self._wake.wait(max(0.0, due - self._monotonic()))
                if self._stop.is_set():
                    break
                gap_s = last_start + self.min_gap_s - self._monotonic()
                if gap_s > 0 and self._stop.wait(gap_s):
                    break
            triggers = self._take_triggers()
            if triggers:
                logger.info("reconcile now: %s", "; ".join(dict.fromkeys(triggers)))
            last_start = self._monotonic()
            try:
                self.run_round()
            except NoValidPolicy as e:
                self._ready = (False, str(e))
                logger.error("%s", e)
            except Exception as e:  # one failed round never stops the loop
                self._ready = (self.rounds > 0, f"last reconcile failed: {e}")
                logger.exception("reconcile failed")
            self._last_tick = self._monotonic()

    def start(self) -> None:
        """Start the loop in a background thread; the first round runs at once."""
        if self._thread is not None:
            raise RuntimeError("the engine service is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tide-engine", daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 30.0) -> bool:
        """Stop the loop: a round under way finishes, or is abandoned after ``timeout_s``.

        Args:
            timeout_s: the most time to wait for the round under way, seconds.

        Returns:
            True when the loop ended within the time, False when its round was abandoned.
        """
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("the round under way did not finish in %.0f s: abandoned", timeout_s)
            return False
        return True

    def close(self) -> None:
        """Release the metrics source (its connections and threads) and the forecast fitter's
        worker; call after ``stop``."""
        close_fitter = getattr(self._fitter, "close", None)
        if callable(close_fitter):
            close_fitter()
        source, self._metrics, self._metrics_for = self._metrics, None, None
        close = getattr(source, "close", None)
        if callable(close):
            close()

    @property
    def running(self) -> bool:
        """True while the loop thread runs."""
        return self._thread is not None and self._thread.is_alive()

    # -- probes ------------------------------------------------------------------------------

    def alive(self) -> bool:
        """Liveness: the loop has run within three intervals."""
        return self._monotonic() - self._last_tick < 3 * self.interval_s

    def ready(self) -> tuple[bool, str]:
        """Readiness: a reconcile has succeeded under a valid policy; with why."""
        return self._ready
