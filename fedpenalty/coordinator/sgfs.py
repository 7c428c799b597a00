"""Federated DP-SGFS: stochastic gradient Fisher scoring on the owners' noisy gradient sums and
noisy sums of gradient outer products (docs/design.md §2.11; Wang, Fienberg & Smola, long
version, Appendix A, Algorithm 4; Ahn, Korattikara & Welling 2012).

Per iteration t and chain, with N records in all, Poisson rate q (expected batch τ = qN) and
the public bound F = f·I (every clipped per-record gradient lies in the ball F·Bᵈ):

* the owners give G = Σ_k g̃_k / q (d,), the unbiased full-data gradient, and
  S = Σ_k Ŝ_k / q (d, d), the unbiased Σ_x ∇ℓ ∇ℓᵀ, both with Gaussian owner noise of known
  variance per coordinate (s_g², s_F²; the function ``FisherFn``);
* V = P₊(S − G Gᵀ/N) (projected onto the PSD cone): N times the paper's sample covariance
  of the per-record gradients, i.e. an estimate of the total Fisher information;
* Ĵ_t = (1 − κ_t) Ĵ_{t−1} + κ_t V, κ_t = (t + 1)^(−γ_κ) (κ_0 = 1: Ĵ_0 = V);
* M = (1 + 1/q) Ĵ_t + 4 f²/η_t I (the paper's (τ + N)N/τ · Î_t + 4FFᵀ/η_t with Ĵ = N Î);
* θ ← reflect(θ + 2 M⁻¹ (∇log p(θ) + G + ζ)), ζ ~ N(0, max(4f²/η_t − s_g², 0) I): the design
  noise 4FFᵀ/η_t of SGFS, of which the owners' gradient noise supplies s_g² (as for SGLD,
  ``sgmcmc.noise_split``; the excess is reported).

Everything is vectorised over C chains and pure: the state is frozen, the RNG explicit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from ..models import Model
from ..schema import NonNegativeFloat, PositiveFloat
from . import sgmcmc
from .base import ChainAlgorithm, ChainData, SamplingAlgorithm, Sections, require

if TYPE_CHECKING:
    from .oracle import Oracle

#: The query kind DP-SGFS asks (protocol-v2 name; ``kinds/grad_fisher.py``).
KIND = "grad_fisher"

#: (iteration, chains (m,), theta (m, d)) -> (G (m, d), S (m, d, d), s_g² (m,), s_F² (m,)):
#: Σ_k g̃_k/q, Σ_k Ŝ_k/q (symmetric) and the owner-noise variances of their entries.
FisherFn = Callable[
    [int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
]


class SGFSSettings(sgmcmc.SGMCMCSettings):
    """The ``[sampler]`` keys only DP-SGFS reads (besides SG-MCMC's step schedule, sampling rate
    and clip)."""

    fisher_bound: NonNegativeFloat = Field(
        default=0.0,
        description="sgfs: f of the public bound F = f·I on per-record gradients (nats per unit "
        "θ); 0: the smaller of the model's Lipschitz bound L and sampler.clip",
    )
    fisher_decay: PositiveFloat = Field(
        default=1.0,
        description="sgfs: γ_κ of the Fisher estimate's weights κ_t = (t + 1)^−γ_κ, in (0, 1]",
    )


@dataclass(frozen=True)
class SGFSState:
    """``theta`` ``(C, d)`` inside Θ, ``fisher`` ``(C, d, d)`` the running estimate Ĵ of the
    total Fisher information (nats per unit θ²; zeros before the first step), and the index
    of the next iteration (it keys the owners' replies)."""

    theta: np.ndarray
    fisher: np.ndarray
    iteration: int = 0

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)``."""
        return self.theta


@dataclass(frozen=True)
class SGFSConfig:
    """What a step needs besides the state: the step schedule η_t (units θ² per nat … as
    ``sgmcmc.StepSchedule``), the bound ``f`` (F = f·I), the Poisson rate ``q``, the total
    record count ``n_total`` N and the decay γ_κ of κ_t."""

    schedule: sgmcmc.StepSchedule
    f: float
    q: float
    n_total: int
    kappa_decay: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.f) and self.f > 0):
            raise ValueError(f"sgfs: the bound f must be finite and > 0, got {self.f!r}")
        if not 0 < self.q <= 1:
            raise ValueError(f"sgfs: the sampling rate must be in (0, 1], got {self.q!r}")
        if self.n_total < 1:
            raise ValueError(
                f"sgfs: needs the public total record count N >= 1, got {self.n_total}"
            )
        if not 0 < self.kappa_decay <= 1:
            raise ValueError(f"sgfs: fisher_decay must be in (0, 1], got {self.kappa_decay!r}")

    def kappa(self, t: int) -> float:
        """κ_t = (t + 1)^(−γ_κ): 1 at t = 0."""
        return float((t + 1.0) ** -self.kappa_decay)


def init(theta: np.ndarray, model: Model) -> SGFSState:
    """Start C chains at ``theta`` ``(C, d)`` inside Θ with Ĵ = 0 (κ_0 = 1 replaces it)."""
    theta = sgmcmc.check_start(theta, model)
    c, d = theta.shape
    return SGFSState(theta, np.zeros((c, d, d)), 0)


def psd_part(matrices: np.ndarray) -> np.ndarray:
    """Projection of symmetric ``matrices`` ``(C, d, d)`` onto the PSD cone (Frobenius):
    negative eigenvalues set to 0."""
    sym = 0.5 * (matrices + np.swapaxes(matrices, 1, 2))
    values, vectors = np.linalg.eigh(sym)
    return np.einsum("cij,cj,ckj->cik", vectors, np.maximum(values, 0.0), vectors)


def step(
    rng: np.random.Generator,
    state: SGFSState,
    model: Model,
    config: SGFSConfig,
    fisher_fn: FisherFn,
) -> tuple[SGFSState, sgmcmc.SGInfo]:
    """One DP-SGFS step for every chain (module docstring)."""
    t, theta = state.iteration, state.theta
    eta = config.schedule(t)
    lik, total_outer, s2, _ = fisher_fn(t, np.arange(len(theta)), theta)
    lik, total_outer = np.asarray(lik, dtype=float), np.asarray(total_outer, dtype=float)
    s2 = np.broadcast_to(np.asarray(s2, dtype=float), (len(theta),))
    if lik.shape != theta.shape or total_outer.shape != state.fisher.shape:
        raise ValueError("sgfs: the owners' sums have the wrong shape")
    v = psd_part(total_outer - np.einsum("ci,cj->cij", lik, lik) / config.n_total)
    kappa = config.kappa(t)
    fisher = (1.0 - kappa) * state.fisher + kappa * v
    design = 4.0 * config.f**2 / eta
    injected, excess = sgmcmc.noise_split(design, s2.copy())
    noise = np.sqrt(injected)[:, None] * rng.standard_normal(theta.shape)
    precond = (1.0 + 1.0 / config.q) * fisher + design * np.eye(theta.shape[1])
    force = model.grad_log_prior(theta) + lik + noise
    moved = theta + 2.0 * np.linalg.solve(precond, force[:, :, None])[:, :, 0]
    sgmcmc.check_finite("sgfs", t, moved, fisher)
    new_theta, folds = sgmcmc.reflect(moved, model.theta_bound)
    info = sgmcmc.SGInfo(eta, s2.copy(), s2.copy(), injected, excess, (folds != 0).any(axis=1))
    return SGFSState(new_theta, fisher, t + 1), info


# ------------------------------------------------------------------ the owners' sums


def upper_pairs(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the upper triangle (i ≤ j) of a ``dim`` × ``dim`` matrix, in
    the order the ``grad_fisher`` answers carry it."""
    return np.triu_indices(dim)


def from_upper(upper: np.ndarray, dim: int) -> np.ndarray:
    """Symmetric matrices ``(m, d, d)`` from their upper triangles ``(m, d(d+1)/2)``."""
    rows, cols = upper_pairs(dim)
    out = np.zeros((len(upper), dim, dim))
    out[:, rows, cols] = upper
    out[:, cols, rows] = upper
    return out


def oracle_fisher(oracle: Oracle, q: float, clip: float, dim: int) -> FisherFn:
    """The ``FisherFn`` of the owners behind ``oracle``: each owner answers, per chain, the
    sum over its Poisson(q) sample of z(x) = [g, vech(g gᵀ)/clip]/√2 (g: ∇ℓ clipped to L2 norm
    ``clip``; vech the upper triangle) plus N(0, (σ_k·clip)² I). So G = √2·Σ_k z_k[:d]/q, the
    Fisher sums S = √2·clip·Σ_k z_k[d:]/q, with noise variances 2·v/q² and 2·clip²·v/q²,
    v = Σ_k (σ_k·clip)²."""
    root2 = math.sqrt(2.0)

    def fisher(iteration: int, chains: np.ndarray, theta: np.ndarray):
        answers = oracle.query(KIND, iteration, chains, theta=theta, clip=clip)
        total, variance = answers.total()
        lik = root2 * total[:, :dim] / q
        outer = from_upper(root2 * clip * total[:, dim:] / q, dim)
        s2 = np.full(len(chains), 2.0 * variance / q**2)
        return lik, outer, s2, s2 * clip**2

    return fisher


def bound_of(model: Model, fisher_bound: float, clip: float) -> float:
    """f of F = f·I: ``fisher_bound`` when > 0, else min(L, clip) (L: the model's Lipschitz
    bound; a clipped gradient never exceeds the clip)."""
    if fisher_bound > 0:
        return float(fisher_bound)
    lipschitz = model.lipschitz
    return float(clip if lipschitz is None else min(lipschitz, clip))


def build(model: Model, data: ChainData, **settings: Any) -> SamplingAlgorithm:
    """DP-SGFS through the owners behind ``data.oracle`` (settings: ``SGFSSettings``)."""
    oracle = data.require_oracle("sgfs")
    if data.n_total is None:
        raise ValueError("sgfs needs the owners' public total record count N (public_n)")
    schedule = sgmcmc.StepSchedule.of(
        settings["step"],
        settings["step_schedule"],
        settings["step_decay_b"],
        settings["step_decay_gamma"],
    )
    q, clip = float(settings["sampling_rate"]), float(settings["clip"])
    f = bound_of(model, settings["fisher_bound"], clip)
    config = SGFSConfig(schedule, f, q, int(data.n_total), float(settings["fisher_decay"]))
    fisher_fn = oracle_fisher(oracle, q, clip, model.dim)

    def advance(rng: np.random.Generator, state: SGFSState) -> tuple[SGFSState, Any]:
        new, info = step(rng, state, model, config, fisher_fn)
        return new, sgmcmc.record(info)

    def step_sizes(state: Any, warmup: int, shape: tuple[int, int]) -> dict[str, np.ndarray]:
        """The kept draws' ``step_size`` η_t ``(C, draws)``, t = warmup + k."""
        eta = [schedule(warmup + k) for k in range(shape[1])]
        return {"step_size": np.broadcast_to(np.array(eta), shape)}

    return SamplingAlgorithm(
        lambda rng, theta0: init(theta0, model), advance, sgmcmc.INFO, derived=step_sizes
    )


def check(sections: Sections, model: Model) -> None:
    """Scenario check: ``sampler.fisher_decay`` in (0, 1]; no secure aggregation."""
    require(
        sections["privacy"].get("aggregation", "none") == "none",
        "sgfs answers do not take secure aggregation: set privacy.aggregation = 'none'",
    )
    decay = sections["sampler"]["fisher_decay"]
    require(
        decay <= 1.0,
        f"sampler.fisher_decay = {decay!r} must be in (0, 1] for sgfs (the weights "
        "κ_t = (t + 1)^−fisher_decay must not sum to a finite total)",
    )


SGFS = ChainAlgorithm(
    "sgfs",
    "DP-SGFS: Fisher scoring on owners' noisy gradient and outer-product sums",
    build,
    SGFSSettings,
    SGFSState,
    "sgfs",
    check=check,
)
