"""What the federated SG-MCMC kernels share (``sgld.py``, ``sghmc.py``, ``sgnht.py``): the step
schedule, the owners' gradient, the noise bookkeeping that counts the owners' privacy noise as
part of the injected noise, and reflection into Θ (docs/design.md §2.3; Wang, Fienberg & Smola
2015).

The kernels are pure functions over frozen state, vectorised over C chains, with the RNG
passed explicitly (the style of ``mh``). The data enter only through a *gradient function*

    grad(iteration, chains (m,), theta (m, d)) -> (G (m, d), s² (m,))

with G = Σ_k g̃_k / q_k, the unbiased estimate of Σ_x ∇ℓ(x, θ) assembled from the owners.
Owner k Poisson-samples its records at rate q_k, clips each sampled record's gradient to L2
norm C_k, sums, and adds N(0, (σ_k C_k)² I) (the owner's ``owner/compute/gradient.py``). s² = Σ_k
(σ_k C_k / q_k)² is the owner-noise variance on each coordinate of G. The kernel adds ∇log
p(θ), so g = ∇log p(θ) + G. The Poisson-subsampling noise in G is data dependent and unknown
to the coordinator; as in every SG-MCMC method it is not subtracted, and it vanishes
relative to the injected noise as the step shrinks.

Noise bookkeeping (per coordinate; the owners' noise is Gaussian with known variance s², so
it can stand in for part of the noise each method injects):

* SGLD (Welling & Teh 2011): θ ← θ + (η/2) g + ζ, with the total noise η. The owners
  contribute (η/2)² s², so ζ ~ N(0, η − (η/2)² s²).
* SGHMC (Chen, Fox & Guestrin 2014, Algorithm 2 with M = I): with h = √η (η is the
  "learning rate" of their SGD-with-momentum form, η = h²) and friction C (``friction``, per
  unit of h-time),
  r ← r + h g − hC r + ζ,  θ ← θ + h r,  ζ ~ N(0, 2(C − B̂) h I),  B̂ = ½ h V̂,
  where V̂ is the variance of the gradient noise. Derivation: in one step the gradient term
  h g carries noise of variance h² V into r. The friction needs a total momentum noise 2Ch
  per step (fluctuation–dissipation: dr = −∇U dt − C r dt + √(2C) dW), so the injected part is
  2Ch − h²V = 2(C − ½hV)h. With V̂ = s² (the owners' noise, known exactly) we inject
  2Ch − h² s², and the total is 2Ch. In the variables v = h r, α = hC, β̂ = hB̂ of
  Chen et al.'s Eq. 15 this is v ← (1 − α)v + ηg + N(0, 2(α − β̂)η) with β̂ = ½ η s².
* SGNHT (Ding et al. 2014, Algorithm 1, M = I): with h = √η and diffusion A (``friction``),
  p ← p − Ξ p h + h g + ζ,  θ ← θ + h p,  Ξ ← Ξ + (pᵀp/d − 1) h,  ζ ~ N(0, (2Ah − h² s²) I),
  Ξ₀ = A. The design momentum noise is 2Ah; the owners supply h² s² of it. The thermostat Ξ
  also absorbs any unknown gradient noise (such as the subsampling noise); that is the point
  of SGNHT.

The state holds the physical momentum (r or p) and thermostat, not the per-step v = h p and
α = hC. The per-step friction hC (or hA) therefore shrinks with the step, as in the papers'
own parameterisation, and a decaying schedule changes h without rescaling the state. (With a
*fixed* per-step friction, SGNHT's thermostat target E[v²] = η leaves a stationary variance
τ²(1 − ξ/2) on a Gaussian target, an O(ξ) bias that no step size removes.) Stability needs
hC ≤ 1 (SGHMC) and hA < ½ (SGNHT, since the momentum noise must stay below what the kinetic
target allows); a step that breaks this raises ``ValueError``.

When the owners' noise alone exceeds the design total (SGLD: (η/2)² s² > η; SGHMC:
h² s² > 2Ch; SGNHT: h² s² > 2Ah), nothing is injected. The chain then runs hotter than the
posterior (SGNHT's thermostat partly compensates), and the step reports
``excess_noise_ratio = owner variance / design variance − 1`` (0 when it fits); it is never
hidden.

Θ is a box. After each move θ is reflected into [−B, B]^d (mirror folding, any number of
times), and for SGHMC/SGNHT the momentum component of every coordinate reflected an odd
number of times is negated (an elastic bounce). Owners are only ever asked at θ inside Θ.
Reflection is exact for the continuous-time reflected diffusion, but with a finite step it
is one more discretisation error: like SG-MCMC itself, the chain is approximate, with error
shrinking as the step shrinks.

Steps: ``StepSchedule`` gives η_t = a (b + t)^(−γ) for iteration t = 0, 1, ... (γ = 0 is a
constant step a). η has units of θ² (the drift (η/2)·g is a move in θ).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import Field

from ..models import Model
from ..schema import PositiveFloat, Rate, Section, one_of
from .base import (
    EXCESS,
    NOISE_VARIANCE,
    QUERIED,
    ChainData,
    Info,
    SamplingAlgorithm,
    Sections,
    require,
)

if TYPE_CHECKING:
    from .oracle import Oracle

#: (iteration, chains (m,), theta (m, d)) -> (Σ_k g̃_k/q_k (m, d), owner-noise variance s² (m,))
GradFn = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


# ------------------------------------------------------------------ steps


@dataclass(frozen=True)
class StepSchedule:
    """η_t = a (b + t)^(−γ), t = 0, 1, ... (Wang et al. §4.1); γ = 0 gives the constant a.
    Needs a > 0, γ ≥ 0, and b > 0 when γ > 0."""

    a: float
    b: float = 1.0
    gamma: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a > 0):
            raise ValueError(f"step: a must be finite and > 0, got {self.a!r}")
        if not (math.isfinite(self.gamma) and self.gamma >= 0):
            raise ValueError(f"step: gamma must be finite and >= 0, got {self.gamma!r}")
        if not math.isfinite(self.b) or (self.gamma > 0 and self.b <= 0):
            raise ValueError(
                f"step: b must be finite and > 0 for a decaying schedule, got {self.b!r}"
            )

    @classmethod
    def constant(cls, step: float) -> StepSchedule:
        return cls(a=step)

    @classmethod
    def of(
        cls, step: float, step_schedule: str, step_decay_b: float, step_decay_gamma: float
    ) -> StepSchedule:
        """The schedule of the ``[sampler]`` keys: ``constant`` η_t = step, or ``polynomial``
        η_t = step · (b + t)^(−γ)."""
        if step_schedule == "polynomial":
            return cls(step, step_decay_b, step_decay_gamma)
        return cls.constant(step)

    def __call__(self, t: int) -> float:
        if self.gamma == 0.0:
            return float(self.a)
        return float(self.a * (self.b + t) ** (-self.gamma))


class SampledSettings(Section):
    """The ``[sampler]`` key of every kernel whose owners Poisson-sample their records."""

    sampling_rate: Rate = Field(
        default=0.01,
        description="sgld, sghmc, sgnht, hybrid, barker: each owner's Poisson sampling rate q "
        "per answer",
    )


class SGMCMCSettings(SampledSettings):
    """The ``[sampler]`` keys every SG-MCMC kernel takes besides ``step`` (``friction`` too for
    SGHMC and SGNHT: ``MomentumSettings``)."""

    step_schedule: Annotated[str, one_of("constant", "polynomial")] = Field(
        default="constant",
        description="sgld, sghmc, sgnht, hybrid: η_t = step, or η_t = step · (b + t)^−γ",
    )
    step_decay_b: PositiveFloat = Field(default=1.0, description="polynomial schedule: b")
    step_decay_gamma: PositiveFloat = Field(default=0.55, description="polynomial schedule: γ")
    clip: PositiveFloat = Field(
        default=1.0,
        description="sgld, sghmc, sgnht, hybrid: per-record gradient clip C (L2 norm); noise sd "
        "σ·C",
    )


class MomentumSettings(SGMCMCSettings):
    """The ``[sampler]`` keys of the momentum kernels (SGHMC, SGNHT): SG-MCMC's and friction."""

    friction: PositiveFloat = Field(
        default=1.0,
        description="sghmc: friction C; sgnht: diffusion A (per unit of h = √η; needs "
        "h·friction ≤ 1 for sghmc, < ½ for sgnht)",
    )


# ------------------------------------------------------------------ what a step did


@dataclass(frozen=True)
class SGInfo:
    """What one step did. ``step``: η_t. Per chain ``(C,)``: ``owner_noise_var`` (s² on each
    coordinate of g), ``owner_var`` (the part of the design noise variance the owners supplied),
    ``injected_var`` (variance of the noise the coordinator added, per coordinate),
    ``excess_noise_ratio`` (owner_var / design variance − 1, or 0), and ``reflected`` (some
    coordinate hit the boundary of Θ)."""

    step: float
    owner_noise_var: np.ndarray
    owner_var: np.ndarray
    injected_var: np.ndarray
    excess_noise_ratio: np.ndarray
    reflected: np.ndarray


# ------------------------------------------------------------------ helpers


def reflect(theta: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Fold ``theta`` ``(C, d)`` into [−bound, bound] by mirror reflection at the faces, any
    number of times. Returns the folded array and ``folds`` ``(C, d)`` (float): the signed
    number of folds k. The coordinate hit a face |k| times, and its direction of motion is
    reversed where k is odd."""
    width = 2.0 * bound
    shifted = theta + bound
    k = np.floor(shifted / width)
    r = shifted - k * width  # in [0, width)
    odd = np.fmod(k, 2.0) != 0
    return np.clip(np.where(odd, width - r, r) - bound, -bound, bound), k


#: Relative excess below which the owners' noise counts as fitting (floating-point rounding, as
#: when the step is exactly the admissible one computed from the same σ, q and clip).
EXCESS_TOLERANCE = 1e-12


def noise_split(design_var: float, owner_var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Injected variance max(design − owner, 0) and excess ratio max(owner/design − 1, 0)
    (0 within ``EXCESS_TOLERANCE``)."""
    injected = np.maximum(design_var - owner_var, 0.0)
    excess = owner_var / design_var - 1.0
    return injected, np.where(excess > EXCESS_TOLERANCE, excess, 0.0)


def gradient(
    state_theta: np.ndarray, iteration: int, model: Model, grad: GradFn
) -> tuple[np.ndarray, np.ndarray]:
    """g = ∇log p(θ) + G for all chains, and s² ``(C,)``."""
    chains = np.arange(len(state_theta))
    lik, s2 = grad(iteration, chains, state_theta)
    lik = np.asarray(lik, dtype=float)
    s2 = np.broadcast_to(np.asarray(s2, dtype=float), (len(state_theta),)).copy()
    if lik.shape != state_theta.shape:
        raise ValueError(f"gradient must have shape {state_theta.shape}, got {lik.shape}")
    if not (np.all(np.isfinite(lik)) and np.all(np.isfinite(s2)) and np.all(s2 >= 0)):
        raise ValueError("gradient and its noise variance must be finite (variance >= 0)")
    return model.grad_log_prior(state_theta) + lik, s2


def check_finite(kernel: str, iteration: int, *arrays: np.ndarray) -> None:
    """``FloatingPointError`` when an update left a non-finite value: the discretisation is
    unstable (step too large for the curvature or the gradient noise)."""
    if not all(np.all(np.isfinite(a)) for a in arrays):
        raise FloatingPointError(
            f"{kernel} diverged at iteration {iteration}: the step is too large for the "
            "curvature and gradient noise; reduce it"
        )


def check_start(theta: np.ndarray, model: Model) -> np.ndarray:
    """``theta`` as a float ``(C, d)`` array; ``ValueError`` unless it lies inside Θ."""
    theta = np.array(theta, dtype=float, ndmin=2)
    if theta.shape[1] != model.dim or not np.all(model.in_theta_space(theta)):
        raise ValueError(f"initial points must have shape (C, {model.dim}) and lie inside Θ")
    return theta


#: The fields an SG-MCMC step reports: no accept step; the excess noise is counted, not kept.
INFO = (QUERIED, NOISE_VARIANCE, EXCESS)


def record(info: SGInfo) -> Info:
    """The driver's record of an SG-MCMC step (``INFO``): every chain asked."""
    return {
        QUERIED.name: np.ones(len(info.owner_noise_var), dtype=bool),
        NOISE_VARIANCE.name: info.owner_noise_var,
        EXCESS.name: info.excess_noise_ratio,
    }


def build_kernel(
    kernel: str,
    model: Model,
    data: ChainData,
    settings: Mapping[str, Any],
    init: Callable[[np.random.Generator, np.ndarray], Any],
    step: Callable[[np.random.Generator, Any, StepSchedule, GradFn], tuple[Any, SGInfo]],
) -> SamplingAlgorithm:
    """An SG-MCMC kernel over the owners behind ``data.oracle``: ``init(rng, theta0)`` and
    ``step(rng, state, schedule, grad)`` with the schedule and the owners' gradient built from
    ``settings`` (``step`` and ``SGMCMCSettings``'s keys)."""
    schedule = StepSchedule.of(
        settings["step"],
        settings["step_schedule"],
        settings["step_decay_b"],
        settings["step_decay_gamma"],
    )
    grad = oracle_gradient(data.require_oracle(kernel), settings["sampling_rate"], settings["clip"])

    def advance(rng: np.random.Generator, state: Any) -> tuple[Any, Info]:
        new, info = step(rng, state, schedule, grad)
        return new, record(info)

    def step_sizes(state: Any, warmup: int, shape: tuple[int, int]) -> dict[str, np.ndarray]:
        """The kept draws' ``step_size`` η_t ``(C, draws)`` (units of θ²), t = warmup + k."""
        eta = [schedule(warmup + k) for k in range(shape[1])]
        return {"step_size": np.broadcast_to(np.array(eta), shape)}

    return SamplingAlgorithm(init, advance, INFO, derived=step_sizes)


# ------------------------------------------------------------------ momentum kernels (SGHMC, SGNHT)


def check_friction(kernel: str, friction: float, h: float) -> float:
    """``friction`` as a float; ``ValueError`` unless finite and > 0 with per-step friction
    h·friction ≤ 1 (SGHMC) or < ½ (SGNHT)."""
    if not (math.isfinite(friction) and friction > 0.0):
        raise ValueError(f"{kernel} friction must be finite and > 0, got {friction!r}")
    per_step = h * friction
    if (kernel == "sghmc" and per_step > 1.0) or (kernel == "sgnht" and per_step >= 0.5):
        rule = "<= 1" if kernel == "sghmc" else "< 0.5"
        raise ValueError(
            f"{kernel}: per-step friction h·friction = {per_step:.4g} (h = √step) must be {rule}; "
            "reduce the step or the friction"
        )
    return float(friction)


@dataclass(frozen=True)
class MomentumKick:
    """The parts of one momentum step: ``eta`` = η_t, ``h`` = √η, ``friction`` (checked), the
    full gradient ``g`` ``(C, d)`` and the injected ``noise`` ``(C, d)``, and the partial
    ``SGInfo`` fields (owner noise variance s², owner and injected variance, excess)."""

    eta: float
    h: float
    friction: float
    g: np.ndarray
    noise: np.ndarray
    s2: np.ndarray
    owner_var: np.ndarray
    injected: np.ndarray
    excess: np.ndarray


def momentum_kick(
    rng: np.random.Generator,
    kernel: str,
    theta: np.ndarray,
    iteration: int,
    model: Model,
    schedule: StepSchedule,
    grad: GradFn,
    friction: float,
) -> MomentumKick:
    """h = √η_t; g = ∇log p + G; momentum noise ζ ~ N(0, max(2·friction·h − h² s², 0) I): the
    design momentum noise 2·friction·h, of which the owners supply h² s²."""
    eta = schedule(iteration)
    h = math.sqrt(eta)
    c = check_friction(kernel, friction, h)
    g, s2 = gradient(theta, iteration, model, grad)
    owner_var = eta * s2
    injected, excess = noise_split(2.0 * c * h, owner_var)
    noise = np.sqrt(injected)[:, None] * rng.standard_normal(theta.shape)
    return MomentumKick(eta, h, c, g, noise, s2, owner_var, injected, excess)


def move(
    kernel: str,
    kick: MomentumKick,
    theta: np.ndarray,
    momentum: np.ndarray,
    iteration: int,
    model: Model,
    *extra: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, SGInfo]:
    """θ ← reflect(θ + h·momentum), with the momentum of every coordinate reflected an odd
    number of times negated (an elastic bounce); ``FloatingPointError`` when ``momentum`` or
    ``extra`` left the finite range. Returns θ, momentum and the step's ``SGInfo``."""
    check_finite(kernel, iteration, momentum, *extra)
    theta, folds = reflect(theta + kick.h * momentum, model.theta_bound)
    momentum = np.where(np.fmod(folds, 2.0) != 0, -momentum, momentum)
    info = SGInfo(
        kick.eta, kick.s2, kick.owner_var, kick.injected, kick.excess, (folds != 0).any(axis=1)
    )
    return theta, momentum, info


def check_momentum_friction(sections: Sections, kernel: str, limit: float, rule: str) -> None:
    """Scenario check of SGHMC/SGNHT: sampler.friction × √(first step) within ``limit``."""
    sampler = sections["sampler"]
    first_step = sampler["step"] * (
        sampler["step_decay_b"] ** -sampler["step_decay_gamma"]
        if sampler["step_schedule"] == "polynomial"
        else 1.0
    )
    per_step = math.sqrt(first_step) * sampler["friction"]
    require(
        per_step < limit or (rule == "at most 1" and per_step == limit),
        f"sampler.friction × √(first step) = {per_step:.4g} must be {rule} for {kernel} "
        "(h·friction is the friction per step); reduce sampler.step or sampler.friction",
    )


# ------------------------------------------------------------------ oracle


def oracle_gradient(oracle: Oracle, sampling_rate: float, clip: float) -> GradFn:
    """The gradient function of owners behind ``oracle`` in an ``sgmcmc`` session opened at
    ``sampling_rate`` q: each owner k answers Σ over its Poisson(q) sample of ∇ℓ clipped to L2
    norm ``clip``, plus N(0, (σ_k·clip)² I), and declares its noise sd σ_k·clip. Returns
    G = Σ_k answer_k / q ``(m, d)`` and s² = Σ_k (noise sd_k / q)² per chain ``(m,)``."""
    q = float(sampling_rate)

    def grad(
        iteration: int, chains: np.ndarray, theta: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        total, variance = oracle.gradient(iteration, chains, theta, clip).total()
        return total / q, np.full(len(chains), variance / q**2)

    return grad
