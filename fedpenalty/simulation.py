"""A whole run from a scenario: owners, session, chains, reports and the run directory.

This is the I/O edge around the pure core. ``run_scenario`` (``fedpenalty simulate``) builds
the owners from the scenario — in this process, or as local owner-host processes reached over
loopback gRPC — and ``run_deployed`` (``fedpenalty run``) reaches owners that run elsewhere;
both connect through an oracle, run the sampler with checkpoints and write

* ``samples.npz`` — ``theta`` ``(chains, draws, d)``, ``accepted`` ``(chains, draws)`` (MH only);
* ``privacy.json`` — per owner, from its own ledger: answers, μ, ε at δ (exact and the paper's
  bound; PLD for gradient answers), budget, and ``ledger_epsilon`` (its spend across all
  sessions). The one-shot baselines (``ops``, ``noisy_stats``, and the OPS half of ``hybrid``)
  are computed here, in the simulation, by the tested formulas of ``coordinator.baselines``,
  and ``privacy.json`` says so;
* ``diagnostics.json`` — acceptance (MH), bulk ESS, split R-hat, moments, error vs reference,
  and for SG-MCMC ``excess_noise_ratio`` (0 when the owners' noise fits under the design noise);
* ``posterior.nc`` — the draws as ArviZ data (posterior, sample_stats, the owners' running
  privacy spend, and privacy.json's and diagnostics.json's content; ``inference_data``), which
  ``RunResult.tree`` holds and ``fedpenalty.sample`` returns;
* ``config.toml`` — the fully resolved scenario; ``trace.png``, ``rank.png`` and
  ``privacy.png`` — the figures of ``plots``;
* ``run.json`` — how to reach the owners again and the session id; ``checkpoint.npz`` — while
  a run is unfinished: its chain state (``resume_run`` continues it).

An owner that refuses (budget) or cannot be reached stops the run: what was sampled is kept and
written, with a checkpoint, and ``RunResult.stopped`` holds the owner's error; privacy.json then
holds the reports of every owner that still answers and, under ``unreported``, the owners that
could not report (never an ε the coordinator made up). A run that fails
before its first iteration (a plan refused at session open, say) leaves no run directory, so
that the same ``--out`` can be used again.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from . import plots
from .common import Policy, PrivacyReport
from .config import Scenario, load_scenario
from .coordinator import checkpoint
from .coordinator.algorithms import ALGORITHMS, Algorithm
from .coordinator.base import ChainAlgorithm, ChainData, ReleaseAlgorithm, SamplingAlgorithm
from .coordinator.driver import ChainResult, Progress, SamplingStopped, sample
from .coordinator.grpc_oracle import GrpcOracle
from .coordinator.oracle import Oracle, Unreported
from .coordinator.reference import reference_posterior
from .coordinator.secure_sum import (
    SIMULATED_SECURE_NOISE,
    aggregation_fields,
    owner_fields,
    requested,
)
from .coordinator.transport_base import OwnerSetup
from .coordinator.transports import TRANSPORTS
from .data import FileRecords, OwnerRecords, synthetic_sources
from .diagnostics import summarize
from .errors import (
    BudgetExhausted,
    ConfigError,
    Interrupted,
    InvalidRequest,
    OutputFailed,
    OwnerError,
)
from .inference_data import POSTERIOR_FILE, SpendTrace, posterior_tree, read_spend, write_posterior
from .kinds import GaussianKind, query_kind
from .models import ExpFamModel, Model, Reference, build_model
from .owner.owner_config import TlsFiles
from .refusals import budget_refusal, plan_causes, plan_needs, policy_refusal

CHECKPOINT, RUN_INFO = "checkpoint.npz", "run.json"


#: privacy.json's ``accounting`` line of a run without owners (the owners' is their query
#: kind's ``report_basis``).
CURATOR_ACCOUNTING = "non-private baseline: a trusted curator pools every record; no owner privacy"
#: privacy.json's ``noise`` line of a simulation (docs/design.md §2.7, invariant 7).
SIMULATED_NOISE = (
    "simulated owners: float Gaussian noise seeded from run.seed and addressed by (session, "
    "chain, iteration), so that a run repeats and a resumed run draws what an uninterrupted one "
    "does; whoever knows the seed knows the noise (deployed owners draw exact lattice noise "
    "from a secret key instead)"
)
#: The session id of every simulation: simulated owners address their seeded noise by session
#: (docs/design.md §2.7), so one fixed id gives the same draws for the same seed on every
#: transport and run; each simulation has fresh owners and ledgers, so ids never collide.
SIMULATION_SESSION = "simulation"
NEIGHBOUR_MEANING = {
    "replace_one": "one record of this owner replaced by another",
    "add_remove": "one record added to or removed from this owner's records",
}


@dataclass(frozen=True)
class RunResult:
    """A finished or stopped run. ``theta`` ``(chains, draws, d)`` is what was sampled;
    ``privacy`` is privacy.json's content (``unreported``: owners that could not report);
    ``stopped`` is the owner error that ended the run early (None when it completed);
    ``tree`` is the run as ArviZ data (posterior.nc's content, ``inference_data``)."""

    out: Path
    privacy: dict[str, Any]
    diagnostics: dict[str, Any]
    theta: np.ndarray
    stopped: OwnerError | Interrupted | None = None
    tree: xr.DataTree | None = None


def owner_records(scenario: Scenario, model: Model, seed: np.random.SeedSequence) -> OwnerRecords:
    """The owners' records, made on demand: read from ``data.paths``, or simulated, owner k
    from the k-th stream of ``seed`` (so every transport's hosts make the same records)."""
    data = scenario["data"]
    if data["source"] == "files":
        return OwnerRecords(model, [FileRecords(str(Path(p).resolve())) for p in data["paths"]])
    n = data["n_per_owner"]
    n_per_owner = n if isinstance(n, list) else [n] * data["owners"]
    true_theta = np.broadcast_to(np.asarray(data["true_theta"], dtype=float), (model.dim,))
    return OwnerRecords(model, synthetic_sources(seed, true_theta, n_per_owner))


def pooled_reference(
    model: Model, records: OwnerRecords, progress: bool = False
) -> tuple[Reference, int]:
    """The reference posterior given every owner's records, and their total count. Closed-form
    exponential-family references sum the owners' statistics one owner at a time, so the
    records are never all held at once; otherwise the records are pooled."""
    if isinstance(model, ExpFamModel):
        n, total = records.stat_total()
        closed = model.reference_from_stats(n, total)
        if closed is not None:
            return closed, n
    pooled = records.pooled()
    return reference_posterior(model, pooled, progress=progress), len(pooled)


def owner_policies(scenario: Scenario, owners: int, sigma: float | None = None) -> list[Policy]:
    """The simulated owners' policies from ``[privacy]`` (``sigma`` overrides privacy.sigma).
    They accept exactly the scenario's sampling rate and clip for gradient answers, and every
    chain in one request (they answer only this run's coordinator: no flood to bound)."""
    p, sampler = scenario["privacy"], scenario["sampler"]
    given = p["sigma"] if sigma is None else sigma
    sigmas = given if isinstance(given, list) else [given] * owners
    max_step = p["max_step"] if p["max_step"] is not None else sampler["step"]
    secure = requested(p)
    return [
        Policy(
            sigma=s,
            max_step=max_step,
            budget_epsilon=p["budget_epsilon"],
            delta=p["delta"],
            neighbour=p["neighbour"],
            max_sampling_rate=sampler["sampling_rate"],
            max_clip=sampler["clip"],
            max_answers_per_request=max(Policy.max_answers_per_request, int(sampler["chains"])),
            total_noise_sd=None if secure is None else secure.total_noise_sd,
            colluders=0 if secure is None else secure.colluders,
        )
        for s in sigmas
    ]


def default_out_dir(scenario: Scenario) -> Path:
    return Path("runs") / f"{scenario['sampler']['algorithm']}-{time.strftime('%Y%m%d-%H%M%S')}"


def _seeds(scenario: Scenario) -> list[np.random.SeedSequence]:
    """Independent streams of the run's seed: data, owners' noise, chains, baseline releases."""
    return np.random.SeedSequence(scenario["run"]["seed"]).spawn(4)


def chain_start(scenario: Scenario, model: Model) -> tuple[np.random.Generator, np.ndarray]:
    """The coordinator's chain RNG and initial points ``(chains, d)`` (data independent)."""
    sampler = scenario["sampler"]
    rng = np.random.default_rng(_seeds(scenario)[2])
    scale = sampler["init_scale"] * model.theta_bound
    return rng, rng.uniform(-scale, scale, size=(sampler["chains"], model.dim))


def _new_run_dir(scenario: Scenario, out: str | Path | None) -> tuple[Path, bool]:
    """The run directory (new, or existing and empty) with the resolved scenario in it, and
    whether it existed before; ``OutputFailed`` (nothing left behind) when it cannot be
    created or written — checked before any owner is asked."""
    out = Path(out or scenario["run"]["out"] or default_out_dir(scenario))
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"--out {out} is a file, not a directory: name a new or empty directory (or run.out)"
        )
    existed = out.is_dir()
    try:
        if existed and any(out.iterdir()):
            raise FileExistsError(
                f"run directory {out} exists and is not empty; choose another --out"
            )
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(scenario.to_toml())
    except FileExistsError:
        raise
    except OSError as exc:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise OutputFailed(
            f"cannot write the run directory {out} ({_reason(exc)}): name a directory you can "
            "write with --out (or run.out)"
        ) from exc
    return out, existed


def _reason(exc: OSError) -> str:
    """What an ``OSError`` says, without its errno and path (the caller names the path)."""
    return exc.strerror or str(exc)


#: Files that hold draws: a run directory with one of these is kept, whatever happened.
_DRAW_FILES = ("samples.npz", CHECKPOINT)


@contextmanager
def _drawless_run_removed(out: Path, existed: bool) -> Iterator[None]:
    """Remove the run directory ``out`` (from ``_new_run_dir``; emptied instead when it
    ``existed``) when what runs inside fails before it holds any draw (a plan refused at
    session open, a launch failure, Ctrl-C during start-up), so that a rerun may use the same
    ``--out``; a run with draws keeps them with its checkpoint, and one that stopped because a
    file could not be written after the owners answered is kept for ``--resume``."""
    try:
        yield
    except BaseException as exc:
        kept = isinstance(exc, OutputFailed) and exc.kept
        if not kept and not any((out / name).exists() for name in _DRAW_FILES):
            shutil.rmtree(out, ignore_errors=True)
            if existed:
                out.mkdir(parents=True, exist_ok=True)
        raise


def simulate(
    scenario: str | Path | Mapping[str, Any] | None = None,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    out: str | Path | None = None,
    progress: bool | None = None,
) -> RunResult:
    """``fedpenalty simulate`` and ``fedpenalty.sample``: the scenario (a file's path, a mapping
    of its sections, or None for the embedded default) with ``overrides`` (``--set`` strings
    or ``{"section.key": value}``; ``config.load_scenario``), ``progress`` replacing
    run.progress when given, run into ``out`` (default run.out, else runs/<algorithm>-<time>)."""
    resolved = load_scenario(scenario, overrides)
    if progress is not None:
        resolved["run"]["progress"] = bool(progress)
    return run_scenario(resolved, out)


def run_scenario(scenario: Scenario, out: str | Path | None = None) -> RunResult:
    """Simulate: build the scenario's owners (``run.transport``: in this process, or as local
    gRPC owner hosts), run the algorithm and write the run directory."""
    model = build_model(scenario["model"])
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    if isinstance(algorithm, ChainAlgorithm) and algorithm.query is not None:
        TRANSPORTS[scenario["run"]["transport"]].check_installed()  # before any run directory
    out, existed = _new_run_dir(scenario, out)
    with _drawless_run_removed(out, existed):
        world = _simulated_world(scenario, model)
        records, reference = world.records, world.reference
        if isinstance(algorithm, ReleaseAlgorithm):
            return _run_release(
                scenario, algorithm, model, list(records), world.release_rng, out, reference
            )
        if algorithm.query is None:
            return _run_pooled(scenario, algorithm, model, records.pooled(), out, reference)
        return _run_owners(scenario, algorithm, model, world, out)


@dataclass(frozen=True)
class _World:
    """What a simulation derives from ``run.seed``: the owners' ``records`` (made on demand),
    their total count, their noise ``seeds``, the generator of releases and data-dependent
    starts, and the ``reference`` posterior."""

    records: OwnerRecords
    n_total: int
    seeds: list[np.random.SeedSequence]
    release_rng: np.random.Generator
    reference: Reference


def _simulated_world(scenario: Scenario, model: Model) -> _World:
    data_seed, owner_seed, _, release_seed = _seeds(scenario)
    records = owner_records(scenario, model, data_seed)
    reference, n_total = pooled_reference(model, records, progress=scenario["run"]["progress"])
    seeds = owner_seed.spawn(len(records))
    return _World(records, n_total, seeds, np.random.default_rng(release_seed), reference)


def resume_simulation(out: str | Path, progress: bool | None = None) -> RunResult:
    """Continue a stopped or interrupted ``fedpenalty simulate`` in ``out`` from its checkpoint
    (``progress``: show the progress bar; None keeps the run's ``run.progress``).

    The owners are built again from the run's seeds on their ledgers: they replay what they
    answered, and their seeded noise is addressed by (session, chain, iteration) (docs/design.md
    §2.7), so the draws are exactly those of an uninterrupted run with the same seed.
    """
    out = Path(out)
    info = _run_info(out)
    if info.get("mode") != "simulate":
        raise ConfigError(
            f"{out} is a run of `fedpenalty run`; continue it with `fedpenalty run --resume {out}`"
        )
    if info.get("complete"):
        raise ConfigError(f"{out} holds a finished simulation; nothing to resume")
    scenario = _resumed_scenario(out, progress)
    model = build_model(scenario["model"])
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    assert isinstance(algorithm, ChainAlgorithm)  # only owner-asking chains write a run.json
    TRANSPORTS[scenario["run"]["transport"]].check_installed()
    done = checkpoint.load(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    return _run_owners(scenario, algorithm, model, _simulated_world(scenario, model), out, done)


def _resumed_scenario(out: Path, progress: bool | None) -> Scenario:
    """The run's resolved scenario (its ``config.toml``), with ``run.progress`` set to
    ``progress`` unless that is None (``--no-progress`` on a resume)."""
    scenario = load_scenario(out / "config.toml")
    if progress is not None:
        scenario["run"]["progress"] = progress
    return scenario


def _run_info(out: Path) -> dict[str, Any]:
    """The ``run.json`` of the run directory ``out``, or a ``ConfigError`` saying why not."""
    if not out.is_dir():
        raise ConfigError(
            f"{out} is not a run directory: --resume takes the directory of a stopped run (the "
            "`--resume DIR` its stop message printed)"
        )
    try:
        return json.loads((out / RUN_INFO).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{out} is not a resumable run directory (no readable {RUN_INFO}: {exc})"
        ) from exc


def _run_owners(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    world: _World,
    out: Path,
    resume: Progress | None = None,
) -> RunResult:
    """Simulated owners (``run.transport``) answering ``algorithm``'s chains (``resume``: from
    that checkpoint, on the owners' existing ledgers)."""
    records, seeds, release_rng = world.records, world.seeds, world.release_rng
    start = None
    if algorithm.start is not None:
        start = algorithm.start(release_rng, model, records.pooled(), scenario.sections)
    policies = owner_policies(scenario, len(records), None if start is None else start.sigma)
    names = [f"owner-{k}" for k in range(len(records))]
    setup = OwnerSetup(out, model, names, records, policies, seeds, scenario["run"])
    try:
        launched = TRANSPORTS[scenario["run"]["transport"]].launch(setup)
    except OSError as exc:  # their records and ledgers go to the run directory
        raise OutputFailed(
            f"could not start the simulated owners ({_reason(exc)}; their files go to {out}): "
            f"free space or make {out} writable"
        ) from exc
    try:
        owners = _Owners(launched.oracle, names, policies, deployed=False)
        info = {
            "mode": "simulate",
            "transport": scenario["run"]["transport"],
            "session": SIMULATION_SESSION,
        }
        theta0 = None if start is None else start.theta
        chains, reports, stopped, spend = _sample_owners(
            scenario, algorithm, model, owners, out, world.n_total, info, resume, theta0
        )
        with _settling(launched.oracle, out, info, stopped):
            extra = _chain_diagnostics(chains, algorithm)
            simulated = launched.oracle.simulation_diagnostics()
            # log-ratio counters, kept for runs of Gaussian answers
            if simulated is not None and isinstance(query_kind(algorithm.query), GaussianKind):
                extra["simulation_only"] = simulated
            privacy = privacy_summary(reports, policies, algorithm, scenario)
            if privacy["owners"]:
                secure = requested(scenario["privacy"])
                privacy["noise"] = SIMULATED_NOISE if secure is None else SIMULATED_SECURE_NOISE
            if start is not None:
                start.privacy(privacy)
            outputs = _Outputs(model, algorithm.name, world.reference, dict(chains.stats))
            return _finish(
                out, chains.theta, chains.accepted, privacy, outputs, extra, stopped, spend
            )
    finally:
        launched.stop()


@dataclass(frozen=True)
class _Owners:
    """The owners of a run behind ``oracle``: their ``names`` and ``policies`` in the order
    the oracle reports them; ``deployed``: served by ``fedpenalty owner serve`` (their policies
    live in their OWNER.toml files, and they give lattice answers)."""

    oracle: Oracle
    names: list[str]
    policies: list[Policy]
    deployed: bool


@dataclass(frozen=True)
class _Outputs:
    """What the run's files say about its draws beyond ``theta``: the ``model`` (parameter
    names), the ``algorithm``'s name, the ``reference`` posterior, and ``sample_stats``
    (name → ``(chains, draws)``, ``inference_data``)."""

    model: Model
    algorithm: str
    reference: Reference | None
    sample_stats: dict[str, np.ndarray]


def _run_pooled(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    pooled: np.ndarray,
    out: Path,
    reference: Reference,
) -> RunResult:
    """A trusted curator's chains over every owner's records pooled (exact_mh)."""
    sampler = scenario["sampler"]
    rng, theta0 = chain_start(scenario, model)
    chains = sample(
        algorithm.kernel(model, ChainData(records=pooled), sampler),
        rng,
        theta0,
        iterations=sampler["iterations"],
        warmup=sampler["warmup"],
        progress=scenario["run"]["progress"],
        description=algorithm.name,
    )
    privacy = {
        "algorithm": algorithm.name,
        "trusted_curator": True,
        "owners": [],
        "accounting": CURATOR_ACCOUNTING,
    }
    outputs = _Outputs(model, algorithm.name, reference, dict(chains.stats))
    return _finish(
        out, chains.theta, chains.accepted, privacy, outputs, _chain_diagnostics(chains, algorithm)
    )


def _run_release(
    scenario: Scenario,
    algorithm: ReleaseAlgorithm,
    model: Model,
    records: list[np.ndarray],
    rng: np.random.Generator,
    out: Path,
    reference: Reference,
) -> RunResult:
    """A one-shot baseline: its draws and privacy.json, computed by the simulation; every owner
    spends the release's ε at its δ."""
    release = algorithm.release(rng, model, records, scenario.sections)
    neighbour = scenario["privacy"]["neighbour"]
    privacy = {
        "delta": release.delta,
        "neighbour": neighbour,
        "neighbour_meaning": NEIGHBOUR_MEANING[neighbour],
        "algorithm": algorithm.name,
        "accounting": release.accounting,
        "trusted_curator": release.trusted_curator,
        "release": release.release,
        "owners": [
            {
                "owner": f"owner-{k}",
                "n": len(r),
                "epsilon": release.epsilon,
                "delta": release.delta,
                **release.per_owner,
            }
            for k, r in enumerate(records)
        ],
        **release.extra,
    }
    outputs = _Outputs(model, algorithm.name, reference, {})
    return _finish(out, release.theta, None, privacy, outputs, {})


def _chain_diagnostics(chains: ChainResult, algorithm: ChainAlgorithm) -> dict[str, Any]:
    """The driver's own counters for diagnostics.json (SG-MCMC: the owners' noise excess; MH:
    the step the draws used and how warmup adapted it, ``StepAdaptation.summary``)."""
    if not chains.theta.shape[1]:
        return {}
    out: dict[str, Any] = {
        "queried_fraction": float(chains.queried.mean()),
        "mean_noise_variance": chains.noise_var,
    }
    if algorithm.adapts:
        out["step_adaptation"] = chains.state.tuning.summary()
    if chains.accepted is None:
        out.update(
            excess_noise_ratio=chains.excess_noise_ratio,
            excess_noise_fraction=chains.excess_fraction,
        )
    return out


def run_deployed(
    scenario: Scenario,
    owners: list[str],
    tls: TlsFiles | None = None,
    out: str | Path | None = None,
) -> RunResult:
    """``fedpenalty run``: the coordinator against owner hosts at ``owners`` (HOST:PORT); the
    owners' own policies govern σ and budgets, and their data never leave them."""
    model = build_model(scenario["model"])
    _deployable(ALGORITHMS[scenario["sampler"]["algorithm"]])
    out, existed = _new_run_dir(scenario, out)  # writable before any owner is asked
    info = {
        "mode": "deployed",
        "owners": list(owners),
        "tls": None
        if tls is None
        else {
            "cert": str(tls.cert.resolve()),
            "key": str(tls.key.resolve()),
            "ca": str(tls.ca.resolve()) if tls.ca else None,
        },
    }
    with _drawless_run_removed(out, existed):
        oracle = GrpcOracle(owners, model, tls, retry_seconds=scenario["run"]["retry_seconds"])
        return _deployed(scenario, model, oracle, out, info, None)


def _deployable(algorithm: Algorithm) -> ChainAlgorithm:
    """``algorithm`` if it can run against deployed owners, else a ``ConfigError`` saying why."""
    if isinstance(algorithm, ChainAlgorithm) and algorithm.deployable:
        return algorithm
    if isinstance(algorithm, ReleaseAlgorithm):
        raise ConfigError(
            f"{algorithm.name} runs in simulation only (fedpenalty simulate): deployed owners have "
            f"no "
            "one-shot release"
        )
    raise ConfigError(
        f"{algorithm.name} needs the pooled records of a trusted curator; deployed owners never "
        f"send "
        "them"
    )


def resume_run(
    out: str | Path,
    owners: list[str] | None = None,
    tls: TlsFiles | None = None,
    progress: bool | None = None,
) -> RunResult:
    """Continue a stopped or crashed ``fedpenalty run`` in ``out`` from its checkpoint (from the
    start when it has none; ``progress`` as in ``resume_simulation``). The owners replay what
    they already answered, so the resumed chain is the chain of an uninterrupted run, and
    nothing is charged twice."""
    out = Path(out)
    info = _run_info(out)
    if info.get("mode") != "deployed":
        raise ConfigError(
            f"{out} is a simulation; continue it with `fedpenalty simulate --resume {out}`"
        )
    if info.get("session") is None or info.get("complete"):
        raise ConfigError(
            f"{out} holds a finished run (or one that never opened a session); nothing to resume"
        )
    scenario = _resumed_scenario(out, progress)
    model = build_model(scenario["model"])
    done = checkpoint.load(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    if tls is None and info["tls"] is not None:
        saved = info["tls"]
        tls = TlsFiles(
            Path(saved["cert"]), Path(saved["key"]), Path(saved["ca"]) if saved["ca"] else None
        )
    info["owners"] = owners or info["owners"]
    oracle = GrpcOracle(info["owners"], model, tls, retry_seconds=scenario["run"]["retry_seconds"])
    return _deployed(scenario, model, oracle, out, info, done)


def _deployed(
    scenario: Scenario,
    model: Model,
    oracle: GrpcOracle,
    out: Path,
    info: dict[str, Any],
    resume: Progress | None,
) -> RunResult:
    described = oracle.describe()
    algorithm = _deployable(ALGORITHMS[scenario["sampler"]["algorithm"]])
    counts = [d.n for d in described]
    n_total = None if None in counts else sum(n for n in counts if n is not None)
    policies = [d.policy for d in described]
    owners = _Owners(oracle, [d.name for d in described], policies, deployed=True)
    chains, reports, stopped, spend = _sample_owners(
        scenario, algorithm, model, owners, out, n_total, info, resume
    )
    with _settling(oracle, out, info, stopped):
        privacy = privacy_summary(reports, policies, algorithm, scenario)
        outputs = _Outputs(model, algorithm.name, None, dict(chains.stats))
        return _finish(
            out,
            chains.theta,
            chains.accepted,
            privacy,
            outputs,
            _chain_diagnostics(chains, algorithm),
            stopped,
            spend,
        )


def _sample_owners(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    owners: _Owners,
    out: Path,
    n_total: int | None,
    info: dict[str, Any],
    resume: Progress | None = None,
    theta0: np.ndarray | None = None,
) -> tuple[
    ChainResult, list[PrivacyReport | Unreported], OwnerError | Interrupted | None, SpendTrace
]:
    """Open (or resume) the session, sample with checkpoints, collect the owners' reports.
    Returns the kept draws, the reports (of a stopped run: ``Unreported`` for each owner whose
    host could not report), the owner error that stopped the run early, if any, and the
    owners' running spend. ``theta0`` ``(chains,
    d)`` overrides the data-independent starts (hybrid: the OPS draws). The oracle is closed
    (session closed) when the run stopped before its first iteration, and disconnected
    (session left open for a resume) when it failed later; else it stays open for
    ``_settling``. A checkpoint that cannot be written stops the run (``_checkpointer``)."""
    sampler, run, oracle = scenario["sampler"], scenario["run"], owners.oracle
    stopped: OwnerError | Interrupted | None = None
    save = _checkpointer(out, info, int(sampler["warmup"]) + int(sampler["iterations"]))
    try:
        _open_recorded(scenario, algorithm, model, owners, out, info)
        rng, start = chain_start(scenario, model)
        recorder = _SpendRecorder.start(oracle, algorithm, sampler, out, resume)
        kernel = algorithm.kernel(model, ChainData(oracle=oracle, n_total=n_total), sampler)
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
                _close_quietly(oracle)
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
    owners: _Owners,
    out: Path,
    info: dict[str, Any],
) -> None:
    """Open (or resume) the run's session and record its id in ``out``'s run.json; when that
    cannot be written, a session this run opened is closed again (nothing was asked of it yet,
    and a gradient plan would otherwise stay reserved) and ``OutputFailed`` raised."""
    recorded = (out / RUN_INFO).exists()
    info["session"] = _open_session(scenario, algorithm, model, owners, info.get("session"))
    try:
        _write_info(out, info)
    except OutputFailed:
        if not recorded:
            _close_quietly(owners.oracle)
        raise


def _open_session(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    owners: _Owners,
    session: str | None,
) -> str:
    """Open (or resume) the run's session at every owner; a plan an owner refuses for its
    budget becomes a ``PlanRefused`` that says what would make it fit."""
    assert algorithm.query is not None  # only algorithms that ask owners come here
    sampler = scenario["sampler"]
    options = algorithm.session_options(sampler)
    planned = algorithm.planned_answers(sampler)
    try:
        return owners.oracle.open_session(
            algorithm.query, planned, session, secure=requested(scenario["privacy"]), **options
        )
    except BudgetExhausted as exc:
        if exc.owner not in owners.names:
            raise
        policy = owners.policies[owners.names.index(exc.owner)]
        spent = max(policy.budget_epsilon - exc.epsilon_left, 0.0)
        needs = plan_needs(algorithm.query, model, policy, planned, options, owners.deployed, spent)
        causes = plan_causes(scenario, algorithm.query, policy, owners.deployed)
        raise budget_refusal(
            exc, needs, policy, algorithm.query, sampler["chains"], owners.deployed, causes
        ) from exc


def _unstarted(cause: OwnerError | Interrupted) -> Exception:
    """The error of a run stopped before its first iteration: for a request outside an
    owner's policy, what to change (a resume would repeat it); else the owner's error."""
    return ConfigError(policy_refusal(cause)) if isinstance(cause, InvalidRequest) else cause


def _checkpointer(out: Path, info: dict[str, Any], total: int) -> Callable[[Progress], None]:
    """``checkpoint.save`` into ``out``; a write that fails stops the run with ``OutputFailed``
    (kept): the owners' ledgers hold what they answered, and ``--resume`` re-asks it from the
    last checkpoint that was written (or the start), replayed uncharged."""

    def save(progress: Progress) -> None:
        try:
            checkpoint.save(out / CHECKPOINT, progress)
        except OSError as exc:
            raise OutputFailed(
                f"could not write the checkpoint {out / CHECKPOINT} ({_reason(exc)}) after "
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
def _settling(
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
            _write_info(out, {**info, "complete": True})
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


def _close_quietly(oracle: Oracle) -> None:
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
        gradient = not isinstance(query_kind(algorithm.query), GaussianKind)
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


def _write_info(out: Path, info: dict[str, Any]) -> None:
    """Replace ``out``'s run.json with ``info`` (``OutputFailed`` when it cannot be written)."""
    tmp = out / (RUN_INFO + ".tmp")
    try:
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(out / RUN_INFO)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputFailed(
            f"could not write {out / RUN_INFO} ({_reason(exc)}): free space or make {out} writable"
        ) from exc


def _finish(
    out: Path,
    theta: np.ndarray,
    accepted: np.ndarray | None,
    privacy: dict[str, Any],
    outputs: _Outputs,
    extra: dict[str, Any],
    stopped: OwnerError | Interrupted | None = None,
    spend: SpendTrace | None = None,
) -> RunResult:
    """Write samples, privacy, diagnostics, posterior.nc and the figures of what was sampled:
    ``theta`` ``(chains, draws, d)``, ``accepted`` ``(chains, draws)`` (None without an accept
    step), the owners' running ``spend`` (None without owners' ledgers). A file that cannot be
    written raises ``OutputFailed`` naming it (or ``out``: a full disk fails a write, which
    names no file)."""
    try:
        return _write_outputs(out, theta, accepted, privacy, outputs, extra, stopped, spend)
    except OSError as exc:
        where = exc.filename or f"the run's files in {out}"
        raise OutputFailed(
            f"could not write {where} ({_reason(exc)}): free space or make {out} writable"
        ) from exc


def _write_outputs(
    out: Path,
    theta: np.ndarray,
    accepted: np.ndarray | None,
    privacy: dict[str, Any],
    outputs: _Outputs,
    extra: dict[str, Any],
    stopped: OwnerError | Interrupted | None,
    spend: SpendTrace | None,
) -> RunResult:
    """``_finish`` without its error message."""
    kept = theta.shape[1]
    names = outputs.model.param_names
    diagnostics: dict[str, Any] = {"kept_draws": kept, "param_names": names}
    if kept > 1:
        diagnostics.update(summarize(theta, accepted, outputs.reference, names))
    diagnostics.update(extra)
    if stopped is not None:
        diagnostics["stopped"] = str(stopped)
    arrays = {"theta": theta} if accepted is None else {"theta": theta, "accepted": accepted}
    np.savez_compressed(out / "samples.npz", **arrays)  # type: ignore[arg-type]  # numpy's stub
    if privacy:
        (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    attrs = {"algorithm": outputs.algorithm, "model": outputs.model.name, "run": str(out)}
    adaptation = extra.get("step_adaptation", {})
    attrs.update({f"step_adaptation_{k}": v for k, v in adaptation.items() if v is not None})
    tree = posterior_tree(
        theta, names, outputs.sample_stats, spend, outputs.reference, attrs, privacy, diagnostics
    )
    try:
        write_posterior(out / POSTERIOR_FILE, tree)
    except ImportError as exc:  # an install without the NetCDF writer: keep the rest of the run
        diagnostics.setdefault("warnings", []).append(
            f"{POSTERIOR_FILE} not written ({exc}); `pip install -e .` installs h5netcdf and h5py"
        )
    (out / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    if kept:
        rhat = diagnostics.get("rhat")
        plots.trace_plot(out / "trace.png", theta, names, outputs.reference, rhat)
        if kept > 1 and theta.shape[0] > 1:
            plots.rank_plot(out / "rank.png", theta, names, rhat)
    if spend is not None and len(spend.iterations) > 1:
        plots.privacy_plot(out / "privacy.png", spend)
    return RunResult(out, privacy, diagnostics, theta, stopped, tree)


def privacy_summary(
    entries: list[PrivacyReport | Unreported],
    policies: list[Policy],
    algorithm: ChainAlgorithm,
    scenario: Scenario,
) -> dict[str, Any]:
    """The ``privacy.json`` content from each owner's entry (in owner order, with its policy):
    under ``owners`` each owner's own report of this run's session (``owner_privacy``); under
    ``unreported`` the owners that gave no report (a stopped run: owner, status, error, answers
    received). With secure aggregation: s, t and the assumption ``epsilon`` rests on."""
    reports = [r for r in entries if isinstance(r, PrivacyReport)]
    neighbour = _common([r.neighbour for r in reports])
    return {
        "delta": _common([r.delta for r in reports]),
        "neighbour": neighbour,
        "neighbour_meaning": NEIGHBOUR_MEANING.get(neighbour, "owners differ"),
        "algorithm": algorithm.name,
        "accounting": query_kind(algorithm.query).report_basis,
        "trusted_curator": False,
        "release": "each owner's own ledger",
        **aggregation_fields(requested(scenario["privacy"]), reports),
        "owners": [
            owner_privacy(r, p, algorithm, scenario)
            for r, p in zip(entries, policies)
            if isinstance(r, PrivacyReport)
        ],
        "unreported": [asdict(r) for r in entries if isinstance(r, Unreported)],
    }


def owner_privacy(
    report: PrivacyReport, policy: Policy, algorithm: ChainAlgorithm, scenario: Scenario
) -> dict[str, Any]:
    """One owner's privacy.json entry: its own report of this run's session, and
    ``ledger_epsilon``, its ε across every session its ledger has seen. Gradient runs show the
    owner's σ as ``noise_multiplier`` with the sampling rate and clip they asked for; ``mu`` is
    null unless the owner's ε is the exact GDP one. With secure aggregation the owner's ε from
    its own noise alone, and no σ (its noise is s/√(K − t), ``owner_fields``)."""
    kind = query_kind(algorithm.query)
    gradient = not isinstance(kind, GaussianKind)
    spend = report.session
    assert spend is not None  # the reports were asked for this run's session
    noise = kind.report_noise(policy.sigma, scenario["sampler"])
    if requested(scenario["privacy"]) is not None:
        noise.pop(kind.report_sigma_key)
    return {
        "owner": report.owner,
        "n": report.n,
        **noise,
        "delta": report.delta,
        "answers": spend.answers,
        "mu": None if gradient else spend.mu,
        "epsilon": spend.epsilon,
        "accountant": spend.accountant,
        "epsilon_paper_bound": _finite_or_none(spend.epsilon_paper_bound),
        "ledger_epsilon": report.total.epsilon,
        "budget_epsilon": report.budget_epsilon,
        "budget_left": report.budget_left,
        **owner_fields(report),
    }


def _common(values: list[Any]) -> Any:
    """The value every owner shares (None when they differ or there are none)."""
    return values[0] if values and all(v == values[0] for v in values) else None


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None
