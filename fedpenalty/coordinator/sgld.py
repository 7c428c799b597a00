"""Federated SGLD (Welling & Teh 2011) with the owners' gradient noise counted as part of the
Langevin noise (docs/design.md §2.3): θ ← reflect(θ + (η/2) g + ζ),
ζ ~ N(0, max(η − (η/2)² s², 0) I), g = ∇log p(θ) + Σ_k g̃_k / q.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import SGMCMC
from ..models import Model
from . import sgmcmc
from .base import ChainAlgorithm, ChainData, SamplingAlgorithm


@dataclass(frozen=True)
class SGLDState:
    """``theta`` ``(C, d)`` inside Θ, and the index of the next iteration (it keys the
    owners' replies)."""

    theta: np.ndarray
    iteration: int = 0

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)``."""
        return self.theta


def init(theta: np.ndarray, model: Model) -> SGLDState:
    """Start C chains at ``theta`` ``(C, d)`` inside Θ."""
    return SGLDState(sgmcmc.check_start(theta, model), 0)


def step(
    rng: np.random.Generator,
    state: SGLDState,
    model: Model,
    schedule: sgmcmc.StepSchedule,
    grad: sgmcmc.GradFn,
) -> tuple[SGLDState, sgmcmc.SGInfo]:
    """θ ← reflect(θ + (η/2) g + ζ), ζ ~ N(0, max(η − (η/2)² s², 0) I)."""
    eta = schedule(state.iteration)
    g, s2 = sgmcmc.gradient(state.theta, state.iteration, model, grad)
    owner_var = (0.5 * eta) ** 2 * s2
    injected, excess = sgmcmc.noise_split(eta, owner_var)
    noise = np.sqrt(injected)[:, None] * rng.standard_normal(state.theta.shape)
    moved = state.theta + 0.5 * eta * g + noise
    sgmcmc.check_finite("sgld", state.iteration, moved)
    theta, folds = sgmcmc.reflect(moved, model.theta_bound)
    info = sgmcmc.SGInfo(eta, s2, owner_var, injected, excess, (folds != 0).any(axis=1))
    return SGLDState(theta, state.iteration + 1), info


def build(model: Model, data: ChainData, **settings: Any) -> SamplingAlgorithm:
    """SGLD through the owners behind ``data.oracle`` (settings: ``sgmcmc.SGMCMCSettings``)."""
    return sgmcmc.build_kernel(
        "sgld",
        model,
        data,
        settings,
        lambda rng, theta0: init(theta0, model),
        lambda rng, state, schedule, grad: step(rng, state, model, schedule, grad),
    )


SGLD = ChainAlgorithm(
    "sgld",
    "federated SGLD (owners' noise counted as Langevin noise)",
    build,
    sgmcmc.SGMCMCSettings,
    SGLDState,
    SGMCMC,
)
