"""Federated SGNHT (Ding et al. 2014, Algorithm 1, M = I) with the owners' gradient noise
counted as part of the momentum noise (docs/design.md §2.3; derivation in ``sgmcmc.py``):
h = √η; p ← p − Ξ p h + h g + ζ, ζ ~ N(0, max(2Ah − h² s², 0) I); θ ← reflect(θ + h p);
Ξ ← Ξ + (pᵀp/d − 1) h. The thermostat Ξ also absorbs unknown gradient noise (subsampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import SGMCMC
from ..models import Model
from . import sgmcmc
from .base import ChainAlgorithm, ChainData, SamplingAlgorithm, Sections


@dataclass(frozen=True)
class SGNHTState:
    """SGHMC state plus the thermostat Ξ ``(C,)`` (Ding et al.'s ξ, per unit of h-time)."""

    theta: np.ndarray
    momentum: np.ndarray
    thermostat: np.ndarray
    iteration: int = 0

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)``."""
        return self.theta


def init(rng: np.random.Generator, theta: np.ndarray, model: Model, friction: float) -> SGNHTState:
    """Start at ``theta`` ``(C, d)`` inside Θ, momentum p ~ N(0, I), thermostat Ξ = A
    (= ``friction``)."""
    theta = sgmcmc.check_start(theta, model)
    if not (math.isfinite(friction) and friction > 0.0):
        raise ValueError(f"sgnht friction must be finite and > 0, got {friction!r}")
    return SGNHTState(
        theta, rng.standard_normal(theta.shape), np.full(len(theta), float(friction)), 0
    )


def step(
    rng: np.random.Generator,
    state: SGNHTState,
    model: Model,
    schedule: sgmcmc.StepSchedule,
    grad: sgmcmc.GradFn,
    friction: float,
) -> tuple[SGNHTState, sgmcmc.SGInfo]:
    """h = √η; p ← p − Ξ p h + h g + ζ, ζ ~ N(0, max(2Ah − h² s², 0) I); θ ← reflect(θ + h p);
    Ξ ← Ξ + (pᵀp/d − 1) h. A = ``friction`` > 0 with hA < ½: the momentum noise per step must
    stay below what the kinetic target E[p²] = 1 allows. ``SGInfo`` variances are those of the
    momentum noise."""
    kick = sgmcmc.momentum_kick(
        rng, "sgnht", state.theta, state.iteration, model, schedule, grad, friction
    )
    h = kick.h
    with np.errstate(over="ignore", invalid="ignore"):
        momentum = (
            state.momentum
            - h * state.thermostat[:, None] * state.momentum
            + h * kick.g
            + kick.noise
        )
        thermostat = state.thermostat + (np.mean(momentum * momentum, axis=1) - 1.0) * h
    theta, momentum, info = sgmcmc.move(
        "sgnht", kick, state.theta, momentum, state.iteration, model, thermostat
    )
    return SGNHTState(theta, momentum, thermostat, state.iteration + 1), info


def build(model: Model, data: ChainData, *, friction: float, **settings: Any) -> SamplingAlgorithm:
    """SGNHT through the owners behind ``data.oracle`` (settings: ``sgmcmc.MomentumSettings``)."""
    return sgmcmc.build_kernel(
        "sgnht",
        model,
        data,
        settings,
        lambda rng, theta0: init(rng, theta0, model, friction),
        lambda rng, state, schedule, grad: step(rng, state, model, schedule, grad, friction),
    )


def check(sections: Sections, model: Model) -> None:
    sgmcmc.check_momentum_friction(sections, "sgnht", 0.5, "below 0.5")


SGNHT = ChainAlgorithm(
    "sgnht",
    "federated SGNHT (owners' noise counted as momentum noise)",
    build,
    sgmcmc.MomentumSettings,
    SGNHTState,
    SGMCMC,
    check=check,
)
