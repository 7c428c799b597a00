"""Gaussian mean with known noise: x ~ N(θ, noise_sd² I_d), records in an L2 ball."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from .api import (
    Configured,
    Param,
    as_point,
    as_prepared,
    as_theta,
    project_to_ball,
    truncated_ppf,
    validate_raw,
)
from .base import ExpFamModel, Neighbour, Reference, check_neighbour


class GaussianMean(Configured, ExpFamModel):
    """x ~ N(θ, σ² I_d) with σ = ``noise_sd`` known; θ ∈ [-theta_bound, theta_bound]^d.

    * Records: ``(n, d)``, columns ``x`` when d = 1, else ``x0 .. x{d-1}``; the data domain is
      the ball ‖x‖₂ ≤ ``data_bound`` (``prepare_records`` rescales longer rows onto it).
    * Prior: independent N(prior_mean, prior_sd²) on each coordinate of θ.
    * ℓ(x, θ) = θᵀx/σ² − ‖θ‖²/(2σ²) − ‖x‖²/(2σ²) − (d/2) log(2πσ²);
      S(x) = x, η = θ/σ², A = ‖θ‖²/(2σ²).
    * ∇ℓ = (x − θ)/σ², so L = (data_bound + theta_bound·√d)/σ² (attained at opposite corners).
    * Reference: the conjugate normal posterior, independent across coordinates, truncated to
      the box coordinate-wise (exact truncated-normal moments).
    * Capabilities: ``BoundedLogLikelihood`` and ``ConjugateUpdate`` (models/capabilities.py).
    """

    name: ClassVar[str] = "gaussian_mean"
    PARAMS: ClassVar[dict[str, Param]] = {
        "dim": Param(1, "dim", "dimension d of θ and of each record"),
        "noise_sd": Param(1.0, "positive", "known observation sd σ"),
        "data_bound": Param(4.0, "positive", "records satisfy ‖x‖₂ ≤ data_bound"),
        "theta_bound": Param(4.0, "positive", "Θ = [-theta_bound, theta_bound]^d"),
        "prior_mean": Param(0.0, "real", "prior mean of every coordinate of θ"),
        "prior_sd": Param(10.0, "positive", "prior sd of every coordinate of θ"),
    }

    def _setup(self) -> None:
        p = self._params
        self.dim = p["dim"]
        self.theta_bound = p["theta_bound"]
        self.noise_sd = p["noise_sd"]
        self.data_bound = p["data_bound"]
        self.prior_mean = p["prior_mean"]
        self.prior_sd = p["prior_sd"]
        self._var = self.noise_sd**2
        self._lipschitz = (self.data_bound + self.theta_bound * math.sqrt(self.dim)) / self._var

    @property
    def column_names(self) -> list[str]:
        return ["x"] if self.dim == 1 else [f"x{i}" for i in range(self.dim)]

    @property
    def param_names(self) -> list[str]:
        """The mean of each record coordinate: ``mu`` (d = 1) or ``mu0 .. mu{d-1}``."""
        return ["mu"] if self.dim == 1 else [f"mu{i}" for i in range(self.dim)]

    # --- data ------------------------------------------------------------------------------
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        """Validate ``(n, d)`` (1-D accepted for d = 1) and rescale rows with ‖x‖₂ > data_bound
        onto the sphere of radius data_bound."""
        arr = validate_raw(raw, self.column_names, self.name)
        return project_to_ball(arr, self.data_bound)

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """``(n, d)`` draws of N(θ, σ² I), rows projected onto the data ball."""
        mu = as_point(theta, self.dim)
        x = mu[None, :] + self.noise_sd * rng.standard_normal((int(n), self.dim))
        return project_to_ball(x, self.data_bound)

    # --- exponential family ----------------------------------------------------------------
    @property
    def stat_dim(self) -> int:
        return self.dim

    def suff_stat(self, records: np.ndarray) -> np.ndarray:
        """S(x) = x: ``(n, d)`` → ``(n, d)``."""
        return as_prepared(records, self.dim).copy()

    def natural_param(self, theta: np.ndarray) -> np.ndarray:
        """η = θ/σ²: ``(C, d)`` → ``(C, d)``."""
        return as_theta(theta, self.dim) / self._var

    def log_partition(self, theta: np.ndarray) -> np.ndarray:
        """A = ‖θ‖²/(2σ²): ``(C, d)`` → ``(C,)``."""
        th = as_theta(theta, self.dim)
        return (th * th).sum(axis=1) / (2.0 * self._var)

    def log_base_measure(self, records: np.ndarray) -> np.ndarray:
        """log h = −‖x‖²/(2σ²) − (d/2) log(2πσ²): ``(n, d)`` → ``(n,)``."""
        x = as_prepared(records, self.dim)
        return -np.sum(x * x, axis=1) / (2.0 * self._var) - 0.5 * self.dim * math.log(
            2.0 * math.pi * self._var
        )

    def stat_sensitivity(self, neighbour: Neighbour) -> float:
        """2·data_bound (replace-one) or data_bound (add/remove)."""
        check_neighbour(neighbour)
        return (2.0 if neighbour == "replace_one" else 1.0) * self.data_bound

    def stat_l1_sensitivity(self, neighbour: Neighbour) -> float:
        """2·data_bound·√d (replace-one) or data_bound·√d (add/remove), as ‖x‖₁ ≤ √d‖x‖₂."""
        return self.stat_sensitivity(neighbour) * math.sqrt(self.dim)

    # --- likelihood ------------------------------------------------------------------------
    @property
    def lipschitz(self) -> float:
        return self._lipschitz

    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """(x − θ)/σ²: ``(C, n, d)``."""
        x = as_prepared(records, self.dim)
        th = as_theta(theta, self.dim)
        return (x[None, :, :] - th[:, None, :]) / self._var

    # --- clip certification: records lie in the ball ‖x‖ ≤ data_bound ---------------------
    def gradient_norm_bound(self, theta: np.ndarray) -> np.ndarray:
        """‖∇ℓ‖ = ‖x − θ‖/σ² ≤ (data_bound + ‖θ‖)/σ² per chain ``(C,)``."""
        th = as_theta(theta, self.dim)
        return (self.data_bound + np.linalg.norm(th, axis=1)) / self._var

    def log_lik_diff_bound(self, theta: np.ndarray, theta_prop: np.ndarray) -> np.ndarray:
        """ℓ(x, θ') − ℓ(x, θ) = (θ' − θ)·(x − θ̄)/σ² with θ̄ = (θ + θ')/2, so its size is at most
        ‖θ' − θ‖ (data_bound + ‖θ̄‖)/σ² per chain ``(C,)``."""
        th, prop = as_theta(theta, self.dim), as_theta(theta_prop, self.dim)
        mid = np.linalg.norm(0.5 * (th + prop), axis=1)
        return np.linalg.norm(prop - th, axis=1) * (self.data_bound + mid) / self._var

    def grad_log_lik_from_stats(
        self, n: int, stat_sum: np.ndarray, theta: np.ndarray
    ) -> np.ndarray:
        """Σ_x (x − θ)/σ² = (Σ x − n θ)/σ²: ``(C, d)``."""
        total = np.asarray(stat_sum, dtype=float).reshape(self.dim)
        return (total[None, :] - n * as_theta(theta, self.dim)) / self._var

    # --- prior -----------------------------------------------------------------------------
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """−Σ (θ_j − m)²/(2 s²): ``(C, d)`` → ``(C,)``."""
        z = (as_theta(theta, self.dim) - self.prior_mean) / self.prior_sd
        return -0.5 * (z * z).sum(axis=1)

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        """−(θ − m)/s²: ``(C, d)``."""
        return -(as_theta(theta, self.dim) - self.prior_mean) / self.prior_sd**2

    # --- reference -------------------------------------------------------------------------
    def reference_from_stats(self, n: int, stat_sum: np.ndarray) -> Reference:
        """Coordinate-wise truncated normal: precision 1/s² + n/σ², mean (m/s² + Σx/σ²)/precision,
        truncated to [−theta_bound, theta_bound]."""
        from scipy import stats  # here: scipy.stats costs ~0.6 s of every process's start-up

        total = np.asarray(stat_sum, dtype=float).reshape(self.dim)
        prec = 1.0 / self.prior_sd**2 + n / self._var
        mu = (self.prior_mean / self.prior_sd**2 + total / self._var) / prec
        tau = 1.0 / math.sqrt(prec)
        b = self.theta_bound
        dist = stats.truncnorm((-b - mu) / tau, (b - mu) / tau, loc=mu, scale=tau)
        mean = np.clip(np.asarray(dist.mean(), dtype=float).reshape(self.dim), -b, b)
        sd = np.asarray(dist.std(), dtype=float).reshape(self.dim)
        return Reference(mean=mean, sd=sd, source="closed_form")

    # --- capabilities: BoundedLogLikelihood ------------------------------------------------
    def log_lik_bound(self) -> float:
        """B = sup |ℓ(x, θ)|: ℓ = c − ‖x − θ‖²/(2σ²) with c = −(d/2) log(2πσ²). ‖x − θ‖ ranges
        over [0, D] with D = data_bound + theta_bound·√d (x on the sphere opposite a corner of
        Θ), so B = max(|c|, |c − D²/(2σ²)|)."""
        c = -0.5 * self.dim * math.log(2 * math.pi * self.noise_sd**2)
        dist = self.data_bound + self.theta_bound * math.sqrt(self.dim)
        return max(abs(c), abs(c - dist * dist / (2 * self.noise_sd**2)))

    def log_lik_range(self) -> float:
        """C: at ‖θ‖ = r, ‖x − θ‖ ranges over [max(0, r − R), r + R] (R = data_bound), so the
        range is ((r + R)² − max(0, r − R)²)/(2σ²). This increases in r, so take
        r = theta_bound·√d: (r + R)²/(2σ²) if r ≤ R, else 2rR/σ²."""
        r = self.theta_bound * math.sqrt(self.dim)
        big_r = self.data_bound
        width = (r + big_r) ** 2 if r <= big_r else 4.0 * r * big_r
        return width / (2 * self.noise_sd**2)

    # --- capabilities: ConjugateUpdate -----------------------------------------------------
    def conjugate_draws(
        self, rng: np.random.Generator, n: float, stat_sum: np.ndarray, size: int, rho: float
    ) -> np.ndarray:
        """Each coordinate N(μ, 1/(ρ·prec)) truncated to [−B, B], with prec = 1/s² + n/σ² and
        μ = (m/s² + Σx/σ²)/prec: ``(size, d)``."""
        from scipy import stats  # here: scipy.stats costs ~0.6 s of every process's start-up

        s = np.asarray(stat_sum, dtype=float).reshape(-1)
        b = self.theta_bound
        prec = 1.0 / self.prior_sd**2 + n / self.noise_sd**2
        mu = (self.prior_mean / self.prior_sd**2 + s / self.noise_sd**2) / prec
        tau = 1.0 / math.sqrt(rho * prec)
        u = rng.random((size, self.dim))
        return np.column_stack(
            [truncated_ppf(stats.norm(mu[j], tau), -b, b, u[:, j]) for j in range(self.dim)]
        )

    def project_stats(self, stat_sum: np.ndarray, n: int) -> np.ndarray:
        """A sum of n records lies in the L2 ball of radius n·data_bound: ``(d,)``."""
        s = np.asarray(stat_sum, dtype=float).reshape(-1).copy()
        radius = n * self.data_bound
        norm = float(np.linalg.norm(s))
        return s * (radius / norm) if norm > radius else s
