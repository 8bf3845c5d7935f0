"""Workloads: the jobs a simulation replays, and tide's built-in seeded workload generator."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler_policy.vocabulary.state import JobKey, QueueName
from simulations.adaptive_batch import AdaptiveApplication
from simulations.profiles import BUILTIN_JOB_TYPES, ScalingProfile

DEFAULT_CHECKPOINT_INTERVAL_S = 600.0
"""How often a job checkpoints on its own; an abrupt kill loses up to this much progress."""


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One training job as submitted.

    Attributes:
        key: ``namespace/name``.
        submit_s: submission time, seconds from the start of the trace.
        queue: the Volcano Queue; None lets the cluster pick (its first elastic or fixed queue).
        elastic: whether its worker task may be resized between min and max replicas.
        gpus_per_replica: GPUs each worker requests.
        min_replicas: the gang minimum (``minAvailable``).
        max_replicas: the most workers it may run with.
        requested_replicas: ``spec.tasks[worker].replicas`` as submitted.
        work_units: total work, in the profile's units.
        profile: work units per second at each size.
        checkpoint_interval_s: progress seconds between two checkpoints.
        restart_cost_s: seconds without progress after a membership change; None for the default.
        declares_planned_samples: whether the job declares the samples its whole run will train
            on (in production the worker runtime's ``tide_worker_planned_samples``, exported
            when the script declares both its epochs and its dataset), so that the engine can
            read its remaining samples (planned minus consumed); False leaves them unknown.
        save_exit_s: seconds its departing workers take to save and exit after a graceful
            shrink (their GPUs stay held meanwhile); None for the cluster's default.
        source: where it came from (``file:line``), for messages.
        adaptive: the application whose batch tide may choose (``tide.io/adaptive-batch``:
            its bounds, step times and gradient statistics), when the job adapts its batch; its
            work is then counted in progress (``simulations.adaptive_batch``) and ``work_units``
            and ``profile`` are those of its submitted batch, for a replay that keeps it. None
            for a job at its submitted batch.
    """

    key: JobKey
    submit_s: float
    queue: QueueName | None
    elastic: bool
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int
    requested_replicas: int
    work_units: float
    profile: ScalingProfile
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    restart_cost_s: float | None = None
    declares_planned_samples: bool = False
    source: str = ""
    save_exit_s: float | None = None
    adaptive: AdaptiveApplication | None = None

    def problems(self) -> list[str]:
        """What makes the job unrunnable, as sentences naming the field; empty when valid."""
        out: list[str] = []
        if not math.isfinite(self.submit_s) or self.submit_s < 0:
            out.append(f"submit_s must be >= 0, got {self.submit_s}")
        if self.gpus_per_replica < 1:
            out.append(f"gpus_per_replica must be >= 1, got {self.gpus_per_replica}")
        if not 1 <= self.min_replicas <= self.requested_replicas <= self.max_replicas:
            out.append(
                "need 1 <= min_replicas <= requested_replicas <= max_replicas, got "
                f"{self.min_replicas} <= {self.requested_replicas} <= {self.max_replicas}"
            )
        if not self.elastic and self.min_replicas != self.max_replicas:
            out.append("a non-elastic job must have min_replicas == max_replicas")
        if not math.isfinite(self.work_units) or self.work_units <= 0:
            out.append(f"work_units must be > 0, got {self.work_units}")
        if not self.checkpoint_interval_s > 0:
            out.append(f"checkpoint_interval_s must be > 0, got {self.checkpoint_interval_s}")
        if self.save_exit_s is not None and not (
            math.isfinite(self.save_exit_s) and self.save_exit_s >= 0
        ):
            out.append(f"save_exit_s must be a finite number >= 0, got {self.save_exit_s}")
        return out

    @property
    def min_gpus(self) -> int:
        """GPUs of the gang minimum."""
        return self.min_replicas * self.gpus_per_replica


@dataclass(frozen=True, slots=True)
class Workload:
    """Jobs to replay, sorted by submission time.

    Attributes:
        name: a label for reports.
        jobs: the jobs, by ``submit_s``.
        skipped_rows: bad trace rows skipped with ``--skip-bad-rows``.
        skipped: each skipped row's line in the trace and what was wrong with it, in file
            order (a loader that counts without saying why leaves it empty).
    """

    name: str
    jobs: tuple[WorkloadJob, ...]
    skipped_rows: int = 0
    skipped: tuple[tuple[int, str], ...] = ()


# Parameters of the built-in generator, fitted (by the command below) to the Philly trace as Pollux
# ships it (traces/philly.csv, 82,247 jobs; Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU
# Clusters for DNN Training Workloads", ATC'19):
#   GPUs per job: 1: 93.2%, 2: 2.2%, 4: 2.3%, 8: 2.0%, >=16: 0.3%
#   ln(duration s) for 1-GPU jobs: mean 6.72, std 1.97 (median 1117 s)
#   ln(duration s) for 4-GPU jobs: mean 9.11, std 2.78; for 8-GPU jobs: mean 9.65, std 2.79
#   (python: numpy log/mean/std of the duration column, grouped by num_gpus)
# Helios (Hu et al., SC'21, helios_cluster_summary.csv) agrees on the shape: median GPU-job run time
# 124-280 s, mean 5,100-13,000 s, i.e. a heavy lognormal tail.
# The built-in workload keeps these shapes but (a) oversamples multi-GPU jobs, since single-GPU
# jobs are what elastic scaling cannot help, and (b) truncates durations to [5 min, 8 h] so that
# the default simulation finishes in seconds. Both choices are documented in the README output.
_NONELASTIC_GPUS = (1, 2, 4, 8)
_NONELASTIC_GPU_P = (0.55, 0.15, 0.18, 0.12)
_ELASTIC_REPLICAS = (1, 2, 4, 8)
_ELASTIC_REPLICA_P = (0.25, 0.25, 0.30, 0.20)
_LN_DURATION_MEAN = {1: 6.72, 2: 7.9, 4: 9.11, 8: 9.65}
_LN_DURATION_STD = 1.6  # narrower than Philly's ~2.0-2.8: the truncation keeps only the body
_MIN_DURATION_S = 300.0
_MAX_DURATION_S = 8 * 3600.0


# Offered load: the GPUs the arrivals ask for (at their requested sizes, for as long as they run
# there), averaged over the arrival window, as a share of the cluster's GPUs. Helios's Earth
# cluster (SC'21 artifact, cluster_sequence_vc.csv: mean of (running_gpu_num + pending_gpu_num) /
# total_gpu_num over May 2020, per minute) puts its busiest virtual clusters at 0.59 (vc8Sj), 0.63
# (vc3sl), 0.73 (vcJLV) and 0.91 (vcgkz), mean 0.72, with work pending 0-23% of the minutes. The
# default is that mean, rounded: a busy shared cluster, not a permanently overloaded one.
DEFAULT_LOAD = 0.7
DEFAULT_DURATION_S = 24 * 3600.0
MAX_BUILTIN_JOBS = 1_000_000
"""Most jobs the generator draws (ITP cluster04's two months have 15,802)."""
_DAY_S = 86400.0

# Share of the built-in workload's jobs that declare their planned samples. The worker runtime
# exports them only when the script gives both its epochs and its dataset: an epoch-bounded
# script does, one bounded by steps, tokens, wall time or early stopping (sweeps, pre-training)
# does not. No published trace records the split, so the default is the midpoint: half the jobs
# tell the engine their remaining work and half do not, so every run exercises both the
# remaining-time ranking and its estimate from a job's age.
DEFAULT_DECLARED_SHARE = 0.5


def _clipped_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """E[clip(exp(X), low, high)] for X ~ Normal(mu, sigma²)."""

    def cdf(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    a, b = (math.log(low) - mu) / sigma, (math.log(high) - mu) / sigma
    body = math.exp(mu + sigma * sigma / 2.0) * (cdf(b - sigma) - cdf(a - sigma))
    return low * cdf(a) + high * (1.0 - cdf(b)) + body


def mean_job_gpu_s(elastic_fraction: float) -> float:
    """Expected GPU-seconds one built-in job asks for at its requested size."""

    def mean(sizes: tuple[int, ...], weights: tuple[float, ...]) -> float:
        return sum(
            p * n * _clipped_lognormal_mean(
                _LN_DURATION_MEAN[n], _LN_DURATION_STD, _MIN_DURATION_S, _MAX_DURATION_S
            )
            for n, p in zip(sizes, weights, strict=True)
        )  # fmt: skip

    elastic = mean(_ELASTIC_REPLICAS, _ELASTIC_REPLICA_P)
    fixed = mean(_NONELASTIC_GPUS, _NONELASTIC_GPU_P)
    return elastic_fraction * elastic + (1.0 - elastic_fraction) * fixed


def _diurnal_mean(duration_s: float, amplitude: float) -> float:
    """Mean of ``1 + amplitude·sin(2π(t/day − 1/4))`` over [0, duration_s]."""
    turns = 2.0 * math.pi * duration_s / _DAY_S
    return 1.0 - amplitude * math.sin(turns) / turns


def arrivals_per_hour(
    *, load: float, cluster_gpus: int, duration_s: float, elastic_fraction: float, amplitude: float
) -> float:
    """The mean arrival rate (``jobs_per_hour``) that offers ``load`` of ``cluster_gpus``.

    Raises:
        ValueError: a load, cluster size or window that is not a positive finite number, or a
            window so long at that load that it would draw more than ``MAX_BUILTIN_JOBS``.
    """
    if not (load > 0 and math.isfinite(load)):
        raise ValueError(f"load must be a finite number > 0, got {load}")
    if cluster_gpus < 1:
        raise ValueError(f"cluster_gpus must be >= 1, got {cluster_gpus}")
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise ValueError(f"duration must be a finite number > 0, got {duration_s / 3600:g} h")
    gpu_s = mean_job_gpu_s(elastic_fraction) * _diurnal_mean(duration_s, amplitude)
    per_hour = load * cluster_gpus * 3600.0 / gpu_s
    expected = per_hour * duration_s / 3600.0
    if expected > MAX_BUILTIN_JOBS:
        raise ValueError(
            f"{duration_s / 3600:g} h at load {load:g} on {cluster_gpus} GPUs would draw about "
            f"{expected:,.0f} jobs, more than the generator's {MAX_BUILTIN_JOBS:,}; shorten the "
            "duration or replay a trace"
        )
    return per_hour


def generate_workload(
    *,
    seed: int = 0,
    duration_s: float = DEFAULT_DURATION_S,
    load: float = DEFAULT_LOAD,
    cluster_gpus: int = 32,
    elastic_fraction: float = 0.5,
    elastic_queue: str | None = None,
    fixed_queue: str | None = None,
    diurnal_amplitude: float = 0.5,
    declared_share: float = DEFAULT_DECLARED_SHARE,
) -> Workload:
    """Generate tide's built-in workload: diurnal Poisson arrivals, heavy-tailed sizes/durations.

    Arrival rate is ``rate * (1 + amplitude * sin(2 pi (t/day - 1/4)))``, sampled by thinning, so
    the trace starts at the daily trough and peaks mid-day; ``rate`` is set so that the arrivals
    offer ``load`` of the cluster's GPUs on average over the window (``arrivals_per_hour``). A
    job's duration is its run time at its requested size; its work is that duration times its
    rate at that size.

    Args:
        seed: random seed; the same seed gives the same workload.
        duration_s: length of the arrival window, seconds.
        load: offered load, a share of ``cluster_gpus`` (see ``DEFAULT_LOAD``).
        cluster_gpus: GPUs of the cluster the workload is for.
        elastic_fraction: share of jobs that are elastic (they go to ``elastic_queue``).
        elastic_queue: queue of the elastic jobs; None lets the cluster place them, so that the
            workload fits any cluster: in its first queue marked elastic (``QueueSpec.elastic``).
        fixed_queue: queue of the non-elastic jobs; None lets the cluster place them: in its
            first queue marked non-elastic, or its first queue when every queue is elastic.
        diurnal_amplitude: relative swing of the arrival rate, in [0, 1].
        declared_share: share of jobs that declare their planned samples
            (``WorkloadJob.declares_planned_samples``; see ``DEFAULT_DECLARED_SHARE``), in
            [0, 1]. Drawn from a stream of its own, so it changes no other draw of a seed.

    Returns:
        The workload, sorted by submission time.

    Raises:
        ValueError: a negative seed, a declared share outside [0, 1], or a load, cluster
            size or window that ``arrivals_per_hour`` refuses.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if not 0.0 <= declared_share <= 1.0:
        raise ValueError(f"declared_share must be in [0, 1], got {declared_share}")
    declares = np.random.default_rng([seed, 17])
    jobs_per_hour = arrivals_per_hour(
        load=load,
        cluster_gpus=cluster_gpus,
        duration_s=duration_s,
        elastic_fraction=elastic_fraction,
        amplitude=diurnal_amplitude,
    )
    rng = np.random.default_rng(seed)
    peak_per_s = jobs_per_hour * (1.0 + diurnal_amplitude) / 3600.0
    jobs: list[WorkloadJob] = []
    t = 0.0
    type_p = np.array([jt.weight for jt in BUILTIN_JOB_TYPES])
    type_p = type_p / type_p.sum()
    while True:
        t += float(rng.exponential(1.0 / peak_per_s))
        if t >= duration_s:
            break
        rate = 1.0 + diurnal_amplitude * math.sin(2 * math.pi * (t / _DAY_S - 0.25))
        if rng.random() * (1.0 + diurnal_amplitude) > rate:
            continue
        index = len(jobs)
        elastic = bool(rng.random() < elastic_fraction)
        job_type = BUILTIN_JOB_TYPES[int(rng.choice(len(BUILTIN_JOB_TYPES), p=type_p))]
        if elastic:
            replicas = int(rng.choice(_ELASTIC_REPLICAS, p=_ELASTIC_REPLICA_P))
            min_replicas = max(1, replicas // 2)
            max_replicas = max(2, replicas * 4)
        else:
            replicas = int(rng.choice(_NONELASTIC_GPUS, p=_NONELASTIC_GPU_P))
            min_replicas = max_replicas = replicas
        ln_d = rng.normal(_LN_DURATION_MEAN[replicas], _LN_DURATION_STD)
        run_s = float(np.clip(math.exp(ln_d), _MIN_DURATION_S, _MAX_DURATION_S))
        name = f"{'el' if elastic else 'fx'}-{job_type.name}-{index}"
        queue = elastic_queue if elastic else fixed_queue
        jobs.append(
            WorkloadJob(
                key=JobKey(f"{'research' if elastic else 'prod'}/{name}"),
                submit_s=round(t, 1),
                queue=None if queue is None else QueueName(queue),
                elastic=elastic,
                gpus_per_replica=1,
                min_replicas=min_replicas,
                max_replicas=max_replicas,
                requested_replicas=replicas,
                work_units=run_s * job_type.profile.rate(replicas),
                profile=job_type.profile,
                declares_planned_samples=bool(declares.random() < declared_share),
                source=f"built-in workload (seed {seed}), job {name}",
            )
        )
    return Workload(name=f"builtin-seed{seed}-load{load:g}", jobs=tuple(jobs))
