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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeGuard

import numpy as np
from scipy import special, stats

from ..models import Bernoulli, ExpFamModel, GaussianMean, Logistic, Model, Neighbour, Poisson
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


def log_lik_bound(model: Model) -> float:
    """B = sup |ℓ(x, θ)| over the model's data domain × Θ (nats), per model:

    * gaussian_mean: ℓ = c − ‖x − θ‖²/(2σ²) with c = −(d/2) log(2πσ²). ‖x − θ‖ ranges over
      [0, D] with D = data_bound + theta_bound·√d (x on the sphere opposite a corner of Θ), so
      B = max(|c|, |c − D²/(2σ²)|).
    * bernoulli: ℓ = −log(1 + e^{∓θ}) ∈ [−log(1 + e^{theta_bound}), 0), so
      B = softplus(theta_bound).
    * poisson: ℓ_x(θ) = xθ − e^θ − log x! is concave in θ. For each count x ∈ {0..count_bound},
      |ℓ_x| is largest at θ = ±theta_bound or at the maximiser θ = log x (clipped to Θ), and
      we take the maximum over that finite set.
    * logistic: ℓ = −log(1 + e^{∓z}), |z| = |xᵀθ| ≤ data_bound·theta_bound·√d, so
      B = softplus(data_bound·theta_bound·√d).
    """
    if isinstance(model, GaussianMean):
        c = -0.5 * model.dim * math.log(2 * math.pi * model.noise_sd**2)
        dist = model.data_bound + model.theta_bound * math.sqrt(model.dim)
        return max(abs(c), abs(c - dist * dist / (2 * model.noise_sd**2)))
    if isinstance(model, Bernoulli):
        return float(np.logaddexp(0.0, model.theta_bound))
    if isinstance(model, Poisson):
        b = model.theta_bound
        x = np.arange(model.count_bound + 1, dtype=float)
        mode = np.clip(np.log(np.maximum(x, 1e-300)), -b, b)
        values = [
            x * t - np.exp(t) - special.gammaln(x + 1)
            for t in (np.full_like(x, -b), np.full_like(x, b), mode)
        ]
        return float(np.max(np.abs(values)))
    if isinstance(model, Logistic):
        return float(np.logaddexp(0.0, model.data_bound * model.theta_bound * math.sqrt(model.dim)))
    raise ValueError(f"no log-likelihood bound is derived for model {model.name!r}")


def log_lik_range(model: Model) -> float:
    """C = sup_θ sup_{x, x'} |ℓ(x', θ) − ℓ(x, θ)| over the data domain and Θ (Foulds et al.'s
    Theorem 2), per model:

    * gaussian_mean: at ‖θ‖ = r, ‖x − θ‖ ranges over [max(0, r − R), r + R] (R = data_bound),
      so the range is ((r + R)² − max(0, r − R)²)/(2σ²). This increases in r, so take
      r = theta_bound·√d: (r + R)²/(2σ²) if r ≤ R, else 2rR/σ².
    * bernoulli: |ℓ(1, θ) − ℓ(0, θ)| = |θ|, so C = theta_bound.
    * poisson: f_x(θ) = xθ − log x!. For each pair (x, x') the difference is linear in θ, so the
      supremum is at θ = ±theta_bound: C = max over θ = ±B of (max_x f_x − min_x f_x).
    * logistic: at fixed θ, ℓ ranges from −softplus(R‖θ‖) to −softplus(−R‖θ‖) (x aligned with θ,
      label wrong or right), a range of R‖θ‖. So C = data_bound·theta_bound·√d.
    """
    if isinstance(model, GaussianMean):
        r = model.theta_bound * math.sqrt(model.dim)
        big_r = model.data_bound
        width = (r + big_r) ** 2 if r <= big_r else 4.0 * r * big_r
        return width / (2 * model.noise_sd**2)
    if isinstance(model, Bernoulli):
        return float(model.theta_bound)
    if isinstance(model, Poisson):
        x = np.arange(model.count_bound + 1, dtype=float)
        f = [x * t - special.gammaln(x + 1) for t in (-model.theta_bound, model.theta_bound)]
        return float(max(v.max() - v.min() for v in f))
    if isinstance(model, Logistic):
        return model.data_bound * model.theta_bound * math.sqrt(model.dim)
    raise ValueError(f"no log-likelihood range is derived for model {model.name!r}")


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


def _is_conjugate(model: Model) -> TypeGuard[ExpFamModel]:
    return isinstance(model, (GaussianMean, Bernoulli, Poisson))


def _truncated_ppf(dist_lo, lo: float, hi: float, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws of a continuous scipy distribution truncated to [lo, hi], using the
    lower tail (cdf/ppf) when the interval lies in it and the upper tail (sf/isf) otherwise,
    so that a posterior piled against either end keeps full precision."""
    f_lo, f_hi = dist_lo.cdf(lo), dist_lo.cdf(hi)
    if f_lo < 0.5:
        return np.clip(dist_lo.ppf(f_lo + u * (f_hi - f_lo)), lo, hi)
    s_lo, s_hi = dist_lo.sf(lo), dist_lo.sf(hi)
    return np.clip(dist_lo.isf(s_hi + u * (s_lo - s_hi)), lo, hi)


def conjugate_draws(
    rng: np.random.Generator,
    model: ExpFamModel,
    n: float,
    stat_sum: np.ndarray,
    size: int,
    rho: float = 1.0,
) -> np.ndarray:
    """``size`` independent draws ``(size, d)`` from the (tempered) posterior over Θ,
    ∝ [p(θ) Π p(x | θ)]^ρ given ``n`` records whose statistics sum to ``stat_sum``, in the
    sampled parameterisation:

    * gaussian_mean: each coordinate N(μ, 1/(ρ·prec)) truncated to [−B, B], with
      prec = 1/s² + n/σ² and μ = (m/s² + Σx/σ²)/prec;
    * bernoulli: p ~ Beta(ρ(a + s), ρ(b + n − s)) truncated to [σ(−B), σ(B)], θ = logit p
      (the model's prior is Beta(a, b) on p carried to θ with its Jacobian, so this is exact);
    * poisson: λ ~ Gamma(ρ(shape + s), rate ρ(rate + n)) truncated to [e^−B, e^B], θ = log λ.

    ``stat_sum`` must be attainable (project a noisy sum first).
    """
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    s = np.asarray(stat_sum, dtype=float).reshape(-1)
    b = model.theta_bound
    if isinstance(model, GaussianMean):
        prec = 1.0 / model.prior_sd**2 + n / model.noise_sd**2
        mu = (model.prior_mean / model.prior_sd**2 + s / model.noise_sd**2) / prec
        tau = 1.0 / math.sqrt(rho * prec)
        u = rng.random((size, model.dim))
        return np.column_stack(
            [_truncated_ppf(stats.norm(mu[j], tau), -b, b, u[:, j]) for j in range(model.dim)]
        )
    if isinstance(model, Bernoulli):
        if not 0.0 <= s[0] <= n:
            raise ValueError(f"bernoulli: the number of ones must lie in [0, n={n}], got {s[0]}")
        alpha, beta = rho * (model.prior_a + s[0]), rho * (model.prior_b + n - s[0])
        # draw the smaller of p and 1 − p, where the mass is (full precision near 0 and 1)
        if alpha <= beta:
            p = _truncated_ppf(
                stats.beta(alpha, beta), special.expit(-b), special.expit(b), rng.random(size)
            )
            return (np.log(p) - np.log1p(-p))[:, None]
        p1 = _truncated_ppf(
            stats.beta(beta, alpha), special.expit(-b), special.expit(b), rng.random(size)
        )
        return (np.log1p(-p1) - np.log(p1))[:, None]
    if isinstance(model, Poisson):
        if not s[0] >= 0.0:
            raise ValueError(f"poisson: the sum of counts must be >= 0, got {s[0]}")
        shape, rate = rho * (model.prior_shape + s[0]), rho * (model.prior_rate + n)
        lam = _truncated_ppf(
            stats.gamma(shape, scale=1.0 / rate), math.exp(-b), math.exp(b), rng.random(size)
        )
        return np.log(lam)[:, None]
    raise ValueError(f"model {model.name!r} has no conjugate posterior here")


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
    if method == "auto" and _is_conjugate(model):
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


def project_stats(model: ExpFamModel, stat_sum: np.ndarray, n: int) -> np.ndarray:
    """The attainable sum nearest to ``stat_sum`` ``(s,)`` for n records: counts into [0, n]
    (bernoulli), count sums into [0, n·count_bound] (poisson), a Gaussian sum into the L2 ball
    of radius n·data_bound."""
    s = np.asarray(stat_sum, dtype=float).reshape(-1).copy()
    if isinstance(model, Bernoulli):
        return np.clip(s, 0.0, float(n))
    if isinstance(model, Poisson):
        return np.clip(s, 0.0, float(n) * model.count_bound)
    if isinstance(model, GaussianMean):
        radius = n * model.data_bound
        norm = float(np.linalg.norm(s))
        return s * (radius / norm) if norm > radius else s
    raise ValueError(f"no projection is defined for model {model.name!r}")


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
