"""Penalty MH for exponential-family models from noisy sufficient statistics
(docs/design.md §2.2).

Each owner releases fresh noisy copies ŝ_k = Σ_{x∈D_k} S(x) + N(0, σ_k² I); the coordinator
forms λ̂ = (η(θ') − η(θ))ᵀ Σ_k ŝ_k − n (A(θ') − A(θ)) with noise variance
v = Σ_k σ_k² ‖η(θ') − η(θ)‖² and accepts with min{1, exp(log p(θ')/p(θ) + λ̂ − v/2)}.

Copy t of chain c serves iteration t of that chain. With ``block`` B > 1 the owners release
the copies for iterations t..t+B−1 of every chain in one reply (charged for all of them), so
the chain runs at local speed; with B = 1 only chains whose proposal lies inside Θ are asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from ..common import SUFF_STATS
from ..models import ExpFamModel, Model
from ..schema import PositiveInt
from . import mh
from .adapt import StepAdaptation
from .base import ChainAlgorithm, ChainData, SamplingAlgorithm, Sections, require

if TYPE_CHECKING:
    from .oracle import Oracle

#: (chains (m,), start, block) -> (Σ_k ŝ_k per chain and copy (m, block, s), Σ_k σ_k²)
StatsFn = Callable[[np.ndarray, int, int], tuple[np.ndarray, float]]


class ExpFamSettings(mh.MHSettings):
    """The ``[sampler]`` keys of ``penalty_expfam``: the MH kernels' and the block size."""

    block: PositiveInt = Field(
        default=1, description="penalty_expfam: noisy statistic copies released per reply"
    )


@dataclass(frozen=True)
class ExpFamState:
    """MH state plus the unused statistic copies: ``stats`` ``(C, B, s)`` serve iterations
    ``stats_start .. stats_start + B − 1`` (none when ``stats_start`` is −1)."""

    mh: mh.MHState
    stats: np.ndarray
    stats_start: int = -1
    stats_var: float = 0.0

    @property
    def position(self) -> np.ndarray:
        """The chains' θ ``(C, d)`` (``mh.theta``)."""
        return self.mh.theta

    @property
    def tuning(self) -> StepAdaptation:
        """The proposal step and its adaptation (``mh.tuning``)."""
        return self.mh.tuning

    def with_tuning(self, tuning: StepAdaptation) -> ExpFamState:
        return replace(self, mh=self.mh.with_tuning(tuning))


def init(theta: np.ndarray, model: ExpFamModel) -> ExpFamState:
    state = mh.init(theta, model)
    return ExpFamState(state, np.zeros((len(state.theta), 0, model.stat_dim)))


def step(
    rng: np.random.Generator,
    state: ExpFamState,
    model: ExpFamModel,
    radius: float,
    stats: StatsFn,
    block: int,
    n_total: int,
) -> tuple[ExpFamState, mh.MHInfo]:
    """One iteration for all chains; fetches a new block of statistics when needed."""
    t = state.mh.iteration
    buffer, start, var = state.stats, state.stats_start, state.stats_var

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        nonlocal buffer, start, var
        if block == 1:
            s_hat, var = stats(chains, t, 1)
            s_hat = s_hat[:, 0]
        else:
            if not start <= t < start + buffer.shape[1]:
                buffer, var = stats(np.arange(len(state.mh.theta)), t, block)
                start = t
            s_hat = buffer[chains, t - start]
        d_eta = model.natural_param(theta_prop) - model.natural_param(theta)
        lam = np.sum(d_eta * s_hat, axis=1) - n_total * (
            model.log_partition(theta_prop) - model.log_partition(theta)
        )
        return lam, var * np.sum(d_eta**2, axis=1)

    new_mh, info = mh.step(rng, state.mh, model, radius, ratio)
    return ExpFamState(new_mh, buffer, start, var), info


def oracle_stats(oracle: Oracle) -> StatsFn:
    """Σ_k of the owners' noisy statistic copies, and Σ_k σ_k². A block larger than the owners
    answer in one request (chains × copies ≤ every owner's ``max_answers_per_request``) is
    asked in consecutive parts; copy j of chain c stays keyed (c, start + j)."""
    limit: list[int] = []

    def stats(chains: np.ndarray, start: int, block: int):
        if not limit:
            limit.append(min(d.policy.max_answers_per_request for d in oracle.describe()))
        part = max(limit[0] // len(chains), 1)
        totals = [
            oracle.suff_stats(chains, first, min(part, start + block - first)).total()
            for first in range(start, start + block, part)
        ]
        return np.concatenate([values for values, _ in totals], axis=1), totals[0][1]

    return stats


def kernel(
    model: ExpFamModel,
    stats: StatsFn,
    block: int,
    n_total: int,
    tuning: StepAdaptation,
    adapt: bool = False,
) -> SamplingAlgorithm:
    """The kernel with statistics source and block size; proposal radius from ``tuning``
    (units of θ; adapted during warmup when ``adapt``)."""

    def move(rng: np.random.Generator, state: ExpFamState, radius: float):
        return step(rng, state, model, radius, stats, block, n_total)

    def start(rng: np.random.Generator, theta0: np.ndarray) -> ExpFamState:
        return init(theta0, model).with_tuning(tuning)

    return mh.tuned(start, move, adapt)


def build(
    model: Model,
    data: ChainData,
    *,
    step: float,
    block: int,
    adapt_step: bool,
    target_accept: float,
) -> SamplingAlgorithm:
    """Penalty MH from the noisy statistics of the owners behind ``data.oracle`` (with
    ``data.n_total``); ``step`` is the largest ball radius (adapted below it during warmup when
    ``adapt_step``), ``block`` the copies per reply. Statistic copies are charged whatever the
    step, so the step's only floor is adaptation's own."""
    if not isinstance(model, ExpFamModel):
        raise ValueError(f"penalty_expfam needs an exponential-family model, not {model.name!r}")
    if data.n_total is None:
        raise ValueError("penalty_expfam needs the owners' public total record count n_total")
    oracle = data.require_oracle("penalty_expfam")
    tuning = StepAdaptation.start(step, target_accept)
    return kernel(model, oracle_stats(oracle), block, data.n_total, tuning, adapt_step)


def plan(sampler: Mapping[str, Any]) -> int:
    """Answers per chain: warmup + iterations, rounded up to whole blocks."""
    block = int(sampler["block"])
    return -(-(int(sampler["warmup"]) + int(sampler["iterations"])) // block) * block


def check(sections: Sections, model: Model) -> None:
    mh.check_step(sections, model)
    require(
        sections["privacy"]["neighbour"] == "replace_one",
        "sampler.algorithm = 'penalty_expfam' needs each owner's record count n, which owners keep "
        "private under privacy.neighbour = 'add_remove'; use 'penalty' or 'replace_one'",
    )
    require(
        isinstance(model, ExpFamModel),
        "sampler.algorithm = 'penalty_expfam' needs an exponential-family "
        f"model; {model.name!r} is not one",
    )


PENALTY_EXPFAM = ChainAlgorithm(
    "penalty_expfam",
    "penalty MH from owners' noisy sufficient statistics",
    build,
    ExpFamSettings,
    ExpFamState,
    SUFF_STATS,
    plan=plan,
    check=check,
)
