"""Linear regression with one random intercept per group, written as a user's own model
(docs/design.md §6, "Writing a model"): scenarios/consortium.py selects it as
``consortium_model:GroupInterceptsRegression``.

Records ``(n, d + 2)``: covariates ``x0 .. x{d-1}`` (‖x‖₂ ≤ data_bound, longer rows rescaled
onto the sphere), ``group`` (an integer in 0 .. groups − 1; in the consortium, the owner's own
index) and ``y`` (clipped to [−y_bound, y_bound]). For a record of group g,

    y = μ_g + xᵀβ + e,   e ~ N(0, noise_sd²),   μ_g ~ N(α, τ²),

θ = (α, β_0 .. β_{d−1}, log τ, μ_0 .. μ_{G−1}) (dimension d + 2 + G), every coordinate in the
box [−theta_bound, theta_bound]. Priors: α, β ~ N(0, prior_sd²); τ ~ half-normal(tau_scale),
carried to log τ with its Jacobian; μ_g | α, τ ~ N(α, τ²) (untruncated density: the target is
the posterior restricted to the box, as for every model).

The group intercepts μ_g = α + b_g are the owner effects. Written with α and an offset b_g
(y = α + xᵀβ + b_g + e) the data determine only α + b_g, so α and every b_g correlate −0.92 to
−0.98 on the consortium's records; with μ_g as coordinates the likelihood of group g touches
only β and μ_g and the posterior is close to diagonal (scenarios/README.md, consortium).
Owner k's records all have group k, so its answers touch only (β, μ_k): its gradient is zero
in α, log τ and every other owner's intercept. The reference posterior is deterministic: given
τ the posterior of (α, β, b) is Gaussian in closed form, μ = α + b is a linear map of it, and
log τ is integrated on a fine grid over its box (Simpson's rule on the unnormalised marginal
density).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from scipy import integrate

from fedpenalty.errors import DataError
from fedpenalty.models.api import (
    Configured,
    Model,
    Param,
    Reference,
    as_point,
    as_prepared,
    as_theta,
    project_to_ball,
    uniform_ball,
    validate_raw,
)

_GRID = 2001  # points of the log τ grid (odd, for Simpson's rule)


class GroupInterceptsRegression(Configured, Model):
    """Linear regression with a random intercept μ_g per group (see the module docstring)."""

    name: ClassVar[str] = "consortium_model:GroupInterceptsRegression"
    PARAMS: ClassVar[dict[str, Param]] = {
        "covariates": Param(10, "dim", "number of covariates d"),
        "groups": Param(4, "dim", "number of groups G (one random intercept each)"),
        "data_bound": Param(1.0, "positive", "covariates satisfy ‖x‖₂ ≤ data_bound"),
        "y_bound": Param(4.0, "positive", "outcomes are clipped to [−y_bound, y_bound]"),
        "noise_sd": Param(1.0, "positive", "sd of the residual e (known)"),
        "theta_bound": Param(5.0, "positive", "every coordinate of θ in [−bound, bound]"),
        "prior_sd": Param(3.0, "positive", "prior sd of the intercept and every β_j"),
        "tau_scale": Param(1.0, "positive", "half-normal prior scale of τ"),
    }

    def _setup(self) -> None:
        p = self._params
        self.d, self.groups = p["covariates"], p["groups"]
        self.dim = self.d + 2 + self.groups
        self.theta_bound = p["theta_bound"]
        self._tau = 1 + self.d  # index of log τ
        b = self.theta_bound
        r_max = p["y_bound"] + b * (1.0 + p["data_bound"] * math.sqrt(self.d))
        self._lip = r_max * math.sqrt(1.0 + p["data_bound"] ** 2) / p["noise_sd"] ** 2

    @property
    def lipschitz(self) -> float:
        """|r|/σ²·‖(x, e_g)‖ with |r| ≤ y_bound + bound·(1 + data_bound·√d)."""
        return self._lip

    @property
    def prior_only_coordinates(self) -> tuple[int, ...]:
        """α and log τ: no record's likelihood depends on them."""
        return (0, self._tau)

    @property
    def column_names(self) -> list[str]:
        return [f"x{j}" for j in range(self.d)] + ["group", "y"]

    @property
    def param_names(self) -> list[str]:
        effects = [f"mu[{g}]" for g in range(self.groups)]
        return ["alpha", *(f"beta[{j}]" for j in range(self.d)), "log_tau", *effects]

    # --- data ------------------------------------------------------------------------------
    def prepare_records(self, raw: np.ndarray) -> np.ndarray:
        arr = validate_raw(raw, self.column_names, self.name)
        group = arr[:, self.d]
        bad = (group != np.round(group)) | (group < 0) | (group >= self.groups)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{self.name}: column 'group' must be an integer in 0..{self.groups - 1}; "
                f"{int(bad.sum())} bad value(s), first at record {i}: {group[i]!r}"
            )
        arr[:, : self.d] = project_to_ball(arr[:, : self.d], self._params["data_bound"])
        arr[:, -1] = np.clip(arr[:, -1], -self._params["y_bound"], self._params["y_bound"])
        return arr

    def simulate_records(self, rng: np.random.Generator, theta: np.ndarray, n: int) -> np.ndarray:
        """x uniform in the ball, groups uniform, y from the model at ``theta``, clipped."""
        th = as_point(theta, self.dim)
        x = uniform_ball(rng, int(n), self.d, self._params["data_bound"])
        g = rng.integers(0, self.groups, int(n))
        mean = x @ th[1 : 1 + self.d] + th[self._tau + 1 :][g]
        y = mean + self._params["noise_sd"] * rng.standard_normal(int(n))
        return self.prepare_records(np.column_stack([x, g, y]))

    # --- likelihood ------------------------------------------------------------------------
    def _residual(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """y − xᵀβ − μ_g: ``(C, n)``."""
        rec = as_prepared(records, self.d + 2)
        th = as_theta(theta, self.dim)
        g = rec[:, self.d].astype(np.int64)
        mean = th[:, 1 : 1 + self.d] @ rec[:, : self.d].T
        return rec[None, :, -1] - mean - th[:, self._tau + 1 :][:, g]

    def log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        s = self._params["noise_sd"]
        r = self._residual(records, theta)
        return -0.5 * (r / s) ** 2 - math.log(s * math.sqrt(2.0 * math.pi))

    def grad_log_lik(self, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """r/σ²·x on β, r/σ² on μ_g, 0 on α and log τ: ``(C, n, dim)``."""
        rec = as_prepared(records, self.d + 2)
        w = self._residual(rec, theta) / self._params["noise_sd"] ** 2
        out = np.zeros((*w.shape, self.dim))
        out[..., 1 : 1 + self.d] = w[..., None] * rec[None, :, : self.d]
        g = rec[:, self.d].astype(np.int64)
        out[:, np.arange(rec.shape[0]), self._tau + 1 + g] = w
        return out

    # --- prior -----------------------------------------------------------------------------
    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        th = as_theta(theta, self.dim)
        fixed = -0.5 * np.sum(th[:, : self._tau] ** 2, axis=1) / self._params["prior_sd"] ** 2
        log_tau, b = th[:, self._tau], th[:, self._tau + 1 :] - th[:, :1]
        tau = np.exp(log_tau)
        hyper = -0.5 * (tau / self._params["tau_scale"]) ** 2 + log_tau
        effects = -0.5 * np.sum(b**2, axis=1) / tau**2 - self.groups * log_tau
        return fixed + hyper + effects

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        th = as_theta(theta, self.dim)
        out = np.empty_like(th)
        out[:, : self._tau] = -th[:, : self._tau] / self._params["prior_sd"] ** 2
        tau2 = np.exp(2.0 * th[:, self._tau])
        b = th[:, self._tau + 1 :] - th[:, :1]
        ss = np.sum(b**2, axis=1)
        out[:, self._tau] = -tau2 / self._params["tau_scale"] ** 2 + 1 + ss / tau2 - self.groups
        out[:, self._tau + 1 :] = -b / tau2[:, None]
        out[:, 0] += np.sum(b, axis=1) / tau2
        return out

    # --- reference -------------------------------------------------------------------------
    def reference_posterior(self, records: np.ndarray) -> Reference:
        """Gaussian (α, β, b) | τ in closed form (b_g = μ_g − α), log τ on a grid over its box
        (Simpson); μ = α + b maps the moments."""
        rec = self.prepare_records(records)
        s2 = self._params["noise_sd"] ** 2
        g = rec[:, self.d].astype(np.int64)
        design = np.column_stack([np.ones(len(rec)), rec[:, : self.d], np.eye(self.groups)[g]])
        gram, rhs = design.T @ design / s2, design.T @ rec[:, -1] / s2
        grid = np.linspace(-self.theta_bound, self.theta_bound, _GRID)
        k = 1 + self.d
        logw, means, second = np.empty(_GRID), [], []
        for i, log_tau in enumerate(grid):
            prior = np.r_[np.full(k, self._params["prior_sd"] ** -2.0), np.full(self.groups, 0.0)]
            prior[k:] = math.exp(-2.0 * log_tau)
            prec = gram + np.diag(prior)
            chol = np.linalg.cholesky(prec)
            mean = np.linalg.solve(prec, rhs)
            cov = np.linalg.inv(prec)
            tau = math.exp(log_tau)
            logw[i] = (
                0.5 * rhs @ mean
                - np.sum(np.log(np.diag(chol)))
                - self.groups * log_tau
                - 0.5 * (tau / self._params["tau_scale"]) ** 2
                + log_tau
            )
            means.append(mean)
            second.append(cov + np.outer(mean, mean))
        w = np.exp(logw - logw.max())
        z = integrate.simpson(w, x=grid)
        m_fixed = integrate.simpson(w[:, None] * np.array(means), x=grid, axis=0) / z
        e2 = integrate.simpson(w[:, None, None] * np.array(second), x=grid, axis=0) / z
        m_tau = integrate.simpson(w * grid, x=grid) / z
        v_tau = integrate.simpson(w * (grid - m_tau) ** 2, x=grid) / z
        to_mu = np.eye(k + self.groups)
        to_mu[k:, 0] = 1.0  # (α, β, b) ↦ (α, β, μ = α + b)
        m_fixed, e2 = to_mu @ m_fixed, to_mu @ e2 @ to_mu.T
        sd_fixed = np.sqrt(np.maximum(np.diag(e2) - m_fixed**2, 0.0))
        mean = np.r_[m_fixed[:k], m_tau, m_fixed[k:]]
        sd = np.r_[sd_fixed[:k], math.sqrt(v_tau), sd_fixed[k:]]
        return Reference(mean, sd, "closed_form")
