"""Private Gibbs from one release of noisy sufficient statistics (docs/design.md §2.10).

Each owner releases its sufficient-statistic sum ŝ_k = Σ_{x∈D_k} S(x) + noise ONCE (chain 0 at
iteration 0, charged once in its ledger): ``sampler.release = "gaussian"`` N(0, σ_k² I) (the
``suff_stats`` kind, μ-GDP) or ``"laplace"`` exact discrete Laplace noise on the owner's lattice
(the ``laplace_stats`` kind, pure ε, docs/design.md §2.10 "The Laplace release"); every chain
then runs a Gibbs sampler whose conditionals use Σ_k ŝ_k alone, so the chain is
post-processing of that one release and costs nothing more however long it runs.

Bayesian linear regression (``linear_regression``): from Σ ŝ the coordinator reads XᵀX (made
symmetric and projected onto the PSD cone: eigenvalues clipped at 0), Xᵀy and, when σ_y is
sampled, yᵀy. One sweep updates each βⱼ | β₋ⱼ, σ_y (a normal truncated to Θ's [−B, B]) and
then σ_y² | β (an inverse gamma IG(n/2, SSR/2) truncated to [σ_min², σ_max²], SSR =
yᵀy − 2βᵀXᵀy + βᵀXᵀXβ floored at ``SSR_FLOOR``·n), which is exact Gibbs for the model's
truncated prior (β ~ N(0, τ² I) on the box, σ_y log-uniform).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import Field
from scipy import special, stats

from ..common import SUFF_STATS
from ..kinds import KINDS
from ..models import Model
from ..models.linear_regression import LinearRegression
from ..schema import Section, one_of
from .base import (
    NOISE_VARIANCE,
    QUERIED,
    ChainAlgorithm,
    ChainData,
    SamplingAlgorithm,
    Sections,
    require,
)

if TYPE_CHECKING:
    from .oracle import Oracle

#: The models private Gibbs has conditionals for (name → the class it needs).
SUPPORTED: dict[str, type] = {"linear_regression": LinearRegression}

#: A noisy SSR below SSR_FLOOR · n (which noise can make negative) is raised to it: it keeps the
#: inverse gamma proper (per record: a residual variance of 1e-6, far below σ_min²).
SSR_FLOOR = 1e-6

#: () -> (Σ_k ŝ_k (s,), Σ_k σ_k²): the owners' one release.
ReleaseFn = Callable[[], tuple[np.ndarray, float]]

#: ``sampler.release`` → the query kind (ledger name) the owners release their statistics by
RELEASES: dict[str, str] = {"gaussian": SUFF_STATS, "laplace": KINDS["laplace_stats"].ledger_name}


class GibbsSettings(Section):
    """The ``[sampler]`` keys of private_gibbs."""

    release: Annotated[str, one_of(*RELEASES)] = Field(
        default="gaussian",
        description="private_gibbs: the owners' one release of their statistics — 'gaussian' "
        "(N(0, σ²) per component, μ-GDP) or 'laplace' (exact discrete Laplace on the owner's "
        "lattice, pure ε, scale calibrated to privacy.budget_epsilon unless "
        "[privacy.noise] names laplace_scale)",
    )


@dataclass(frozen=True)
class RegressionStats:
    """What the conditionals read: XᵀX ``(d, d)`` (symmetric PSD), Xᵀy ``(d,)``, yᵀy (nan when
    σ_y is known) and the public record count n."""

    xtx: np.ndarray
    xty: np.ndarray
    yty: float
    n: int


@dataclass(frozen=True)
class GibbsState:
    """The chains' θ ``(C, d)`` and the released statistic sum ``stats`` ``(s,)`` (empty until
    the first step asks the owners); ``iteration`` counts steps."""

    theta: np.ndarray
    stats: np.ndarray
    iteration: int = 0

    @property
    def position(self) -> np.ndarray:
        return self.theta


INFO = (QUERIED, NOISE_VARIANCE)


def psd_projection(matrix: np.ndarray) -> np.ndarray:
    """The nearest (Frobenius) symmetric PSD matrix: symmetrise, clip eigenvalues at 0."""
    sym = (matrix + matrix.T) / 2
    values, vectors = np.linalg.eigh(sym)
    return (vectors * np.maximum(values, 0.0)) @ vectors.T


def regression_stats(model: LinearRegression, n: int, stat_sum: np.ndarray) -> RegressionStats:
    """XᵀX (PSD-projected), Xᵀy, yᵀy from a (noisy) statistic sum ``(s,)``."""
    xtx, xty, yty = model.gram(n, stat_sum)
    return RegressionStats(psd_projection(xtx), xty, yty, n)


def truncated_normal(
    rng: np.random.Generator, mean: np.ndarray, sd: np.ndarray, lo: float, hi: float
) -> np.ndarray:
    """N(mean, sd²) truncated to [lo, hi], elementwise (exact, by scipy's truncnorm)."""
    a, b = (lo - mean) / sd, (hi - mean) / sd
    return np.asarray(stats.truncnorm.rvs(a, b, loc=mean, scale=sd, random_state=rng))


def truncated_gamma(
    rng: np.random.Generator, shape: float, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Gamma(shape, 1) truncated to [lo, hi] ``(C,)`` by inversion: of the CDF where the interval
    lies below the median, of the survival function above it (each keeps its precision)."""
    u = rng.uniform(size=np.shape(lo))
    upper = lo > shape  # the median of Gamma(a) is below a
    p_lo, p_hi = special.gammainc(shape, lo), special.gammainc(shape, hi)
    q_lo, q_hi = special.gammaincc(shape, lo), special.gammaincc(shape, hi)
    below = special.gammaincinv(shape, p_lo + u * (p_hi - p_lo))
    above = special.gammainccinv(shape, q_lo - u * (q_lo - q_hi))
    return np.clip(np.where(upper, above, below), lo, hi)


def beta_sweep(
    rng: np.random.Generator,
    beta: np.ndarray,
    var: np.ndarray,
    s: RegressionStats,
    prior_sd: float,
    bound: float,
) -> np.ndarray:
    """One systematic sweep of βⱼ | β₋ⱼ, σ_y² = ``var`` ``(C,)``: with precision
    P = I/τ² + XᵀX/σ² and b = Xᵀy/σ², βⱼ ~ N((bⱼ − Σ_{k≠j} P_jk β_k)/P_jj, 1/P_jj) on [−B, B]."""
    beta = beta.copy()
    for j in range(beta.shape[1]):
        p_jj = 1.0 / prior_sd**2 + s.xtx[j, j] / var
        rest = beta @ s.xtx[j] - beta[:, j] * s.xtx[j, j]
        mean = (s.xty[j] - rest) / var / p_jj
        beta[:, j] = truncated_normal(rng, mean, 1.0 / np.sqrt(p_jj), -bound, bound)
    return beta


def variance_draw(
    rng: np.random.Generator, beta: np.ndarray, s: RegressionStats, lo: float, hi: float
) -> np.ndarray:
    """σ_y² | β ~ IG(n/2, SSR/2) on [lo, hi] ``(C,)`` (σ_y log-uniform: p(σ²) ∝ 1/σ²), drawn as
    SSR/(2G) with G ~ Gamma(n/2) on [SSR/(2hi), SSR/(2lo)]."""
    ssr = s.yty - 2 * beta @ s.xty + np.einsum("ci,ij,cj->c", beta, s.xtx, beta)
    half = np.maximum(ssr, SSR_FLOOR * s.n) / 2
    g = truncated_gamma(rng, s.n / 2, half / hi, half / lo)
    return half / g


def gibbs_sweep(
    rng: np.random.Generator, theta: np.ndarray, model: LinearRegression, s: RegressionStats
) -> np.ndarray:
    """One Gibbs sweep of every chain ``(C, dim)`` → ``(C, dim)``: β, then σ_y (as s) when it
    is sampled."""
    beta = theta[:, : model.n_beta]
    var = model.sigma(theta) ** 2
    beta = beta_sweep(rng, beta, var, s, model.prior_sd, model.theta_bound)
    if model.known:
        return beta
    var = variance_draw(rng, beta, s, model.sigma_min**2, model.sigma_max**2)
    scaled = (0.5 * np.log(var) - model.log_sigma_mid) / model.log_sigma_slope
    return np.hstack([beta, np.clip(scaled, -model.theta_bound, model.theta_bound)[:, None]])


def kernel(model: LinearRegression, release: ReleaseFn, n_total: int) -> SamplingAlgorithm:
    """Gibbs over the statistics ``release`` gives on the first step (asked once per run)."""

    def init(rng: np.random.Generator, theta0: np.ndarray) -> GibbsState:
        return GibbsState(np.array(theta0, dtype=float), np.zeros(0))

    def step(rng: np.random.Generator, state: GibbsState) -> tuple[GibbsState, dict[str, Any]]:
        chains = len(state.theta)
        asked = state.stats.size == 0
        noise_var = math.nan
        stat_sum = state.stats
        if asked:
            stat_sum, noise_var = release()
        theta = gibbs_sweep(rng, state.theta, model, regression_stats(model, n_total, stat_sum))
        info = {
            QUERIED.name: np.full(chains, asked),
            NOISE_VARIANCE.name: np.full(chains, noise_var),
        }
        return GibbsState(theta, stat_sum, state.iteration + 1), info

    return SamplingAlgorithm(init, step, INFO)


def oracle_release(oracle: Oracle, release: str = "gaussian") -> ReleaseFn:
    """The owners' one release (``release``, a key of ``RELEASES``): one statistic answer
    keyed (chain 0, iteration 0), summed over owners → ``(Σ_k ŝ_k (s,), Σ_k noise variance)``.
    A repeated ask (a resumed run) is replayed by the owners' ledgers, not charged again."""

    def gaussian() -> tuple[np.ndarray, float]:
        values, noise_var = oracle.suff_stats(np.array([0]), 0, 1).total()
        return np.asarray(values)[0, 0], float(noise_var)

    def laplace() -> tuple[np.ndarray, float]:
        values, noise_var = oracle.query(RELEASES["laplace"], 0, np.array([0])).total()
        return np.asarray(values)[0], float(noise_var)

    return gaussian if release == "gaussian" else laplace


def build(
    model: Model, data: ChainData, *, step: float, release: str = "gaussian"
) -> SamplingAlgorithm:
    """Private Gibbs over the owners behind ``data.oracle`` (with ``data.n_total``) from their
    ``release``; ``step`` is unused (a Gibbs sweep has none)."""
    if not isinstance(model, LinearRegression):
        raise ValueError(f"private_gibbs has no conditionals for model {model.name!r}")
    if data.n_total is None:
        raise ValueError("private_gibbs needs the owners' public total record count n_total")
    oracle = data.require_oracle("private_gibbs")
    return kernel(model, oracle_release(oracle, release), data.n_total)


def plan(sampler: Mapping[str, Any]) -> int:
    """One statistic answer per run, chain 0's, whatever the chain count (``once``)."""
    return 1


def asks(sampler: Mapping[str, Any]) -> dict[str, int]:
    """The release's kind (``sampler.release``) and its one answer per run: the entry's
    ``once`` names every release kind, so the plan (and a budget-calibrated Laplace scale)
    counts it once, not per chain, and an owner refuses a second release."""
    return {RELEASES[sampler.get("release", "gaussian")]: plan(sampler)}


def check(sections: Sections, model: Model) -> None:
    """A model with conditionals here, and replace-one neighbours (n is public)."""
    require(
        type(model) in SUPPORTED.values(),
        f"sampler.algorithm = 'private_gibbs' supports the models {', '.join(SUPPORTED)}; "
        f"{model.name!r} is not one (change model.name or sampler.algorithm)",
    )
    require(
        sections["privacy"]["neighbour"] == "replace_one",
        "sampler.algorithm = 'private_gibbs' needs each owner's record count n, which owners keep "
        "private under privacy.neighbour = 'add_remove'; set privacy.neighbour = 'replace_one'",
    )


PRIVATE_GIBBS = ChainAlgorithm(
    "private_gibbs",
    "Gibbs sampling from owners' noisy sufficient statistics, released once",
    build,
    GibbsSettings,
    GibbsState,
    SUFF_STATS,
    plan=plan,
    check=check,
    kinds=asks,
    once=tuple(RELEASES.values()),
)
