"""The chain driver: runs any chain algorithm for warmup + kept iterations and keeps the draws.

``sample`` is the one loop every kernel goes through (docs/design.md §4); the kernel — built
from the algorithm registry — decides how a step asks for data (owners through an oracle, or a
trusted curator's pooled records). Each kernel declares the fields its steps report
(``base.InfoField``); the driver keeps every kept field per draw (posterior.nc's sample_stats)
and counts the owners' noise and its excess over the run. The penalty MH kernels report
acceptances; the SG-MCMC kernels have no accept step and report instead how far the owners'
noise exceeds the noise the dynamics needs (``excess_noise_ratio``, docs/design.md §2.3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import Interrupted, OwnerError
from ..progress import ProgressBar
from .base import (
    ACCEPTED,
    EXCESS,
    NOISE_VARIANCE,
    QUERIED,
    ChainState,
    Derived,
    Info,
    SamplingAlgorithm,
)


@dataclass(frozen=True)
class ChainResult:
    """Kept draws ``theta`` ``(C, iterations, d)``; per kept iteration ``accepted`` (None for
    SG-MCMC) and ``queried`` ``(C, iterations)``; ``noise_var`` the mean owner-noise variance of
    the queried steps; over all steps (warmup included) ``excess_noise_ratio`` the largest
    excess of the owners' noise over the design noise and ``excess_fraction`` the fraction of
    chain steps with any excess (both 0 for MH); ``noise_draws`` ``(C, iterations)`` the owners'
    noise variance of each kept step (NaN where no owner was asked); ``stats`` every per-draw
    statistic, name → ``(C, iterations, ...)``: the kernel's kept fields, then those it
    derives (posterior.nc's sample_stats)."""

    theta: np.ndarray
    accepted: np.ndarray | None
    queried: np.ndarray
    noise_var: float
    excess_noise_ratio: float = 0.0
    excess_fraction: float = 0.0
    noise_draws: np.ndarray | None = None
    state: Any = None
    stats: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: the kernel reports its owners' noise excess (SG-MCMC, ``base.EXCESS``)
    reports_excess: bool = False

    @property
    def acceptance_rate(self) -> float | None:
        return None if self.accepted is None else float(self.accepted.mean())


@dataclass(frozen=True)
class Progress:
    """A run after ``done`` of its warmup + iterations: everything needed to continue it
    exactly. ``rng_state`` is the chain RNG's ``bit_generator.state`` at that point; ``theta``
    ``(C, iterations, d)``, ``accepted`` (None for SG-MCMC) and ``queried`` ``(C, iterations)``
    are filled for the first ``kept`` draws; ``noise_sum``/``noise_count`` total the noise
    variance of queried chain steps, ``excess_max``/``excess_steps`` the largest excess noise
    ratio and the number of chain steps with excess; ``noise_draws`` ``(C, iterations)`` the
    noise variance of each kept step (NaN: not queried; None in checkpoints of older runs);
    ``stats`` the buffers of the kernel's other kept fields (``base.InfoField``), name →
    ``(C, iterations, ...)``; ``derive`` the kernel's derived statistics (not saved: the
    kernel sets it again on resume). The arrays are the live buffers: copy or save them at
    once."""

    done: int
    warmup: int
    state: Any
    rng_state: Mapping[str, Any]
    theta: np.ndarray
    accepted: np.ndarray | None
    queried: np.ndarray
    noise_sum: float
    noise_count: int
    excess_max: float = 0.0
    excess_steps: int = 0
    noise_draws: np.ndarray | None = None
    stats: Mapping[str, np.ndarray] = field(default_factory=dict)
    derive: Derived | None = field(default=None, compare=False)
    #: the kernel declares ``EXCESS`` (not saved: set from the kernel, as ``derive``)
    reports_excess: bool = field(default=False, compare=False)

    def buffers(self) -> dict[str, np.ndarray]:
        """Every kept field's buffer by name: queried, accepted and noise_variance (those
        present), then ``stats``."""
        standard = {
            QUERIED.name: self.queried,
            ACCEPTED.name: self.accepted,
            NOISE_VARIANCE.name: self.noise_draws,
        }
        return {**{k: v for k, v in standard.items() if v is not None}, **self.stats}

    def advanced(self, state: ChainState, info: Info) -> Progress:
        """This run one iteration later: ``state`` after it, its ``info`` written into the
        buffers (kept draws only) and added to the counters. ``rng_state`` is left for the
        caller to set."""
        t = self.done
        if t >= self.warmup:
            k = t - self.warmup
            self.theta[:, k] = state.position
            for name, buffer in self.buffers().items():
                buffer[:, k] = info[name]
        queried = info[QUERIED.name]
        noise = info.get(NOISE_VARIANCE.name)
        excess = info.get(EXCESS.name)
        return replace(
            self,
            done=t + 1,
            state=state,
            noise_sum=self.noise_sum + (0.0 if noise is None else float(noise[queried].sum())),
            noise_count=self.noise_count + int(queried.sum()),
            excess_max=max(self.excess_max, 0.0 if excess is None else float(excess.max())),
            excess_steps=self.excess_steps
            + (0 if excess is None else int(np.count_nonzero(excess))),
        )

    @property
    def kept(self) -> int:
        return max(self.done - self.warmup, 0)

    def result(self) -> ChainResult:
        """The draws kept so far."""
        k = self.kept
        steps = self.done * self.theta.shape[0]
        stats = {name: buffer[:, :k] for name, buffer in self.buffers().items()}
        if self.derive is not None:
            stats.update(self.derive(self.state, self.warmup, (self.theta.shape[0], k)))
        return ChainResult(
            self.theta[:, :k],
            None if self.accepted is None else self.accepted[:, :k],
            self.queried[:, :k],
            self.noise_sum / max(self.noise_count, 1),
            self.excess_max,
            self.excess_steps / max(steps, 1),
            None if self.noise_draws is None else self.noise_draws[:, :k],
            self.state,
            stats,
            self.reports_excess,
        )


class SamplingStopped(Exception):
    """An owner refused or could not be reached, or the user interrupted the run. ``progress``
    is the run up to the last completed iteration (resumable); ``cause`` the owner's error or
    ``Interrupted``."""

    def __init__(self, progress: Progress, cause: OwnerError | Interrupted):
        super().__init__(str(cause))
        self.progress, self.cause = progress, cause


def _iterate(
    algorithm: SamplingAlgorithm,
    rng: np.random.Generator,
    run: Progress,
    total: int,
    checkpoint: Callable[[Progress], None] | None,
    checkpoint_every: int,
) -> Progress:
    """One iteration of every chain after ``run``, checkpointed when due (every
    ``checkpoint_every`` iterations and after the last, so a run whose outputs then cannot be
    written is still resumable); an owner error becomes ``SamplingStopped`` at ``run``."""
    advance = algorithm.step
    if run.done < run.warmup and algorithm.warmup is not None:  # adapting kernels tune here
        advance = algorithm.warmup
    try:
        state, record = advance(rng, run.state)
    except OwnerError as exc:
        raise SamplingStopped(run, exc) from exc
    run = replace(run.advanced(state, record), rng_state=rng.bit_generator.state)
    due = checkpoint_every and (run.done % checkpoint_every == 0 or run.done == total)
    if checkpoint is not None and due:
        checkpoint(run)
    return run


def start(
    algorithm: SamplingAlgorithm,
    rng: np.random.Generator,
    theta0: np.ndarray,
    iterations: int,
    warmup: int,
) -> Progress:
    """A new run of ``len(theta0)`` chains from ``theta0`` ``(C, d)``, before its first step,
    with a buffer ``(C, iterations, *shape)`` for each kept field the kernel declares."""
    chains, dim = np.shape(theta0)
    state = algorithm.init(rng, theta0)
    buffers = {
        f.name: np.full((chains, iterations, *f.shape), f.fill, dtype=f.dtype)
        for f in algorithm.info
        if f.kept
    }
    if QUERIED.name not in buffers:
        raise ValueError("a kernel must report which chains asked for data (base.QUERIED)")
    return Progress(
        0,
        warmup,
        state,
        rng.bit_generator.state,
        np.empty((chains, iterations, dim)),
        buffers.pop(ACCEPTED.name, None),
        buffers.pop(QUERIED.name),
        0.0,
        0,
        noise_draws=buffers.pop(NOISE_VARIANCE.name, None),
        stats=buffers,
        derive=algorithm.derived,
        reports_excess=EXCESS in algorithm.info,
    )


def sample(
    algorithm: SamplingAlgorithm,
    rng: np.random.Generator,
    theta0: np.ndarray,
    *,
    iterations: int,
    warmup: int,
    progress: bool = True,
    description: str = "chains",
    resume: Progress | None = None,
    checkpoint: Callable[[Progress], None] | None = None,
    checkpoint_every: int = 0,
) -> ChainResult:
    """Run ``len(theta0)`` chains of ``algorithm`` (a built kernel) from ``theta0`` ``(C, d)``.

    ``resume``: continue from a saved ``Progress`` (``theta0`` is then ignored and ``rng`` is
    reset to the saved state), which gives exactly the chain of an uninterrupted run when the
    owners replay re-asked queries. ``checkpoint`` is called every ``checkpoint_every``
    iterations and after the last (never when it is 0). An owner error, or Ctrl-C during an
    iteration, stops the run with ``SamplingStopped``.
    """
    if resume is None:
        run = start(algorithm, rng, theta0, iterations, warmup)
    else:
        if resume.theta.shape[:2] != (len(theta0), iterations) or resume.warmup != warmup:
            raise ValueError(
                "the checkpoint belongs to a run with other chains, iterations, warmup or dimension"
            )
        run = replace(resume, derive=algorithm.derived, reports_excess=EXCESS in algorithm.info)
        rng.bit_generator.state = run.rng_state
    total = warmup + iterations
    with ProgressBar(
        total=total,
        initial=run.done,
        desc=description,
        disable=not progress,
        unit="it",
        mininterval=0.5,
        leave=False,
    ) as bar:
        while run.done < total:
            try:
                run = _iterate(algorithm, rng, run, total, checkpoint, checkpoint_every)
                if run.done % 64 == 1 or run.done == total:
                    bar.update(run.done - bar.n)
            except KeyboardInterrupt:  # the iteration is dropped; what owners answered replays
                raise SamplingStopped(run, Interrupted("interrupted (Ctrl-C)")) from None
    return run.result()
