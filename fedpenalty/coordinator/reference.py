"""Reference posteriors for measuring a run's error.

Closed form where the model has one. Otherwise self-normalised importance sampling from a
multivariate Student-t centred at the posterior mode with the Laplace covariance (exact as the
number of draws grows, and one pass over the records per draw); when its importance-sampling
ESS is too small for the moments to be trusted, a long exact (non-private) MH run on the
pooled records. Either is computed once and cached on disk, keyed by a hash of the model, the
records and the method's settings.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from ..models import Model, Reference
from . import exact, mh
from .adapt import StepAdaptation
from .driver import sample

#: Exact-MH reference: chains × kept draws (after a quarter as many warmup draws).
REFERENCE_CHAINS = 8
REFERENCE_DRAWS = 10_000
#: Importance-sampling reference: proposal draws, Student-t degrees of freedom of the proposal,
#: smallest importance-sampling ESS accepted (the Monte-Carlo sd of its mean is then at most
#: posterior sd / √IS_MIN_ESS ≈ 0.03 sd), and records × draws evaluated at once.
IS_DRAWS = 2_000
IS_DF = 4.0
IS_MIN_ESS = 1_000.0
IS_CHUNK = 1 << 22


@dataclass(frozen=True)
class Importance:
    """Self-normalised importance-sampling moments ``(d,)`` and the Kish ESS of the weights."""

    mean: np.ndarray
    sd: np.ndarray
    ess: float


def cache_dir() -> Path:
    """``$FEDPENALTY_CACHE`` or ``$XDG_CACHE_HOME/fedpenalty`` (default ``~/.cache/fedpenalty``)."""
    if "FEDPENALTY_CACHE" in os.environ:
        return Path(os.environ["FEDPENALTY_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fedpenalty"


def reference_posterior(
    model: Model, records: np.ndarray, seed: int = 20_161_122, progress: bool = False
) -> Reference:
    """Posterior moments given all ``records`` pooled (trusted-curator view)."""
    closed = model.reference_posterior(records)
    if closed is not None:
        return closed
    key = hashlib.sha256(
        json.dumps({"model": model.name, **model.params()}, sort_keys=True).encode()
    )
    key.update(np.ascontiguousarray(records, dtype="<f8").tobytes())
    key.update(f"{seed}-{REFERENCE_CHAINS}-{REFERENCE_DRAWS}".encode())
    key.update(f"importance-{IS_DRAWS}-{IS_DF}-{IS_MIN_ESS}".encode())
    path = cache_dir() / f"reference-{key.hexdigest()[:24]}.npz"
    if path.is_file():
        with np.load(path) as cached:
            return Reference(cached["mean"], cached["sd"], str(cached["source"]))
    rng = np.random.default_rng(seed)
    ref = sampled_reference(model, records, rng, laplace_proposal(model, records), progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, mean=ref.mean, sd=ref.sd, source=ref.source)
    tmp.replace(path)
    return ref


def sampled_reference(
    model: Model,
    records: np.ndarray,
    rng: np.random.Generator,
    proposal: stats._multivariate.multivariate_t_frozen | None,
    progress: bool = False,
) -> Reference:
    """Importance sampling from ``proposal`` when there is one and its ESS reaches IS_MIN_ESS
    (source "importance_sampling"), else the exact-MH reference (source "exact_mh")."""
    if proposal is not None:
        found = importance_moments(model, records, rng, proposal, IS_DRAWS)
        if found.ess >= IS_MIN_ESS:
            return Reference(found.mean, found.sd, "importance_sampling")
    draws = exact_mh_draws(model, records, rng, REFERENCE_CHAINS, REFERENCE_DRAWS, progress)
    return Reference(draws.mean(axis=(0, 1)), draws.std(axis=(0, 1), ddof=1), "exact_mh")


def log_posterior(model: Model, records: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Unnormalised log posterior over Θ (−inf outside): theta ``(C, d)`` → ``(C,)``, the
    records evaluated in blocks of at most IS_CHUNK records × draws."""
    out = np.full(theta.shape[0], -np.inf)
    inside = np.flatnonzero(model.in_theta_space(theta))
    block = max(1, IS_CHUNK // max(1, len(records)))
    for start in range(0, len(inside), block):
        rows = inside[start : start + block]
        out[rows] = model.log_lik(records, theta[rows]).sum(axis=1) + model.log_prior(theta[rows])
    return out


def laplace_proposal(
    model: Model, records: np.ndarray
) -> stats._multivariate.multivariate_t_frozen | None:
    """Student-t (IS_DF degrees of freedom) at the posterior mode over Θ (L-BFGS-B with the
    model's gradient) with the Laplace covariance (the inverse of minus the Hessian, by central
    differences of the gradient); None when that Hessian is not negative definite."""

    def negative(theta: np.ndarray) -> tuple[float, np.ndarray]:
        point = theta[None, :]
        value = model.log_lik(records, point).sum() + model.log_prior(point)[0]
        grad = model.grad_log_lik(records, point).sum(axis=1)[0] + model.grad_log_prior(point)[0]
        return -float(value), -grad

    bounds = [(-model.theta_bound, model.theta_bound)] * model.dim
    mode = optimize.minimize(negative, np.zeros(model.dim), jac=True, bounds=bounds).x
    h = 1e-5 * max(1.0, float(np.abs(mode).max()))
    columns = [
        (negative(mode - h * e)[1] - negative(mode + h * e)[1]) / (2 * h) for e in np.eye(model.dim)
    ]
    hessian = np.array(columns)
    hessian = 0.5 * (hessian + hessian.T)
    if not np.all(np.linalg.eigvalsh(-hessian) > 0.0):
        return None
    return stats.multivariate_t(loc=mode, shape=np.linalg.inv(-hessian), df=IS_DF)


def importance_moments(
    model: Model,
    records: np.ndarray,
    rng: np.random.Generator,
    proposal: stats._multivariate.multivariate_t_frozen,
    draws: int,
) -> Importance:
    """Self-normalised importance sampling of the posterior over Θ with ``draws`` proposal
    draws: weighted mean and sd, and the ESS (Σw)²/Σw² of the weights."""
    theta = np.atleast_2d(proposal.rvs(size=draws, random_state=rng)).reshape(draws, model.dim)
    log_w = log_posterior(model, records, theta) - proposal.logpdf(theta)
    if not np.isfinite(log_w.max()):
        return Importance(np.zeros(model.dim), np.zeros(model.dim), 0.0)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ theta
    sd = np.sqrt(w @ (theta - mean) ** 2)
    return Importance(mean, sd, float(1.0 / np.sum(w * w)))


def exact_mh_draws(
    model: Model,
    records: np.ndarray,
    rng: np.random.Generator,
    chains: int,
    draws: int,
    progress: bool = False,
) -> np.ndarray:
    """Exact MH draws ``(chains, draws, d)``: the ball radius is tuned in a pilot phase to an
    acceptance near 0.3, then frozen (so the kept chain is a fixed, exact kernel)."""
    ratio = exact.exact_ratio(model, records)
    state, radius = mh.tune_radius(
        rng, mh.init(np.zeros((chains, model.dim)), model), model, ratio, 30
    )
    result = sample(
        mh.kernel(model, ratio, StepAdaptation.start(radius)),
        rng,
        state.theta,
        iterations=draws,
        warmup=draws // 4,
        progress=progress,
        description="reference (exact MH)",
    )
    return result.theta
