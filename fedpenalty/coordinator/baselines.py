"""The papers' baselines (docs/design.md §2.4) as pure functions: OPS, noisy sufficient
statistics, and Wang et al.'s hybrid OPS + DP-SGLD.

* ``ops``: one sample from the tempered posterior ∝ p(θ)^ρ Π_x p(x | θ)^ρ on Θ (an
  exponential mechanism whose utility is the log joint).
  - Wang, Fienberg & Smola (2015), Algorithm 1 / Theorem 1: if sup_{x, θ} |log p(x | θ)| ≤ B,
    then ρ = min{1, ε/(4B)} gives ε-DP under replace-one (the density ratio moves by ≤ 2ρB,
    and the normaliser by ≤ 2ρB more). Under add/remove the log joint changes by one term
    ℓ(x, θ) ∈ [−B, B], so ρ = min{1, ε/(2B)}.
  - Foulds et al. (2016), Theorem 2: if sup_{x, x', θ} |ℓ(x', θ) − ℓ(x, θ)| ≤ C, posterior
    sampling is 2C-DP (replace-one), so ρ = min{1, ε/(2C)}. C ≤ 2B, so this is never worse.
  OPS is **centralised**: a *trusted curator* pools every owner's records and samples once
  (closed form for the conjugate models, else an exact MH run). Every owner is then
  (ε, 0)-DP, against the analyst but not against the curator.
* ``noisy_stats`` (Foulds et al. §3.2): each owner releases, once,
  ŝ_k = proj_k(Σ_{x∈D_k} S(x) + Laplace(Δ₁/ε)^s), where Δ₁ is the L1 sensitivity of Σ S(x) and
  proj_k maps to the attainable sums (counts into [0, n_k], count sums into
  [0, n_k·count_bound], Gaussian sums into the ball of radius n_k·data_bound). The coordinator
  draws from the conjugate posterior given n = Σ n_k and Σ_k ŝ_k, treating the released sums
  as if exact (the plug-in posterior of the paper). The Gaussian variant adds N(0, σ² I) with
  σ calibrated exactly (μ-GDP) to (ε, δ) for the L2 sensitivity Δ₂; it reports μ = Δ₂/σ.
* ``hybrid`` (Wang et al., Algorithm 3): OPS at ε/2 starts each chain, then DP-SGLD through
  the owners' Poisson-subsampled clipped gradients, with the noise multiplier calibrated by
  the exact subsampled-Gaussian accountant to the remaining ε/2 at δ. The two parts compose
  to (ε, δ) per owner.

Samples are in the models' sampled parameterisation (logit p, log λ, θ), restricted to Θ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..models import (
    Bernoulli,
    BoundedLogLikelihood,
    ConjugateUpdate,
    ExpFamModel,
    Model,
    Neighbour,
)
from ..privacy import gaussian, subsampled
from . import mh
from .exact import pooled_log_ratio

OPSForm = Literal["wang", "foulds"]
Mechanism = Literal["laplace", "gaussian"]

#: How OPS draws from a tempered posterior without a closed form: chains are started at 0,
#: the ball radius is tuned over ``_PILOT`` batches of 100 steps towards acceptance 0.3, then
#: ``mh_steps`` more steps are run with the radius frozen and each chain's last state is kept.
_PILOT = 20


# ------------------------------------------------------------------ bounds on the log-likelihood


def _bounded(model: Model, what: str) -> BoundedLogLikelihood:
    """``model`` as a ``BoundedLogLikelihood``; ``ValueError`` naming ``what`` it lacks."""
    if not isinstance(model, BoundedLogLikelihood):
        raise ValueError(f"no log-likelihood {what} is derived for model {model.name!r}")
    return model


def log_lik_bound(model: Model) -> float:
    """B = sup |ℓ(x, θ)| over the model's data domain × Θ (nats), each model's own derivation
    (``BoundedLogLikelihood.log_lik_bound``, proved in its docstring)."""
    return _bounded(model, "bound").log_lik_bound()


def log_lik_range(model: Model) -> float:
    """C = sup_θ sup_{x, x'} |ℓ(x', θ) − ℓ(x, θ)| over the data domain and Θ (Foulds et al.'s
    Theorem 2), each model's own derivation (``BoundedLogLikelihood.log_lik_range``)."""
    return _bounded(model, "range").log_lik_range()


# ------------------------------------------------------------------ OPS


def ops_temperature(
    model: Model, epsilon: float, *, form: OPSForm = "wang", neighbour: Neighbour = "replace_one"
) -> float:
    """ρ ∈ (0, 1] for ε-DP by one tempered-posterior sample: Wang et al. min{1, ε/(4B)}
    (replace-one) or min{1, ε/(2B)} (add/remove); Foulds et al. min{1, ε/(2C)} (replace-one
    only, since C is defined by substitution)."""
    eps = gaussian.check_positive("epsilon", epsilon)
    if neighbour not in ("replace_one", "add_remove"):
        raise ValueError(f"neighbour must be 'replace_one' or 'add_remove', got {neighbour!r}")
    if form == "wang":
        factor = 4.0 if neighbour == "replace_one" else 2.0
        return min(1.0, eps / (factor * log_lik_bound(model)))
    if form == "foulds":
        if neighbour != "replace_one":
            raise ValueError(
                "Foulds et al.'s 2C form is for replace-one neighbours; use form='wang'"
            )
        return min(1.0, eps / (2.0 * log_lik_range(model)))
    raise ValueError(f"form must be 'wang' or 'foulds', got {form!r}")


def conjugate_draws(
    rng: np.random.Generator,
    model: Model,
    n: float,
    stat_sum: np.ndarray,
    size: int,
    rho: float = 1.0,
) -> np.ndarray:
    """``size`` independent draws ``(size, d)`` from the (tempered) posterior over Θ,
    ∝ [p(θ) Π p(x | θ)]^ρ given ``n`` records whose statistics sum to ``stat_sum``, in the
    sampled parameterisation, by the model's ``ConjugateUpdate.conjugate_draws`` (e.g. a
    truncated normal for gaussian_mean, a truncated Beta on p for bernoulli, a truncated Gamma
    on λ for poisson). ``stat_sum`` must be attainable (project a noisy sum first)."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    if not isinstance(model, ConjugateUpdate):
        raise ValueError(f"model {model.name!r} has no conjugate posterior here")
    return model.conjugate_draws(rng, n, stat_sum, size, rho)


def tempered_mh_draws(
    rng: np.random.Generator,
    model: Model,
    records: np.ndarray,
    rho: float,
    size: int,
    mh_steps: int,
) -> np.ndarray:
    """``size`` draws ``(size, d)`` from ∝ [p(θ) Π p(x | θ)]^ρ on Θ by exact MH on the pooled
    ``records`` (trusted curator): ``size`` independent chains from θ = 0, with a tempered
    ratio ρ Σ_x Δℓ + (ρ − 1) Δlog p(θ) (Σ_x Δℓ from summed statistics where the model has them,
    ``exact.pooled_log_ratio``). The ball radius is tuned to acceptance ≈ 0.3, then
    ``mh_steps`` steps are run with it frozen, and each chain's last state is returned."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")

    pooled = pooled_log_ratio(model, records)

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        lik = pooled(theta, theta_prop)
        prior = model.log_prior(theta_prop) - model.log_prior(theta)
        return rho * lik + (rho - 1.0) * prior, np.zeros(len(chains))

    state, radius = mh.tune_radius(
        rng, mh.init(np.zeros((size, model.dim)), model), model, ratio, _PILOT
    )
    for _ in range(mh_steps):
        state, _ = mh.step(rng, state, model, radius, ratio)
    return state.theta


@dataclass(frozen=True)
class OPSResult:
    """One OPS release: ``theta`` ``(d,)`` (or ``(k, d)`` for k samples, each charged ε),
    temperature ``rho``, the ε every owner spends (``epsilon_per_owner``, δ = 0), and how it
    was drawn. ``trusted_curator`` is always True: OPS pools all records centrally."""

    theta: np.ndarray
    rho: float
    epsilon_per_owner: float
    form: str
    neighbour: str
    method: str
    trusted_curator: bool = True


def ops(
    rng: np.random.Generator,
    model: Model,
    records: np.ndarray,
    epsilon: float,
    *,
    form: OPSForm = "wang",
    neighbour: Neighbour = "replace_one",
    samples: int = 1,
    method: Literal["auto", "mh"] = "auto",
    mh_steps: int = 2000,
) -> OPSResult:
    """OPS (Wang et al. Alg. 1 / Foulds et al. Thm 2) on the pooled, prepared ``records``
    (TRUSTED CURATOR). Each of ``samples`` draws is ε-DP, so every owner spends
    ``samples × epsilon``. ``method="auto"`` uses the closed form for conjugate models and
    tempered MH (``mh_steps`` after tuning) otherwise; ``"mh"`` forces MH."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
    rho = ops_temperature(model, epsilon, form=form, neighbour=neighbour)
    if method == "auto" and isinstance(model, ConjugateUpdate):
        total = model.suff_stat(records).sum(axis=0)
        theta = conjugate_draws(rng, model, len(records), total, samples, rho)
        used = "closed_form"
    elif method in ("auto", "mh"):
        theta = tempered_mh_draws(rng, model, records, rho, samples, mh_steps)
        used = "mh"
    else:
        raise ValueError(f"method must be 'auto' or 'mh', got {method!r}")
    return OPSResult(
        theta[0] if samples == 1 else theta, rho, samples * float(epsilon), form, neighbour, used
    )


# ------------------------------------------------------------------ noisy sufficient statistics


def laplace_scale(model: ExpFamModel, epsilon: float, neighbour: Neighbour) -> float:
    """b = Δ₁/ε: the Laplace scale per component of Σ S(x) for ε-DP (Foulds et al. §3.2)."""
    eps = gaussian.check_positive("epsilon", epsilon)
    return model.stat_l1_sensitivity(neighbour) / eps


def project_stats(model: Model, stat_sum: np.ndarray, n: int) -> np.ndarray:
    """The attainable sum nearest to ``stat_sum`` ``(s,)`` for n records, by the model's
    ``ConjugateUpdate.project_stats``: counts into [0, n] (bernoulli), count sums into
    [0, n·count_bound] (poisson), a Gaussian sum into the L2 ball of radius n·data_bound."""
    if not isinstance(model, ConjugateUpdate):
        raise ValueError(f"no projection is defined for model {model.name!r}")
    return model.project_stats(stat_sum, n)


@dataclass(frozen=True)
class NoisyStatsResult:
    """One noisy-statistics run. ``released`` ``(K, s)``: each owner's projected noisy sum;
    ``total`` ``(s,)``: their sum; ``n``: total records; ``theta`` ``(draws, d)``: draws from
    the conjugate posterior given (n, total). Privacy per owner: ``epsilon_per_owner`` at
    ``delta`` (δ = 0 for Laplace); ``scale`` is the Laplace b or the Gaussian σ;
    ``sensitivity`` is Δ₁ (Laplace) or Δ₂ (Gaussian); ``mu`` = Δ₂/σ for the Gaussian variant,
    else None."""

    theta: np.ndarray
    released: np.ndarray
    total: np.ndarray
    n: int
    mechanism: str
    neighbour: str
    epsilon_per_owner: float
    delta: float
    scale: float
    sensitivity: float
    mu: float | None


def noisy_stats(
    rng: np.random.Generator,
    model: ExpFamModel,
    owner_records: Sequence[np.ndarray],
    epsilon: float,
    *,
    neighbour: Neighbour,
    draws: int,
    mechanism: Mechanism = "laplace",
    delta: float = 0.0,
) -> NoisyStatsResult:
    """Foulds et al. §3.2: each owner releases its projected noisy Σ S(x) once; then ``draws``
    samples from the conjugate posterior given the released sums. ``mechanism="laplace"``:
    Laplace(Δ₁/ε) per component, (ε, 0)-DP. ``"gaussian"``: N(0, σ²) per component with σ
    calibrated exactly (μ-GDP, analytic Gaussian) to (ε, ``delta``) for the L2 sensitivity."""
    if mechanism == "laplace":
        sensitivity = model.stat_l1_sensitivity(neighbour)
        scale = laplace_scale(model, epsilon, neighbour)
        mu = None
        delta = 0.0
    elif mechanism == "gaussian":
        sensitivity = model.stat_sensitivity(neighbour)
        scale = gaussian.calibrate_sigma(epsilon, delta, 1, sensitivity)
        mu = sensitivity / scale
    else:
        raise ValueError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism!r}")
    released = []
    for records in owner_records:
        true = model.suff_stat(records).sum(axis=0)
        if mechanism == "laplace":
            noisy = true + rng.laplace(0.0, scale, size=true.shape)
        else:
            noisy = true + rng.normal(0.0, scale, size=true.shape)
        released.append(project_stats(model, noisy, len(records)))
    released_arr = np.array(released)
    total = released_arr.sum(axis=0)
    n = int(sum(len(r) for r in owner_records))
    theta = conjugate_draws(rng, model, n, total, draws)
    return NoisyStatsResult(
        theta,
        released_arr,
        total,
        n,
        mechanism,
        neighbour,
        float(epsilon),
        float(delta),
        float(scale),
        float(sensitivity),
        mu,
    )


@dataclass(frozen=True)
class PseudoCountsResult:
    """One release of Foulds et al.'s Beta–Bernoulli pseudo-counts. ``released`` ``(2,)``: the
    noisy (n₁, n₀) after clamping at 0; ``theta`` ``(draws, 1)``: draws of logit p from
    Beta(a + n̂₁, b + n̂₀) on Θ; ``scale`` the Laplace b = Δ₁/ε; ``sensitivity`` Δ₁ of the pair;
    (``epsilon``, 0)-DP for every record, n included."""

    theta: np.ndarray
    released: np.ndarray
    epsilon: float
    neighbour: str
    scale: float
    sensitivity: float


def laplace_pseudo_counts(
    rng: np.random.Generator,
    model: Bernoulli,
    records: np.ndarray,
    epsilon: float,
    *,
    neighbour: Neighbour,
    draws: int,
) -> PseudoCountsResult:
    """Foulds et al.'s own Laplace mechanism for the Beta–Bernoulli model (their §3.2 and
    Figure 2), as opposed to ``noisy_stats`` (which releases Σx alone and treats n as public):
    both pseudo-counts (n₁, n₀) = (Σx, n − Σx) of the prepared ``records`` get independent
    Laplace(Δ₁/ε) noise, with Δ₁ the L1 sensitivity of the pair — 2 for replace-one (one record
    moves one count up and the other down), 1 for add/remove — and are clamped at 0
    (post-processing), so n stays private. ``draws`` samples of θ = logit p follow from
    Beta(a + n̂₁, b + n̂₀) restricted to Θ, the conjugate posterior treating n̂ as exact."""
    eps = gaussian.check_positive("epsilon", epsilon)
    if neighbour not in ("replace_one", "add_remove"):
        raise ValueError(f"neighbour must be 'replace_one' or 'add_remove', got {neighbour!r}")
    ones = float(model.suff_stat(records).sum())
    sensitivity = 2.0 if neighbour == "replace_one" else 1.0
    scale = sensitivity / eps
    counts = np.array([ones, len(records) - ones]) + rng.laplace(0.0, scale, size=2)
    released = np.maximum(counts, 0.0)
    theta = conjugate_draws(rng, model, float(released.sum()), released[:1], draws)
    return PseudoCountsResult(theta, released, eps, neighbour, scale, sensitivity)


# ------------------------------------------------------------------ hybrid OPS + DP-SGLD


def hybrid_start(
    rng: np.random.Generator,
    model: Model,
    pooled: np.ndarray,
    epsilon: float,
    delta: float,
    *,
    sampling_rate: float,
    answers: int,
    chains: int,
    neighbour: Neighbour,
    accountant: subsampled.Accountant = "pld",
    ops_form: OPSForm = "wang",
    mh_steps: int = 2000,
) -> tuple[OPSResult, float]:
    """The first half of Wang et al.'s Algorithm 3 and the second half's noise: OPS at ε/2 on
    the ``pooled`` records (``chains`` draws, ε/(2·chains) each; trusted curator) gives the
    chains' starts, and the returned noise multiplier σ makes ``answers`` subsampled-Gaussian
    gradient answers per owner at ``sampling_rate`` (ε/2, δ)-DP by ``accountant``."""
    eps = gaussian.check_positive("epsilon", epsilon)
    start = ops(
        rng,
        model,
        pooled,
        eps / (2 * chains),
        form=ops_form,
        neighbour=neighbour,
        samples=chains,
        mh_steps=mh_steps,
    )
    sigma = subsampled.calibrate_noise_multiplier(
        eps / 2, delta, sampling_rate, answers, neighbour=neighbour, accountant=accountant
    )
    return start, sigma
