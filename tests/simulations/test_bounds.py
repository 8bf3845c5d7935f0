"""The average-JCT lower bounds the comparison and the quality benchmark quote."""

from __future__ import annotations

import dataclasses
import math

import pytest

from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations import bounds
from simulations.bounds import alone_jct_bound_h, jct_lower_bound_h, jct_lower_bounds_h
from simulations.cluster_config import ClusterSpec, QueueSpec
from simulations.profiles import ScalingProfile
from simulations.workload import Workload, WorkloadJob

PROFILE = ScalingProfile(name="t", units_per_s=(1.0, 1.8, 2.4, 2.2))  # peaks at 3 replicas
LINEAR = ScalingProfile(name="linear", units_per_s=(1.0, 2.0, 3.0, 4.0))


def job(
    name: str,
    *,
    lo: int,
    hi: int,
    work: float,
    submit_s: float = 0.0,
    profile: ScalingProfile = PROFILE,
    gpus: int = 1,
) -> WorkloadJob:
    return WorkloadJob(
        key=JobKey(f"ns/{name}"), submit_s=submit_s, queue=QueueName("q"), elastic=lo != hi,
        gpus_per_replica=gpus, min_replicas=lo, max_replicas=hi, requested_replicas=lo,
        work_units=work, profile=profile,
    )  # fmt: skip


def cluster(gpus: int, *queues: QueueSpec) -> ClusterSpec:
    return ClusterSpec(
        name="c", nodes=1, gpus_per_node=gpus, queues=queues or (QueueSpec(QueueName("q")),)
    )


def workload(*jobs: WorkloadJob) -> Workload:
    return Workload(name="w", jobs=tuple(sorted(jobs, key=lambda j: j.submit_s)))


@pytest.mark.parametrize(
    ("jobs", "expected_h"),
    [
        ((job("rigid", lo=2, hi=2, work=3600 * 1.8),), 1.0),
        ((job("elastic", lo=1, hi=4, work=3600 * 2.4),), 1.0),  # fastest at 3, not at max 4
        ((job("a", lo=1, hi=1, work=3600.0), job("b", lo=2, hi=3, work=3600 * 7.2)), 2.0),
    ],
    ids=["rigid-at-its-size", "elastic-at-its-fastest-size", "mean-over-jobs"],
)
def test_alone_bound(jobs, expected_h):
    assert alone_jct_bound_h(workload(*jobs)) == pytest.approx(expected_h)
    # With GPUs to spare, sharing the cluster costs nothing: both bounds agree.
    assert jct_lower_bound_h(workload(*jobs), cluster(64)) == pytest.approx(expected_h, rel=1e-6)


def test_empty_workload_has_no_bound():
    assert math.isnan(alone_jct_bound_h(Workload(name="w", jobs=())))
    assert math.isnan(jct_lower_bound_h(Workload(name="w", jobs=()), cluster(4)))


def test_two_jobs_that_each_need_the_whole_cluster_take_turns():
    # Each needs all 4 GPUs for 1 h. One runs first (JCT 1 h), the other after it (2 h): the
    # best average is 1.5 h, however they are interleaved; alone, each would take 1 h.
    jobs = (job("a", lo=4, hi=4, work=3600 * 4, profile=LINEAR),
            job("b", lo=4, hi=4, work=3600 * 4, profile=LINEAR))  # fmt: skip
    assert alone_jct_bound_h(workload(*jobs)) == pytest.approx(1.0)
    bound = jct_lower_bound_h(workload(*jobs), cluster(4))
    assert 1.5 - 0.01 <= bound <= 1.5 + 1e-9


@pytest.mark.parametrize(("gpus", "expected_h"), [(2, 1.0), (4, 1.5)])
def test_a_replica_holds_its_gpus_per_replica(gpus, expected_h):
    # Two one-replica jobs of 1 h each on 4 GPUs: side by side at 2 GPUs a replica, in turns at 4.
    jobs = (job("a", lo=1, hi=1, work=3600.0, gpus=gpus),
            job("b", lo=1, hi=1, work=3600.0, gpus=gpus))  # fmt: skip
    bound = jct_lower_bound_h(workload(*jobs), cluster(4))
    assert expected_h - 0.01 <= bound <= expected_h + 1e-9


def test_elastic_jobs_that_share_gpus_gain_nothing_over_running_one_after_the_other():
    # Linear speedup up to 4 GPUs, 4 GPU-hours each: the best is one at a time at 4 GPUs
    # (JCTs 1 h and 2 h); sharing 2 + 2 would finish both at 2 h.
    jobs = (job("a", lo=1, hi=4, work=3600 * 4, profile=LINEAR),
            job("b", lo=1, hi=4, work=3600 * 4, profile=LINEAR))  # fmt: skip
    assert 1.5 - 0.01 <= jct_lower_bound_h(workload(*jobs), cluster(4)) <= 1.5 + 1e-9


def test_a_job_that_scales_poorly_leaves_gpus_to_the_other():
    # "poor" gains 25% from 4 GPUs, "lin" 4x. Alone, each takes 1 h on 4 GPUs; together on 4
    # GPUs they contend, so the bound rises above 1 h. It must stay at or below any schedule's
    # average, e.g. poor on 1 GPU (done at 1.25 h) while lin runs on 3 (3.75 of its 4 units by
    # then, the last 0.25 on 4 GPUs: done at 1.3125 h).
    poor = ScalingProfile(name="poor", units_per_s=(1.0, 1.1, 1.2, 1.25))
    jobs = (job("poor", lo=1, hi=4, work=3600 * 1.25, profile=poor),
            job("lin", lo=1, hi=4, work=3600 * 4, profile=LINEAR))  # fmt: skip
    alone = alone_jct_bound_h(workload(*jobs))  # both 1 h at 4 replicas
    assert alone == pytest.approx(1.0)
    feasible = (1.25 + 1.3125) / 2
    bound = jct_lower_bound_h(workload(*jobs), cluster(4))
    assert alone < bound <= feasible + 1e-9


def test_a_later_submission_counts_from_its_own_submission():
    # b arrives when a (whole cluster, 1 h) is done: no contention, both take 1 h.
    jobs = (job("a", lo=4, hi=4, work=3600 * 4, profile=LINEAR),
            job("b", lo=4, hi=4, work=3600 * 4, profile=LINEAR, submit_s=3600.0))  # fmt: skip
    assert jct_lower_bound_h(workload(*jobs), cluster(4)) == pytest.approx(1.0, rel=1e-6)
    # Half an hour earlier, b must wait for GPUs a holds or share them: 1.25 h on average.
    jobs = (jobs[0], job("b", lo=4, hi=4, work=3600 * 4, profile=LINEAR, submit_s=1800.0))
    assert 1.25 - 0.01 <= jct_lower_bound_h(workload(*jobs), cluster(4)) <= 1.25 + 1e-9


def test_a_coarser_grid_gives_a_looser_bound_never_above_the_finer():
    jobs = tuple(
        job(f"j{i}", lo=1, hi=4, work=3600 * (1 + i % 3), profile=LINEAR, submit_s=600.0 * i)
        for i in range(12)
    )
    fine = jct_lower_bound_h(workload(*jobs), cluster(4), max_variables=50_000)
    coarse = jct_lower_bound_h(workload(*jobs), cluster(4), max_variables=500)
    assert alone_jct_bound_h(workload(*jobs)) <= coarse <= fine + 1e-9


@pytest.mark.parametrize(
    ("queues", "expected_h"),
    [
        ((QueueSpec(QueueName("q"), capability_gpus=2.0),), 2.0),
        ((QueueSpec(QueueName("q")), QueueSpec(QueueName("p"), guarantee_gpus=3.0)), 4.0),
        ((QueueSpec(QueueName("q"), guarantee_gpus=1.0), QueueSpec(QueueName("p"))), 1.0),
    ],
    ids=["its-capability", "never-into-another-queues-guarantee", "its-own-guarantee-is-its"],
)
def test_a_queue_never_holds_more_than_its_real_capability(queues, expected_h):
    # 4 GPU-hours of linear work in queue q of a 4-GPU cluster: 1 h on all 4 GPUs, unless the
    # queue may hold fewer (Volcano's real capability, which no policy changes).
    jobs = (job("a", lo=1, hi=4, work=3600 * 4, profile=LINEAR),)
    assert jct_lower_bound_h(workload(*jobs), cluster(4, *queues)) == pytest.approx(
        expected_h, rel=1e-6
    )


def test_queue_ceilings_bind_their_own_jobs_only():
    # q may hold 2 GPUs, p all 4, each with 4 GPU-hours of linear work: alone, q's job takes
    # 2 h and p's 1 h. Both on 2 GPUs from the start finish at 2 h. Were p's job capped too,
    # no schedule would average under 2 h.
    queues = (QueueSpec(QueueName("q"), capability_gpus=2.0), QueueSpec(QueueName("p")))
    jobs = (job("a", lo=1, hi=4, work=3600 * 4, profile=LINEAR),
            dataclasses.replace(job("b", lo=1, hi=4, work=3600 * 4, profile=LINEAR),
                                queue=QueueName("p")))  # fmt: skip
    bound = jct_lower_bound_h(workload(*jobs), cluster(4, *queues))
    assert 1.5 < bound < 2.0


def test_too_many_jobs_for_the_grid_give_the_alone_bound():
    # Twenty jobs that contend for 4 GPUs: a grid of 4,000 variables sees it, one of 40 cannot.
    jobs = tuple(job(f"j{i}", lo=4, hi=4, work=3600 * 4, profile=LINEAR) for i in range(20))
    assert jct_lower_bound_h(workload(*jobs), cluster(4), max_variables=4_000) > 5.0
    alone = alone_jct_bound_h(workload(*jobs))
    assert jct_lower_bound_h(workload(*jobs), cluster(4), max_variables=40) == alone == 1.0


def test_both_fallbacks_keep_each_job_within_its_queues_ceiling(caplog):
    # q may hold 2 GPUs: alone, each job's 4 GPU-hours take 2 h there, not 1 h on all 4 GPUs,
    # whether the grid is too coarse for the jobs or no solver finishes in time.
    capped = cluster(4, QueueSpec(QueueName("q"), capability_gpus=2.0))
    jobs = tuple(job(f"j{i}", lo=1, hi=4, work=3600 * 4, profile=LINEAR) for i in range(20))
    assert alone_jct_bound_h(workload(*jobs)) == 1.0
    with caplog.at_level("INFO", logger="simulations.bounds"):
        assert jct_lower_bound_h(workload(*jobs), capped, max_variables=40) == 2.0
        assert jct_lower_bound_h(workload(*jobs), capped, solve_limit_s=1e-6) == 2.0
    assert "too many for a 40-variable grid" in caplog.text
    assert "using the alone bound" in caplog.text


def test_the_interior_point_method_takes_over_from_a_simplex_that_runs_out_of_time(
    caplog, monkeypatch
):
    # Twenty identical jobs: a degenerate program the dual simplex takes several seconds to
    # solve, the interior-point method a fraction of one. Twenty turns of 1 h: 10.5 h on average.
    # Which solver runs out of time is made an order of events, not a race with the machine's
    # load: the simplex gets a limit it always reaches, the interior point all the time it needs.
    real = bounds.linprog
    tried = []

    def limited(*args, method, options, **kwargs):
        tried.append((method, options["time_limit"]))
        limit_s = 1e-6 if method == "highs-ds" else 600.0
        return real(*args, method=method, options=options | {"time_limit": limit_s}, **kwargs)

    monkeypatch.setattr(bounds, "linprog", limited)
    jobs = tuple(job(f"j{i}", lo=4, hi=4, work=3600 * 4, profile=LINEAR) for i in range(20))
    with caplog.at_level("INFO", logger="simulations.bounds"):
        bound = jct_lower_bound_h(workload(*jobs), cluster(4), solve_limit_s=2.0)
    assert tried == [("highs-ds", 2.0), ("highs-ipm", 2.0)]
    assert "highs-ds solver stopped" in caplog.text
    assert bound == pytest.approx(10.5, abs=0.01)


def test_no_solver_in_time_gives_the_alone_bound(caplog):
    jobs = tuple(job(f"j{i}", lo=4, hi=4, work=3600 * 4, profile=LINEAR) for i in range(20))
    with caplog.at_level("INFO", logger="simulations.bounds"):
        bound = jct_lower_bound_h(workload(*jobs), cluster(4), solve_limit_s=1e-6)
    assert "using the alone bound" in caplog.text
    assert bound == alone_jct_bound_h(workload(*jobs)) == 1.0


def test_a_workload_given_at_several_seeds_is_solved_once(monkeypatch):
    # A trace at three seeds is one workload object three times; the built-in workload's draws
    # are distinct objects, each solved.
    one = workload(job("a", lo=1, hi=4, work=3600 * 4, profile=LINEAR))
    other = workload(job("b", lo=1, hi=4, work=3600 * 8, profile=LINEAR))
    solved: list[Workload] = []
    real = bounds.jct_lower_bound_h

    def counting(w: Workload, c: ClusterSpec) -> float:
        solved.append(w)
        return real(w, c)

    monkeypatch.setattr(bounds, "jct_lower_bound_h", counting)
    found = jct_lower_bounds_h([one, other, one, one], cluster(4))
    assert [id(w) for w in solved] == [id(one), id(other)]
    assert found == pytest.approx([1.0, 2.0, 1.0, 1.0], rel=1e-6)
