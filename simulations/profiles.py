"""How fast a job trains at each size: scaling profiles, built-in job types and their curves.

A profile maps a replica count to a rate of *work units* per second. A job's work is counted in the
same units (iterations at a fixed global batch for Pollux's measured applications, "seconds at the
requested size" for duration-only traces), so a job finishes when its done work reaches its total.
``samples_per_unit`` converts that rate to the samples/s the job would export as a metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_PROFILE_REPLICAS = 128
"""Profiles are tabulated up to this many replicas; larger sizes run at the last entry's rate."""


@dataclass(frozen=True, slots=True)
class ScalingProfile:
    """Work rate as a function of replicas.

    Attributes:
        name: the job type or application, e.g. ``resnet50`` or ``pollux/cifar10@2048``.
        units_per_s: rate at 1, 2, ... replicas (index 0 is one replica); all > 0.
        samples_per_unit: training samples in one work unit (the global batch for iterations).
    """

    name: str
    units_per_s: tuple[float, ...]
    samples_per_unit: float = 1.0

    def rate(self, replicas: int) -> float:
        """Work units per second at ``replicas`` (0 for no replicas).

        Args:
            replicas: the number of workers running.

        Returns:
            The rate in work units per second; sizes past the table run at its last entry.
        """
        if replicas <= 0:
            return 0.0
        return self.units_per_s[min(replicas, len(self.units_per_s)) - 1]

    def speedup(self, replicas: int) -> float:
        """Rate at ``replicas`` relative to one replica."""
        return self.rate(replicas) / self.units_per_s[0]

    def scaled_to(self, *, replicas: int, units_per_s: float) -> ScalingProfile:
        """The same curve rescaled so that ``replicas`` runs at ``units_per_s``.

        Args:
            replicas: the reference size.
            units_per_s: the rate the reference size must have.

        Returns:
            A new profile with the same shape.
        """
        factor = units_per_s / self.rate(replicas)
        return ScalingProfile(
            name=self.name,
            units_per_s=tuple(r * factor for r in self.units_per_s),
            samples_per_unit=self.samples_per_unit,
        )


def usl_profile(
    name: str, *, sigma: float, kappa: float, max_replicas: int = MAX_PROFILE_REPLICAS
) -> ScalingProfile:
    """A profile following the Universal Scalability Law, one replica = 1 unit/s.

    X(n) = n / (1 + sigma (n - 1) + kappa n (n - 1)); past its peak the curve is held flat at the
    peak (a real job would not be run slower by adding workers; the engine would not ask).

    Args:
        name: the job type's name.
        sigma: contention coefficient, >= 0.
        kappa: coherency (crosstalk) coefficient, >= 0.
        max_replicas: how many sizes to tabulate.

    Returns:
        The profile.
    """
    rates: list[float] = []
    best = 0.0
    for n in range(1, max_replicas + 1):
        x = n / (1.0 + sigma * (n - 1) + kappa * n * (n - 1))
        best = max(best, x)
        rates.append(best)
    return ScalingProfile(name=name, units_per_s=tuple(rates))


@dataclass(frozen=True, slots=True)
class JobType:
    """A built-in kind of training job.

    Attributes:
        name: the type's name.
        profile: its scaling curve (1 unit/s at one replica).
        weight: relative frequency among elastic jobs in the built-in workload.
    """

    name: str
    profile: ScalingProfile
    weight: float


# tide's own illustrative job types. The coefficients are NOT measurements of any model; they are
# chosen to span the range of data-parallel scaling seen in published profiles (e.g. Pollux's
# traces/<app>/scalability.csv, where throughput at 16 replicas ranges from ~3x to ~12x one
# replica). Speedup at 4 / 8 / 16 replicas, from usl_profile:
#   vision-cnn       sigma=0.02,  kappa=0.0005 -> 3.8 / 6.8 / 11.3  (compute-bound convnet)
#   transformer      sigma=0.05,  kappa=0.001  -> 3.4 / 5.7 / 8.0   (large gradients, good overlap)
#   speech-rnn       sigma=0.10,  kappa=0.002  -> 3.0 / 4.4 / 5.4   (sequential, sync-heavy)
#   recommender      sigma=0.25,  kappa=0.005  -> 2.2 / 2.6 / 2.7   (embedding-bound, scales poorly)
BUILTIN_JOB_TYPES: tuple[JobType, ...] = (
    JobType("vision-cnn", usl_profile("vision-cnn", sigma=0.02, kappa=0.0005), weight=0.35),
    JobType("transformer", usl_profile("transformer", sigma=0.05, kappa=0.001), weight=0.30),
    JobType("speech-rnn", usl_profile("speech-rnn", sigma=0.10, kappa=0.002), weight=0.20),
    JobType("recommender", usl_profile("recommender", sigma=0.25, kappa=0.005), weight=0.15),
)


def builtin_job_type(name: str) -> JobType:
    """The built-in job type called ``name``.

    Raises:
        KeyError: no such type; the message lists the known ones.
    """
    for job_type in BUILTIN_JOB_TYPES:
        if job_type.name == name:
            return job_type
    known = ", ".join(t.name for t in BUILTIN_JOB_TYPES)
    raise KeyError(f"unknown job type {name!r}; known: {known}")


@dataclass(frozen=True, slots=True)
class ThroughputMeasurement:
    """A job's throughput measured at one size.

    Attributes:
        replicas: worker replicas it ran with, >= 1.
        samples_per_s: training samples per second the whole job made at that size, > 0.
        nodes: nodes the replicas were spread over; None when not recorded.
    """

    replicas: int
    samples_per_s: float
    nodes: int | None = None


def measured_profile(
    name: str,
    measurements: Sequence[ThroughputMeasurement],
    *,
    max_replicas: int = MAX_PROFILE_REPLICAS,
) -> ScalingProfile:
    """A job's own scaling curve from its measured throughput, in samples per second.

    A simulated job's rate does not depend on the nodes its pods are on, so a size measured on
    several node counts takes the slowest of them. Between measured sizes the rate is
    interpolated linearly; below the smallest measured size m it is X(m) n / m (per-replica
    efficiency no better than at m); past the largest it stays at the largest size's rate. For a
    curve that is concave in n (every data-parallel job's), each of the three is at or below the
    true curve: a replay never runs a job faster than it was seen to run.

    Args:
        name: the profile's name, e.g. ``measured/ns/job``.
        measurements: at least one; ``replicas`` in [1, max_replicas], rates finite and > 0.
        max_replicas: how many sizes to tabulate.

    Returns:
        The profile; its work unit is one sample (``samples_per_unit`` 1).

    Raises:
        ValueError: no measurements, a size outside [1, max_replicas] or a rate that is not a
            finite number > 0.
    """
    if not measurements:
        raise ValueError("a measured curve needs at least one measurement")
    slowest: dict[int, float] = {}
    for m in measurements:
        if not 1 <= m.replicas <= max_replicas:
            raise ValueError(f"replicas must be in [1, {max_replicas}], got {m.replicas}")
        if not is_valid_rate(m.samples_per_s):
            raise ValueError(f"samples_per_s must be a finite number > 0, got {m.samples_per_s}")
        slowest[m.replicas] = min(slowest.get(m.replicas, math.inf), m.samples_per_s)
    sizes = sorted(slowest)
    rates: list[float] = []
    upper = 0
    for n in range(1, max_replicas + 1):
        while upper < len(sizes) and sizes[upper] < n:
            upper += 1
        if upper == len(sizes):  # past the largest measured size: flat
            rates.append(slowest[sizes[-1]])
        elif upper == 0:  # at or below the smallest measured size: proportional to n
            rates.append(slowest[sizes[0]] * n / sizes[0])
        else:
            lo, hi = sizes[upper - 1], sizes[upper]
            share = (n - lo) / (hi - lo)
            rates.append(slowest[lo] + share * (slowest[hi] - slowest[lo]))
    return ScalingProfile(name=name, units_per_s=tuple(rates), samples_per_unit=1.0)


def is_valid_rate(value: float) -> bool:
    """Whether ``value`` is a usable rate (finite and > 0)."""
    return math.isfinite(value) and value > 0
