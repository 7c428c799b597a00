"""The penalty algorithm: Metropolis–Hastings with a noisy (penalised) log-likelihood ratio.

Pure functions over immutable state, vectorised over C chains, RNG passed explicitly
(BlackJAX style). The data enter only through a *ratio function*, so the one MH kernel here
also serves ``exact.py`` (a trusted curator's exact ratio, variance 0) and ``expfam.py``:

* ``penalty`` (docs/design.md §2.1): ratio = Σ_k λ̂_k from the owners, variance s² = Σ_k σ_k².

Acceptance: min{1, exp(log p(θ')/p(θ) + λ̂ − s²/2)}. With Gaussian noise of known variance
s² this leaves the posterior exactly invariant (Ceperley–Dewing penalty method).

The proposal is uniform in the L2 ball of radius ``step`` around θ (symmetric, bounded, data
independent). A proposal outside Θ is rejected before any owner is asked. During warmup the
radius adapts (``adapt.py``) within the step the owners admitted; kept draws use it fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field
from scipy.special import log_ndtr

from ..common import LOG_RATIO
from ..kinds import KINDS
from ..models import Model
from ..schema import Bool, NonNegativeFloat, Probability, Section
from .adapt import TARGET_ACCEPT, UNSET, StepAdaptation
from .base import (
    ACCEPTED,
    NOISE_VARIANCE,
    QUERIED,
    ChainAlgorithm,
    ChainData,
    Info,
    SamplingAlgorithm,
    Sections,
    planned_steps,
    require,
)

if TYPE_CHECKING:
    from .oracle import Oracle

#: The kind a penalty run with ``sampler.ratio_clip`` > 0 asks (docs/design.md §2.8).
CLIPPED = KINDS["clipped_log_ratio"].name

#: (iteration, chains (m,), theta (m, d), theta_prop (m, d))
#:     -> (log-ratio (m,), noise variance (m,))
RatioFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class MHSettings(Section):
    """The ``[sampler]`` keys of the MH kernels (``penalty``, ``penalty_expfam``, ``exact_mh``):
    warmup adaptation of the proposal radius (``adapt.py``)."""

    adapt_step: Bool = Field(
        default=True,
        description="penalty, penalty_expfam, exact_mh: adapt the proposal radius during warmup "
        "towards target_accept, never above sampler.step (the step the owners admitted); kept "
        "draws use the adapted radius, fixed",
    )
    target_accept: Probability = Field(
        default=TARGET_ACCEPT,
        description="adapt_step: the acceptance aimed at, as a fraction of the noise ceiling "
        "2Φ(−s/2) (the acceptance as the step → 0 with penalty noise s²; 1 without noise)",
    )


class PenaltySettings(MHSettings):
    """The ``[sampler]`` keys of ``penalty``: the MH kernels' and the per-record clip of the
    log-likelihood ratios (docs/design.md §2.8)."""

    ratio_clip: NonNegativeFloat = Field(
        default=0.0,
        description="penalty: 0 (default) asks owners for log ratios clipped at the model's "
        "Lipschitz bound L·step (exact posterior); c > 0 asks for clipped_log_ratio, each "
        "record's ratio clipped to ±c and noise sd σ·c (σ: the owners' ratio_noise_multiplier), "
        "any step at one cost: the chain then samples the clipped-likelihood posterior",
    )


@dataclass(frozen=True)
class MHState:
    """Chain state: ``theta`` ``(C, d)``, its ``log_prior`` ``(C,)``, the index of the next
    iteration (it keys owner queries, so a resumed run asks exactly the same questions) and the
    proposal step with its warmup adaptation (``tuning``; checkpoints carry it)."""

    theta: np.ndarray
    log_prior: np.ndarray
    iteration: int = 0
    tuning: StepAdaptation = UNSET

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)``."""
        return self.theta

    def with_tuning(self, tuning: StepAdaptation) -> MHState:
        return replace(self, tuning=tuning)


@dataclass(frozen=True)
class MHInfo:
    """What one step did, per chain: ``accepted``, ``queried`` (proposal inside Θ, owners
    asked), ``noise_var`` (s² used in the penalty; 0 where not queried) and ``accept_prob``
    (min{1, e^{log α}} of the noisy test; 0 where not queried)."""

    accepted: np.ndarray
    queried: np.ndarray
    noise_var: np.ndarray
    accept_prob: np.ndarray


def init(theta: np.ndarray, model: Model) -> MHState:
    """Start C chains at ``theta`` ``(C, d)``, which must lie inside Θ."""
    theta = np.array(theta, dtype=float, ndmin=2)
    if theta.shape[1] != model.dim or not np.all(model.in_theta_space(theta)):
        raise ValueError(f"initial points must have shape (C, {model.dim}) and lie inside Θ")
    return MHState(theta, model.log_prior(theta), 0)


def propose_in_ball(
    rng: np.random.Generator, theta: np.ndarray, radius: float, min_radius: float = 0.0
) -> np.ndarray:
    """θ' = θ + u with u uniform in the L2 ball of ``radius`` outside the ball of
    ``min_radius`` (< radius): ``(C, d)`` → ``(C, d)``. Symmetric either way, so MH stays exact;
    the hole keeps steps above what owners refuse as carrying no information (min_step)."""
    c, d = theta.shape
    direction = rng.standard_normal((c, d))
    # np.linalg.norm(axis=1, keepdims=True), bit for bit, without its wrapper's cost
    direction /= np.sqrt(np.add.reduce(direction * direction, axis=1, keepdims=True))
    hole = (min_radius / radius) ** d
    # radius·(hole + (1 − hole)·u)^(1/d) · direction + θ, in place: the same operations
    length = rng.random((c, 1))  # the stream's next c numbers, as rng.random(c)
    length *= 1.0 - hole
    length += hole
    length **= 1.0 / d
    length *= radius
    direction *= length
    direction += theta
    return direction


def step(
    rng: np.random.Generator,
    state: MHState,
    model: Model,
    radius: float,
    ratio: RatioFn,
    min_radius: float = 0.0,
) -> tuple[MHState, MHInfo]:
    """One MH iteration for all chains (proposals in the shell [min_radius, radius])."""
    theta_prop = propose_in_ball(rng, state.theta, radius, min_radius)
    log_u = np.log(rng.random(len(state.theta)))
    queried = model.in_theta_space(theta_prop)
    # the usual step (count_nonzero: np.all without its reduction's cost): no fancy indexing,
    # the same numbers in fewer operations
    if np.count_nonzero(queried) == len(queried):
        return _step_all(state, model, theta_prop, log_u, queried, ratio)
    idx = np.flatnonzero(queried)
    accepted = np.zeros(len(state.theta), dtype=bool)
    noise_var = np.zeros(len(state.theta))
    accept_prob = np.zeros(len(state.theta))
    theta, log_prior = state.theta, state.log_prior
    if idx.size:
        lam, s2 = ratio(state.iteration, idx, state.theta[idx], theta_prop[idx])
        lp_prop = model.log_prior(theta_prop[idx])
        log_alpha = lp_prop - state.log_prior[idx] + lam - 0.5 * s2
        acc = log_u[idx] < log_alpha
        accepted[idx] = acc
        noise_var[idx] = s2
        accept_prob[idx] = np.exp(np.minimum(log_alpha, 0.0))
        theta = state.theta.copy()
        log_prior = state.log_prior.copy()
        theta[idx[acc]] = theta_prop[idx[acc]]
        log_prior[idx[acc]] = lp_prop[acc]
    new = MHState(theta, log_prior, state.iteration + 1, state.tuning)
    return new, MHInfo(accepted, queried, noise_var, accept_prob)


def _step_all(
    state: MHState,
    model: Model,
    theta_prop: np.ndarray,
    log_u: np.ndarray,
    queried: np.ndarray,
    ratio: RatioFn,
) -> tuple[MHState, MHInfo]:
    """``step`` when every chain's proposal ``theta_prop`` ``(C, d)`` lies inside Θ: every
    chain asks the owners (the same numbers as ``step``'s indexed path)."""
    chains = np.arange(len(state.theta))
    lam, s2 = ratio(state.iteration, chains, state.theta, theta_prop)
    lp_prop = model.log_prior(theta_prop)
    log_alpha = lp_prop - state.log_prior + lam - 0.5 * s2
    acc = log_u < log_alpha
    theta = np.where(acc[:, None], theta_prop, state.theta)
    log_prior = np.where(acc, lp_prop, state.log_prior)
    noise_var = np.full(len(acc), s2, dtype=float)
    info = MHInfo(acc, queried, noise_var, np.exp(np.minimum(log_alpha, 0.0)))
    return MHState(theta, log_prior, state.iteration + 1, state.tuning), info


def expected_acceptance(log_ratio: np.ndarray | float, noise_var: float) -> np.ndarray:
    """The penalty test's acceptance probability E_ξ[min{1, exp(λ + sξ − s²/2)}], ξ ~ N(0, 1),
    for exact log ratios λ (nats, prior ratio included; any shape) and noise variance s²
    (nats²): Φ((λ − s²/2)/s) + e^λ Φ((−λ − s²/2)/s), and min{1, e^λ} when s² = 0.

    Averaged over the chain's stationary pairs (θ, θ') it is the expected acceptance of the
    penalty paper's Proposition 1, which falls monotonically as s² grows (docs/design.md
    §2.1). Computed in log space, so λ may be large of either sign."""
    lam = np.asarray(log_ratio, dtype=float)
    if not noise_var >= 0.0:
        raise ValueError(f"noise_var must be >= 0, got {noise_var!r}")
    if noise_var == 0.0:
        return np.exp(np.minimum(lam, 0.0))
    s = np.sqrt(noise_var)
    first = log_ndtr((lam - 0.5 * noise_var) / s)
    second = lam + log_ndtr((-lam - 0.5 * noise_var) / s)
    return np.exp(np.logaddexp(first, second))


def tune_radius(
    rng: np.random.Generator,
    state: MHState,
    model: Model,
    ratio: RatioFn,
    batches: int,
    radius: float = 0.1,
) -> tuple[MHState, float]:
    """Pilot tuning of the ball radius: ``batches`` batches of 100 steps, each multiplying the
    radius by exp(acceptance − 0.3)³ (by 0.2 after a batch with no acceptance), capped at the
    diameter of Θ. Returns the state after the pilot and the radius to freeze (the chain after
    it is then a fixed, exact kernel)."""
    cap = 2.0 * model.theta_bound * np.sqrt(model.dim)
    for _ in range(batches):
        accepted = 0.0
        for _ in range(100):
            state, info = step(rng, state, model, radius, ratio)
            accepted += info.accepted.mean() / 100
        radius *= float(np.exp(accepted - 0.3) ** 3) if accepted > 0 else 0.2
        radius = min(radius, cap)
    return state, radius


def oracle_ratio(oracle: Oracle, clip: float = 0.0) -> RatioFn:
    """The penalty algorithm's ratio: Σ_k λ̂_k from all owners, with s² = Σ_k σ_k² (the noise
    variance they return); ``clip`` > 0: their per-record clipped ratios at that clip
    (``clipped_log_ratio``, s² = Σ_k (σ_k·clip)²)."""

    # the last answers' noise sd array and Σ_k sd_k² per chain (read-only): an in-process host
    # replies with the same array of its owners' sd while its session's mechanism stays, so
    # the sum is kept for it
    kept: list = [None, np.zeros(0)]

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        if clip > 0:
            answers = oracle.query(
                CLIPPED, iteration, chains, theta=theta, theta_prop=theta_prop, clip=clip
            )
        else:
            answers = oracle.log_ratio(iteration, chains, theta, theta_prop)
        if answers.noise_sd is kept[0] and len(kept[1]) == len(chains):
            return answers.values.sum(axis=0), kept[1]
        lam, s2 = answers.total()
        variances = np.full(len(chains), s2)
        variances.flags.writeable = False
        kept[:] = answers.noise_sd, variances
        return lam, variances

    return ratio


#: The fields an MH step reports (in posterior.nc's sample_stats order).
INFO = (QUERIED, ACCEPTED, NOISE_VARIANCE)


def record(info: MHInfo) -> Info:
    """The driver's record of an MH step (``INFO``)."""
    return {
        QUERIED.name: info.queried,
        ACCEPTED.name: info.accepted,
        NOISE_VARIANCE.name: np.where(info.queried, info.noise_var, np.nan),
    }


def step_sizes(state: Any, warmup: int, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The kept draws' ``step_size`` ``(C, draws)``: the proposal radius warmup chose
    (``state.tuning.step``, units of θ), fixed for every kept draw."""
    return {"step_size": np.full(shape, state.tuning.step)}


#: (rng, state, radius) -> (state, what the step did): one MH move at a given radius.
Move = Callable[[np.random.Generator, Any, float], tuple[Any, MHInfo]]


def tuned(init: Callable[[np.random.Generator, np.ndarray], Any], move: Move, adapt: bool):
    """A built MH kernel whose state carries its step (``state.tuning``): kept draws move at
    ``tuning.step``; with ``adapt``, warmup iterations move at ``tuning.warmup_step`` and then
    update the adaptation from the step's acceptance probabilities and noise variances."""

    def advance(rng: np.random.Generator, state: Any) -> tuple[Any, Info]:
        new, info = move(rng, state, state.tuning.step)
        return new, record(info)

    def warm(rng: np.random.Generator, state: Any) -> tuple[Any, Info]:
        new, info = move(rng, state, state.tuning.warmup_step)
        return new.with_tuning(new.tuning.update(info.accept_prob, info.noise_var)), record(info)

    return SamplingAlgorithm(init, advance, INFO, warm if adapt else None, step_sizes)


def kernel(
    model: Model, ratio: RatioFn, tuning: StepAdaptation, floor: float = 0.0, adapt: bool = False
) -> SamplingAlgorithm:
    """The MH kernel of ``ratio`` as a built algorithm: proposal radius from ``tuning`` (units
    of θ; adapted during warmup when ``adapt``), every step at least min(``floor``, radius/2)."""

    def move(rng: np.random.Generator, state: MHState, radius: float):
        return step(rng, state, model, radius, ratio, min(floor, 0.5 * radius))

    def start(rng: np.random.Generator, theta0: np.ndarray) -> MHState:
        return init(theta0, model).with_tuning(tuning)

    return tuned(start, move, adapt)


def build(
    model: Model,
    data: ChainData,
    *,
    step: float,
    adapt_step: bool,
    target_accept: float,
    ratio_clip: float = 0.0,
) -> SamplingAlgorithm:
    """Penalty MH through the owners behind ``data.oracle``; ``step`` is the ball radius the
    owners admitted (adapted below it during warmup when ``adapt_step``). Steps stay above
    twice the largest ``min_step`` of the owners (they refuse shorter ones; twice, so that
    rounding in θ′ − θ never takes a step below it), and adaptation above twice that.
    ``ratio_clip`` > 0: clipped ratios at that clip, whose cost does not depend on the step
    (no floor, any radius)."""
    oracle = data.require_oracle("penalty")
    if ratio_clip > 0:
        tuning = StepAdaptation.start(step, target_accept)
        return kernel(model, oracle_ratio(oracle, ratio_clip), tuning, 0.0, adapt_step)
    policies = [d.policy for d in oracle.describe()]
    floor = 2.0 * max(p.min_step for p in policies)
    charged = max(p.charged_step for p in policies)
    tuning = StepAdaptation.start(step, target_accept, 2.0 * floor, charged)
    return kernel(model, oracle_ratio(oracle), tuning, floor, adapt_step)


def penalty_kinds(sampler: Mapping[str, Any]) -> dict[str, int]:
    """The one kind a penalty run asks (by ``sampler.ratio_clip``), one answer per iteration."""
    kind = CLIPPED if sampler.get("ratio_clip", 0.0) > 0 else LOG_RATIO
    return {kind: planned_steps(sampler)}


def penalty_clips(sampler: Mapping[str, Any]) -> dict[str, float]:
    """The clip of a clipped penalty run (none: the Lipschitz route, the exact posterior)."""
    clip = sampler.get("ratio_clip", 0.0)
    return {CLIPPED: float(clip)} if clip > 0 else {}


def check_step(sections: Sections, model: Model) -> None:
    """The proposal radius must not exceed what the owners answer for (privacy.max_step),
    unless the ratios are clipped per record (their cost does not grow with the step)."""
    step, max_step = sections["sampler"]["step"], sections["privacy"]["max_step"]
    if max_step is not None and not sections["sampler"].get("ratio_clip", 0.0) > 0:
        require(
            step <= max_step,
            f"sampler.step = {step:g} exceeds privacy.max_step = {max_step:g}; owners would refuse "
            f"every query",
        )


PENALTY = ChainAlgorithm(
    "penalty",
    "penalty MH: owners' noisy log-likelihood ratios, exact chain",
    build,
    PenaltySettings,
    MHState,
    LOG_RATIO,
    check=check_step,
    max_step=lambda sampler: sampler["step"],
    kinds=penalty_kinds,
    clips=penalty_clips,
)
