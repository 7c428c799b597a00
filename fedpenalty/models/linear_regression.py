"""Linear regression y = xᵀβ + ε, ε ~ N(0, σ_y²), with σ_y known or sampled (docs/design.md §6,
"Regression models")."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from scipy import integrate, optimize

from ..errors import ConfigError
from .api import (
    Configured,
    Param,
    as_point,
    as_prepared,
    as_theta,
    project_to_ball,
    uniform_ball,
    validate_raw,
)
from .base import ExpFamModel, Neighbour, Reference, check_neighbour

#: A Gaussian reference is used only when the box Θ lies this many posterior sd beyond the
#: mean in every coordinate of β (the truncated mass is then below 2e-9 per coordinate).
BOX_MARGIN_SD = 6.0


class LinearRegression(Configured, ExpFamModel):
    """y | x ~ N(xᵀβ, σ_y²), no intercept (add a constant feature yourself).

    * Records ``(n, d + 1)``, columns ``x0 .. x{d-1}, y``; ‖x‖₂ ≤ R = ``data_bound`` (longer
      rows rescaled onto the sphere) and y clipped to [−Y, Y], Y = ``y_bound``.
    * ``known_variance = 1``: σ_y = ``noise_sd`` and θ = β (d coordinates).
      ``known_variance = 0``: θ = (β, s), s ∈ [−B, B] mapped linearly onto
      log σ_y ∈ [log sigma_min, log sigma_max]: log σ_y = c + k·s with c the midpoint and
      k = (log sigma_max − log sigma_min)/(2B) (so Θ stays the box [−B, B]^(d+1)).
    * Prior: β ~ N(0, prior_sd² I); σ_y log-uniform on [sigma_min, sigma_max], i.e. s uniform
      on [−B, B] (the Jacobian σ_y·k of σ_y ↦ s cancels the 1/σ_y density: a constant).
    * ℓ = −r²/(2σ²) − log σ − ½ log 2π, r = y − xᵀβ; ∇_β ℓ = r x/σ², ∂ℓ/∂s = k(r²/σ² − 1).
    * L: |r| ≤ ρ = Y + R·B√d and ‖x‖ ≤ R, so L = Rρ/σ² (known; attained at a corner of Θ
      with x opposite it and y = Y); unknown: L = √((Rρ/σ_min²)² + k² max(1, ρ²/σ_min² − 1)²),
      a bound of each term by its own supremum.
    * Exponential family: S = (x y, U(xxᵀ)[, y²]) with U the upper triangle (row major),
      η = (β/σ², −w⊙U(ββᵀ)/(2σ²)[, −1/(2σ²)]), w = 1 on the diagonal and 2 off it;
      A = 0 (known; y² is in log h) or log σ (unknown).
    * Reference: known — the conjugate Gaussian; unknown — 1-D adaptive quadrature over s of
      the Gaussian β | σ; both only when Θ lies ``BOX_MARGIN_SD`` sd beyond the mean of β
      (else ``None`` and the coordinator samples it, ``coordinator/reference.py``).
    * Capabilities: ``BoundedLogLikelihood``; not ``ConjugateUpdate``.
    """

    name: ClassVar[str] = "linear_regression"
    PARAMS: ClassVar[dict[str, Param]] = {
        "dim": Param(2, "dim", "number of covariates d (= dimension of β)"),
        "data_bound": Param(1.0, "positive", "covariates satisfy ‖x‖₂ ≤ data_bound"),
        "y_bound": Param(3.0, "positive", "responses are clipped to [-y_bound, y_bound]"),
        "theta_bound": Param(1.0, "positive", "Θ = [-theta_bound, theta_bound]^d (or d + 1)"),
        "prior_sd": Param(2.0, "positive", "prior sd of every coefficient of β"),
        "known_variance": Param(1, "real", "1: σ_y = noise_sd is known; 0: σ_y is sampled"),
        "noise_sd": Param(1.0, "positive", "σ_y when known_variance = 1"),
        "sigma_min": Param(0.5, "positive", "smallest σ_y when known_variance = 0"),
        "sigma_max": Param(2.0, "positive", "largest σ_y when known_variance = 0"),
    }

    def _setup(self) -> None:
        p = self._params
        if p["known_variance"] not in (0.0, 1.0):
            raise ConfigError(
                f"[model] {self.name}: 'known_variance' must be 0 or 1, got {p['known_variance']}"
            )
        if p["sigma_min"] >= p["sigma_max"]:
            raise ConfigError(f"[model] {self.name}: 'sigma_min' must be below 'sigma_max'")
        self.known = p["known_variance"] == 1.0
        self.n_beta = p["dim"]
        self.dim = self.n_beta + (0 if self.known else 1)
        self.data_bound, self.y_bound = p["data_bound"], p["y_bound"]
        self.theta_bound, self.prior_sd = p["theta_bound"], p["prior_sd"]
        self.noise_sd, self.sigma_min, self.sigma_max = (
            p["noise_sd"],
            p["sigma_min"],
            p["sigma_max"],
        )
        lo, hi = math.log(p["sigma_min"]), math.log(p["sigma_max"])
        self.log_sigma_mid, self.log_sigma_slope = (lo + hi) / 2, (hi - lo) / (2 * self.theta_bound)
        self._iu = np.triu_indices(self.n_beta)
        self._w = np.where(self._iu[0] == self._iu[1], 1.0, 2.0)
        self._lipschitz = self._lipschitz_bound()

    def _max_residual(self) -> float:
        """ρ = sup |y − xᵀβ| = Y + R·B√d over the domain × Θ."""
        return self.y_bound + self.data_bound * self.theta_bound * math.sqrt(self.n_beta)

    def _lipschitz_bound(self) -> float:
        rho, r = self._max_residual(), self.data_bound
        if self.known:
            return r * rho / self.noise_sd**2
        var_min = self.sigma_min**2
        score = self.log_sigma_slope * max(1.0, rho * rho / var_min - 1.0)
        return math.hypot(r * rho / var_min, score)

    @property
    def column_names(self) -> list[str]:
        return [f"x{i}" for i in range(self.n_beta)] + ["y"]

    @property
    def param_names(self) -> list[str]:
        """``beta0 .. beta{d-1}`` and, when σ_y is sampled, ``log_sigma_scaled`` (s)."""
        return [f"beta{j}" for j in range(self.n_beta)] + (
            [] if self.known else ["log_sigma_scaled"]
        )

    # --- data ------------------------------------------------------------------------------
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        """Validate ``(n, d + 1)`` records; rescale rows with ‖x‖₂ > R onto the sphere and clip
        y to [−Y, Y]."""
        arr = validate_raw(raw, self.column_names, self.name)
        arr[:, :-1] = project_to_ball(arr[:, :-1], self.data_bound)
        np.clip(arr[:, -1], -self.y_bound, self.y_bound, out=arr[:, -1])
        return arr

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """``(n, d + 1)``: x uniform in the ball of radius R, y = xᵀβ + σ_y ε clipped."""
        point = as_point(theta, self.dim)
        beta, sigma = point[: self.n_beta], float(self.sigma(point[None, :])[0])
        x = uniform_ball(rng, int(n), self.n_beta, self.data_bound)
        y = np.clip(x @ beta + sigma * rng.standard_normal(int(n)), -self.y_bound, self.y_bound)
        return np.column_stack([x, y])

    def sigma(self, theta: np.ndarray) -> np.ndarray:
        """σ_y per chain: ``(C, dim)`` → ``(C,)``."""
        th = as_theta(theta, self.dim)
        if self.known:
            return np.full(len(th), self.noise_sd)
        return np.exp(self.log_sigma_mid + self.log_sigma_slope * th[:, -1])

    # --- exponential family ----------------------------------------------------------------
    @property
    def stat_dim(self) -> int:
        return self.n_beta + len(self._w) + (0 if self.known else 1)

    def suff_stat(self, records: np.ndarray) -> np.ndarray:
        """S = (x y, U(xxᵀ)[, y²]): ``(n, d + 1)`` → ``(n, s)``."""
        arr = as_prepared(records, self.n_beta + 1)
        x, y = arr[:, :-1], arr[:, -1:]
        parts = [x * y, x[:, self._iu[0]] * x[:, self._iu[1]]]
        return np.hstack(parts if self.known else [*parts, y * y])

    def natural_param(self, theta: np.ndarray) -> np.ndarray:
        """η = (β/σ², −w⊙U(ββᵀ)/(2σ²)[, −1/(2σ²)]): ``(C, dim)`` → ``(C, s)``."""
        th = as_theta(theta, self.dim)
        beta, var = th[:, : self.n_beta], self.sigma(th)[:, None] ** 2
        quad = -self._w * beta[:, self._iu[0]] * beta[:, self._iu[1]] / (2 * var)
        parts = [beta / var, quad]
        return np.hstack(parts if self.known else [*parts, -0.5 / var])

    def log_partition(self, theta: np.ndarray) -> np.ndarray:
        """A = 0 (known σ_y) or log σ_y: ``(C, dim)`` → ``(C,)``."""
        return np.zeros(len(as_theta(theta, self.dim))) if self.known else np.log(self.sigma(theta))

    def log_base_measure(self, records: np.ndarray) -> np.ndarray:
        """log h = −y²/(2σ²) − ½ log(2πσ²) (known) or −½ log 2π: ``(n,)``."""
        y = as_prepared(records, self.n_beta + 1)[:, -1]
        if not self.known:
            return np.full(len(y), -0.5 * math.log(2 * math.pi))
        var = self.noise_sd**2
        return -y * y / (2 * var) - 0.5 * math.log(2 * math.pi * var)

    def stat_sensitivity(self, neighbour: Neighbour) -> float:
        """sup‖S(x)‖₂ = √(R²Y² + R⁴[+ Y⁴]) (x on an axis, |y| = Y) for add/remove; twice it
        (the triangle inequality, an upper bound) for replace-one."""
        check_neighbour(neighbour)
        r, y = self.data_bound, self.y_bound
        sup = math.sqrt(r * r * y * y + r**4 + (0.0 if self.known else y**4))
        return (2.0 if neighbour == "replace_one" else 1.0) * sup

    def stat_l1_sensitivity(self, neighbour: Neighbour) -> float:
        """sup‖S(x)‖₁ ≤ YR√d + (d + 1)R²/2 [+ Y²] (‖x‖₁ ≤ √d‖x‖₂); twice it for replace-one."""
        check_neighbour(neighbour)
        r, y, d = self.data_bound, self.y_bound, self.n_beta
        sup = y * r * math.sqrt(d) + (d + 1) * r * r / 2 + (0.0 if self.known else y * y)
        return (2.0 if neighbour == "replace_one" else 1.0) * sup

    # --- likelihood ------------------------------------------------------------------------
    @property
    def lipschitz(self) -> float:
        return self._lipschitz

    def _residuals(self, records: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, ...]:
        """x ``(n, d)``, residuals r ``(C, n)`` and σ_y ``(C,)``."""
        arr, th = as_prepared(records, self.n_beta + 1), as_theta(theta, self.dim)
        x = arr[:, :-1]
        return x, arr[None, :, -1] - th[:, : self.n_beta] @ x.T, self.sigma(th)

    def log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """−r²/(2σ²) − log σ − ½ log 2π, computed from the residual: ``(C, n)``."""
        _, r, sigma = self._residuals(records, theta)
        scaled = r / sigma[:, None]
        return -0.5 * scaled * scaled - np.log(sigma)[:, None] - 0.5 * math.log(2 * math.pi)

    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """(r x/σ²[, k(r²/σ² − 1)]): ``(C, n, dim)``."""
        x, r, sigma = self._residuals(records, theta)
        var = (sigma * sigma)[:, None]
        beta_part = (r / var)[:, :, None] * x[None, :, :]
        if self.known:
            return beta_part
        score = self.log_sigma_slope * (r * r / var - 1.0)
        return np.concatenate([beta_part, score[:, :, None]], axis=2)

    # --- prior -----------------------------------------------------------------------------
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        """−‖β‖²/(2 s²) (s uniform: constant): ``(C, dim)`` → ``(C,)``."""
        beta = as_theta(theta, self.dim)[:, : self.n_beta] / self.prior_sd
        return -0.5 * np.sum(beta * beta, axis=1)

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        """(−β/s²[, 0]): ``(C, dim)``."""
        grad = -as_theta(theta, self.dim) / self.prior_sd**2
        if not self.known:
            grad[:, -1] = 0.0
        return grad

    # --- reference -------------------------------------------------------------------------
    def gram(self, n: int, stat_sum: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """XᵀX ``(d, d)``, Xᵀy ``(d,)`` and yᵀy (nan when σ_y is known) from Σ S."""
        s = np.asarray(stat_sum, dtype=float).reshape(self.stat_dim)
        d, m = self.n_beta, len(self._w)
        xtx = np.zeros((d, d))
        xtx[self._iu] = s[d : d + m]
        xtx = xtx + np.triu(xtx, 1).T
        return xtx, s[:d], (math.nan if self.known else float(s[-1]))

    def reference_from_stats(self, n: int, stat_sum: np.ndarray) -> Reference | None:
        """Known σ_y: the Gaussian β | data; unknown: the mixture over s by quadrature. ``None``
        when the box cuts within ``BOX_MARGIN_SD`` posterior sd of the mean of β."""
        xtx, xty, yty = self.gram(n, stat_sum)
        if self.known:
            mean, var = _beta_given_sigma(xtx, xty, self.noise_sd, self.prior_sd)
            ref = Reference(mean, np.sqrt(np.diag(var)), "closed_form")
        else:
            ref = self._unknown_variance_reference(n, xtx, xty, yty)
        beta_mean, beta_sd = ref.mean[: self.n_beta], ref.sd[: self.n_beta]
        if np.any(np.abs(beta_mean) + BOX_MARGIN_SD * beta_sd > self.theta_bound):
            return None
        return ref

    def _unknown_variance_reference(
        self, n: int, xtx: np.ndarray, xty: np.ndarray, yty: float
    ) -> Reference:
        """Moments of (β, s) by adaptive quadrature over s ∈ [−B, B] of p(s | data) (β
        integrated out in closed form) times the moments of the Gaussian β | σ_y(s)."""
        d, b = self.n_beta, self.theta_bound

        def log_marginal(s: float) -> float:
            sigma = math.exp(self.log_sigma_mid + self.log_sigma_slope * s)
            mean, var = _beta_given_sigma(xtx, xty, sigma, self.prior_sd)
            logdet = np.linalg.slogdet(var)[1]
            return (
                -n * math.log(sigma) - yty / (2 * sigma**2) + 0.5 * (mean @ xty / sigma**2 + logdet)
            )

        grid = np.linspace(-b, b, 4001)
        logs = np.array([log_marginal(s) for s in grid])
        step = 2 * b / 4000
        guess = float(grid[np.argmax(logs)])
        # at large n p(s | data) is narrower than the grid: find its peak and width first
        lo, hi = max(-b, guess - step), min(b, guess + step)
        peak = float(
            optimize.minimize_scalar(
                lambda s: -log_marginal(s),
                bounds=(lo, hi),
                method="bounded",
                options={"xatol": 1e-12},
            ).x
        )
        top, h = log_marginal(peak), min(step, 1e-3 * b)
        curve = 2 * top - log_marginal(max(-b, peak - h)) - log_marginal(min(b, peak + h))
        width = math.sqrt(h * h / curve) if curve > 0 else step

        def moments(s: float) -> np.ndarray:
            mean, var = _beta_given_sigma(
                xtx, xty, math.exp(self.log_sigma_mid + self.log_sigma_slope * s), self.prior_sd
            )
            w, ds = math.exp(log_marginal(s) - top), s - peak  # moments about the peak
            return w * np.concatenate([[1.0, ds, ds * ds], mean, np.diag(var) + mean * mean])

        marks = [peak + k * width for k in (-30, -10, -3, 0, 3, 10, 30)]
        total = integrate.quad_vec(
            moments, -b, b, epsrel=1e-11, points=[t for t in marks if -b < t < b]
        )
        z = total[0] / total[0][0]
        s_mean, s_var = peak + z[1], z[2] - z[1] ** 2
        beta_mean, beta_var = z[3 : 3 + d], z[3 + d :] - z[3 : 3 + d] ** 2
        mean = np.append(beta_mean, s_mean)
        sd = np.sqrt(np.maximum(np.append(beta_var, s_var), 0.0))
        return Reference(mean, sd, "closed_form")

    # --- capabilities: BoundedLogLikelihood ------------------------------------------------
    def _log_lik_extremes(self) -> tuple[float, float]:
        """(inf ℓ, sup ℓ) over the domain × Θ: sup at r = 0, σ = σ_min; inf at |r| = ρ and an
        end of [σ_min, σ_max] (−ρ²/(2σ²) − log σ has no interior minimum in σ)."""
        rho, c = self._max_residual(), -0.5 * math.log(2 * math.pi)
        sigmas = [self.noise_sd] if self.known else [self.sigma_min, self.sigma_max]
        top = max(c - math.log(s) for s in sigmas)
        bottom = min(c - math.log(s) - rho * rho / (2 * s * s) for s in sigmas)
        return bottom, top

    def log_lik_bound(self) -> float:
        """B = sup |ℓ| = max(|inf ℓ|, |sup ℓ|) over the domain × Θ."""
        bottom, top = self._log_lik_extremes()
        return max(abs(bottom), abs(top))

    def log_lik_range(self) -> float:
        """C: at fixed θ, |r| ranges over [0, Y + R‖β‖] (x = 0, y = 0 gives r = 0), so
        C = ρ²/(2σ_min²) with ρ = Y + R·B√d (σ_min = noise_sd when known)."""
        var = self.noise_sd**2 if self.known else self.sigma_min**2
        return self._max_residual() ** 2 / (2 * var)


def _beta_given_sigma(
    xtx: np.ndarray, xty: np.ndarray, sigma: float, prior_sd: float
) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``(d,)`` and covariance ``(d, d)`` of β | σ_y, data under the N(0, prior_sd² I)
    prior: precision P = I/prior_sd² + XᵀX/σ², mean P⁻¹Xᵀy/σ²."""
    precision = np.eye(len(xty)) / prior_sd**2 + xtx / sigma**2
    var = np.linalg.inv(precision)
    return var @ xty / sigma**2, var
