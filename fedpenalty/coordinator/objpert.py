"""Objective perturbation (``objpert``; docs/design.md §2.4 "Objective perturbation"): regularised
logistic regression whose objective carries a random linear term b, pure ε-DP for replace-one
neighbours. A central-DP reference: the pooled version needs every owner's records at one
trusted curator, and says so in its privacy.json; ``sampler.objpert_per_owner`` instead lets
each owner release its own minimiser and averages them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field
from scipy.special import expit

from ..errors import FedPenaltyError
from ..models import Model
from ..models.logistic import Logistic
from ..schema import Bool, PositiveFloat, Section
from .base import Release, ReleaseAlgorithm, Sections, require

CURVATURE = 0.25
"""c: the logistic loss ℓ(z) = log(1 + e^{−z}) has |ℓ''| ≤ 1/4."""

_NEWTON_STEPS, _TOLERANCE = 100, 1e-10


@dataclass(frozen=True)
class Calibration:
    """ε′ (the part of ε spent on b) and the regulariser Λ actually used (Λ + Δ)."""

    epsilon_prime: float
    regulariser: float
    raised: bool


def calibrate(epsilon: float, n: int, regulariser: float, c: float = CURVATURE) -> Calibration:
    """Steps 1–2 of the algorithm: ε′ = ε − log(1 + 2c/(nΛ) + c²/(n²Λ²)); when ε′ ≤ 0 the
    regulariser rises to Λ + Δ = c/(n(e^{ε/4} − 1)) and ε′ = ε/2."""
    ratio = c / (n * regulariser)
    epsilon_prime = epsilon - math.log1p(2 * ratio + ratio**2)
    if epsilon_prime > 0:
        return Calibration(epsilon_prime, regulariser, False)
    return Calibration(epsilon / 2, c / (n * math.expm1(epsilon / 4)), True)


def perturbation(rng: np.random.Generator, dim: int, epsilon_prime: float) -> np.ndarray:
    """b ``(dim,)`` with density ∝ exp(−ε′‖b‖/2): ‖b‖ ~ Gamma(dim, scale 2/ε′), direction
    uniform on the sphere."""
    direction = rng.standard_normal(dim)
    direction /= np.linalg.norm(direction)
    return rng.gamma(dim, 2.0 / epsilon_prime) * direction


def gradient(
    f: np.ndarray, x: np.ndarray, s: np.ndarray, regulariser: float, b: np.ndarray
) -> np.ndarray:
    """∇J at f ``(d,)`` of J(f) = (1/n)Σ ℓ(s_i x_iᵀf) + (Λ/2)‖f‖² + bᵀf/n, for features x
    ``(n, d)`` with ‖x_i‖ ≤ 1 and labels s ``(n,)`` in {−1, +1}."""
    n = len(x)
    weights = -s * expit(-s * (x @ f))
    return x.T @ weights / n + regulariser * f + b / n


def _objective(
    f: np.ndarray, x: np.ndarray, s: np.ndarray, regulariser: float, b: np.ndarray
) -> float:
    n = len(x)
    return float(np.logaddexp(0.0, -s * (x @ f)).mean() + 0.5 * regulariser * f @ f + b @ f / n)


def minimise(x: np.ndarray, s: np.ndarray, regulariser: float, b: np.ndarray) -> np.ndarray:
    """The minimiser f ``(d,)`` of J (strictly convex) by damped Newton steps, until
    ‖∇J‖ ≤ 1e-10 (1 + ‖b‖/n); the guarantee is for the exact minimiser, so non-convergence is an
    error. The line search tolerates rounding (1e-12 relative) so that the last steps are full."""
    f, tolerance = np.zeros(x.shape[1]), _TOLERANCE * (1 + np.linalg.norm(b) / len(x))
    for _ in range(_NEWTON_STEPS):
        g = gradient(f, x, s, regulariser, b)
        if np.linalg.norm(g) <= tolerance:
            return f
        p = expit(x @ f)
        hessian = (x.T * (p * (1 - p))) @ x / len(x) + regulariser * np.eye(len(f))
        direction = np.linalg.solve(hessian, -g)
        step, current = 1.0, _objective(f, x, s, regulariser, b)
        limit = current + 1e-12 * abs(current)
        while _objective(f + step * direction, x, s, regulariser, b) > limit and step > 1e-12:
            step /= 2
        f = f + step * direction
    raise FedPenaltyError(
        "objpert: Newton's method did not reach the exact minimiser the guarantee needs; "
        "raise sampler.objpert_lambda (a better-conditioned objective)"
    )


@dataclass(frozen=True)
class Fit:
    """One release: θ ``(d,)`` in the model's coordinates, the b ``(d,)`` drawn and the
    calibration it used."""

    theta: np.ndarray
    b: np.ndarray
    calibration: Calibration


def release(
    rng: np.random.Generator, records: np.ndarray, epsilon: float, regulariser: float, bound: float
) -> Fit:
    """One ε-DP release on logistic ``records`` ``(n, d + 1)`` (y in {0, 1}, ‖x‖ ≤ ``bound``):
    the features are divided by ``bound`` so that ‖x‖ ≤ 1, and θ = f/bound is returned."""
    x, s = records[:, :-1] / bound, 2.0 * records[:, -1] - 1.0
    cal = calibrate(epsilon, len(x), regulariser)
    b = perturbation(rng, x.shape[1], cal.epsilon_prime)
    return Fit(minimise(x, s, cal.regulariser, b) / bound, b, cal)


class ObjPertSettings(Section):
    """The ``[sampler]`` keys of objpert."""

    objpert_lambda: PositiveFloat | None = Field(
        default=None,
        description="objpert: the regulariser Λ of (1/n)Σℓ + (Λ/2)‖f‖² on the features scaled to "
        "‖x‖ ≤ 1 (raised when ε′ ≤ 0); unset: 1/(n data_bound² prior_sd²), the prior's",
    )
    objpert_per_owner: Bool = Field(
        default=False,
        description="objpert: each owner releases its own minimiser (no pooling) and the "
        "coordinator averages them weighted by n_k, instead of one release on the pooled records",
    )


_CENTRAL = (
    "CENTRAL DP (a reference, not a federated method): computed by the simulation on every "
    "owner's records pooled (a trusted curator); no owner ledger is involved"
)
_PER_OWNER = (
    "each owner's own objective-perturbation release on its own records (computed by the "
    "simulation), averaged by the coordinator weighted by n_k; no owner ledger is involved"
)
_ACCOUNTING = (
    "objective perturbation (Chaudhuri, Monteleoni & Sarwate 2011, Alg. 2; replace-one): each "
    "of the chains × iterations independent releases is (epsilon / draws, 0)-DP, composed by "
    "basic composition"
)


def _regulariser(sampler: Mapping[str, Any], model: Logistic, n: int) -> float:
    """Λ: the setting, else the prior's 1/(n R² prior_sd²) in the scaled coordinates f = Rθ."""
    if sampler["objpert_lambda"] is not None:
        return float(sampler["objpert_lambda"])
    return 1.0 / (n * model.data_bound**2 * model.prior_sd**2)


def _fits(
    rng: np.random.Generator, model: Logistic, parts: list[np.ndarray], sections: Sections
) -> tuple[np.ndarray, list[Fit]]:
    """``draws`` rounds of one fit per part at ε/draws: (θ ``(draws, d)``, the fits per part of
    the last round)."""
    sampler = sections["sampler"]
    draws = sampler["chains"] * sampler["iterations"]
    eps = sections["privacy"]["epsilon"] / draws
    weights = np.array([len(p) for p in parts], dtype=float) / sum(len(p) for p in parts)
    theta, fits = np.empty((draws, model.dim)), list[Fit]()
    for i in range(draws):
        fits = [
            release(rng, p, eps, _regulariser(sampler, model, len(p)), model.data_bound)
            for p in parts
        ]
        theta[i] = weights @ np.array([f.theta for f in fits])
    return theta, fits


def _objpert(
    rng: np.random.Generator, model: Model, records: list[np.ndarray], sections: Sections
) -> Release:
    """chains × iterations independent releases at ε/(chains × iterations) each."""
    sampler, epsilon = sections["sampler"], sections["privacy"]["epsilon"]
    assert isinstance(model, Logistic)  # _check refused the others
    per_owner = bool(sampler["objpert_per_owner"])
    parts = records if per_owner else [np.concatenate(records)]
    theta, fits = _fits(rng, model, parts, sections)
    draws = len(theta)
    return Release(
        theta.reshape(sampler["chains"], sampler["iterations"], model.dim),
        epsilon,
        0.0,
        _ACCOUNTING,
        _PER_OWNER if per_owner else _CENTRAL,
        not per_owner,
        {"epsilon_per_draw": epsilon / draws},
        {
            "draws": draws,
            "central_dp": not per_owner,
            "objpert": [
                {
                    "n": len(p),
                    "epsilon_prime": f.calibration.epsilon_prime,
                    "regulariser": f.calibration.regulariser,
                    "regulariser_raised": f.calibration.raised,
                }
                for p, f in zip(parts, fits, strict=True)
            ],
            "note": "draws: independent releases, each a point estimate (the perturbed "
            "minimiser), not posterior draws; their spread is the mechanism's noise",
        },
    )


def _check(sections: Sections, model: Model) -> None:
    """Logistic regression only, replace-one neighbours only (the theorem's)."""
    require(
        isinstance(model, Logistic),
        "sampler.algorithm = 'objpert' (objective perturbation) is for model.name = 'logistic' "
        f"only; {model.name!r} is not supported",
    )
    require(
        sections["privacy"]["neighbour"] == "replace_one",
        "sampler.algorithm = 'objpert' is ε-DP for replace-one neighbours only: set "
        "privacy.neighbour = 'replace_one'",
    )


OBJPERT = ReleaseAlgorithm(
    "objpert",
    "objective perturbation, pure ε (central-DP reference: trusted curator)",
    _objpert,
    _check,
    ObjPertSettings,
)
