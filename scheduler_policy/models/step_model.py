"""How long an adaptive-batch job's optimizer step takes at any shape: Pollux's throughput model.

Per worker, with ``b`` samples per micro batch, ``s`` micro batches per step, ``r`` workers on
``m`` nodes (Qiao et al., "Pollux", OSDI 2021, section 3.2):

    t_grad(b)    = α_c + β_c·b                      one micro batch's forward and backward
    t_sync(m, r) = α_intra + β_intra·(r − 2)         m = 1, r ≥ 2: the all-reduce inside a node
                 = α_inter + β_inter·(r − 2)         m ≥ 2: the all-reduce across nodes
                 = 0                                 r = 1
    step(m, r, b, s) = (s − 1)·t_grad + (t_grad^γ + t_sync^γ)^(1/γ)

The last micro batch overlaps its backward with the all-reduce: γ = 1 is no overlap (they add),
γ → ∞ is full overlap (the slower one alone). The worker measures the three parts apart
(``StepTimes``, means at one shape): ``accumulation_step_s`` is ``t_grad(b)``, ``sync_s`` is
``t_sync(m, r)`` (the span from the first gradient bucket sent to the last reduced, which is the
network time stretched where it waits for the backward), ``optim_step_s`` is the overlapped
last term; at ``r = 1`` that term is ``t_grad`` itself.

The fit minimises the squared log errors of every measured part (relative errors, so a job's
time scale does not matter) with bounded, deterministic least squares. A parameter no point can
identify stays at a stated prior (:class:`StepModel` names each and when it is free); each free
parameter is also pulled toward its prior with weight ``prior_pull`` in log units, which decides
only directions the points leave open (a sync time and a compute time measured together, never
apart) and moves an identified parameter by far less than its measurement noise. An optimizer
that does not converge raises :class:`ModelFitError`: its answer is never used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares

from scheduler_policy.vocabulary.errors import ModelFitError
from scheduler_policy.vocabulary.state import StepTimes

FloatArray = npt.NDArray[np.float64]

GAMMA_PRIOR = 1.0
"""γ until a step's sync is measured beside its overlapped time: no overlap, the slower end."""
GAMMA_MAX = 10.0
"""The largest γ fitted: beyond it the overlapped time is the larger part within 7 %."""
SYNC_PRIOR_FRACTION = 0.2
"""An all-reduce never measured inside a node: a fifth of the compute of the largest measured
micro batch (the prior of ``NodeScalingModel``; Pollux measured 5-23 % of a step in a node)."""
INTER_NODE_PRIOR_FACTOR = 2.0
"""An all-reduce never measured across nodes: twice the in-node one (Pollux measured 32-73 % of
a step across nodes against 5-23 % inside; AdaptDL assumes only 1.1x). The engine's growth cap
bounds what this bet can cost."""
RETROGRESSION_MAX = 10.0
"""Bound of β/α of either tier (each further worker adds at most ten base all-reduces)."""
PRIOR_PULL = 1e-2
"""Weight of each free parameter's pull toward its prior, in log units."""


@dataclass(frozen=True, slots=True)
class StepParams:
    """Pollux's seven parameters (see the module docstring), seconds unless said.

    Attributes:
        compute_alpha_s: α_c, a micro batch's fixed compute.
        compute_beta_s: β_c, compute per sample of a micro batch.
        intra_alpha_s: α_intra, an all-reduce of two workers in one node.
        intra_beta_s: β_intra, what each further worker in one node adds.
        inter_alpha_s: α_inter, an all-reduce across nodes.
        inter_beta_s: β_inter, what each further worker across nodes adds.
        gamma: γ, the overlap of the last backward with the all-reduce (dimensionless, ≥ 1).
    """

    compute_alpha_s: float
    compute_beta_s: float
    intra_alpha_s: float
    intra_beta_s: float
    inter_alpha_s: float
    inter_beta_s: float
    gamma: float

    def grad_s(self, local_batch_size: npt.ArrayLike) -> FloatArray:
        """t_grad: one micro batch of ``local_batch_size`` samples, seconds."""
        b = np.asarray(local_batch_size, dtype=np.float64)
        return np.asarray(self.compute_alpha_s + self.compute_beta_s * b, dtype=np.float64)

    def sync_s(self, *, nodes: npt.ArrayLike, replicas: npt.ArrayLike) -> FloatArray:
        """t_sync: the step's all-reduce at ``replicas`` workers on ``nodes`` nodes, seconds."""
        m = np.asarray(nodes, dtype=np.float64)
        r = np.asarray(replicas, dtype=np.float64)
        beyond = np.maximum(r - 2.0, 0.0)
        intra = self.intra_alpha_s + self.intra_beta_s * beyond
        inter = self.inter_alpha_s + self.inter_beta_s * beyond
        synced = np.where(m > 1.0, inter, intra)
        return np.asarray(np.where(r >= 2.0, synced, 0.0), dtype=np.float64)

    def optim_s(
        self, *, nodes: npt.ArrayLike, replicas: npt.ArrayLike, local_batch_size: npt.ArrayLike
    ) -> FloatArray:
        """The overlapped last micro batch, (t_grad^γ + t_sync^γ)^(1/γ), seconds."""
        g = self.grad_s(local_batch_size)
        s = self.sync_s(nodes=nodes, replicas=replicas)
        # Scaled by the larger part before the power, so that γ = 10 cannot overflow.
        top = np.maximum(g, s)
        safe = np.where(top > 0, top, 1.0)
        mixed = top * ((g / safe) ** self.gamma + (s / safe) ** self.gamma) ** (1.0 / self.gamma)
        return np.asarray(mixed, dtype=np.float64)

    def step_s(
        self,
        *,
        nodes: npt.ArrayLike,
        replicas: npt.ArrayLike,
        local_batch_size: npt.ArrayLike,
        accumulation_steps: npt.ArrayLike,
    ) -> FloatArray:
        """A whole optimizer step of ``accumulation_steps`` micro batches per worker, seconds."""
        s = np.asarray(accumulation_steps, dtype=np.float64)
        optim = self.optim_s(nodes=nodes, replicas=replicas, local_batch_size=local_batch_size)
        return np.asarray((s - 1.0) * self.grad_s(local_batch_size) + optim, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class ShapeStepTimes:
    """The model at one (nodes, replicas): the step-time predictor the batch choice reads
    (``scheduler_policy.models.batch_choice.StepTimePredictor``).

    Plain float arithmetic, the same formulas as ``StepParams``: the choice asks for every
    candidate at every size, and a numpy scalar per call cost 40 times as much.
    """

    params: StepParams
    nodes: int
    replicas: int

    def predict(self, *, local_batch_size: int, accumulation_steps: int) -> float:
        """See base class (``StepTimePredictor``)."""
        p = self.params
        grad = p.compute_alpha_s + p.compute_beta_s * local_batch_size
        sync = 0.0
        if self.replicas >= 2:
            alpha, beta = (
                (p.inter_alpha_s, p.inter_beta_s)
                if self.nodes > 1
                else (p.intra_alpha_s, p.intra_beta_s)
            )
            sync = alpha + beta * max(self.replicas - 2, 0)
        top = max(grad, sync)
        optim = top
        if top > 0 and sync > 0:
            optim = top * ((grad / top) ** p.gamma + (sync / top) ** p.gamma) ** (1.0 / p.gamma)
        return (accumulation_steps - 1) * grad + optim


@dataclass(frozen=True, slots=True)
class _Measured:
    """The usable measurements, one entry per value (non-finite or non-positive ones dropped)."""

    grad: tuple[tuple[int, float], ...]  # (b, t_grad): accumulation micro batches, and r = 1
    sync: tuple[tuple[int, int, float], ...]  # (m, r, t_sync), r ≥ 2
    optim: tuple[tuple[int, int, int, float], ...]  # (m, r, b, optim), r ≥ 2


def _usable(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _measured(points: Sequence[StepTimes]) -> _Measured:
    grad: list[tuple[int, float]] = []
    sync: list[tuple[int, int, float]] = []
    optim: list[tuple[int, int, int, float]] = []
    for p in points:
        if p.replicas < 1 or p.nodes < 1 or p.local_batch_size < 1:
            continue
        acc, opt, syn = (_usable(v) for v in (p.accumulation_step_s, p.optim_step_s, p.sync_s))
        if acc is not None:
            grad.append((p.local_batch_size, acc))
        if opt is not None and p.replicas == 1:
            grad.append((p.local_batch_size, opt))  # no all-reduce: the last micro batch alone
        elif opt is not None:
            optim.append((p.nodes, p.replicas, p.local_batch_size, opt))
        if syn is not None and p.replicas >= 2:
            sync.append((p.nodes, p.replicas, syn))
    return _Measured(tuple(grad), tuple(sync), tuple(optim))


class StepModel:
    """Pollux's step time of one job, fitted to its ``StepTimes`` (see the module docstring).

    When each parameter is free (else it stays at its prior):

    - α_c and β_c: fitted as t_ref = t_grad(b_ref), b_ref the largest measured micro batch, and
      f = α_c / t_ref ∈ [0, 1]. t_ref is always free; f only when two or more micro batch sizes
      were measured, else f = 1/2 (the worker's own prior: a larger micro batch looks up to
      twice as fast per sample, bounded by the candidates' twice-the-measured cap).
    - α_intra: free when a point ran on one node with two or more workers; else
      ``SYNC_PRIOR_FRACTION`` × t_ref, or α_inter / ``INTER_NODE_PRIOR_FACTOR`` when only
      cross-node points exist. α_inter likewise across nodes, with prior
      ``INTER_NODE_PRIOR_FACTOR`` × α_intra.
    - β of a tier: free as ρ = β/α ∈ [0, ``RETROGRESSION_MAX``] when the tier was measured at
      two or more worker counts; else the other tier's ρ, or 0 (an all-reduce whose time does
      not grow with the workers: a ring's bandwidth-bound limit).
    - γ ∈ [1, ``GAMMA_MAX``]: free when a point with two or more workers measured its sync
      beside its overlapped time; else ``GAMMA_PRIOR``.

    Args:
        prior_pull: weight of each free parameter's pull toward its prior (log units).
        max_evaluations: the least-squares solver's budget of function evaluations.

    Attributes:
        params_: the fitted ``StepParams``.
        free_: names of the parameters the points identified (the rest are priors).
        relative_error_: mean |t̂ − t| / t over every measured part.
    """

    def __init__(self, *, prior_pull: float = PRIOR_PULL, max_evaluations: int = 400) -> None:
        self.prior_pull = prior_pull
        self.max_evaluations = max_evaluations

    def fit(self, points: Sequence[StepTimes]) -> StepModel:
        """Fit the seven parameters to a job's measured steps.

        Args:
            points: the job's ``StepTimes``; non-finite or non-positive times are left out.

        Returns:
            self, fitted.

        Raises:
            ValueError: ``prior_pull`` is negative or not finite, or ``max_evaluations`` < 1.
            ModelFitError: no usable time, or the solver did not converge.
        """
        if not (math.isfinite(self.prior_pull) and self.prior_pull >= 0):
            raise ValueError(
                f"StepModel.prior_pull: must be finite and >= 0, got {self.prior_pull}"
            )
        if self.max_evaluations < 1:
            raise ValueError(f"StepModel.max_evaluations: must be >= 1, got {self.max_evaluations}")
        data = _measured(points)
        if not data.grad and not data.optim:
            raise ModelFitError(
                f"StepModel.fit: no usable step time among {len(points)} point(s) "
                "(each optim_step_s missing, not finite or not positive)"
            )
        layout = _Layout.of(data)
        x0, lower, upper = layout.start(data)
        result = least_squares(
            lambda x: _residuals(layout.params(x), layout, data, x, self.prior_pull),
            x0,
            bounds=(lower, upper),
            method="trf",
            max_nfev=self.max_evaluations,
        )
        if not result.success or not np.all(np.isfinite(result.x)):
            raise ModelFitError(
                f"StepModel.fit: least squares did not converge on {len(points)} point(s) "
                f"(status {result.status}: {result.message})"
            )
        self.params_ = layout.params(result.x)
        self.free_ = layout.free
        errors = np.abs(np.expm1(_residuals(self.params_, layout, data, result.x, 0.0)))
        self.relative_error_ = float(np.mean(errors[: layout.measured_count(data)]))
        return self

    def at(self, *, nodes: int, replicas: int) -> ShapeStepTimes:
        """The fitted model at one shape, as the batch choice's step-time predictor.

        Raises:
            RuntimeError: before ``fit``.
        """
        if not hasattr(self, "params_"):
            raise RuntimeError("StepModel: call fit() before at()")
        return ShapeStepTimes(self.params_, nodes, replicas)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Which parameters are free, and how the solver's vector maps to ``StepParams``."""

    free: tuple[str, ...]  # among "t_ref", "f", "intra", "rho_intra", "inter", "rho_inter", "gamma"
    b_ref: int

    @classmethod
    def of(cls, data: _Measured) -> _Layout:
        batches = {b for b, _ in data.grad} | {b for _, _, b, _ in data.optim}
        intra = {r for m, r, _ in data.sync if m <= 1} | {r for m, r, _, _ in data.optim if m <= 1}
        inter = {r for m, r, _ in data.sync if m > 1} | {r for m, r, _, _ in data.optim if m > 1}
        free = ["t_ref"]
        if len(batches) >= 2:
            free.append("f")
        if intra:
            free.append("intra")
        if len(intra) >= 2:
            free.append("rho_intra")
        if inter:
            free.append("inter")
        if len(inter) >= 2:
            free.append("rho_inter")
        if data.sync:
            free.append("gamma")
        return cls(tuple(free), max(batches))

    def start(self, data: _Measured) -> tuple[FloatArray, FloatArray, FloatArray]:
        """The solver's start, lower and upper bounds: logs for times, plain for f, ρ, γ."""
        at_ref = [t for b, t in data.grad if b == self.b_ref]
        t_ref = float(np.median(at_ref)) if at_ref else min(t for *_, t in data.optim) / 1.2
        syncs = {
            tier: [t for m, _, t in data.sync if (m > 1) == (tier == "inter")]
            for tier in ("intra", "inter")
        }
        guess = {
            "t_ref": (math.log(t_ref), -np.inf, np.inf),
            "f": (0.5, 0.0, 1.0),
            "rho_intra": (0.0, 0.0, RETROGRESSION_MAX),
            "rho_inter": (0.0, 0.0, RETROGRESSION_MAX),
            "gamma": (1.5, 1.0, GAMMA_MAX),
        }
        for tier, factor in (("intra", 1.0), ("inter", INTER_NODE_PRIOR_FACTOR)):
            seen = syncs[tier]
            level = float(np.median(seen)) if seen else SYNC_PRIOR_FRACTION * factor * t_ref
            guess[tier] = (math.log(level), -np.inf, np.inf)
        x0, lower, upper = (np.array([guess[n][i] for n in self.free]) for i in range(3))
        return x0, lower, upper

    def params(self, x: FloatArray) -> StepParams:
        v = dict(zip(self.free, x.tolist(), strict=True))
        t_ref = math.exp(v["t_ref"])
        f = v.get("f", 0.5)
        alpha_c = f * t_ref
        beta_c = (1.0 - f) * t_ref / self.b_ref
        intra = math.exp(v["intra"]) if "intra" in v else None
        inter = math.exp(v["inter"]) if "inter" in v else None
        if intra is None:
            intra = (
                SYNC_PRIOR_FRACTION * t_ref if inter is None else inter / INTER_NODE_PRIOR_FACTOR
            )
        if inter is None:
            inter = INTER_NODE_PRIOR_FACTOR * intra
        rho_intra = v.get("rho_intra", v.get("rho_inter", 0.0))
        rho_inter = v.get("rho_inter", rho_intra)
        return StepParams(
            compute_alpha_s=alpha_c,
            compute_beta_s=beta_c,
            intra_alpha_s=intra,
            intra_beta_s=rho_intra * intra,
            inter_alpha_s=inter,
            inter_beta_s=rho_inter * inter,
            gamma=v.get("gamma", GAMMA_PRIOR),
        )

    def measured_count(self, data: _Measured) -> int:
        return len(data.grad) + len(data.sync) + len(data.optim)

    def prior_residuals(self, x: FloatArray, params: StepParams) -> list[float]:
        """Each free parameter's distance from its prior (log units for times)."""
        v = dict(zip(self.free, x.tolist(), strict=True))
        t_ref = params.compute_alpha_s + params.compute_beta_s * self.b_ref
        priors: dict[str, Callable[[], float]] = {
            "t_ref": lambda: 0.0,  # always measured: no prior of its own
            "f": lambda: v["f"] - 0.5,
            "intra": lambda: v["intra"] - math.log(SYNC_PRIOR_FRACTION * t_ref),
            "inter": lambda: v["inter"] - math.log(INTER_NODE_PRIOR_FACTOR * params.intra_alpha_s),
            "rho_intra": lambda: v["rho_intra"],
            "rho_inter": lambda: v["rho_inter"],
            "gamma": lambda: v["gamma"] - GAMMA_PRIOR,
        }
        return [priors[name]() for name in self.free]


def _residuals(
    params: StepParams, layout: _Layout, data: _Measured, x: FloatArray, pull: float
) -> FloatArray:
    """log(predicted / measured) of every measured part, then the weighted prior pulls."""
    parts: list[FloatArray] = []
    if data.grad:
        b, t = (np.array(c, dtype=np.float64) for c in zip(*data.grad, strict=True))
        parts.append(np.log(params.grad_s(b) / t))
    if data.sync:
        m, r, t = (np.array(c, dtype=np.float64) for c in zip(*data.sync, strict=True))
        parts.append(np.log(params.sync_s(nodes=m, replicas=r) / t))
    if data.optim:
        m, r, b, t = (np.array(c, dtype=np.float64) for c in zip(*data.optim, strict=True))
        parts.append(np.log(params.optim_s(nodes=m, replicas=r, local_batch_size=b) / t))
    if pull > 0:
        parts.append(pull * np.array(layout.prior_residuals(x, params), dtype=np.float64))
    return np.concatenate(parts)
