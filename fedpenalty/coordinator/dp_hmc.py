"""DP-HMC (Räisä, Koskela & Honkela, "Differentially private Hamiltonian Monte Carlo"):
Hamiltonian Monte Carlo whose leapfrog runs on the owners' clipped, noised gradient sums and
whose accept/reject is the penalty test on their clipped, noised log-likelihood ratios
(docs/design.md §2.9).

Pure functions over frozen state, vectorised over C chains, RNG passed explicitly (the style
of ``mh`` and ``sgmcmc``). The data enter only through two functions, so the mathematics is
the same whether the owners answer (``oracle_gradient``, ``oracle_ratio``) or a test or
scenario computes the sums on pooled records (``pooled_gradient``, ``pooled_ratio``):

    grad(iteration, substep, chains (m,), theta (m, d)) -> (G (m, d), s_g² (m,))
    ratio(iteration, chains (m,), theta (m, d), theta_prop (m, d)) -> (λ̂ (m,), s² (m,))

G = Σ_k (Σ_x clip_c(∇ℓ(x, θ)) + N(0, s_{g,k}² I)) and s_g² = Σ_k s_{g,k}² its noise variance
per coordinate; λ̂ = Σ_k (Σ_x clip_r(ℓ(x, θ') − ℓ(x, θ)) + N(0, s_k²)) and s² = Σ_k s_k².

One iteration, per chain (mass M, I unless adapted, diagonal or dense; step ε = ``step`` × (1 −
j·u), u ~ U(0, 1), j = ``jitter``): p ~ N(0, M); L leapfrog steps θ += ε M⁻¹p, p += ε g̃ with
the noisy gradient g̃ = ∇log p(θ) + G (the gradient at the current θ is the one kept in the
state: asked once at the start and then taken from the accepted end point or kept on a
rejection);
then

    log α = log p(θ_L) − log p(θ) + λ̂ − s²/2 − ½ p_Lᵀ M⁻¹ p_L + ½ pᵀ M⁻¹ p,

accepted when log U < log α. A trajectory that leaves Θ is rejected at once: the owners are
asked nothing more for that chain in the iteration (neither gradients nor the ratio).

The first ``warmup_descent`` warmup iterations *descend* instead (``descend``): the same L
leapfrog steps from rest (p = 0), kept without a ratio test, so each ends no higher in
potential than it started (up to the gradient noise) and a far start reaches the mode's basin,
which the clipped ratio test cannot do (docs/design.md §2.9, "Far starts"). With
``adapt_mass`` the warmup after the descent estimates M⁻¹ from the chains' own draws in Stan's
windows (``adapt.mass_windows``) and restarts the step adaptation after each (§2.9, "Mass
matrix"): coordinator-side work on released answers, no privacy cost.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

import numpy as np
from pydantic import Field
from scipy.linalg import solve_triangular

from ..errors import ConfigError
from ..kinds import KINDS
from ..models import Model
from ..schema import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, Rate, refusal
from . import mh, prior_gibbs
from .adapt import IDENTITY, MIN_SPAN, UNSET, MassAdaptation, StepAdaptation, mass_windows
from .base import (
    ACCEPTED,
    KERNEL_KEYS,
    NOISE_VARIANCE,
    QUERIED,
    ChainAlgorithm,
    ChainData,
    Info,
    InfoField,
    SamplingAlgorithm,
    Sections,
    planned_steps,
    require,
)
from .mh import RatioFn

if TYPE_CHECKING:
    from .oracle import Oracle


class GradFn(Protocol):
    """(iteration, substep, chains (m,), theta (m, d)) -> (G (m, d), s_g² (m,)): the noisy
    clipped likelihood-gradient sum (no prior) and its noise variance per coordinate."""

    def __call__(
        self, iteration: int, substep: int, chains: np.ndarray, theta: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...


#: The protocol-v2 names of the kinds DP-HMC asks (docs/design.md §6 "A query kind").
GRADIENT_KIND, RATIO_KIND = "clipped_gradient", "clipped_log_ratio"


#: ``sampler.adapt_mass``: false (M = I), true or "diag" (diagonal M), "dense" (dense M).
MassOption = Annotated[
    Annotated[bool, Field(strict=True)] | Literal["diag", "dense"],
    refusal("true, false, 'diag' or 'dense'"),
]
#: The mass-matrix shape (``adapt.SHAPES``) of each adapting ``sampler.adapt_mass`` value.
MASS_SHAPES: dict[bool | str, str] = {True: "diag", "diag": "diag", "dense": "dense"}


class DPHMCSettings(mh.MHSettings):
    """The ``[sampler]`` keys of ``dp_hmc`` besides ``step`` (the largest leapfrog step, units
    of θ) and MH's warmup adaptation of it (``adapt_step``, ``target_accept``). Its ratio clip
    is its own key: penalty's ``ratio_clip`` defaults to 0 (the Lipschitz route), which has no
    meaning for DP-HMC."""

    leapfrog_steps: PositiveInt = Field(
        default=10,
        description="dp_hmc: leapfrog steps L per iteration (L gradient answers per chain and "
        "iteration, plus one at the start)",
    )
    grad_clip: PositiveFloat = Field(
        default=5.0,
        description="dp_hmc: per-record gradient clip (L2 norm, nats per unit of θ); the "
        "owners' noise sd is their clipped_gradient_noise_multiplier × grad_clip",
    )
    hmc_ratio_clip: PositiveFloat = Field(
        default=0.01,
        description="dp_hmc: per-record log-likelihood-ratio clip (nats); the owners' noise sd "
        "is their ratio_noise_multiplier × hmc_ratio_clip; the chain samples the "
        "clipped-likelihood posterior (the posterior itself when no record's term is clipped)",
    )
    hmc_ratio_clip_per_distance: NonNegativeFloat = Field(
        default=0.0,
        description="dp_hmc: > 0 clips each record's log-likelihood ratio at this × ‖θ' − θ‖ "
        "(nats per unit of θ; the paper's form) instead of at hmc_ratio_clip, so each chain's "
        "bound and ratio noise sd (ratio_noise_multiplier × this × ‖θ' − θ‖) scale with its "
        "move at the same cost per answer; 0: the absolute hmc_ratio_clip",
    )
    step_jitter: Rate = Field(
        default=0.2,
        description="dp_hmc: each iteration's leapfrog step is step × (1 − jitter·u), "
        "u ~ U(0, 1) per chain, jitter in (0, 1] (breaks periodic trajectories; the paper's "
        "code uses 1)",
    )
    warmup_descent: NonNegativeInt = Field(
        default=50,
        description="dp_hmc: the first warmup iterations (at most sampler.warmup) run their L "
        "leapfrog steps from rest and keep the end point without a ratio test: a descent that "
        "brings far starts to the mode (L gradient answers each, no ratio); 0: none",
    )
    adapt_mass: MassOption = Field(
        default=False,
        description="dp_hmc: estimate a mass matrix during warmup after the descent (Stan's "
        "windows, pooled over the chains) and restart the step adaptation after each window; "
        "true or 'diag': diagonal, the regularised variances with the smallest scaled to 1 (so "
        "step stays the narrowest coordinate's leapfrog step in units of θ, the wider ones "
        "moving faster); 'dense': the regularised covariance, its smallest eigenvalue scaled "
        "to 1 (for correlated posteriors); false: M = I; needs sampler.warmup − "
        "warmup_descent ≥ 20; no privacy cost",
    )


@dataclass(frozen=True)
class HMCState:
    """``theta`` ``(C, d)`` inside Θ, its ``log_prior`` ``(C,)``, the owners' noisy gradient
    sum ``grad`` ``(C, d)`` at ``theta`` (likelihood only) with its noise variance
    ``grad_var`` ``(C,)``, the next ``iteration`` (it keys the owners' answers) and the
    leapfrog step with its warmup adaptation (``tuning``) and the mass matrix (diagonal or
    dense) with its warmup estimate (``metric``; checkpoints carry both)."""

    theta: np.ndarray
    log_prior: np.ndarray
    grad: np.ndarray
    grad_var: np.ndarray
    iteration: int = 0
    tuning: StepAdaptation = UNSET
    metric: MassAdaptation = IDENTITY

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)``."""
        return self.theta

    @property
    def inv_mass(self) -> np.ndarray:
        """M⁻¹: ``(d,)`` its diagonal or ``(d, d)`` dense."""
        return self.metric.inverse(self.theta.shape[1])

    def with_tuning(self, tuning: StepAdaptation) -> HMCState:
        return replace(self, tuning=tuning)


@dataclass(frozen=True)
class HMCInfo:
    """What one iteration did, per chain ``(C,)``: ``accepted``; ``queried`` (the trajectory
    stayed in Θ and the ratio was asked); ``noise_var`` (s² of the ratio; 0 where not asked);
    ``grad_var`` (s_g² of the last gradient asked); ``accept_prob`` (min{1, e^{log α}}, 0
    where not asked); ``gradients`` (gradient answers asked in the iteration)."""

    accepted: np.ndarray
    queried: np.ndarray
    noise_var: np.ndarray
    grad_var: np.ndarray
    accept_prob: np.ndarray
    gradients: np.ndarray


def init(theta: np.ndarray, model: Model, grad: GradFn) -> HMCState:
    """Start C chains at ``theta`` ``(C, d)`` inside Θ: the owners' gradient there is asked
    once, at iteration 0, sub-step 0 (the leapfrog steps of iteration t are sub-steps 1 … L)."""
    theta = np.array(theta, dtype=float, ndmin=2)
    if theta.shape[1] != model.dim or not np.all(model.in_theta_space(theta)):
        raise ValueError(f"initial points must have shape (C, {model.dim}) and lie inside Θ")
    g, s2 = _checked(grad(0, 0, np.arange(len(theta)), theta), theta.shape)
    return HMCState(
        theta, model.log_prior(theta), g, s2, 0, metric=MassAdaptation.identity(model.dim)
    )


def _checked(answer: tuple[np.ndarray, np.ndarray], shape: tuple[int, ...]):
    """A gradient answer as float arrays ``(m, d)``, ``(m,)``; ``ValueError`` when malformed."""
    g = np.asarray(answer[0], dtype=float)
    s2 = np.broadcast_to(np.asarray(answer[1], dtype=float), shape[:1]).copy()
    if g.shape != shape:
        raise ValueError(f"gradient must have shape {shape}, got {g.shape}")
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(s2)) and np.all(s2 >= 0)):
        raise ValueError("gradient and its noise variance must be finite (variance >= 0)")
    return g, s2


@dataclass
class _Trajectory:
    """The leapfrog in progress (mutable, local to one ``step``): position ``q``, momentum
    ``p``, the likelihood gradient at ``q`` with its variance, and which chains are still
    inside Θ (``alive``) and how many gradients each asked."""

    q: np.ndarray
    p: np.ndarray
    grad: np.ndarray
    grad_var: np.ndarray
    alive: np.ndarray
    asked: np.ndarray


def leapfrog(
    state: HMCState, model: Model, grad: GradFn, p0: np.ndarray, eps: np.ndarray, steps: int
) -> _Trajectory:
    """L leapfrog steps of size ``eps`` ``(C,)`` from (θ, ``p0``) on g̃ = ∇log p + G: half
    kick, then per step a drift ε M⁻¹p, the owners' gradient at the new position (sub-step j)
    and a kick (half at the last). A chain whose position leaves Θ stops; nobody is asked for
    it."""
    t = _Trajectory(
        state.theta.copy(),
        p0.copy(),
        state.grad.copy(),
        state.grad_var.copy(),
        np.ones(len(p0), dtype=bool),
        np.zeros(len(p0), dtype=int),
    )
    e, inv_mass = eps[:, None], state.inv_mass
    with np.errstate(over="ignore", invalid="ignore"):
        t.p += 0.5 * e * (model.grad_log_prior(t.q) + t.grad)
        for j in range(1, steps + 1):
            live = np.flatnonzero(t.alive)
            t.q[live] += drift(e[live], t.p[live], inv_mass)
            t.alive[live] = model.in_theta_space(t.q[live])
            live = np.flatnonzero(t.alive)
            if not live.size:
                break
            g, s2 = _checked(grad(state.iteration, j, live, t.q[live]), (live.size, model.dim))
            t.grad[live], t.grad_var[live], t.asked[live] = g, s2, t.asked[live] + 1
            kick = 0.5 if j == steps else 1.0
            t.p[live] += kick * e[live] * (model.grad_log_prior(t.q[live]) + g)
    return t


def step(
    rng: np.random.Generator,
    state: HMCState,
    model: Model,
    grad: GradFn,
    ratio: RatioFn,
    eps: float,
    steps: int,
    jitter: float,
) -> tuple[HMCState, HMCInfo]:
    """One DP-HMC iteration for all chains at leapfrog step ``eps`` (units of θ): momentum,
    ``steps`` leapfrog steps on the owners' noisy gradients, the penalty test on their noisy
    clipped ratio λ̂ with the correction −s²/2 (docs/design.md §2.9)."""
    if not (np.isfinite(eps) and eps > 0):  # warmup adaptation at a noise ceiling of 0 gives NaN
        raise ValueError(
            f"dp_hmc: the leapfrog step is {eps!r}; the owners' ratio noise s² is too large for "
            "the acceptance test (lower sampler.hmc_ratio_clip or the ratio noise multiplier)"
        )
    c, inv_mass = len(state.theta), state.inv_mass
    p0 = momentum(rng.standard_normal(state.theta.shape), inv_mass)
    step_sizes = eps * (1.0 - jitter * rng.random(c))
    log_u = np.log(rng.random(c))
    t = leapfrog(state, model, grad, p0, step_sizes, steps)
    idx = np.flatnonzero(t.alive)
    accepted, noise_var, accept_prob = np.zeros(c, bool), np.zeros(c), np.zeros(c)
    theta, log_prior = state.theta.copy(), state.log_prior.copy()
    g_kept, v_kept = state.grad.copy(), state.grad_var.copy()
    if idx.size:
        lam, s2 = ratio(state.iteration, idx, state.theta[idx], t.q[idx])
        lp = model.log_prior(t.q[idx])
        kinetic = kinetic_energy(p0[idx], inv_mass) - kinetic_energy(t.p[idx], inv_mass)
        log_alpha = lp - state.log_prior[idx] + lam - 0.5 * s2 + kinetic
        log_alpha = np.where(np.isfinite(log_alpha), log_alpha, -np.inf)
        passed = log_u[idx] < log_alpha
        acc = idx[passed]
        accepted[acc], noise_var[idx] = True, s2
        accept_prob[idx] = np.exp(np.minimum(log_alpha, 0.0))
        theta[acc], log_prior[acc] = t.q[acc], lp[passed]
        g_kept[acc], v_kept[acc] = t.grad[acc], t.grad_var[acc]
    new = replace(
        state,
        theta=theta,
        log_prior=log_prior,
        grad=g_kept,
        grad_var=v_kept,
        iteration=state.iteration + 1,
    )
    return new, HMCInfo(accepted, t.alive, noise_var, t.grad_var, accept_prob, t.asked)


@dataclass(frozen=True)
class Kinetics:
    """The Gaussian kinetic energy of one shape of M⁻¹ (docs/design.md §2.9, "Mass matrix"):
    ``momentum(z, M⁻¹)``: p ~ N(0, M) from z ~ N(0, I) ``(C, d)``; ``drift(ε (m, 1), p, M⁻¹)``:
    the position step εM⁻¹p ``(m, d)``; ``energy(p, M⁻¹)``: ½pᵀM⁻¹p ``(m,)``."""

    momentum: Callable[[np.ndarray, np.ndarray], np.ndarray]
    drift: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    energy: Callable[[np.ndarray, np.ndarray], np.ndarray]


def _dense_momentum(z: np.ndarray, inv_mass: np.ndarray) -> np.ndarray:
    """p = L⁻ᵀz with M⁻¹ = LLᵀ (Cholesky; a triangular solve): Cov p = (LLᵀ)⁻¹ = M."""
    chol = np.linalg.cholesky(inv_mass)
    return solve_triangular(chol, z.T, lower=True, trans="T").T


#: By the ndim of M⁻¹: 1 diagonal (its entries; the arithmetic of before the dense option, so
#: diagonal chains stay bit-identical), 2 dense.
KINETICS: dict[int, Kinetics] = {
    1: Kinetics(
        momentum=lambda z, inv_mass: z / np.sqrt(inv_mass),
        drift=lambda e, p, inv_mass: e * inv_mass * p,
        energy=lambda p, inv_mass: 0.5 * np.sum(inv_mass * p**2, axis=1),
    ),
    2: Kinetics(
        momentum=_dense_momentum,
        drift=lambda e, p, inv_mass: e * (p @ inv_mass),
        energy=lambda p, inv_mass: 0.5 * np.sum(p * (p @ inv_mass), axis=1),
    ),
}


def momentum(z: np.ndarray, inv_mass: np.ndarray) -> np.ndarray:
    """Momenta p ~ N(0, M) ``(C, d)`` from standard normals ``z`` ``(C, d)``."""
    return KINETICS[inv_mass.ndim].momentum(z, inv_mass)


def drift(e: np.ndarray, p: np.ndarray, inv_mass: np.ndarray) -> np.ndarray:
    """The leapfrog's position step εM⁻¹p ``(m, d)`` for steps ``e`` ``(m, 1)``."""
    return KINETICS[inv_mass.ndim].drift(e, p, inv_mass)


def kinetic_energy(p: np.ndarray, inv_mass: np.ndarray) -> np.ndarray:
    """½ pᵀ M⁻¹ p per chain ``(m,)`` for momenta ``p`` ``(m, d)`` and M⁻¹ (``(d,)``
    diagonal or ``(d, d)`` dense)."""
    return KINETICS[inv_mass.ndim].energy(p, inv_mass)


def descend(
    state: HMCState, model: Model, grad: GradFn, eps: float, steps: int
) -> tuple[HMCState, HMCInfo]:
    """One descent iteration (warmup only): ``steps`` leapfrog steps of size ``eps`` from rest
    (p = 0), the end point kept for every chain whose trajectory stayed in Θ (the others stay).
    From rest the potential at the end is the start's minus the kinetic energy gained (up to
    the gradient noise and the discretisation), so the chains fall towards the mode. No ratio
    is asked; ``accepted`` says which chains moved."""
    c = len(state.theta)
    t = leapfrog(state, model, grad, np.zeros_like(state.theta), np.full(c, eps), steps)
    moved = t.alive
    theta = np.where(moved[:, None], t.q, state.theta)
    g_kept = np.where(moved[:, None], t.grad, state.grad)
    v_kept = np.where(moved, t.grad_var, state.grad_var)
    new = replace(
        state,
        theta=theta,
        log_prior=model.log_prior(theta),
        grad=g_kept,
        grad_var=v_kept,
        iteration=state.iteration + 1,
    )
    none = np.zeros(c)
    return new, HMCInfo(moved, np.zeros(c, bool), none, t.grad_var, none, t.asked)


GRADIENT_NOISE = InfoField(
    "gradient_noise_variance",
    np.float64,
    "noise variance of the owners' gradient sum, per coordinate ((nats per unit of θ)²)",
    fill=np.nan,
)
GRADIENTS = InfoField("gradient_answers", np.int64, "gradient answers asked per chain")
#: The fields a DP-HMC step reports (posterior.nc's sample_stats order).
INFO = (QUERIED, ACCEPTED, NOISE_VARIANCE, GRADIENT_NOISE, GRADIENTS)


def record(info: HMCInfo) -> Info:
    """The driver's record of a DP-HMC step (``INFO``)."""
    return {
        QUERIED.name: info.queried,
        ACCEPTED.name: info.accepted,
        NOISE_VARIANCE.name: np.where(info.queried, info.noise_var, np.nan),
        GRADIENT_NOISE.name: info.grad_var,
        GRADIENTS.name: info.gradients,
    }


def adapt_metric(state: HMCState, windows: tuple[tuple[int, int], ...], restart: bool) -> HMCState:
    """After warmup iteration ``state.iteration − 1``: its draws added to the mass matrix's
    window when one of ``windows`` holds it; at a window's end M⁻¹ re-estimated and, when
    ``restart``, the step adaptation begun afresh (docs/design.md §2.9, "Mass matrix")."""
    done = state.iteration - 1
    window = next((w for w in windows if w[0] <= done < w[1]), None)
    if window is None:
        return state
    metric = state.metric.add(state.theta)
    if state.iteration < window[1]:
        return replace(state, metric=metric)
    tuning = state.tuning.restart() if restart else state.tuning
    return replace(state, metric=metric.estimate(), tuning=tuning)


def kernel(
    model: Model,
    grad: GradFn,
    ratio: RatioFn,
    tuning: StepAdaptation,
    *,
    leapfrog_steps: int,
    step_jitter: float,
    adapt: bool,
    descent: int = 0,
    ceiling: bool = True,
    windows: tuple[tuple[int, int], ...] = (),
    mass: str = "diag",
    prior_only: tuple[int, ...] = (),
) -> SamplingAlgorithm:
    """DP-HMC over ``grad`` and ``ratio`` as a built algorithm: its leapfrog step from
    ``tuning`` (adapted during warmup when ``adapt``, as ``mh.tuned`` does for MH); the first
    ``descent`` iterations descend from rest (``descend``; the caller keeps them in warmup).
    ``ceiling``: adapt the acceptance relative to the noise ceiling 2Φ(−s/2); False for a ratio
    noise sd ∝ ‖θ' − θ‖, which vanishes with the step (the plain acceptance then).
    ``windows``: the warmup iterations ``[start, stop)`` whose draws estimate the mass matrix
    (``adapt.mass_windows``; none: M = I throughout); ``mass``: the shape of M estimated in
    them (a key of ``adapt.SHAPES``); ``prior_only``: coordinates no record's likelihood
    touches, redrawn from their prior conditional after every iteration but the descent's
    (``prior_gibbs``: exact, and no owner is asked)."""

    def move(rng: np.random.Generator, state: HMCState, eps: float):
        new, info = step(rng, state, model, grad, ratio, eps, leapfrog_steps, step_jitter)
        if not prior_only:
            return new, info
        theta, log_prior = prior_gibbs.update(rng, new.theta, new.log_prior, model, prior_only)
        return replace(new, theta=theta, log_prior=log_prior), info

    def start(rng: np.random.Generator, theta0: np.ndarray) -> HMCState:
        state = init(theta0, model, grad).with_tuning(tuning)
        return replace(state, metric=MassAdaptation.identity(model.dim, mass))

    def kept(rng: np.random.Generator, state: HMCState) -> tuple[HMCState, Info]:
        new, info = move(rng, state, state.tuning.step)
        return new, record(info)

    def warming(rng: np.random.Generator, state: HMCState) -> tuple[HMCState, Info]:
        if state.iteration < descent:
            new, info = descend(state, model, grad, state.tuning.warmup_step, leapfrog_steps)
            return new, record(info)
        if not adapt:
            new, info = move(rng, state, state.tuning.step)
        else:
            new, info = move(rng, state, state.tuning.warmup_step)
            noise_var = info.noise_var if ceiling else np.zeros_like(info.noise_var)
            new = new.with_tuning(new.tuning.update(info.accept_prob, noise_var))
        return adapt_metric(new, windows, adapt), record(info)

    warmup = warming if adapt or descent or windows else None
    return SamplingAlgorithm(start, kept, INFO, warmup, mh.step_sizes)


def build(
    model: Model,
    data: ChainData,
    *,
    step: float,
    adapt_step: bool,
    target_accept: float,
    leapfrog_steps: int,
    grad_clip: float,
    hmc_ratio_clip: float,
    step_jitter: float,
    warmup_descent: int,
    warmup: int,
    hmc_ratio_clip_per_distance: float = 0.0,
    adapt_mass: bool | str = False,
) -> SamplingAlgorithm:
    """DP-HMC through the owners behind ``data.oracle``: ``step`` is the largest leapfrog step
    (units of θ; adapted below it during warmup when ``adapt_step``), the first
    min(``warmup_descent``, ``warmup``) iterations descend; the ratio is clipped at
    ``hmc_ratio_clip_per_distance`` × ‖θ' − θ‖ when that is > 0, else at ``hmc_ratio_clip``.
    The clipped kinds' cost does not depend on the step, so the step is free of the privacy
    budget; nor does the mass matrix (``adapt_mass``: true or "diag", a diagonal one, "dense",
    a dense one, estimated in Stan's windows between the descent and the end of warmup)."""
    oracle = data.require_oracle("dp_hmc")
    per_distance = hmc_ratio_clip_per_distance > 0
    descent = min(warmup_descent, warmup)
    return kernel(
        model,
        without(oracle_gradient(oracle, grad_clip), model.prior_only_coordinates),
        oracle_ratio(
            oracle, hmc_ratio_clip_per_distance if per_distance else hmc_ratio_clip, per_distance
        ),
        StepAdaptation.start(step, target_accept),
        leapfrog_steps=leapfrog_steps,
        step_jitter=step_jitter,
        adapt=adapt_step,
        descent=descent,
        ceiling=not per_distance,
        windows=mass_windows(descent, warmup) if adapt_mass else (),
        mass=MASS_SHAPES.get(adapt_mass, "diag"),
        prior_only=model.prior_only_coordinates,
    )


# ------------------------------------------------------------------ where the sums come from


def oracle_gradient(oracle: Oracle, clip: float) -> GradFn:
    """The owners' ``clipped_gradient`` answers summed: G = Σ_k answer_k ``(m, d)`` and
    s_g² = Σ_k (σ_k·clip)² per chain ``(m,)`` (the sd each owner declares)."""

    def grad(iteration: int, substep: int, chains: np.ndarray, theta: np.ndarray):
        answers = oracle.query(
            GRADIENT_KIND, iteration, chains, substep=substep, theta=theta, clip=clip
        )
        total, variance = answers.total()
        return total, np.full(len(chains), variance)

    return grad


def without(grad: GradFn, coordinates: tuple[int, ...]) -> GradFn:
    """``grad`` with its sum set to 0 in ``coordinates`` (``Model.prior_only_coordinates``:
    no record's gradient is non-zero there, so those entries of the sum are the owners' noise
    alone). A fixed function of the answers, so the leapfrog stays a composition of shears and
    the chain exact (docs/design.md §2.9, "Prior-only coordinates")."""
    if not coordinates:
        return grad
    drop = np.asarray(coordinates, dtype=np.int64)

    def masked(iteration: int, substep: int, chains: np.ndarray, theta: np.ndarray):
        total, variance = grad(iteration, substep, chains, theta)
        total = np.array(total, dtype=float)
        total[:, drop] = 0.0
        return total, variance

    return masked


def oracle_ratio(oracle: Oracle, clip: float, per_distance: bool = False) -> RatioFn:
    """The owners' ``clipped_log_ratio`` answers summed: λ̂ ``(m,)`` and s² = Σ_k (σ_k·clip)².
    ``per_distance``: ``clip`` is per unit of ‖θ' − θ‖ and the owners answer the difference
    quotient, so λ̂ = ‖θ' − θ‖ × their sum and s² = ‖θ' − θ‖² Σ_k (σ_k·clip)² per chain
    (docs/design.md §2.9)."""
    name = "clip_per_distance" if per_distance else "clip"

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        arrays: dict[str, Any] = {"theta": theta, "theta_prop": theta_prop, name: clip}
        total, variance = oracle.query(RATIO_KIND, iteration, chains, **arrays).total()
        unit = distances(theta, theta_prop) if per_distance else np.ones(len(chains))
        return unit * total, unit**2 * variance

    return ratio


def clip_rows(g: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Each vector of ``g`` ``(..., d)`` scaled to L2 norm ≤ ``clip``; and where it bound."""
    norm = np.linalg.norm(g, axis=-1, keepdims=True)
    scale = np.minimum(1.0, clip / np.maximum(norm, np.finfo(float).tiny))
    return g * scale, norm[..., 0] > clip


def pooled_gradient(
    model: Model, records: np.ndarray, clip: float, noise_sd: float, rng: np.random.Generator
) -> GradFn:
    """A single data holder's answer on ``records`` ``(n, p)`` (the paper's setting; tests and
    scenarios): Σ_x of ∇ℓ clipped to L2 norm ``clip``, plus N(0, ``noise_sd``² I)."""

    def grad(iteration: int, substep: int, chains: np.ndarray, theta: np.ndarray):
        clipped, _ = clip_rows(model.grad_log_lik(records, theta), clip)
        noise = noise_sd * rng.standard_normal(theta.shape)
        return clipped.sum(axis=1) + noise, np.full(len(chains), noise_sd**2)

    return grad


def distances(theta: np.ndarray, theta_prop: np.ndarray) -> np.ndarray:
    """‖θ' − θ‖ per chain ``(m,)`` (units of θ)."""
    return np.linalg.norm(theta_prop - theta, axis=1)


def pooled_ratio(
    model: Model,
    records: np.ndarray,
    clip: float,
    noise_sd: float,
    rng: np.random.Generator,
    per_distance: bool = False,
) -> RatioFn:
    """A single data holder's answer: Σ_x ℓ(x,θ') − ℓ(x,θ) each clipped to [−b, b], plus
    N(0, (``noise_sd``/``clip`` × b)²), b = ``clip`` — or, ``per_distance``, b = ``clip`` ×
    ‖θ' − θ‖ per chain (the noise sd then ``noise_sd`` × ‖θ' − θ‖)."""

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        unit = distances(theta, theta_prop) if per_distance else np.ones(len(chains))
        bound = (clip * unit)[:, None]
        diff = np.clip(model.log_lik_diff(records, theta, theta_prop), -bound, bound)
        noise = noise_sd * unit * rng.standard_normal(len(chains))
        return diff.sum(axis=1) + noise, (noise_sd * unit) ** 2

    return ratio


def asks(sampler: Mapping[str, Any]) -> dict[str, int]:
    """Answers per chain a run asks of each owner, by kind: L gradients per iteration plus the
    start's, and one ratio per iteration but the descent's (fewer when a trajectory leaves Θ)."""
    iterations = planned_steps(sampler)
    descent = min(int(sampler["warmup_descent"]), int(sampler["warmup"]))
    return {
        GRADIENT_KIND: int(sampler["leapfrog_steps"]) * iterations + 1,
        RATIO_KIND: iterations - descent,
    }


def clips(sampler: Mapping[str, Any]) -> dict[str, float]:
    """The per-record clip of each kind a run asks (owners admit them; the ratio clip makes the
    target the clipped-likelihood posterior, the gradient clip changes only the proposal)."""
    per_distance = float(sampler.get("hmc_ratio_clip_per_distance", 0.0))
    return {
        GRADIENT_KIND: float(sampler["grad_clip"]),
        RATIO_KIND: per_distance if per_distance > 0 else float(sampler["hmc_ratio_clip"]),
    }


def clip_units(sampler: Mapping[str, Any]) -> dict[str, str]:
    """The ratio clip's unit when it scales with the move (``hmc_ratio_clip_per_distance``)."""
    if float(sampler.get("hmc_ratio_clip_per_distance", 0.0)) > 0:
        return {RATIO_KIND: " per unit of ‖θ′ − θ‖"}
    return {}


def check(sections: Sections, model: Model) -> None:
    """``adapt_mass`` needs warmup iterations after the descent to estimate from; a model's
    ``prior_only_coordinates`` must be what it says (``check_prior_only``)."""
    check_prior_only(model)
    sampler = sections["sampler"]
    if not sampler.get("adapt_mass", False):
        return
    warmup = int(sampler["warmup"])
    descent = min(int(sampler.get("warmup_descent", DPHMCSettings().warmup_descent)), warmup)
    value = json.dumps(sampler["adapt_mass"])
    require(
        bool(mass_windows(descent, warmup)),
        f"sampler.adapt_mass = {value} needs at least {MIN_SPAN} warmup iterations after the "
        f"descent; sampler.warmup = {warmup} with warmup_descent = {descent} leaves "
        f"{warmup - descent}: raise sampler.warmup or lower sampler.warmup_descent",
    )


def check_prior_only(model: Model, points: int = 8, records: int = 64) -> None:
    """``model.prior_only_coordinates`` are distinct coordinates of θ, and — where the model can
    simulate records — its per-record gradient is 0 there at ``points`` random θ inside Θ on
    ``records`` simulated records (a spot check: the prior-only update is exact only if the
    declaration is true; docs/design.md §2.9, "Prior-only coordinates")."""
    coords = model.prior_only_coordinates
    if not coords:
        return
    require(
        len(set(coords)) == len(coords) and all(0 <= i < model.dim for i in coords),
        f"[model] {model.name}: prior_only_coordinates {coords} must be distinct coordinates "
        f"0..{model.dim - 1} of θ",
    )
    rng = np.random.default_rng(0)
    theta = rng.uniform(-0.5, 0.5, (points, model.dim)) * model.theta_bound
    try:
        x = model.simulate_records(rng, theta[0], records)
    except ConfigError:  # a model that cannot simulate is taken at its word
        return
    grad = model.grad_log_lik(x, theta)[..., list(coords)]
    moved = [i for j, i in enumerate(coords) if np.any(grad[..., j] != 0)]
    require(
        not moved,
        f"[model] {model.name} declares prior_only_coordinates {coords}, but a record's "
        f"log-likelihood gradient is not 0 in coordinate(s) {moved}: DP-HMC would sample the "
        "wrong posterior; remove them from the model's prior_only_coordinates",
    )


DP_HMC = ChainAlgorithm(
    "dp_hmc",
    "DP-HMC: leapfrog on owners' clipped noisy gradients, penalty test on clipped noisy ratios",
    build,
    DPHMCSettings,
    HMCState,
    KINDS[GRADIENT_KIND].ledger_name,
    generic=(*KERNEL_KEYS, "warmup"),
    kinds=asks,
    clips=clips,
    clip_units=clip_units,
    check=check,
)
