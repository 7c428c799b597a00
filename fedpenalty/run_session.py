"""The session of a run that asks owners (``Owners``: the oracle, names and policies): open it
(a plan an owner refuses for its budget says what would fit), sample with checkpoints while
recording the owners' running spend (``sample_owners``), and settle it once the run's files are
written (``settling``: close a completed session, leave a stopped one open for ``--resume``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .common import Policy, PrivacyReport
from .config import Scenario
from .coordinator import checkpoint
from .coordinator.base import ChainAlgorithm, ChainData, SamplingAlgorithm, planned_steps
from .coordinator.driver import ChainResult, Progress, SamplingStopped, sample
from .coordinator.oracle import Oracle, Unreported
from .coordinator.secure_sum import requested
from .errors import (
    BudgetExhausted,
    ConfigError,
    Interrupted,
    InvalidRequest,
    OutputFailed,
    OwnerError,
)
from .inference_data import POSTERIOR_FILE, SpendTrace, read_spend
from .kinds import GaussianKind, query_kind
from .models import BoundHierarchy, Model
from .refusals import (
    budget_refusal,
    kinds_refusal,
    plan_causes,
    plan_needs,
    plan_needs_kinds,
    policy_refusal,
)
from .run_files import CHECKPOINT, RUN_INFO, reason, write_info


def run_seeds(scenario: Scenario) -> list[np.random.SeedSequence]:
    """Independent streams of the run's seed: data, owners' noise, chains, baseline releases."""
    return np.random.SeedSequence(scenario["run"]["seed"]).spawn(4)


def chain_start(scenario: Scenario, model: Model) -> tuple[np.random.Generator, np.ndarray]:
    """The coordinator's chain RNG and initial points ``(chains, d)`` (data independent); with
    ``sampler.superchains`` = S, S points, each shared by chains/S consecutive chains."""
    sampler = scenario["sampler"]
    rng = np.random.default_rng(run_seeds(scenario)[2])
    scale = sampler["init_scale"] * model.theta_bound
    chains, groups = sampler["chains"], sampler["superchains"]
    if not groups:
        return rng, rng.uniform(-scale, scale, size=(chains, model.dim))
    return rng, np.repeat(rng.uniform(-scale, scale, size=(groups, model.dim)), chains // groups, 0)


@dataclass(frozen=True)
class Owners:
    """The owners of a run behind ``oracle``: their ``names`` and ``policies`` in the order
    the oracle reports them; ``deployed``: served by ``fedpenalty owner serve`` (their policies
    live in their OWNER.toml files, and they give lattice answers)."""

    oracle: Oracle
    names: list[str]
    policies: list[Policy]
    deployed: bool


def sample_owners(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    owners: Owners,
    out: Path,
    n_total: int | None,
    info: dict[str, Any],
    resume: Progress | None = None,
    theta0: np.ndarray | None = None,
    sampled: BoundHierarchy | None = None,
) -> tuple[
    ChainResult, list[PrivacyReport | Unreported], OwnerError | Interrupted | None, SpendTrace
]:
    """Open (or resume) the session, sample with checkpoints, collect the owners' reports.
    Returns the kept draws, the reports (of a stopped run: ``Unreported`` for each owner whose
    host could not report), the owner error that stopped the run early, if any, and the
    owners' running spend. ``theta0`` ``(chains, d)`` overrides the data-independent starts
    (hybrid: the OPS draws); ``sampled``: the hierarchical model the kernel samples (``model``
    is then the owners' local model). The oracle is closed
    (session closed) when the run stopped before its first iteration, and disconnected
    (session left open for a resume) when it failed later; else it stays open for
    ``settling``. A checkpoint that cannot be written stops the run (``_checkpointer``)."""
    sampler, run, oracle = scenario["sampler"], scenario["run"], owners.oracle
    stopped: OwnerError | Interrupted | None = None
    save = _checkpointer(out, info, int(sampler["warmup"]) + int(sampler["iterations"]), oracle)
    try:
        _open_recorded(scenario, algorithm, model, owners, out, info)
        rng, start = chain_start(scenario, model)
        recorder = _SpendRecorder.start(oracle, algorithm, sampler, out, resume)
        target = model if sampled is None else sampled
        kernel = algorithm.kernel(target, ChainData(oracle=oracle, n_total=n_total), sampler)
        try:
            chains = sample(
                recorder.observing(kernel),
                rng,
                start if theta0 is None else theta0,
                iterations=sampler["iterations"],
                warmup=sampler["warmup"],
                progress=run["progress"],
                description=algorithm.name,
                resume=resume,
                checkpoint=save,
                checkpoint_every=run["checkpoint_every"],
            )
            done = int(sampler["warmup"]) + int(sampler["iterations"])
        except SamplingStopped as stop:
            if stop.progress.done == 0:  # nothing sampled: nothing to keep or to resume
                close_quietly(oracle)
                raise _unstarted(stop.cause) from stop.cause
            save(stop.progress)
            chains, stopped, done = stop.progress.result(), stop.cause, stop.progress.done
        reports: list[PrivacyReport | Unreported] = list(
            oracle.privacy_reports() if stopped is None else oracle.reachable_reports()
        )
    except BaseException:
        oracle.disconnect()
        raise
    return chains, reports, stopped, recorder.finished(done, reports)


def _open_recorded(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    owners: Owners,
    out: Path,
    info: dict[str, Any],
) -> None:
    """Open (or resume) the run's session and record its id in ``out``'s run.json; when that
    cannot be written, a session this run opened is closed again (nothing was asked of it yet,
    and a gradient plan would otherwise stay reserved) and ``OutputFailed`` raised."""
    recorded = (out / RUN_INFO).exists()
    info["session"] = _open_session(scenario, algorithm, model, owners, info.get("session"))
    try:
        write_info(out, info)
    except OutputFailed:
        if not recorded:
            close_quietly(owners.oracle)
        raise


def _open_session(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    owners: Owners,
    session: str | None,
) -> str:
    """Open (or resume) the run's session at every owner; a plan an owner refuses for its
    budget becomes a ``PlanRefused`` that says what would make it fit."""
    sampler = scenario["sampler"]
    terms = algorithm.kind_terms(sampler)  # one per kind the run asks (docs/design.md §4)
    secure = requested(scenario["privacy"])
    try:
        return owners.oracle.open_kinds(terms, session, secure)
    except BudgetExhausted as exc:
        if exc.owner not in owners.names:
            raise
        policy = owners.policies[owners.names.index(exc.owner)]
        spent = max(policy.budget_epsilon - exc.epsilon_left, 0.0)
        if len(terms) > 1:
            s = None if secure is None else secure.total_noise_sd
            needs = plan_needs_kinds(terms, model, policy, owners.deployed, spent, s)
            raise kinds_refusal(exc, needs, terms, policy, owners.deployed, s is not None) from exc
        options = algorithm.session_options(sampler)
        [only] = terms
        planned = only.planned_answers
        needs = plan_needs(only.kind, model, policy, planned, options, owners.deployed, spent)
        causes = plan_causes(scenario, only.kind, policy, owners.deployed)
        each = 1  # answers per chain and iteration, where the algorithm declares its kinds
        if algorithm.kinds is not None:
            each = max(algorithm.asks(sampler)[only.kind] // planned_steps(sampler), 1)
        raise budget_refusal(
            exc, needs, policy, only.kind, sampler["chains"], owners.deployed, causes, each
        ) from exc


def _unstarted(cause: OwnerError | Interrupted) -> Exception:
    """The error of a run stopped before its first iteration: for a request outside an
    owner's policy, what to change (a resume would repeat it); else the owner's error."""
    return ConfigError(policy_refusal(cause)) if isinstance(cause, InvalidRequest) else cause


def _checkpointer(
    out: Path, info: dict[str, Any], total: int, oracle: Oracle
) -> Callable[[Progress], None]:
    """``checkpoint.save`` into ``out``, once the owners' charges so far are durable
    (``Oracle.persist``); a write that fails stops the run with ``OutputFailed``
    (kept): the owners' ledgers hold what they answered, and ``--resume`` re-asks it from the
    last checkpoint that was written (or the start), replayed uncharged."""

    def save(progress: Progress) -> None:
        oracle.persist()
        try:
            checkpoint.save(out / CHECKPOINT, progress)
        except OSError as exc:
            raise OutputFailed(
                f"could not write the checkpoint {out / CHECKPOINT} ({reason(exc)}) after "
                f"{progress.done} of {total} iterations; the run stopped and {out} is kept "
                f"(the owners' ledgers hold what they answered): free space or make the "
                f"directory writable, then {_resume_command(out, info)} continues it from its "
                "last checkpoint, charging nothing twice",
                kept=True,
            ) from exc

    return save


def _resume_command(out: Path, info: dict[str, Any]) -> str:
    command = "simulate" if info.get("mode") == "simulate" else "run"
    return f"`fedpenalty {command} --resume {out}`"


@contextmanager
def settling(
    oracle: Oracle, out: Path, info: dict[str, Any], stopped: OwnerError | Interrupted | None
) -> Iterator[None]:
    """Around writing a run's files: once they are written, a completed run is marked complete
    in run.json, then closes its session and drops its checkpoint; a stopped one leaves its
    session open for a resume. A file that cannot be written (``OutputFailed``) leaves the
    session open and the checkpoint (if any) in place, so ``--resume`` writes them again,
    charging nothing: the owners replay what they answered."""
    try:
        yield
        if stopped is None:
            write_info(out, {**info, "complete": True})
    except OutputFailed as exc:
        oracle.disconnect()  # the session stays open: a resume re-asks what it must, uncharged
        then = f", then {_resume_command(out, info)} writes them again, charging nothing twice"
        raise OutputFailed(f"{exc}{then}", kept=True) from exc.__cause__
    except BaseException:
        oracle.disconnect()
        raise
    if stopped is not None:
        oracle.disconnect()
        return
    oracle.close()
    (out / CHECKPOINT).unlink(missing_ok=True)


def close_quietly(oracle: Oracle) -> None:
    """Close the session (releasing what a gradient plan reserved); an owner that cannot be
    reached keeps it open until it is closed or expires."""
    with suppress(OwnerError):
        oracle.close()


class _SpendRecorder:
    """Asks the owners for their reports while the chains run (``observing``), so ``trace``
    holds each owner's running spend as its ledger reports it: at most POINTS points, and only
    while the reports have taken at most SHARE of the time the steps took (an owner accounts
    gradient answers with PLD, about a second a report), then after the last iteration
    (``finished``)."""

    POINTS = 100
    SHARE = 0.05

    def __init__(self, oracle: Oracle, trace: SpendTrace, every: int, gradient: bool):
        self.oracle, self.trace, self.every, self.gradient = oracle, trace, every, gradient
        self.stepping = self.reporting = 0.0

    @classmethod
    def start(
        cls,
        oracle: Oracle,
        algorithm: ChainAlgorithm,
        sampler: dict[str, Any],
        out: Path,
        resume: Progress | None,
    ) -> _SpendRecorder:
        """The recorder of a run about to start (or resume: with the points recorded before
        it, from the run's posterior.nc) holding its first point."""
        reports = oracle.privacy_reports()
        done = 0 if resume is None else resume.done
        earlier = read_spend(out / POSTERIOR_FILE) if resume is not None else None
        trace = SpendTrace.empty(reports) if earlier is None else earlier.before(done)
        total = int(sampler["warmup"]) + int(sampler["iterations"])
        gradient = any(
            not isinstance(query_kind(kind), GaussianKind) for kind in algorithm.asks(sampler)
        )
        recorder = cls(oracle, trace, max(1, total // cls.POINTS), gradient)
        recorder.trace = trace.added(done, reports, recorder.gradient)
        return recorder

    def observing(self, kernel: SamplingAlgorithm) -> SamplingAlgorithm:
        """``kernel`` that records a point after every ``every``-th iteration (warmup ones
        too), time allowing."""
        done = int(self.trace.iterations[-1])

        def step(rng: np.random.Generator, state: Any, advance: Any = kernel.step) -> Any:
            nonlocal done
            began = time.perf_counter()
            new, record = advance(rng, state)
            self.stepping += time.perf_counter() - began
            done += 1
            if done % self.every == 0 and self.reporting <= self.SHARE * self.stepping:
                began = time.perf_counter()
                # a failed report only loses this point: the next query meets the same failure
                # and stops the run, which reports what it can
                with suppress(OwnerError):
                    self.trace = self.trace.added(
                        done, self.oracle.privacy_reports(), self.gradient
                    )
                self.reporting += time.perf_counter() - began
            return new, record

        warm = kernel.warmup
        warmup = None if warm is None else lambda rng, state: step(rng, state, warm)
        return kernel._replace(step=step, warmup=warmup)

    def finished(self, done: int, reports: list[PrivacyReport | Unreported]) -> SpendTrace:
        """The trace with the run's final ``reports`` after ``done`` iterations (when every
        owner reported)."""
        full = [r for r in reports if isinstance(r, PrivacyReport)]
        if len(full) < len(reports) or (
            len(self.trace.iterations) and self.trace.iterations[-1] >= done
        ):
            return self.trace
        return self.trace.added(done, full, self.gradient)
