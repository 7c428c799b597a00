"""The chain driver: runs a kernel for warmup + kept iterations and collects the draws.

``sample`` is the one loop every algorithm goes through; the algorithm decides only how a
step asks for data (owners through an oracle, or a trusted curator's pooled records). The
penalty MH kernels report acceptances; the SG-MCMC kernels (``sgld``, ``sghmc``, ``sgnht``)
have no accept step and report instead how far the owners' noise exceeds the noise the
dynamics needs (``excess_noise_ratio``, DESIGN §2.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from ..errors import OwnerError
from ..models import ExpFamModel, Model
from ..owner.policy import LOG_RATIO, SGMCMC, SUFF_STATS
from . import expfam, mh, sgmcmc
from .oracle import Oracle

#: SG-MCMC kernels: no accept step; they ask the owners for gradients.
SG_KERNELS = ("sgld", "sghmc", "sgnht")
#: Every kernel ``sample`` runs.
KERNELS = ("penalty", "penalty_expfam", "exact_mh", *SG_KERNELS)

State = mh.MHState | expfam.ExpFamState | sgmcmc.SGLDState | sgmcmc.SGHMCState | sgmcmc.SGNHTState


def session_algorithm(algorithm: str) -> str:
    """The owners' name of what ``algorithm`` asks them for (one ``sgmcmc`` gradient session
    serves all SG-MCMC kernels)."""
    if algorithm in SG_KERNELS:
        return SGMCMC
    if algorithm in (LOG_RATIO, SUFF_STATS):
        return algorithm
    raise ValueError(f"{algorithm!r} asks no owner for answers")


@dataclass(frozen=True)
class GradientSettings:
    """What an SG-MCMC run needs besides the oracle: the step ``schedule`` η_t (units of θ²),
    the owners' Poisson ``sampling_rate`` q ∈ (0, 1], the per-record gradient ``clip`` C (L2
    norm), and ``friction`` (SGHMC's C, SGNHT's A; per unit of h = √η)."""

    schedule: sgmcmc.StepSchedule
    sampling_rate: float
    clip: float
    friction: float = 1.0


@dataclass(frozen=True)
class StepRecord:
    """What the driver keeps of one step of any kernel, per chain ``(C,)``: ``accepted`` (None
    for kernels without an accept step), ``queried`` (owners asked), ``noise_var`` (the noise
    variance of the owners' answers: s² of the penalty, or of each coordinate of the gradient)
    and ``excess`` (excess_noise_ratio of the SG-MCMC step; 0 for MH)."""

    accepted: np.ndarray | None
    queried: np.ndarray
    noise_var: np.ndarray
    excess: np.ndarray


@dataclass(frozen=True)
class ChainResult:
    """Kept draws ``theta`` ``(C, iterations, d)``; per kept iteration ``accepted`` (None for
    SG-MCMC) and ``queried`` ``(C, iterations)``; ``noise_var`` the mean owner-noise variance of
    the queried steps; over all steps (warmup included) ``excess_noise_ratio`` the largest
    excess of the owners' noise over the design noise and ``excess_fraction`` the fraction of
    chain steps with any excess (both 0 for MH)."""

    theta: np.ndarray
    accepted: np.ndarray | None
    queried: np.ndarray
    noise_var: float
    excess_noise_ratio: float = 0.0
    excess_fraction: float = 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return None if self.accepted is None else float(self.accepted.mean())


def planned_answers(algorithm: str, chains: int, iterations: int, warmup: int, block: int = 1) -> int:
    """Answers each owner is asked for at most (proposals outside Θ are never asked; SG-MCMC
    asks once per chain per iteration)."""
    total = iterations + warmup
    if algorithm == "penalty_expfam" and block > 1:
        total = -(-total // block) * block
    return chains * total


def chain_theta(state: State) -> np.ndarray:
    """The chains' current θ ``(C, d)`` of any kernel's state."""
    return state.mh.theta if isinstance(state, expfam.ExpFamState) else state.theta


@dataclass(frozen=True)
class Progress:
    """A run after ``done`` of its warmup + iterations: everything needed to continue it
    exactly. ``rng_state`` is the chain RNG's ``bit_generator.state`` at that point; ``theta``
    ``(C, iterations, d)``, ``accepted`` (None for SG-MCMC) and ``queried`` ``(C, iterations)``
    are filled for the first ``kept`` draws; ``noise_sum``/``noise_count`` total the noise
    variance of queried chain steps, ``excess_max``/``excess_steps`` the largest excess noise
    ratio and the number of chain steps with excess. The arrays are the live buffers: copy or
    save them at once."""

    done: int
    warmup: int
    state: State
    rng_state: dict[str, Any]
    theta: np.ndarray
    accepted: np.ndarray | None
    queried: np.ndarray
    noise_sum: float
    noise_count: int
    excess_max: float = 0.0
    excess_steps: int = 0

    @property
    def kept(self) -> int:
        return max(self.done - self.warmup, 0)

    def result(self) -> ChainResult:
        """The draws kept so far."""
        k = self.kept
        steps = self.done * self.theta.shape[0]
        return ChainResult(self.theta[:, :k], None if self.accepted is None else self.accepted[:, :k],
                           self.queried[:, :k], self.noise_sum / max(self.noise_count, 1), self.excess_max,
                           self.excess_steps / max(steps, 1))


class SamplingStopped(Exception):
    """An owner refused or could not be reached. ``progress`` is the run up to the last
    completed iteration (resumable); ``cause`` the owner's error."""

    def __init__(self, progress: Progress, cause: OwnerError):
        super().__init__(str(cause))
        self.progress, self.cause = progress, cause


def sample(algorithm: str, model: Model, rng: np.random.Generator, theta0: np.ndarray, *, iterations: int,
           warmup: int, step: float | None = None, oracle: Oracle | None = None, records: np.ndarray | None = None,
           n_total: int | None = None, block: int = 1, gradient: GradientSettings | None = None,
           progress: bool = True, description: str | None = None, resume: Progress | None = None,
           checkpoint: Callable[[Progress], None] | None = None, checkpoint_every: int = 0) -> ChainResult:
    """Run ``len(theta0)`` chains. ``oracle`` serves ``penalty``, ``penalty_expfam`` (with
    ``n_total``, the public total record count) and the SG-MCMC kernels (with ``gradient``);
    ``records`` (pooled, trusted curator) serves ``exact_mh``. ``step`` is the MH proposal
    radius.

    ``resume``: continue from a saved ``Progress`` (``theta0`` is then ignored and ``rng`` is
    reset to the saved state), which gives exactly the chain of an uninterrupted run when the
    owners replay re-asked queries. ``checkpoint`` is called every ``checkpoint_every``
    iterations. An owner error stops the run with ``SamplingStopped``.
    """
    init, advance = _kernel(algorithm, model, step, oracle, records, n_total, block, gradient)
    chains, total = len(theta0), warmup + iterations
    if resume is None:
        state = init(rng, theta0)
        run = Progress(0, warmup, state, rng.bit_generator.state, np.empty((chains, iterations, model.dim)),
                       None if algorithm in SG_KERNELS else np.zeros((chains, iterations), dtype=bool),
                       np.zeros((chains, iterations), dtype=bool), 0.0, 0)
    else:
        if resume.theta.shape != (chains, iterations, model.dim) or resume.warmup != warmup:
            raise ValueError("the checkpoint belongs to a run with other chains, iterations, warmup or dimension")
        run = resume
        rng.bit_generator.state = run.rng_state
    state, noise_sum, noise_count = run.state, run.noise_sum, run.noise_count
    excess_max, excess_steps = run.excess_max, run.excess_steps
    theta, accepted, queried = run.theta, run.accepted, run.queried

    def at(done: int, rng_state: dict[str, Any]) -> Progress:
        return Progress(done, warmup, state, rng_state, theta, accepted, queried, noise_sum, noise_count,
                        excess_max, excess_steps)

    with tqdm(total=total, initial=run.done, desc=description or algorithm, disable=not progress, unit="it",
              mininterval=0.5, leave=False) as bar:
        for t in range(run.done, total):
            before = rng.bit_generator.state
            try:
                state, record = advance(rng, state)
            except OwnerError as exc:
                raise SamplingStopped(at(t, before), exc) from exc
            noise_sum += float(record.noise_var[record.queried].sum())
            noise_count += int(record.queried.sum())
            excess_max = max(excess_max, float(record.excess.max()))
            excess_steps += int(np.count_nonzero(record.excess))
            if t >= warmup:
                k = t - warmup
                theta[:, k] = chain_theta(state)
                if accepted is not None:
                    accepted[:, k] = record.accepted
                queried[:, k] = record.queried
            if checkpoint is not None and checkpoint_every and (t + 1) % checkpoint_every == 0 and t + 1 < total:
                checkpoint(at(t + 1, rng.bit_generator.state))
            if t % 64 == 0 or t == total - 1:
                bar.update(t + 1 - bar.n)
    return at(total, rng.bit_generator.state).result()


Init = Callable[[np.random.Generator, np.ndarray], State]
Advance = Callable[[np.random.Generator, State], tuple[State, StepRecord]]


def _mh_record(info: mh.MHInfo) -> StepRecord:
    return StepRecord(info.accepted, info.queried, info.noise_var, np.zeros(len(info.queried)))


def _sg_record(info: sgmcmc.SGInfo) -> StepRecord:
    return StepRecord(None, np.ones(len(info.owner_noise_var), dtype=bool), info.owner_noise_var,
                      info.excess_noise_ratio)


def _kernel(algorithm: str, model: Model, radius: float | None, oracle: Oracle | None, records: np.ndarray | None,
            n_total: int | None, block: int, gradient: GradientSettings | None) -> tuple[Init, Advance]:
    """(init, advance) of ``algorithm``; advance returns the new state and its ``StepRecord``."""
    if algorithm in SG_KERNELS:
        if oracle is None or gradient is None:
            raise ValueError(f"{algorithm} needs an oracle and gradient settings")
        grad = sgmcmc.oracle_gradient(oracle, gradient.sampling_rate, gradient.clip)
        sch, friction = gradient.schedule, gradient.friction
        init, step, record = {
            "sgld": (lambda rng, th: sgmcmc.sgld_init(th, model),
                     lambda rng, st: sgmcmc.sgld_step(rng, st, model, sch, grad), _sg_record),
            "sghmc": (lambda rng, th: sgmcmc.sghmc_init(rng, th, model),
                      lambda rng, st: sgmcmc.sghmc_step(rng, st, model, sch, grad, friction), _sg_record),
            "sgnht": (lambda rng, th: sgmcmc.sgnht_init(rng, th, model, friction),
                      lambda rng, st: sgmcmc.sgnht_step(rng, st, model, sch, grad, friction), _sg_record),
        }[algorithm]
    elif radius is None:
        raise ValueError(f"{algorithm} needs the proposal radius step")
    elif algorithm == "penalty_expfam":
        if oracle is None or n_total is None:
            raise ValueError("penalty_expfam needs an oracle and the public total n")
        if not isinstance(model, ExpFamModel):
            raise ValueError(f"penalty_expfam needs an exponential-family model, not {model.name!r}")
        stats = expfam.oracle_stats(oracle)
        init, step, record = (lambda rng, th: expfam.init(th, model),
                              lambda rng, st: expfam.step(rng, st, model, radius, stats, block, n_total), _mh_record)
    elif algorithm in ("penalty", "exact_mh"):
        if algorithm == "penalty" and oracle is None:
            raise ValueError("penalty needs an oracle")
        if algorithm == "exact_mh" and records is None:
            raise ValueError("exact_mh needs the pooled records (trusted curator)")
        ratio = mh.oracle_ratio(oracle) if algorithm == "penalty" else mh.exact_ratio(model, records)
        init, step, record = (lambda rng, th: mh.init(th, model),
                              lambda rng, st: mh.step(rng, st, model, radius, ratio), _mh_record)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(KERNELS)}")

    def advance(rng: np.random.Generator, state: State) -> tuple[State, StepRecord]:
        new, info = step(rng, state)
        return new, record(info)

    return init, advance
