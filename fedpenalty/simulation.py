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

The run directory and its files are ``run_files``'s; the owners' session (open, sample with
checkpoints and spend recording, settle) is ``run_session``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .common import Policy
from .config import Scenario, load_scenario
from .coordinator import checkpoint
from .coordinator.algorithms import ALGORITHMS, Algorithm
from .coordinator.base import ChainAlgorithm, ChainData, ReleaseAlgorithm
from .coordinator.cost import MeteredOracle
from .coordinator.driver import Progress, sample
from .coordinator.grpc_oracle import GrpcOracle
from .coordinator.network import network_of
from .coordinator.reference import reference_posterior
from .coordinator.secure_sum import SIMULATED_SECURE_NOISE, requested
from .coordinator.transport_base import OwnerSetup
from .coordinator.transports import TRANSPORTS
from .data import ChildSeeds, FileRecords, OwnerRecords, synthetic_sources
from .errors import ConfigError, OutputFailed
from .kinds import KINDS, GaussianKind, QueryKind, query_kind
from .models import (
    BoundHierarchy,
    ExpFamModel,
    HierarchicalModel,
    Model,
    Reference,
    build_hierarchical,
    build_model,
)
from .owner.owner_config import TlsFiles
from .run_cost import with_cost
from .run_files import (
    CHECKPOINT,
    NEIGHBOUR_MEANING,
    Outputs,
    RunResult,
    chain_diagnostics,
    drawless_run_removed,
    finish,
    new_run_dir,
    privacy_summary,
    reason,
    resumed_scenario,
    run_info,
)
from .run_session import Owners, chain_start, run_seeds, sample_owners, settling

#: privacy.json's ``accounting`` line of a run without owners (the owners' is their query
#: kind's ``report_basis``).
CURATOR_ACCOUNTING = "non-private baseline: a trusted curator pools every record; no owner privacy"
#: privacy.json's ``noise`` line of a simulation (docs/design.md §2.7, invariant 7).
SIMULATED_NOISE = (
    "simulated owners: {noise} seeded from run.seed and addressed by (session, "
    "chain, iteration), so that a run repeats and a resumed run draws what an uninterrupted one "
    "does; whoever knows the seed knows the noise (deployed owners draw exact lattice noise "
    "from a secret key instead)"
)
#: The session id of every simulation: simulated owners address their seeded noise by session
#: (docs/design.md §2.7), so one fixed id gives the same draws for the same seed on every
#: transport and run; each simulation has fresh owners and ledgers, so ids never collide.
SIMULATION_SESSION = "simulation"


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
    model: Model, records: OwnerRecords, progress: bool = False, temperature: float = 1.0
) -> tuple[Reference | None, int]:
    """The reference posterior given every owner's records, and their total count. Closed-form
    exponential-family references sum the owners' statistics one owner at a time, so the
    records are never all held at once; otherwise the records are pooled. A tempered target
    p(θ)Πp(x|θ)^τ (``temperature`` τ ≠ 1) is the posterior of the statistics scaled by τ
    (n·τ records with sum τ·ΣS: the exponential family's likelihood to the power τ); a model
    without closed-form statistics has no tempered reference (None)."""
    if isinstance(model, ExpFamModel):
        n, total = records.stat_total()
        closed = model.reference_from_stats(n * temperature, total * temperature)  # type: ignore[arg-type]
        if closed is not None and temperature != 1.0:
            closed = Reference(
                closed.mean, closed.sd, f"{closed.source}, tempered τ = {temperature:g}"
            )
        if closed is not None or temperature != 1.0:
            return closed, n
    elif temperature != 1.0:
        return None, sum(len(r) for r in records)
    pooled = records.pooled()
    return reference_posterior(model, pooled, progress=progress), len(pooled)


def owner_policies(
    scenario: Scenario, owners: int, sigma: float | None = None, model: Model | None = None
) -> list[Policy]:
    """The simulated owners' policies from ``[privacy]`` (``sigma`` overrides privacy.sigma).
    They accept exactly the scenario's sampling rate and clip for gradient answers, and every
    chain in one request (they answer only this run's coordinator: no flood to bound).
    ``model``: the kinds that calibrate their level to the budget get it (``budget_levels``)."""
    p, sampler = scenario["privacy"], scenario["sampler"]
    given = p["sigma"] if sigma is None else sigma
    sigmas = given if isinstance(given, list) else [given] * owners
    max_step = p["max_step"] if p["max_step"] is not None else sampler["step"]
    secure = requested(p)
    algorithm = ALGORITHMS[sampler["algorithm"]]  # its per-record clips are admitted too
    clips = (
        algorithm.clips(sampler)
        if isinstance(algorithm, ChainAlgorithm) and algorithm.clips
        else {}
    )
    levels = noise_levels(p["noise"]) | budget_levels(scenario, model)
    made = {  # one policy object per distinct σ, shared by its owners (docs/design.md §4)
        s: Policy(
            sigma=s,
            max_step=max_step,
            budget_epsilon=p["budget_epsilon"],
            delta=p["delta"],
            neighbour=p["neighbour"],
            max_sampling_rate=sampler["sampling_rate"],
            max_clip=max([sampler["clip"], *clips.values()]),
            max_answers_per_request=max(Policy.max_answers_per_request, int(sampler["chains"])),
            total_noise_sd=None if secure is None else secure.total_noise_sd,
            colluders=0 if secure is None else secure.colluders,
            noise=dict(levels),
        )
        for s in dict.fromkeys(sigmas)
    }
    return [made[s] for s in sigmas]


def budget_levels(scenario: Scenario, model: Model | None) -> dict[str, float]:
    """The noise levels (ledger name → level) of the kinds the run asks that calibrate theirs
    to the budget (``QueryKind.budget_level``) when ``[privacy.noise]`` names none: each answer
    the plan reserves then costs privacy.budget_epsilon / the planned answers."""
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    p, sampler = scenario["privacy"], scenario["sampler"]
    if model is None or not isinstance(algorithm, ChainAlgorithm):
        return {}
    each = p["budget_epsilon"] / algorithm.planned_answers(sampler)
    kinds = [query_kind(name) for name in algorithm.asks(sampler)]
    levels = {k.ledger_name: k.budget_level(model, p["neighbour"], each) for k in kinds}
    return {
        name: level
        for name, level in levels.items()
        if level is not None and query_kind(name).noise_key not in p["noise"]
    }


def noise_levels(noise: Mapping[str, float]) -> dict[str, float]:
    """``[privacy.noise]`` (kind noise key → level) as ``Policy.noise`` (ledger name → level)."""
    by_key = {kind.noise_key: kind.ledger_name for kind in KINDS.values()}
    return {by_key[key]: level for key, level in noise.items()}


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
    hierarchical = build_hierarchical(scenario["model"])
    if hierarchical is not None:
        return _run_hierarchical(scenario, hierarchical, out)
    model = build_model(scenario["model"])
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    if isinstance(algorithm, ChainAlgorithm) and algorithm.query is not None:
        TRANSPORTS[scenario["run"]["transport"]].check_installed()  # before any run directory
    out, existed = new_run_dir(scenario, out)
    with drawless_run_removed(out, existed):
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
    starts, and the ``reference`` posterior; for a hierarchical model also the ``sampled``
    model with its owners and the chains' ``start`` ``(chains, d + K·p)``."""

    records: OwnerRecords
    n_total: int
    seeds: Sequence[np.random.SeedSequence]
    release_rng: np.random.Generator
    reference: Reference | None
    sampled: BoundHierarchy | None = None
    start: np.ndarray | None = None


def _run_hierarchical(
    scenario: Scenario, model: HierarchicalModel, out: str | Path | None
) -> RunResult:
    """Simulate a hierarchical model: its owners serve its local model (``penalty_hier``)."""
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    assert isinstance(algorithm, ChainAlgorithm)  # config: penalty_hier only
    TRANSPORTS[scenario["run"]["transport"]].check_installed()
    out, existed = new_run_dir(scenario, out)
    with drawless_run_removed(out, existed):
        world = _hierarchical_world(scenario, model)
        return _run_owners(scenario, algorithm, model.local_model(), world, out)


def _hierarchical_world(scenario: Scenario, model: HierarchicalModel) -> _World:
    """A hierarchical simulation's world: the blocks b_k drawn at (μ = data.true_theta,
    the model's true τ) from the data stream's child K, owner k's records from its child k,
    the closed-form reference, and the chains' starts (``start_points``, sampler.init_scale)
    from a child of the chain stream."""
    data, sampler = scenario["data"], scenario["sampler"]
    data_seed, owner_seed, chain_seed, release_seed = run_seeds(scenario)
    k, n = data["owners"], data["n_per_owner"]
    counts = n if isinstance(n, list) else [n] * k
    key = data_seed.spawn_key
    streams = [
        np.random.default_rng(np.random.SeedSequence(data_seed.entropy, spawn_key=(*key, j)))
        for j in range(k + 1)
    ]
    z_true = model.simulate_blocks(streams[k], model.true_shared(data["true_theta"]), k)
    local = model.local_model()
    records = [
        local.prepare_records(model.simulate_owner_records(streams[j], z_true, j, counts[j]))
        for j in range(k)
    ]
    names = tuple(f"owner-{j}" for j in range(k))
    start = model.start_points(
        np.random.default_rng(chain_seed.spawn(1)[0]), sampler["chains"], k, sampler["init_scale"]
    )
    return _World(
        records,  # type: ignore[arg-type]  # a list: every transport takes arrays
        sum(counts),
        owner_seed.spawn(k),
        np.random.default_rng(release_seed),
        model.reference_posterior(records),
        BoundHierarchy(model, names),
        start,
    )


def _simulated_world(scenario: Scenario, model: Model) -> _World:
    data_seed, owner_seed, _, release_seed = run_seeds(scenario)
    records = owner_records(scenario, model, data_seed)
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    tempered = isinstance(algorithm, ChainAlgorithm) and algorithm.temperature is not None
    temperature = algorithm.temperature(scenario["sampler"]) if tempered else 1.0  # type: ignore[union-attr, misc]
    reference, n_total = pooled_reference(
        model, records, progress=scenario["run"]["progress"], temperature=temperature
    )
    seeds = ChildSeeds.of(owner_seed, len(records))  # owner_seed.spawn's, made when asked
    return _World(records, n_total, seeds, np.random.default_rng(release_seed), reference)


def resume_simulation(out: str | Path, progress: bool | None = None) -> RunResult:
    """Continue a stopped or interrupted ``fedpenalty simulate`` in ``out`` from its checkpoint
    (``progress``: show the progress bar; None keeps the run's ``run.progress``).

    The owners are built again from the run's seeds on their ledgers: they replay what they
    answered, and their seeded noise is addressed by (session, chain, iteration) (docs/design.md
    §2.7), so the draws are exactly those of an uninterrupted run with the same seed.
    """
    out = Path(out)
    info = run_info(out)
    if info.get("mode") != "simulate":
        raise ConfigError(
            f"{out} is a run of `fedpenalty run`; continue it with `fedpenalty run --resume {out}`"
        )
    if info.get("complete"):
        raise ConfigError(f"{out} holds a finished simulation; nothing to resume")
    scenario = resumed_scenario(out, progress)
    hierarchical = build_hierarchical(scenario["model"])
    if hierarchical is not None:
        algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
        assert isinstance(algorithm, ChainAlgorithm)
        done = checkpoint.load(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
        world = _hierarchical_world(scenario, hierarchical)
        local = hierarchical.local_model()
        return _run_owners(scenario, algorithm, local, world, out, done)
    model = build_model(scenario["model"])
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    assert isinstance(algorithm, ChainAlgorithm)  # only owner-asking chains write a run.json
    TRANSPORTS[scenario["run"]["transport"]].check_installed()
    done = checkpoint.load(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    return _run_owners(scenario, algorithm, model, _simulated_world(scenario, model), out, done)


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
    sigma = None if start is None else start.sigma
    policies = owner_policies(scenario, len(records), sigma, model)
    names = [f"owner-{k}" for k in range(len(records))]
    setup = OwnerSetup(out, model, names, records, policies, seeds, scenario["run"])
    network = network_of(scenario["network"], len(names), scenario["run"]["seed"])
    try:
        launched = TRANSPORTS[scenario["run"]["transport"]].launch(setup)
    except OSError as exc:  # their records and ledgers go to the run directory
        raise OutputFailed(
            f"could not start the simulated owners ({reason(exc)}; their files go to {out}): "
            f"free space or make {out} writable"
        ) from exc
    try:
        oracle = MeteredOracle(launched.oracle, network)
        owners = Owners(oracle, names, policies, deployed=False)
        info = {"mode": "simulate", "transport": scenario["run"]["transport"]}
        info["session"] = SIMULATION_SESSION
        theta0 = world.start if start is None else start.theta
        chains, reports, stopped, spend = sample_owners(
            scenario, algorithm, model, owners, out, world.n_total, info, resume, theta0,
            world.sampled,
        )  # fmt: skip
        with settling(oracle, out, info, stopped):
            extra = chain_diagnostics(chains, algorithm)
            simulated = oracle.simulation_diagnostics()
            # log-ratio counters, kept for runs of Gaussian answers
            asked = [query_kind(kind) for kind in algorithm.asks(scenario["sampler"])]
            if simulated is not None and any(isinstance(k, GaussianKind) for k in asked):
                extra["simulation_only"] = simulated
            target = algorithm.target(scenario["sampler"])
            if target is not None:
                extra["target"] = target
            privacy = privacy_summary(reports, policies, algorithm, scenario)
            if privacy["owners"]:
                privacy["noise"] = _noise_line(scenario, asked)
            if start is not None:
                start.privacy(privacy)
            named = model if world.sampled is None else world.sampled
            stats, groups = dict(chains.stats), scenario["sampler"]["superchains"]
            outputs = Outputs(named, algorithm.name, world.reference, stats, superchains=groups)
            result = finish(
                out, chains.theta, chains.accepted, privacy, outputs, extra, stopped, spend
            )
            return with_cost(result, oracle, names, scenario["run"]["seed"], info["transport"])
    finally:
        launched.stop()


def _noise_line(scenario: Scenario, asked: list[QueryKind]) -> str:
    """privacy.json's ``noise``: how the simulated owners' noise was drawn."""
    if requested(scenario["privacy"]) is not None:
        return SIMULATED_SECURE_NOISE
    noise = " and ".join(dict.fromkeys(k.simulated_noise for k in asked))
    return SIMULATED_NOISE.format(noise=noise)


def _run_pooled(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    pooled: np.ndarray,
    out: Path,
    reference: Reference | None,
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
    outputs = Outputs(
        model, algorithm.name, reference, dict(chains.stats), superchains=sampler["superchains"]
    )
    return finish(
        out, chains.theta, chains.accepted, privacy, outputs, chain_diagnostics(chains, algorithm)
    )


def _run_release(
    scenario: Scenario,
    algorithm: ReleaseAlgorithm,
    model: Model,
    records: list[np.ndarray],
    rng: np.random.Generator,
    out: Path,
    reference: Reference | None,
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
    outputs = Outputs(model, algorithm.name, reference, {}, independent=True)
    return finish(out, release.theta, None, privacy, outputs, {})


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
    out, existed = new_run_dir(scenario, out)  # writable before any owner is asked
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
    with drawless_run_removed(out, existed):
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
    info = run_info(out)
    if info.get("mode") != "deployed":
        raise ConfigError(
            f"{out} is a simulation; continue it with `fedpenalty simulate --resume {out}`"
        )
    if info.get("session") is None or info.get("complete"):
        raise ConfigError(
            f"{out} holds a finished run (or one that never opened a session); nothing to resume"
        )
    scenario = resumed_scenario(out, progress)
    model = build_model(scenario["model"])  # hierarchical models are never deployed
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
    metered = MeteredOracle(oracle)
    names = [d.name for d in described]
    owners = Owners(metered, names, policies, deployed=True)
    chains, reports, stopped, spend = sample_owners(
        scenario, algorithm, model, owners, out, n_total, info, resume
    )
    with settling(metered, out, info, stopped):
        privacy = privacy_summary(reports, policies, algorithm, scenario)
        outputs = Outputs(
            model,
            algorithm.name,
            None,
            dict(chains.stats),
            superchains=scenario["sampler"]["superchains"],
        )
        result = finish(
            out,
            chains.theta,
            chains.accepted,
            privacy,
            outputs,
            chain_diagnostics(chains, algorithm),
            stopped,
            spend,
        )
        return with_cost(result, metered, names, scenario["run"]["seed"], "grpc")
