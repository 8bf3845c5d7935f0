"""What decides replicas in a simulation: tide's engine through ``reconcile``, or a baseline."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from scheduler_policy.decision.pipeline import Plan
from scheduler_policy.engine.reconcile import observe, reconcile
from scheduler_policy.engine.trigger import reconcile_trigger, seen_gangs
from scheduler_policy.extender import DEFAULT_GRACE_MARGIN_S, Extender, ExtenderView
from scheduler_policy.models.cache import ModelCache
from scheduler_policy.policy.spec import ElasticPolicy
from scheduler_policy.vocabulary.state import JobKey
from simulations.baselines import (
    Baseline,
    BaselinePlan,
    HpaBaseline,
    OptimusBaseline,
    ThresholdBaseline,
    TiresiasBaseline,
)
from simulations.cluster import SimulatedCluster
from simulations.state import SimJob, Status
from simulations.volcano import JobOrder, fifo_order
from simulations.workload import Workload

logger = logging.getLogger(__name__)

BASELINE_NAMES = ("static", "threshold", "hpa", "optimus", "tiresias")
"""The baselines ``make_controller`` knows, besides ``tide``."""


class Controller(Protocol):
    """Runs at every reconcile of a simulation.

    Attributes:
        name: the policy's name in reports.
        rigid: True when the policy runs every job at its requested size as a full gang
            (``min_replicas = max_replicas = requested``), as a non-elastic scheduler does.
        extender: the extender Volcano's reclaim asks before it evicts (tide's); None for
            Volcano's plain reclaim.
        adapts_batch: True when the jobs that let it choose their batch
            (``WorkloadJob.adaptive``) adapt under it (tide); False runs every job at its
            submitted batch, as the baselines do in Pollux's own comparison
            (``simulator.py`` lines 180-196: only Pollux's jobs have no target batch).
    """

    name: str
    rigid: bool
    extender: Extender | None
    adapts_batch: bool

    def control(self, cluster: SimulatedCluster, *, now_s: float) -> int:
        """Observe the cluster and write its decisions.

        Args:
            cluster: the simulated cluster.
            now_s: the reconcile time.

        Returns:
            How many jobs it changed.
        """
        ...

    def order(self) -> JobOrder:
        """The job order the scheduler uses within a queue."""
        ...

    def trigger(self, cluster: SimulatedCluster, *, withheld_pods: int) -> str | None:
        """Whether to reconcile at once (before the next interval), and why.

        Args:
            cluster: the simulated cluster, after a scheduling session.
            withheld_pods: pods the extender withheld in that session.

        Returns:
            Why, or None to wait for the interval.
        """
        ...


@dataclass(slots=True)
class TideController:
    """tide's engine, run exactly as in production: ``engine.reconcile`` on the cluster, its
    extender's view updated after each reconcile (as ``tide engine`` does), and a reconcile at
    once on a new pending gang or withheld pods (``engine.trigger.reconcile_trigger``).

    Attributes:
        grace_margin_s: the extender's margin over a pod's grace period (its save-and-exit
            time here), seconds.
        last_plan: the last reconcile's plan (budgets, headroom, forecasts), for benchmarks
            that follow them; None before the first.
    """

    policy: ElasticPolicy
    name: str = "tide"
    rigid: bool = False
    adapts_batch: bool = True
    models: ModelCache = field(default_factory=ModelCache)
    decisions: int = 0
    grace_margin_s: float = DEFAULT_GRACE_MARGIN_S
    extender: Extender | None = None
    last_plan: Plan | None = None
    _seen: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.extender is None:
            self.extender = Extender(
                stale_after_s=3 * self.policy.interval_s, grace_margin_s=self.grace_margin_s
            )

    def control(self, cluster: SimulatedCluster, *, now_s: float) -> int:
        """See base class."""
        result = reconcile(
            metrics=cluster, cluster=cluster, policy=self.policy, now_s=now_s, models=self.models
        )
        self.decisions += len(result.decisions)
        self.last_plan = result.plan
        self._seen = seen_gangs(result.observation)
        if self.extender is not None and result.plan is not None:
            self.extender.update(
                ExtenderView.from_plan(result.plan, result.observation, leader=True, now_s=now_s)
            )
        return sum(1 for c in result.applied if c.to_replicas != c.from_replicas)

    def order(self) -> JobOrder:
        """See base class. Volcano's FIFO."""
        return fifo_order

    def trigger(self, cluster: SimulatedCluster, *, withheld_pods: int) -> str | None:
        """See base class. The engine's rule: new pending gangs or withheld pods."""
        return reconcile_trigger(
            seen=self._seen, pending_gangs=cluster.list_pending_gangs(), withheld_pods=withheld_pods
        )


@dataclass(slots=True)
class StaticController:
    """Volcano as-is (``static``): every job keeps the replicas it asked for.

    It decides nothing, so it observes nothing: an observation it would not read was half of
    a static replay's time on long traces.
    """

    name: str = "static"
    rigid: bool = False
    extender: Extender | None = None
    adapts_batch: bool = False

    def control(self, cluster: SimulatedCluster, *, now_s: float) -> int:
        """See base class. Changes nothing."""
        return 0

    def order(self) -> JobOrder:
        """See base class. Volcano's FIFO."""
        return fifo_order

    def trigger(self, cluster: SimulatedCluster, *, withheld_pods: int) -> str | None:
        """See base class. Never: it decides nothing."""
        return None


@dataclass(slots=True)
class BaselineController:
    """A baseline fed by the same ``observe`` as the engine; its targets resize gracefully."""

    baseline: Baseline
    name: str = ""
    rigid: bool = False
    extender: Extender | None = None
    adapts_batch: bool = False
    _priority: dict[JobKey, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.name or self.baseline.name

    def control(self, cluster: SimulatedCluster, *, now_s: float) -> int:
        """See base class."""
        observation = observe(metrics=cluster, cluster=cluster, now_s=now_s)
        plan: BaselinePlan = self.baseline.decide(observation, now_s=now_s)
        self._priority = dict(plan.priority)
        changed = 0
        for key in sorted(plan.suspend):  # a set: sorted, so runs repeat whatever the hash seed
            job = cluster.jobs[key]
            if job.status is Status.RUNNING:
                cluster.suspend(job)
                changed += 1
        for key, target in plan.targets.items():
            found = cluster.jobs.get(key)
            if found is None or found.status is Status.DONE or not found.spec.elastic:
                continue
            target = max(found.spec.min_replicas, min(found.spec.max_replicas, target))
            if target != found.spec_replicas:
                cluster.resize(found, target)
                changed += 1
        return changed

    def order(self) -> JobOrder:
        """See base class. The baseline's priority when it gives one, else FIFO."""
        if not self._priority:
            return fifo_order
        priority = self._priority

        def key(job: SimJob) -> tuple[float, float]:
            return (priority.get(job.key, job.spec.submit_s), job.spec.submit_s)

        return key

    def trigger(self, cluster: SimulatedCluster, *, withheld_pods: int) -> str | None:
        """See base class. Never: a baseline decides on the interval only."""
        return None


def make_controller(
    name: str, *, workload: Workload, policy: ElasticPolicy | None = None
) -> Controller:
    """Build the controller called ``name`` (``tide`` or one of ``BASELINE_NAMES``).

    Args:
        name: the policy's name.
        workload: the workload (the optimus oracle reads its true scaling curves).
        policy: tide's policy; required for ``tide``.

    Returns:
        A fresh controller (controllers keep state; use one per run).

    Raises:
        ValueError: unknown name, or ``tide`` without a policy.
    """
    if name == "tide":
        if policy is None:
            raise ValueError("the tide controller needs a policy")
        return TideController(policy=policy, models=ModelCache(refit_s=policy.model_refit_s))
    baseline: Baseline
    if name == "static":
        return StaticController()
    if name == "threshold":
        baseline = ThresholdBaseline()
    elif name == "hpa":
        baseline = HpaBaseline()
    elif name == "optimus":
        baseline = OptimusBaseline(
            profiles={j.key: j.profile for j in workload.jobs},
            samples_per_unit={j.key: j.profile.samples_per_unit for j in workload.jobs},
        )
    elif name == "tiresias":
        return BaselineController(TiresiasBaseline(), rigid=True)
    else:
        known = ", ".join(("tide", *BASELINE_NAMES))
        raise ValueError(f"unknown policy {name!r}; known: {known}")
    return BaselineController(baseline)
