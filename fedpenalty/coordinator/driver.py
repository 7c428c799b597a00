"""The chain driver: runs a kernel for warmup + kept iterations and collects the draws.

``sample`` is the one loop every algorithm goes through; the algorithm decides only how a
step asks for data (owners through an oracle, or a trusted curator's pooled records).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from ..models import ExpFamModel, Model
from . import expfam, mh
from .oracle import Oracle

ALGORITHMS = ("penalty", "penalty_expfam", "exact_mh")


@dataclass(frozen=True)
class ChainResult:
    """Kept draws ``theta`` ``(C, iterations, d)``; per kept iteration ``accepted`` and
    ``queried`` ``(C, iterations)``; ``noise_var`` the mean s² of the queried steps."""

    theta: np.ndarray
    accepted: np.ndarray
    queried: np.ndarray
    noise_var: float

    @property
    def acceptance_rate(self) -> float:
        return float(self.accepted.mean())


def planned_answers(algorithm: str, chains: int, iterations: int, warmup: int, block: int = 1) -> int:
    """Answers each owner is asked for at most (proposals outside Θ are never asked)."""
    total = iterations + warmup
    if algorithm == "penalty_expfam" and block > 1:
        total = -(-total // block) * block
    return chains * total


def sample(algorithm: str, model: Model, rng: np.random.Generator, theta0: np.ndarray, *, iterations: int,
           warmup: int, step: float, oracle: Oracle | None = None, records: np.ndarray | None = None,
           n_total: int | None = None, block: int = 1, progress: bool = True,
           description: str | None = None) -> ChainResult:
    """Run ``len(theta0)`` chains. ``oracle`` serves ``penalty`` and ``penalty_expfam``
    (``n_total``, the public total record count, is needed for the latter); ``records`` (pooled,
    trusted curator) serves ``exact_mh``."""
    advance = _kernel(algorithm, model, step, oracle, records, n_total, block)
    state = expfam.init(theta0, model) if algorithm == "penalty_expfam" else mh.init(theta0, model)
    chains, total = len(theta0), warmup + iterations
    theta = np.empty((chains, iterations, model.dim))
    accepted = np.empty((chains, iterations), dtype=bool)
    queried = np.empty((chains, iterations), dtype=bool)
    noise_sum, noise_count = 0.0, 0
    with tqdm(total=total, desc=description or algorithm, disable=not progress, unit="it",
              mininterval=0.5, leave=False) as bar:
        for t in range(total):
            state, info = advance(rng, state)
            noise_sum += float(info.noise_var[info.queried].sum())
            noise_count += int(info.queried.sum())
            if t >= warmup:
                k = t - warmup
                theta[:, k] = (state.mh if isinstance(state, expfam.ExpFamState) else state).theta
                accepted[:, k] = info.accepted
                queried[:, k] = info.queried
            if t % 64 == 0 or t == total - 1:
                bar.update(t + 1 - bar.n)
    return ChainResult(theta, accepted, queried, noise_sum / max(noise_count, 1))


def _kernel(algorithm: str, model: Model, radius: float, oracle: Oracle | None, records: np.ndarray | None,
            n_total: int | None, block: int) -> Callable:
    if algorithm == "penalty":
        if oracle is None:
            raise ValueError("penalty needs an oracle")
        ratio = mh.oracle_ratio(oracle)
        return lambda rng, state: mh.step(rng, state, model, radius, ratio)
    if algorithm == "penalty_expfam":
        if oracle is None or n_total is None:
            raise ValueError("penalty_expfam needs an oracle and the public total n")
        if not isinstance(model, ExpFamModel):
            raise ValueError(f"penalty_expfam needs an exponential-family model, not {model.name!r}")
        stats = expfam.oracle_stats(oracle)
        return lambda rng, state: expfam.step(rng, state, model, radius, stats, block, n_total)
    if algorithm == "exact_mh":
        if records is None:
            raise ValueError("exact_mh needs the pooled records (trusted curator)")
        ratio = mh.exact_ratio(model, records)
        return lambda rng, state: mh.step(rng, state, model, radius, ratio)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
