"""Step adaptation during warmup for the Metropolis–Hastings kernels (docs/design.md §2.1,
"Step adaptation").

During warmup the proposal radius follows Nesterov's dual averaging of log step as in
Hoffman & Gelman (2014, Algorithm 5) and Stan (γ = 0.05, t₀ = 10, κ = 0.75), pooled over the
chains, towards a target acceptance stated *relative to the noise ceiling*: with penalty noise
of variance s² the acceptance cannot exceed 2Φ(−s/2) (its limit as the step → 0), so the
statistic is each chain's acceptance probability min{1, e^{log α}} divided by 2Φ(−√v/2) for
the noise variance v of its step (1 without noise), averaged over chains (proposals outside Θ
count 0). The kept draws use the averaged step, fixed, so the kept chain is an exact MH chain.

The step stays in [``lower``, ``admitted``]: ``admitted`` is ``sampler.step``, the largest step
the owners admitted the plan at, so adaptation only shrinks what is spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy.special import ndtr

#: Dual-averaging constants of Hoffman & Gelman (2014) and Stan: shrinkage γ, stabilisation
#: t₀ and the averaging exponent κ.
GAMMA, T0, KAPPA = 0.05, 10.0, 0.75
#: Adaptation never goes below admitted / RANGE (an owner bound may raise the floor).
RANGE = 1000.0
#: ``sampler.target_accept``'s default: relative to the noise ceiling (docs/design.md §2.1).
TARGET_ACCEPT = 0.5


@dataclass(frozen=True)
class StepAdaptation:
    """The proposal step of an MH kernel and its warmup adaptation (units of θ; scalars, pooled
    over chains). ``admitted``: the largest step (``sampler.step``); ``lower``: the smallest the
    adaptation may choose; ``charged``: the owners' charged floor (a shorter step is charged as
    this one; 0: none); ``target``: the acceptance aimed at, relative to the noise ceiling.
    ``step``: the step of the kept draws (the averaged iterate); ``warmup_step``: the step of
    the next warmup iteration; ``log_step_avg``, ``h_avg``, ``count``: dual averaging's x̄, H̄
    and t; ``ceiling``: the chains' mean noise ceiling 2Φ(−√v/2) at the last adapted step."""

    admitted: float = math.nan
    lower: float = 0.0
    charged: float = 0.0
    target: float = TARGET_ACCEPT
    step: float = math.nan
    warmup_step: float = math.nan
    log_step_avg: float = 0.0
    h_avg: float = 0.0
    count: int = 0
    ceiling: float = 1.0

    @classmethod
    def start(
        cls,
        admitted: float,
        target: float = TARGET_ACCEPT,
        lower: float = 0.0,
        charged: float = 0.0,
    ) -> StepAdaptation:
        """Before warmup: both steps at ``admitted``; the floor is the larger of ``lower`` and
        admitted / RANGE, never above ``admitted``."""
        floor = min(max(lower, admitted / RANGE), admitted)
        return cls(admitted, floor, charged, target, admitted, admitted)

    def _clipped(self, log_step: float) -> float:
        return min(max(math.exp(log_step), self.lower), self.admitted)

    def update(self, accept_prob: np.ndarray, noise_var: np.ndarray) -> StepAdaptation:
        """After one warmup iteration: per chain ``(C,)`` the acceptance probability (0 where
        no owner was asked) and the noise variance of its step (nats²)."""
        ceiling = 2.0 * ndtr(-0.5 * np.sqrt(noise_var))
        relative = float(np.mean(accept_prob / ceiling))
        m = self.count + 1
        eta = 1.0 / (m + T0)
        h_avg = (1.0 - eta) * self.h_avg + eta * (self.target - relative)
        log_step = math.log(self.admitted) - math.sqrt(m) / GAMMA * h_avg
        log_step = min(max(log_step, math.log(self.lower)), math.log(self.admitted))
        weight = m**-KAPPA
        log_avg = weight * log_step + (1.0 - weight) * self.log_step_avg
        return replace(
            self,
            step=self._clipped(log_avg),
            warmup_step=self._clipped(log_step),
            log_step_avg=log_avg,
            h_avg=h_avg,
            count=m,
            ceiling=float(np.mean(ceiling)),
        )

    def restart(self) -> StepAdaptation:
        """The adaptation begun afresh at ``admitted`` with the same bounds and target (after a
        change of the mass matrix, whose step scale the old averages do not know)."""
        return StepAdaptation.start(self.admitted, self.target, self.lower, self.charged)

    def summary(self) -> dict[str, float | int | str | None]:
        """diagnostics.json's ``step_adaptation``: the step kept draws used and how it was
        chosen; ``bound`` says which end of [lower, admitted] it stopped within 1% of (the
        averaged iterate approaches a bound it is held at; None: neither)."""
        bound = None
        if self.count and self.step >= self.admitted * 0.99:
            bound = "admitted"
        elif self.count and self.step <= self.lower * 1.01:
            bound = "lower"
        return {
            "adapted_iterations": self.count,
            "step": self.step,
            "admitted_step": self.admitted,
            "lower_step": self.lower,
            "charged_step": self.charged or None,
            "target_accept": self.target,
            "noise_ceiling": self.ceiling,
            "bound": bound,
        }


#: The tuning of an MH state that no kernel set (``mh.init`` alone: pilots, tests): no step.
UNSET = StepAdaptation()


# ------------------------------------------------------------ mass matrix (DP-HMC's warmup)

#: Stan's windowed adaptation (iterations): the fast buffer before the first slow window, the
#: fast buffer after the last and the first slow window's length; a shorter span than their sum
#: is split 15% / 75% / 10%, and one shorter than ``MIN_SPAN`` adapts no mass.
INIT_BUFFER, TERM_BUFFER, BASE_WINDOW, MIN_SPAN = 75, 50, 25, 20
#: Stan's regularisation of a window's variance towards 1e-3 with the weight of 5 draws.
SHRINK_DRAWS, SHRINK_TARGET = 5.0, 1e-3


def mass_windows(begin: int, end: int) -> tuple[tuple[int, int], ...]:
    """Stan's slow windows ``[start, stop)`` (iteration numbers) inside warmup iterations
    ``begin`` … ``end − 1``: after a fast buffer, windows doubling from ``BASE_WINDOW``, a window
    stretched to the last slow iteration when the next one would not fit twice; then a fast
    buffer in which only the step adapts. Empty when the span is under ``MIN_SPAN``."""
    span = end - begin
    if span < MIN_SPAN:
        return ()
    init, term, size = INIT_BUFFER, TERM_BUFFER, BASE_WINDOW
    if span < init + term + size:
        init, term = int(0.15 * span), int(0.1 * span)
        size = span - init - term
    start, stop, windows = begin + init, end - term, []
    while start < stop:
        close = start + size
        if close + 2 * size >= stop:
            close = stop
        windows.append((start, close))
        start, size = close, 2 * size
    return tuple(windows)


@dataclass(frozen=True)
class Metric:
    """How a mass matrix's shape enters its window sums and estimate: ``comoment`` of the
    deviations ``(k, d)`` from the batch mean, the ``outer`` product of a mean shift ``(d,)``,
    the shrink ``target(d)`` Stan adds (times 1e-3·5/(n+5)) and the ``smallest`` scale of a
    regularised estimate (divided out so that it is 1)."""

    comoment: Callable[[np.ndarray], np.ndarray]
    outer: Callable[[np.ndarray], np.ndarray]
    target: Callable[[int], np.ndarray | float]
    smallest: Callable[[np.ndarray], float]
    identity: Callable[[int], np.ndarray]


#: The mass matrices by the ndim of M⁻¹: 1, diagonal (its entries); 2, dense (Stan's
#: ``dense_e``, docs/design.md §2.9 "Mass matrix"). Diagonal arithmetic is unchanged from
#: before the dense option, so its chains stay bit-identical.
METRICS: dict[int, Metric] = {
    1: Metric(
        comoment=lambda dev: (dev**2).sum(axis=0),
        outer=lambda delta: delta**2,
        target=lambda dim: 1.0,
        smallest=lambda reg: float(reg.min()),
        identity=np.ones,
    ),
    2: Metric(
        comoment=lambda dev: dev.T @ dev,
        outer=lambda delta: np.outer(delta, delta),
        target=np.eye,
        smallest=lambda reg: float(np.linalg.eigvalsh(reg)[0]),
        identity=np.eye,
    ),
}
#: ``sampler.adapt_mass``'s named shapes and the ndim of their M⁻¹.
SHAPES = {"diag": 1, "dense": 2}


@dataclass(frozen=True)
class MassAdaptation:
    """A mass matrix M and its warmup estimate, pooled over the chains, diagonal or dense.
    ``inv_mass``: M⁻¹, ``(d,)`` its diagonal or ``(d, d)`` dense, the regularised posterior
    (co)variance of the last window scaled so that its smallest entry (diagonal) or eigenvalue
    (dense) is 1 (the narrowest direction moves ε per unit momentum, in units of θ, as under
    M = I, and the wider ones faster: a step stable under M = I stays so; the identity: M = I;
    empty: M = I too, for a state no kernel set). ``count``, ``mean`` ``(d,)``, ``m2``
    (M⁻¹'s shape): Welford's sums over the current window's draws (all chains), ``m2`` the
    sum of squared (diagonal) or outer products (dense) of the deviations from the mean."""

    inv_mass: np.ndarray
    count: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def identity(cls, dim: int, shape: str = "diag") -> MassAdaptation:
        """M = I in ``dim`` dimensions (``shape``: a key of ``SHAPES``), nothing collected."""
        ones = METRICS[SHAPES[shape]].identity(dim)
        return cls(ones, 0, np.zeros(dim), np.zeros_like(ones))

    @property
    def _metric(self) -> Metric:
        return METRICS[self.inv_mass.ndim]

    def add(self, theta: np.ndarray) -> MassAdaptation:
        """The window's sums with the draws ``theta`` ``(C, d)`` added (Chan et al.'s merge)."""
        k = len(theta)
        mean_b = theta.mean(axis=0)
        m2_b = self._metric.comoment(theta - mean_b)
        n = self.count + k
        delta = mean_b - self.mean
        mean = self.mean + delta * (k / n)
        m2 = self.m2 + m2_b + self._metric.outer(delta) * (self.count * k / n)
        return replace(self, count=n, mean=mean, m2=m2)

    def estimate(self) -> MassAdaptation:
        """The window closed: M⁻¹ ∝ (n/(n+5))·Σ̂ + 1e-3·(5/(n+5))·I (Stan's; Σ̂ the variances
        or the covariance), smallest entry or eigenvalue 1; sums reset. Fewer than two draws
        keep the current M."""
        zeros, m2 = np.zeros_like(self.mean), np.zeros_like(self.m2)
        if self.count < 2:
            return MassAdaptation(self.inv_mass, 0, zeros, m2)
        n, metric = float(self.count), self._metric
        var = self.m2 / (n - 1.0)
        shrink = SHRINK_TARGET * (SHRINK_DRAWS / (n + SHRINK_DRAWS))
        reg = (n / (n + SHRINK_DRAWS)) * var + shrink * metric.target(len(self.mean))
        return MassAdaptation(reg / metric.smallest(reg), 0, zeros, m2)

    def inverse(self, dim: int) -> np.ndarray:
        """M⁻¹ (``(dim,)`` diagonal or ``(dim, dim)`` dense; ones for a state no kernel set)."""
        return self.inv_mass if self.inv_mass.size else np.ones(dim)


#: The mass matrix of a DP-HMC state that no kernel set (tests building states by hand): M = I.
IDENTITY = MassAdaptation(np.ones(0), 0, np.zeros(0), np.zeros(0))
