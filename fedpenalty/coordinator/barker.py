"""Subsampled DP-MCMC with the Barker test (docs/design.md §2.12; Heikkilä, Jälkö, Dikmen &
Honkela 2019, after Seita et al. 2017). Target: the tempered posterior
π_τ(θ) ∝ p(θ) Π_x p(x | θ)^τ with each record's log-likelihood ratio clipped at ±c.

One step per chain: θ′ = θ + step·ξ (ξ ~ N(0, I); θ′ outside Θ is rejected). Each owner k
answers S_k = Σ over its Poisson(q) sample of clip(ℓ(x,θ′) − ℓ(x,θ), ±c) + N(0, (σ_k c)²).
The coordinator forms Λ̂ = (τ/q)·Σ_k S_k + log p(θ′) − log p(θ), an unbiased estimate of the
tempered log ratio Λ, whose normal error has variance v_noise + v_sub: v_noise = (τ/q)² Σ_k
(σ_k c)² (declared by the owners) and the subsampling part v_sub ≤ τ²(1 − q) N c²/q (N: the
public record count). It adds N(0, C − v_noise − v_sub-bound) and X_corr (``barker_correction``)
and accepts when the sum is > 0: with the normal error exactly N(0, C), the sum is Λ plus
logistic noise, so P(accept) = 1/(1 + e^{−Λ}), Barker's rule, which leaves π_τ invariant.
With q < 1 the subsampling part is taken at its bound, so the normal variance is C − (bound −
v_sub): exact at q = 1, and within the bound's slack otherwise. Work per step: O(q·N) records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from ..kinds import KINDS
from ..models import Model
from ..schema import PositiveFloat
from .barker_correction import MAX_NORMAL_VARIANCE, Correction, check_variance, correction
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
from .sgmcmc import SampledSettings

#: The kind every step asks (``kinds/sampled_log_ratio.py``).
KIND = "sampled_log_ratio"

#: (iteration, chains (m,), theta (m, d), theta_prop (m, d)) -> (Σ_k S_k (m,), Σ_k (σ_k c)² (m,))
RatioFn = Callable[[int, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


class BarkerSettings(SampledSettings):
    """The ``[sampler]`` keys of ``barker`` besides ``step`` (the proposal sd, units of θ)."""

    barker_clip: PositiveFloat = Field(
        default=1.0,
        description="barker: per-record log-likelihood-ratio clip c (nats); noise sd σ·c",
    )
    temperature: PositiveFloat = Field(
        default=0.01,
        description="barker: the likelihood's exponent τ in the tempered target p(θ)Πp(x|θ)^τ",
    )
    barker_variance: PositiveFloat = Field(
        default=MAX_NORMAL_VARIANCE,
        description="barker: the normal variance C of the test's estimate that the correction "
        f"turns into logistic noise, in (0, {MAX_NORMAL_VARIANCE:g}]",
    )


@dataclass(frozen=True)
class BarkerTerms:
    """A run's fixed terms: proposal sd ``step``, rate ``q``, clip ``c``, temperature ``tau``,
    record count ``n``, the correction (its variance C) and the ratio function."""

    step: float
    q: float
    clip: float
    tau: float
    n: int
    corr: Correction
    ratio: RatioFn

    @property
    def sub_variance(self) -> float:
        """The bound τ²(1 − q) N c²/q on the subsampling variance of Λ̂ (nats²)."""
        return self.tau**2 * (1.0 - self.q) * self.n * self.clip**2 / self.q


@dataclass(frozen=True)
class BarkerState:
    """``theta`` ``(C, d)`` inside Θ and the index of the next iteration (it keys answers)."""

    theta: np.ndarray
    iteration: int = 0

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)``."""
        return self.theta


def init(theta: np.ndarray, model: Model) -> BarkerState:
    """Start C chains at ``theta`` ``(C, d)``; ``ValueError`` unless inside Θ."""
    theta = np.array(theta, dtype=float, ndmin=2)
    if theta.shape[1] != model.dim or not np.all(model.in_theta_space(theta)):
        raise ValueError(f"initial points must have shape (C, {model.dim}) and lie inside Θ")
    return BarkerState(theta, 0)


def top_up(terms: BarkerTerms, noise_var: np.ndarray) -> np.ndarray:
    """The normal variance the coordinator adds ``(m,)``: C − v_noise − v_sub-bound, with
    v_noise = (τ/q)²·``noise_var``; ``ValueError`` naming the keys when it is negative."""
    v_noise = (terms.tau / terms.q) ** 2 * noise_var
    extra = terms.corr.variance - v_noise - terms.sub_variance
    if np.any(extra < -1e-12 * terms.corr.variance):
        raise ValueError(
            f"barker: the estimate's normal variance (owner noise {float(np.max(v_noise)):.4g} + "
            f"subsampling bound {terms.sub_variance:.4g}) exceeds sampler.barker_variance = "
            f"{terms.corr.variance:g}; lower sampler.temperature, sampler.barker_clip or the "
            "owners' noise (privacy.sigma), or raise sampler.sampling_rate"
        )
    return np.maximum(extra, 0.0)


def step(
    rng: np.random.Generator, state: BarkerState, model: Model, terms: BarkerTerms
) -> tuple[BarkerState, Info]:
    """One Barker step for every chain (module docstring)."""
    theta = state.theta
    prop = theta + terms.step * rng.standard_normal(theta.shape)
    inside = np.asarray(model.in_theta_space(prop), dtype=bool)
    accepted = np.zeros(len(theta), dtype=bool)
    noise_var = np.full(len(theta), np.nan)
    chains = np.flatnonzero(inside)
    if chains.size:
        total, owner_var = terms.ratio(state.iteration, chains, theta[chains], prop[chains])
        prior = model.log_prior(prop[chains]) - model.log_prior(theta[chains])
        estimate = terms.tau / terms.q * np.asarray(total) + prior
        extra = top_up(terms, np.asarray(owner_var))
        test = estimate + np.sqrt(extra) * rng.standard_normal(chains.size)
        accepted[chains] = test + terms.corr.sample(rng, chains.size) > 0
        noise_var[chains] = (terms.tau / terms.q) ** 2 * np.asarray(owner_var)  # in Λ's nats²
    new = np.where(accepted[:, None], prop, theta)
    info = {QUERIED.name: inside, ACCEPTED.name: accepted, NOISE_VARIANCE.name: noise_var}
    return BarkerState(new, state.iteration + 1), info


def oracle_ratio(data: ChainData, clip: float) -> RatioFn:
    """The owners' ``sampled_log_ratio`` answers summed: Σ_k S_k ``(m,)`` and Σ_k (σ_k c)²."""
    oracle = data.require_oracle("barker")

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        answers = oracle.query(
            KIND, iteration, chains, theta=theta, theta_prop=theta_prop, clip=clip
        )
        total, variance = answers.total()
        return np.reshape(total, len(chains)), np.full(len(chains), variance)

    return ratio


def kernel(model: Model, terms: BarkerTerms) -> SamplingAlgorithm:
    """The Barker kernel on ``model`` with ``terms``."""
    return SamplingAlgorithm(
        lambda rng, theta0: init(theta0, model),
        lambda rng, state: step(rng, state, model, terms),
        (QUERIED, ACCEPTED, NOISE_VARIANCE),
    )


def build(model: Model, data: ChainData, **settings: Any) -> SamplingAlgorithm:
    """Barker through the owners behind ``data.oracle`` (settings: ``BarkerSettings``)."""
    if data.n_total is None:
        raise ValueError("barker needs the owners' public record count (data.n_total)")
    variance = check_variance(settings["barker_variance"], "sampler.barker_variance")
    terms = BarkerTerms(
        float(settings["step"]),
        float(settings["sampling_rate"]),
        float(settings["barker_clip"]),
        float(settings["temperature"]),
        int(data.n_total),
        correction(variance),
        oracle_ratio(data, float(settings["barker_clip"])),
    )
    declared = sum(
        (o.policy.noise_for(KINDS[KIND].ledger_name) * terms.clip) ** 2
        for o in data.require_oracle("barker").describe()
    )
    top_up(terms, np.array([declared]))  # before any answer: the owners' public noise levels
    return kernel(model, terms)


def check(sections: Sections, model: Model) -> None:
    """The correction's variance in range (the noise check needs the owners: ``top_up``)."""
    variance = sections["sampler"]["barker_variance"]
    require(
        math.isfinite(variance) and 0 < variance <= MAX_NORMAL_VARIANCE,
        f"sampler.barker_variance = {variance!r}: the Barker correction absorbs a normal "
        f"variance in (0, {MAX_NORMAL_VARIANCE:g}] only; lower sampler.barker_variance",
    )


def clips(sampler: Mapping[str, Any]) -> dict[str, float]:
    """The per-record clip of the ratios (the target is the clipped-likelihood one)."""
    return {KIND: float(sampler["barker_clip"])}


BARKER = ChainAlgorithm(
    "barker",
    "subsampled DP-MCMC: Barker test on owners' Poisson-sampled clipped noisy log ratios",
    build,
    BarkerSettings,
    BarkerState,
    KINDS[KIND].ledger_name,
    plan=planned_steps,
    check=check,
    clips=clips,
    temperature=lambda sampler: float(sampler["temperature"]),
)
