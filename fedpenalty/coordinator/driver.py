"""The chain driver: runs a kernel for warmup + kept iterations and collects the draws.

``sample`` is the one loop every algorithm goes through; the algorithm decides only how a
step asks for data (owners through an oracle, or a trusted curator's pooled records).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from ..errors import OwnerError
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


@dataclass(frozen=True)
class Progress:
    """A run after ``done`` of its warmup + iterations: everything needed to continue it
    exactly. ``rng_state`` is the chain RNG's ``bit_generator.state`` at that point; ``theta``
    ``(C, iterations, d)``, ``accepted`` and ``queried`` ``(C, iterations)`` are filled for the
    first ``kept`` draws. The arrays are the live buffers: copy or save them at once."""

    done: int
    warmup: int
    state: mh.MHState | expfam.ExpFamState
    rng_state: dict[str, Any]
    theta: np.ndarray
    accepted: np.ndarray
    queried: np.ndarray
    noise_sum: float
    noise_count: int

    @property
    def kept(self) -> int:
        return max(self.done - self.warmup, 0)

    def result(self) -> ChainResult:
        """The draws kept so far."""
        k = self.kept
        return ChainResult(self.theta[:, :k], self.accepted[:, :k], self.queried[:, :k],
                           self.noise_sum / max(self.noise_count, 1))


class SamplingStopped(Exception):
    """An owner refused or could not be reached. ``progress`` is the run up to the last
    completed iteration (resumable); ``cause`` the owner's error."""

    def __init__(self, progress: Progress, cause: OwnerError):
        super().__init__(str(cause))
        self.progress, self.cause = progress, cause


def sample(algorithm: str, model: Model, rng: np.random.Generator, theta0: np.ndarray, *, iterations: int,
           warmup: int, step: float, oracle: Oracle | None = None, records: np.ndarray | None = None,
           n_total: int | None = None, block: int = 1, progress: bool = True,
           description: str | None = None, resume: Progress | None = None,
           checkpoint: Callable[[Progress], None] | None = None, checkpoint_every: int = 0) -> ChainResult:
    """Run ``len(theta0)`` chains. ``oracle`` serves ``penalty`` and ``penalty_expfam``
    (``n_total``, the public total record count, is needed for the latter); ``records`` (pooled,
    trusted curator) serves ``exact_mh``.

    ``resume``: continue from a saved ``Progress`` (``theta0`` is then ignored and ``rng`` is
    reset to the saved state), which gives exactly the chain of an uninterrupted run when the
    owners replay re-asked queries. ``checkpoint`` is called every ``checkpoint_every``
    iterations. An owner error stops the run with ``SamplingStopped``.
    """
    advance = _kernel(algorithm, model, step, oracle, records, n_total, block)
    chains, total = len(theta0), warmup + iterations
    if resume is None:
        state = expfam.init(theta0, model) if algorithm == "penalty_expfam" else mh.init(theta0, model)
        run = Progress(0, warmup, state, rng.bit_generator.state, np.empty((chains, iterations, model.dim)),
                       np.zeros((chains, iterations), dtype=bool), np.zeros((chains, iterations), dtype=bool), 0.0, 0)
    else:
        if resume.theta.shape != (chains, iterations, model.dim) or resume.warmup != warmup:
            raise ValueError("the checkpoint belongs to a run with other chains, iterations, warmup or dimension")
        run = resume
        rng.bit_generator.state = run.rng_state
    state, noise_sum, noise_count = run.state, run.noise_sum, run.noise_count
    theta, accepted, queried = run.theta, run.accepted, run.queried

    def at(done: int, rng_state: dict[str, Any]) -> Progress:
        return Progress(done, warmup, state, rng_state, theta, accepted, queried, noise_sum, noise_count)

    with tqdm(total=total, initial=run.done, desc=description or algorithm, disable=not progress, unit="it",
              mininterval=0.5, leave=False) as bar:
        for t in range(run.done, total):
            before = rng.bit_generator.state
            try:
                state, info = advance(rng, state)
            except OwnerError as exc:
                raise SamplingStopped(at(t, before), exc) from exc
            noise_sum += float(info.noise_var[info.queried].sum())
            noise_count += int(info.queried.sum())
            if t >= warmup:
                k = t - warmup
                theta[:, k] = (state.mh if isinstance(state, expfam.ExpFamState) else state).theta
                accepted[:, k] = info.accepted
                queried[:, k] = info.queried
            if checkpoint is not None and checkpoint_every and (t + 1) % checkpoint_every == 0 and t + 1 < total:
                checkpoint(at(t + 1, rng.bit_generator.state))
            if t % 64 == 0 or t == total - 1:
                bar.update(t + 1 - bar.n)
    return at(total, rng.bit_generator.state).result()


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
