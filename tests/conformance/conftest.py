"""One fixture per implementation of ``ClusterClient`` and ``MetricsSource``.

Each fixture gives a ``Harness``: the implementation, one running elastic job in it, and the
few hooks a test needs that the protocols do not offer (make that job's metrics go missing,
spoil its stored memory). A new implementation (the Volcano client against a real API server,
the Prometheus source) joins every test in ``test_protocols.py`` by adding one fixture here
and its name to ``IMPLEMENTATIONS``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from scheduler_policy.adapters.memory_codec import MEMORY_ANNOTATION
from scheduler_policy.testing.fake import FakeCluster
from scheduler_policy.vocabulary.protocols import ClusterClient, MetricsSource
from scheduler_policy.vocabulary.state import JobKey
from simulations.cluster import SimulatedCluster
from simulations.volcano import run_session
from tests.scheduler_policy.builders import NOW_S, make_job, make_observation, make_queue
from tests.simulations.helpers import make_job as make_sim_job
from tests.simulations.helpers import make_sim


@dataclass
class Harness:
    """An implementation under test and what the tests need to know about it.

    Attributes:
        client: the cluster side.
        metrics: the metrics side.
        job: a running elastic job, at ``replicas`` replicas, with room to grow by one.
        now_s: a time to sample at.
        lose_metrics: makes ``job``'s own metrics missing from the next samples.
        spoil_memory: replaces ``job``'s stored memory with a value no codec can read.
    """

    client: ClusterClient
    metrics: MetricsSource
    job: JobKey
    now_s: float
    lose_metrics: Callable[[], None]
    spoil_memory: Callable[[], None]


def fake_harness() -> Harness:
    cluster = FakeCluster(
        make_observation(
            make_job("a", current=2, max_replicas=4), make_job("b", current=1),
            queues=(make_queue(capability=16),), free=8,
        )
    )  # fmt: skip
    key = JobKey("ns/a")

    def lose() -> None:
        cluster.stale_jobs[key] = "throughput series absent"

    def spoil() -> None:
        cluster.annotations[key][MEMORY_ANNOTATION] = '{"v":1,"recommendations":"x"'

    return Harness(cluster, cluster, key, NOW_S, lose, spoil)


def simulated_harness() -> Harness:
    sim: SimulatedCluster = make_sim(
        [make_sim_job("a", replicas=2, min_r=1, max_r=4, work=1e7),
         make_sim_job("b", replicas=1, min_r=1, max_r=2, work=1e7)],
        nodes=2,
    )  # fmt: skip
    run_session(sim)
    sim.advance(600.0)
    key = JobKey("ns/a")

    def lose() -> None:
        sim.metrics = dataclasses.replace(sim.metrics, outages=((0.0, math.inf),))

    def spoil() -> None:
        sim.jobs[key].annotations[MEMORY_ANNOTATION] = "not json"

    return Harness(sim, sim, key, 600.0, lose, spoil)


IMPLEMENTATIONS = {"fake": fake_harness, "simulated": simulated_harness}


@pytest.fixture(params=list(IMPLEMENTATIONS), ids=list(IMPLEMENTATIONS))
def harness(request: pytest.FixtureRequest) -> Harness:
    return IMPLEMENTATIONS[request.param]()
