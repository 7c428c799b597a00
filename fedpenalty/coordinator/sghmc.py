"""Federated SGHMC (Chen, Fox & Guestrin 2014, Algorithm 2, M = I) with the owners' gradient
noise counted as part of the momentum noise (docs/design.md §2.3; derivation in
``sgmcmc.py``): h = √η; r ← (1 − hC) r + h g + ζ, ζ ~ N(0, max(2Ch − h² s², 0) I);
θ ← reflect(θ + h r).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import SGMCMC
from ..models import Model
from . import sgmcmc
from .base import ChainAlgorithm, ChainData, SamplingAlgorithm, Sections


@dataclass(frozen=True)
class SGHMCState:
    """``theta`` ``(C, d)`` inside Θ and ``momentum`` r ``(C, d)`` (mass I; θ moves by h·r)."""

    theta: np.ndarray
    momentum: np.ndarray
    iteration: int = 0

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)``."""
        return self.theta


def init(rng: np.random.Generator, theta: np.ndarray, model: Model) -> SGHMCState:
    """Start at ``theta`` ``(C, d)`` inside Θ with momentum r ~ N(0, I)."""
    theta = sgmcmc.check_start(theta, model)
    return SGHMCState(theta, rng.standard_normal(theta.shape), 0)


def step(
    rng: np.random.Generator,
    state: SGHMCState,
    model: Model,
    schedule: sgmcmc.StepSchedule,
    grad: sgmcmc.GradFn,
    friction: float,
) -> tuple[SGHMCState, sgmcmc.SGInfo]:
    """h = √η; r ← (1 − hC) r + h g + ζ, ζ ~ N(0, max(2Ch − h² s², 0) I); θ ← reflect(θ + h r)
    (C = ``friction`` > 0 with hC ≤ 1; reflected coordinates reverse r). ``SGInfo`` variances
    are those of the momentum noise."""
    kick = sgmcmc.momentum_kick(
        rng, "sghmc", state.theta, state.iteration, model, schedule, grad, friction
    )
    with np.errstate(over="ignore", invalid="ignore"):
        momentum = (1.0 - kick.h * kick.friction) * state.momentum + kick.h * kick.g + kick.noise
    theta, momentum, info = sgmcmc.move(
        "sghmc", kick, state.theta, momentum, state.iteration, model
    )
    return SGHMCState(theta, momentum, state.iteration + 1), info


def build(model: Model, data: ChainData, *, friction: float, **settings: Any) -> SamplingAlgorithm:
    """SGHMC through the owners behind ``data.oracle`` (settings: ``sgmcmc.MomentumSettings``)."""
    return sgmcmc.build_kernel(
        "sghmc",
        model,
        data,
        settings,
        lambda rng, theta0: init(rng, theta0, model),
        lambda rng, state, schedule, grad: step(rng, state, model, schedule, grad, friction),
    )


def check(sections: Sections, model: Model) -> None:
    sgmcmc.check_momentum_friction(sections, "sghmc", 1.0, "at most 1")


SGHMC = ChainAlgorithm(
    "sghmc",
    "federated SGHMC (owners' noise counted as momentum noise)",
    build,
    sgmcmc.MomentumSettings,
    SGHMCState,
    SGMCMC,
    check=check,
)
