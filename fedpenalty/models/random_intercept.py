"""``random_intercept``: owner k's records y ~ N(μ + b_k, σ_y²), b_k ~ N(0, τ²)
(docs/design.md §6, "Hierarchical models (design)").

z = (μ, log τ, b_1, …, b_K): θ_L = μ, θ_H = log τ, one block b_k (p = 1) per owner.
Owners serve ``gaussian_mean`` (d = 1) on their local parameter φ_k = μ + b_k, the one
combination their likelihood reads: −(y − φ_k)²/(2σ_y²) + const, with local box
|φ_k| ≤ mu_bound + b_bound. So an owner never sees μ or b_k apart; its local step at a move
of μ (sub-step 2) is |Δμ|, at a move of b_k (sub-step 3) |Δb_k|; both ≤ ‖Δ(μ, b_k)‖₂.
Its Lipschitz bound is gaussian_mean's (data_bound + mu_bound + b_bound)/σ_y² nats per unit of φ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from scipy import integrate

from ..errors import ConfigError
from .api import Param, resolve_params
from .base import Reference
from .gaussian_mean import GaussianMean
from .hierarchical import HierarchicalModel


class RandomIntercept(HierarchicalModel):
    """y_ki ~ N(μ + b_k, σ_y²) with σ_y = ``noise_sd``; records clipped to ±data_bound.

    * Box: |μ| ≤ mu_bound, log τ ∈ [log tau_min, log tau_max], |b_k| ≤ b_bound, with
      b_bound ≥ 6·tau_max (checked) so the box trims a negligible mass of p(b_k | τ).
    * Prior: μ ~ N(prior_mean, prior_sd²); τ ~ half-normal(tau_scale) carried to log τ:
      log p(log τ) = −τ²/(2·tau_scale²) + log τ; b_k | τ ~ N(0, τ²) (untruncated density).
    * Reference: given τ, (μ, b) is Gaussian in closed form; log τ by adaptive quadrature
      over its box (``reference_posterior``).
    """

    name: ClassVar[str] = "random_intercept"  # type: ignore[misc]
    PARAMS: ClassVar[dict[str, Param]] = {
        "noise_sd": Param(1.0, "positive", "known observation sd σ_y, units of y"),
        "data_bound": Param(4.0, "positive", "records satisfy |y| ≤ data_bound"),
        "mu_bound": Param(3.0, "positive", "|μ| ≤ mu_bound, units of y"),
        "tau_min": Param(0.05, "positive", "τ ≥ tau_min, units of y"),
        "tau_max": Param(2.0, "positive", "τ ≤ tau_max, units of y"),
        "b_bound": Param(12.0, "positive", "|b_k| ≤ b_bound (≥ 6·tau_max), units of y"),
        "prior_mean": Param(0.0, "real", "prior mean of μ"),
        "prior_sd": Param(10.0, "positive", "prior sd of μ"),
        "tau_scale": Param(1.0, "positive", "scale of τ's half-normal prior, units of y"),
        "true_tau": Param(
            0.7, "positive", "synthetic data only: the τ the owner effects b_k are drawn with"
        ),
    }
    shared_dim = 2
    block_dim = 1
    lik_index = (0,)

    def __init__(self, **params: Any) -> None:
        p = resolve_params(self.name, self.PARAMS, params)
        if not p["tau_min"] < p["tau_max"]:
            raise ConfigError(f"[model] {self.name}: tau_min must be < tau_max, got {p}")
        if p["b_bound"] < 6.0 * p["tau_max"] * (1.0 - 1e-12):  # 6 × 0.1 is 0.6000000000000001
            raise ConfigError(
                f"[model] {self.name}: b_bound must be ≥ 6·tau_max = {6.0 * p['tau_max']:g} so "
                f"that the box trims a negligible mass of p(b | τ); got {p['b_bound']}"
            )
        self._params = p
        self.noise_sd, self.data_bound = p["noise_sd"], p["data_bound"]
        self.mu_bound, self.b_bound = p["mu_bound"], p["b_bound"]
        self.block_bound = self.b_bound
        self.log_tau_box = (math.log(p["tau_min"]), math.log(p["tau_max"]))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {k: spec.default for k, spec in cls.PARAMS.items()}

    def params(self) -> dict[str, Any]:
        return dict(self._params)

    def local_model(self) -> GaussianMean:
        p = self._params
        return GaussianMean(
            dim=1,
            noise_sd=p["noise_sd"],
            data_bound=p["data_bound"],
            theta_bound=p["mu_bound"] + p["b_bound"],
        )

    def local_params(self, z: np.ndarray, owners: int) -> np.ndarray:
        """φ_k = μ + b_k: ``(K, C, 1)``."""
        z = np.asarray(z, dtype=float)
        return z[None, :, :1] + self.blocks(z, owners)

    def invariant_directions(self, owners: int) -> np.ndarray:
        """μ + c with every b_k − c: ``(1, 2 + K)``."""
        return np.array([[1.0, 0.0] + [-1.0] * owners])

    def log_prior(self, z: np.ndarray, owners: int) -> np.ndarray:
        z = np.asarray(z, dtype=float)
        p = self._params
        mu, log_tau = z[:, 0], z[:, 1]
        tau = np.exp(log_tau)
        b = z[:, 2 : 2 + owners]
        return (
            -0.5 * ((mu - p["prior_mean"]) / p["prior_sd"]) ** 2
            - 0.5 * (tau / p["tau_scale"]) ** 2
            + log_tau
            - 0.5 * np.sum(b * b, axis=1) / tau**2
            - owners * log_tau
        )

    def grad_log_prior(self, z: np.ndarray, owners: int) -> np.ndarray:
        z = np.asarray(z, dtype=float)
        p = self._params
        tau2 = np.exp(2.0 * z[:, 1])
        b = z[:, 2 : 2 + owners]
        out = np.empty_like(z)
        out[:, 0] = -(z[:, 0] - p["prior_mean"]) / p["prior_sd"] ** 2
        out[:, 1] = -tau2 / p["tau_scale"] ** 2 + 1.0 + np.sum(b * b, axis=1) / tau2 - owners
        out[:, 2:] = -b / tau2[:, None]
        return out

    def in_theta_space(self, z: np.ndarray, owners: int) -> np.ndarray:
        z = np.asarray(z, dtype=float)
        lo, hi = self.log_tau_box
        return (
            (z.shape[1] == self.full_dim(owners))
            & (np.abs(z[:, 0]) <= self.mu_bound)
            & (z[:, 1] >= lo)
            & (z[:, 1] <= hi)
            & (np.abs(z[:, 2:]) <= self.b_bound).all(axis=1)
        )

    def param_names(self, owner_names: Sequence[str]) -> list[str]:
        return ["mu", "log_tau", *(f"b[{name}]" for name in owner_names)]

    def start_points(self, rng: np.random.Generator, chains: int, owners: int, scale: float):
        """Data-independent starts ``(chains, 2 + K)``: μ uniform in ±scale·mu_bound, log τ
        uniform in the middle ``scale`` of its box, b_k uniform in ±scale·tau_max."""
        lo, hi = self.log_tau_box
        mid, half = 0.5 * (lo + hi), 0.5 * scale * (hi - lo)
        return np.column_stack(
            [
                rng.uniform(-scale * self.mu_bound, scale * self.mu_bound, chains),
                rng.uniform(mid - half, mid + half, chains),
                rng.uniform(-1, 1, (chains, owners)) * scale * self._params["tau_max"],
            ]
        )

    def true_shared(self, true_theta: float) -> np.ndarray:
        """The synthetic data's (μ, log τ): μ = data.true_theta, τ = ``true_tau``."""
        return np.array([true_theta, math.log(self._params["true_tau"])])

    def simulate_blocks(
        self, rng: np.random.Generator, theta: np.ndarray, owners: int
    ) -> np.ndarray:
        """(μ, log τ) = ``theta``; b_k ~ N(0, τ²) clipped to ±b_bound: ``(2 + K,)``."""
        mu, log_tau = np.asarray(theta, dtype=float).reshape(2)
        b = np.clip(math.exp(log_tau) * rng.standard_normal(owners), -self.b_bound, self.b_bound)
        return np.concatenate([[mu, log_tau], b])

    def simulate_owner_records(
        self, rng: np.random.Generator, z: np.ndarray, owner: int, n: int
    ) -> np.ndarray:
        """``(n, 1)`` draws of N(μ + b_owner, σ_y²), clipped to ±data_bound."""
        z = np.asarray(z, dtype=float).reshape(-1)
        y = z[0] + z[2 + owner] + self.noise_sd * rng.standard_normal(int(n))
        return np.clip(y, -self.data_bound, self.data_bound)[:, None]

    def reference_posterior(self, records: Sequence[np.ndarray]) -> Reference:
        """Deterministic moments of z: see ``intercept_reference``."""
        local = self.local_model()
        prepared = [local.prepare_records(r)[:, 0] for r in records]
        counts = np.array([len(r) for r in prepared], dtype=float)
        means = np.array([r.mean() for r in prepared])
        return intercept_reference(self._params, counts, means, self.log_tau_box)


def _given_tau(p: Mapping[str, float], n: np.ndarray, ybar: np.ndarray, log_tau: float):
    """Given τ: log marginal likelihood of the owners' means (up to a constant in τ) + log prior
    of log τ, and the conditional means ``(2 + K,)`` and variances ``(2 + K,)`` of z."""
    tau2 = math.exp(2.0 * log_tau)
    s0sq = p["prior_sd"] ** 2
    v = p["noise_sd"] ** 2 / n + tau2  # ȳ_k | μ, τ ~ N(μ, v_k)
    prec = 1.0 / s0sq + np.sum(1.0 / v)
    m = (p["prior_mean"] / s0sq + np.sum(ybar / v)) / prec
    quad = p["prior_mean"] ** 2 / s0sq + np.sum(ybar**2 / v) - prec * m * m
    log_w = -0.5 * (np.sum(np.log(v)) + math.log(prec) + quad)
    log_w += -0.5 * tau2 / p["tau_scale"] ** 2 + log_tau
    w = tau2 / v  # E[b_k | μ, τ, y] = w_k (ȳ_k − μ)
    b_mean = w * (ybar - m)
    b_var = 1.0 / (n / p["noise_sd"] ** 2 + 1.0 / tau2) + w * w / prec
    mean = np.concatenate([[m, log_tau], b_mean])
    var = np.concatenate([[1.0 / prec, 0.0], b_var])
    return log_w, mean, var


def intercept_reference(
    p: Mapping[str, float], n: np.ndarray, ybar: np.ndarray, log_tau_box: tuple[float, float]
) -> Reference:
    """Posterior moments of z given K owners' record counts n ``(K,)`` and means ȳ ``(K,)``:
    (μ, b) | τ is Gaussian in closed form; the marginal of log τ over its box by adaptive
    quadrature (relative error ~1e-10). The μ and b boxes are ignored, which the check that
    each lies ≥ 6 posterior sd beyond the mean justifies (``ValueError`` otherwise, naming
    mu_bound / b_bound)."""
    lo, hi = log_tau_box
    grid = np.linspace(lo, hi, 201)
    peak = max(_given_tau(p, n, ybar, t)[0] for t in grid)

    def moments(t: float) -> np.ndarray:
        log_w, mean, var = _given_tau(p, n, ybar, t)
        w = math.exp(log_w - peak)
        return w * np.concatenate([[1.0], mean, var + mean * mean])

    opts = dict(epsabs=0.0, epsrel=1e-10, limit=400, points=list(grid[1:-1:20]))
    total = np.asarray(integrate.quad_vec(moments, lo, hi, **opts)[0])
    k2 = len(ybar) + 2
    mean = total[1 : 1 + k2] / total[0]
    sd = np.sqrt(np.maximum(total[1 + k2 :] / total[0] - mean * mean, 0.0))
    bounds = {"mu_bound": (0, 1), "b_bound": (2, k2)}
    for key, (a, b) in bounds.items():
        if np.any(np.abs(mean[a:b]) + 6.0 * sd[a:b] > p[key]):
            raise ValueError(
                f"random_intercept reference: the posterior reaches within 6 sd of the box "
                f"edge; raise model.{key}"
            )
    return Reference(mean=mean, sd=sd, source="closed_form")
