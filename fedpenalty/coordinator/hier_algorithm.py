"""The ``penalty_hier`` registry entry: the three-sub-step kernel of ``penalty_hier`` as a chain
algorithm the driver runs (docs/design.md §6, "Hierarchical models").

Its model is a ``BoundHierarchy`` (a hierarchical model with its owners); its state carries
the proposal radii, adapted during warmup (``penalty_hier.adapted``) and frozen after, so a
checkpoint resumes the same chain. Every owner answers ``log_ratio`` twice per chain and
iteration (``ANSWERS_PER_ITERATION``), each about a local step of at most ``sampler.step``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from ..common import LOG_RATIO
from ..models.hierarchical import BoundHierarchy
from ..schema import PositiveFloat, Section
from . import penalty_hier
from .base import (
    ACCEPTED,
    KERNEL_KEYS,
    NOISE_VARIANCE,
    QUERIED,
    ChainAlgorithm,
    ChainData,
    Info,
    InfoField,
    SamplingAlgorithm,
    Sections,
    planned_steps,
    require,
)
from .penalty_hier import HierInfo, HierState, Radii

#: The sample_stats penalty_hier adds to MH's: how the unasked sub-steps moved.
HYPER_ACCEPTED = InfoField("hyper_accepted", np.bool_, "θ_H (log τ) moved (prior-only MH)")
BLOCK_ACCEPTANCE = InfoField(
    "block_acceptance", np.float64, "fraction of the owners' blocks b_k that moved"
)
SHIFT_ACCEPTED = InfoField(
    "shift_accepted", np.bool_, "the likelihood-invariant shift (μ + c, b_k − c) moved"
)
INFO = (QUERIED, ACCEPTED, NOISE_VARIANCE, HYPER_ACCEPTED, BLOCK_ACCEPTANCE, SHIFT_ACCEPTED)


class HierSettings(Section):
    """The ``[sampler]`` keys of ``penalty_hier`` besides ``step`` (the θ_L and block radii's
    start and cap: the owners' max_step, units of the local parameter) and ``adapt_step``
    (MH's key: each radius adapts in warmup towards acceptance ``penalty_hier.TARGET_ACCEPT``
    on its own sub-step, then stays fixed)."""

    hyper_step: PositiveFloat = Field(
        default=0.5,
        description="penalty_hier: the start radius of the random walk on θ_H (log τ), which "
        "asks no owner; adapted in warmup when adapt_step",
    )


@dataclass(frozen=True)
class HierRunState:
    """The kernel's state: the chains (``chain``) and the radii they move with."""

    chain: HierState
    radii: Radii

    @property
    def position(self) -> np.ndarray:
        """z ``(C, d + K·p)``."""
        return self.chain.z

    @property
    def tuning(self) -> HierRunState:
        """What diagnostics.json's ``step_adaptation`` reads (``summary``)."""
        return self

    def summary(self) -> dict[str, float]:
        """The radii the kept draws moved with, units of z."""
        r = self.radii
        return {
            "step": r.shared,
            "block_step": r.block,
            "hyper_step": r.hyper,
            "shift_step": r.shift,
        }


def record(info: HierInfo) -> Info:
    """The driver's record of a step (``INFO``)."""
    return {
        QUERIED.name: info.queried,
        ACCEPTED.name: info.accepted,
        NOISE_VARIANCE.name: np.where(info.queried, info.noise_var, np.nan),
        HYPER_ACCEPTED.name: info.hyper_accepted,
        BLOCK_ACCEPTANCE.name: info.block_acceptance,
        SHIFT_ACCEPTED.name: info.shift_accepted,
    }


def build(
    model: BoundHierarchy, data: ChainData, *, step: float, hyper_step: float, adapt_step: bool
) -> SamplingAlgorithm:
    """penalty_hier through the owners behind ``data.oracle``: θ_L and block radii start at
    ``step`` (the owners' max_step, their cap), θ_H's at ``hyper_step``, the likelihood-
    invariant shift's at ``step`` (units of θ_L; uncapped: it asks no owner)."""
    oracle = data.require_oracle("penalty_hier")
    hier, owners = model.model, model.owners
    # the reflected block proposal is symmetric only below the box's half-width
    start = Radii(hyper_step, step, min(step, 0.5 * hier.block_bound), shift=step)

    def init(rng: np.random.Generator, z0: np.ndarray) -> HierRunState:
        return HierRunState(penalty_hier.init(z0, hier, owners), start)

    def advance(rng: np.random.Generator, state: HierRunState) -> tuple[HierRunState, Info]:
        chain, info = penalty_hier.step(rng, state.chain, hier, oracle, state.radii)
        return HierRunState(chain, state.radii), record(info)

    def warm(rng: np.random.Generator, state: HierRunState) -> tuple[HierRunState, Info]:
        chain, info = penalty_hier.step(rng, state.chain, hier, oracle, state.radii)
        radii = penalty_hier.adapted(state.radii, info, state.chain.iteration, start.block)
        return HierRunState(chain, radii), record(info)

    return SamplingAlgorithm(init, advance, INFO, warm if adapt_step else None, radii_drawn)


def radii_drawn(state: HierRunState, warmup: int, shape: tuple[int, int]):
    """The kept draws' radii ``(C, draws)`` each (fixed after warmup), units of z."""
    r = state.radii
    return {
        "step_size": np.full(shape, r.shared),
        "block_step_size": np.full(shape, r.block),
        "hyper_step_size": np.full(shape, r.hyper),
        "shift_step_size": np.full(shape, r.shift),
    }


def asks(sampler: Mapping[str, Any]) -> dict[str, int]:
    """Two log ratios per owner per chain per iteration (sub-steps 2 and 3)."""
    return {LOG_RATIO: penalty_hier.ANSWERS_PER_ITERATION * planned_steps(sampler)}


def check(sections: Sections, model: Any) -> None:
    """Each owner's own answer (no secure aggregation), and the owners admit ``step``. (That
    the model is hierarchical, config checks for every algorithm marked ``hierarchical``.)"""
    require(
        sections["privacy"]["aggregation"] != "secure",
        "penalty_hier needs each owner's own answer: set privacy.aggregation = 'none'",
    )
    max_step = sections["privacy"]["max_step"]
    step = sections["sampler"]["step"]
    require(
        max_step is None or step <= max_step,
        f"sampler.step = {step:g} exceeds privacy.max_step = {max_step}; owners would refuse "
        "every query",
    )


PENALTY_HIER = ChainAlgorithm(
    "penalty_hier",
    "penalty MH within Gibbs on a hierarchical model: each owner answers at its own block",
    build,
    HierSettings,
    HierRunState,
    LOG_RATIO,
    generic=(*KERNEL_KEYS, "adapt_step"),
    check=check,
    max_step=lambda sampler: sampler["step"],
    kinds=asks,
    hierarchical=True,
)
