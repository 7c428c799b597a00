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
* ``config.toml`` — the fully resolved scenario; ``trace.png`` — a trace plot;
* ``run.json`` — how to reach the owners again and the session id; ``checkpoint.npz`` — while
  a run is unfinished: its chain state (``resume_run`` continues it).

An owner that refuses (budget) or cannot be reached stops the run: what was sampled is kept and
written, with a checkpoint, and ``RunResult.stopped`` holds the owner's error.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .common import LOG_RATIO, SGMCMC, SUFF_STATS, Policy, PrivacyReport
from .config import Scenario, load_scenario
from .coordinator import checkpoint
from .coordinator.algorithms import ALGORITHMS, Algorithm
from .coordinator.base import ChainAlgorithm, ChainData, ReleaseAlgorithm
from .coordinator.driver import ChainResult, Progress, SamplingStopped, sample
from .coordinator.grpc_oracle import GrpcOracle
from .coordinator.oracle import Oracle
from .coordinator.reference import reference_posterior
from .coordinator.secure_sum import (
    SIMULATED_SECURE_NOISE,
    aggregation_fields,
    owner_fields,
    requested,
)
from .coordinator.transport_base import OwnerSetup
from .coordinator.transports import TRANSPORTS
from .data import load_records, synthetic_owners
from .diagnostics import summarize
from .errors import ConfigError, OwnerError
from .models import Model, Reference, build_model
from .owner.owner_config import TlsFiles

CHECKPOINT, RUN_INFO = "checkpoint.npz", "run.json"


#: How each owner's privacy is accounted, by the owners' query kind (the ``accounting`` line of
#: privacy.json; None: a trusted curator's non-private baseline).
_LEDGER = "ledger_epsilon: the owner's spend across all its sessions, as its ledger reports it"
_GDP = (
    "Gaussian answers composed by their total μ (each μ = Δ/σ): accountant 'gdp' is the exact "
    "μ-GDP ε(δ) (analytic Gaussian) of float noise (simulated owners); 'rdp' is the Rényi-DP ε of "
    "the same μ, for owners releasing exact lattice answers (deployed owners, docs/design.md "
    "§2.7); epsilon_paper_bound: classical Gaussian mechanism + advanced composition (null: not "
    "applicable); " + _LEDGER
)
ACCOUNTING = {
    LOG_RATIO: _GDP,
    SUFF_STATS: _GDP,
    SGMCMC: "Poisson-subsampled Gaussian gradient answers (rate sampling_rate, noise sd "
    "noise_multiplier × clip) "
    "composed by dp-accounting's PLD accountant (pessimistic) in each owner's ledger; "
    "epsilon_paper_bound: "
    "not applicable; " + _LEDGER,
    None: "non-private baseline: a trusted curator pools every record; no owner privacy",
}
#: privacy.json's ``noise`` line of a simulation (docs/design.md §2.7, invariant 7).
SIMULATED_NOISE = (
    "simulated owners: float Gaussian noise seeded from run.seed and addressed by (session, "
    "chain, iteration), so that a run repeats and a resumed run draws what an uninterrupted one "
    "does; whoever knows the seed knows the noise (deployed owners draw exact lattice noise "
    "from a secret key instead)"
)
NEIGHBOUR_MEANING = {
    "replace_one": "one record of this owner replaced by another",
    "add_remove": "one record added to or removed from this owner's records",
}


@dataclass(frozen=True)
class RunResult:
    """A finished or stopped run. ``theta`` ``(chains, draws, d)`` is what was sampled;
    ``privacy`` is empty when the owners could not report; ``stopped`` is the owner error
    that ended the run early (None when it completed)."""

    out: Path
    privacy: dict[str, Any]
    diagnostics: dict[str, Any]
    theta: np.ndarray
    stopped: OwnerError | None = None


def owner_records(scenario: Scenario, model: Model, rng: np.random.Generator) -> list[np.ndarray]:
    data = scenario["data"]
    if data["source"] == "files":
        return [load_records(p, model) for p in data["paths"]]
    n = data["n_per_owner"]
    n_per_owner = n if isinstance(n, list) else [n] * data["owners"]
    true_theta = np.broadcast_to(np.asarray(data["true_theta"], dtype=float), (model.dim,))
    return synthetic_owners(model, rng, true_theta, n_per_owner)


def owner_policies(scenario: Scenario, owners: int, sigma: float | None = None) -> list[Policy]:
    """The simulated owners' policies from ``[privacy]`` (``sigma`` overrides privacy.sigma).
    They accept exactly the scenario's sampling rate and clip for gradient answers."""
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


def _new_run_dir(scenario: Scenario, out: str | Path | None) -> Path:
    out = Path(out or scenario["run"]["out"] or default_out_dir(scenario))
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"run directory {out} exists and is not empty; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(scenario.to_toml())
    return out


def run_scenario(scenario: Scenario, out: str | Path | None = None) -> RunResult:
    """Simulate: build the scenario's owners (``run.transport``: in this process, or as local
    gRPC owner hosts), run the algorithm and write the run directory."""
    model = build_model(scenario["model"])
    algorithm = ALGORITHMS[scenario["sampler"]["algorithm"]]
    out = _new_run_dir(scenario, out)
    data_seed, owner_seed, _, release_seed = _seeds(scenario)
    records = owner_records(scenario, model, np.random.default_rng(data_seed))
    pooled = np.concatenate(records)
    reference = reference_posterior(model, pooled, progress=scenario["run"]["progress"])
    release_rng = np.random.default_rng(release_seed)
    if isinstance(algorithm, ReleaseAlgorithm):
        return _run_release(scenario, algorithm, model, records, release_rng, out, reference)
    if algorithm.query is None:
        return _run_pooled(scenario, algorithm, model, pooled, out, reference)
    start = None
    if algorithm.start is not None:
        start = algorithm.start(release_rng, model, pooled, scenario.sections)
    policies = owner_policies(scenario, len(records), None if start is None else start.sigma)
    names = [f"owner-{k}" for k in range(len(records))]
    seeds = owner_seed.spawn(len(records))
    setup = OwnerSetup(out, model, names, records, policies, seeds, scenario["run"])
    launched = TRANSPORTS[scenario["run"]["transport"]].launch(setup)
    try:
        info = {"mode": "simulate", "transport": scenario["run"]["transport"]}
        theta0 = None if start is None else start.theta
        chains, reports, stopped = _sample_owners(
            scenario, algorithm, model, launched.oracle, out, len(pooled), info, theta0=theta0
        )
        extra = _chain_diagnostics(chains)
        simulated = launched.oracle.simulation_diagnostics()
        if simulated is not None and algorithm.query != SGMCMC:  # counters of log-ratio answers
            extra["simulation_only"] = simulated
    finally:
        launched.stop()
    privacy = privacy_summary(reports, policies, algorithm, scenario) if reports else {}
    if privacy:
        secure = requested(scenario["privacy"])
        privacy["noise"] = SIMULATED_NOISE if secure is None else SIMULATED_SECURE_NOISE
    if privacy and start is not None:
        start.privacy(privacy)
    return _finish(out, chains.theta, chains.accepted, privacy, reference, extra, stopped)


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
        "accounting": ACCOUNTING[None],
    }
    return _finish(
        out, chains.theta, chains.accepted, privacy, reference, _chain_diagnostics(chains)
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
    return _finish(out, release.theta, None, privacy, reference, {})


def _chain_diagnostics(chains: ChainResult) -> dict[str, Any]:
    """The driver's own counters for diagnostics.json (SG-MCMC: the owners' noise excess)."""
    if not chains.theta.shape[1]:
        return {}
    out: dict[str, Any] = {
        "queried_fraction": float(chains.queried.mean()),
        "mean_noise_variance": chains.noise_var,
    }
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
    oracle = GrpcOracle(owners, model, tls, retry_seconds=scenario["run"]["retry_seconds"])
    try:
        out = _new_run_dir(scenario, out)
    except BaseException:
        oracle.disconnect()
        raise
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
    out: str | Path, owners: list[str] | None = None, tls: TlsFiles | None = None
) -> RunResult:
    """Continue a stopped or crashed ``fedpenalty run`` in ``out`` from its checkpoint (from the
    start when it has none). The owners replay what they already answered, so the resumed
    chain is the chain of an uninterrupted run, and nothing is charged twice."""
    out = Path(out)
    try:
        info = json.loads((out / RUN_INFO).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{out} is not a resumable run directory (no readable {RUN_INFO}: {exc})"
        ) from exc
    if info.get("mode") != "deployed":
        raise ConfigError(f"{out} is a simulation; only runs of `fedpenalty run` can be resumed")
    if info.get("session") is None or info.get("complete"):
        raise ConfigError(
            f"{out} holds a finished run (or one that never opened a session); nothing to resume"
        )
    scenario = load_scenario(out / "config.toml")
    model = build_model(scenario["model"])
    progress = checkpoint.load(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    if tls is None and info["tls"] is not None:
        saved = info["tls"]
        tls = TlsFiles(
            Path(saved["cert"]), Path(saved["key"]), Path(saved["ca"]) if saved["ca"] else None
        )
    info["owners"] = owners or info["owners"]
    oracle = GrpcOracle(info["owners"], model, tls, retry_seconds=scenario["run"]["retry_seconds"])
    return _deployed(scenario, model, oracle, out, info, progress)


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
    chains, reports, stopped = _sample_owners(
        scenario, algorithm, model, oracle, out, n_total, info, resume
    )
    privacy = (
        privacy_summary(reports, [d.policy for d in described], algorithm, scenario)
        if reports
        else {}
    )
    return _finish(
        out, chains.theta, chains.accepted, privacy, None, _chain_diagnostics(chains), stopped
    )


def _sample_owners(
    scenario: Scenario,
    algorithm: ChainAlgorithm,
    model: Model,
    oracle: Oracle,
    out: Path,
    n_total: int | None,
    info: dict[str, Any],
    resume: Progress | None = None,
    theta0: np.ndarray | None = None,
) -> tuple[ChainResult, list[PrivacyReport], OwnerError | None]:
    """Open (or resume) the session, sample with checkpoints, collect the owners' reports.
    Returns the kept draws, the reports (empty if some owner cannot report) and the owner
    error that stopped the run early, if any. ``theta0`` ``(chains, d)`` overrides the
    data-independent starts (hybrid: the OPS draws). The oracle is closed (session closed) when
    the run completed, and only disconnected (session left open for a resume) when it stopped."""
    sampler, run = scenario["sampler"], scenario["run"]
    assert algorithm.query is not None  # only algorithms that ask owners come here
    stopped: OwnerError | None = None
    try:
        info["session"] = oracle.open_session(
            algorithm.query,
            algorithm.planned_answers(sampler),
            info.get("session"),
            secure=requested(scenario["privacy"]),
            **algorithm.session_options(sampler),
        )
        _write_info(out, info)
        rng, start = chain_start(scenario, model)
        try:
            chains = sample(
                algorithm.kernel(model, ChainData(oracle=oracle, n_total=n_total), sampler),
                rng,
                start if theta0 is None else theta0,
                iterations=sampler["iterations"],
                warmup=sampler["warmup"],
                progress=run["progress"],
                description=algorithm.name,
                resume=resume,
                checkpoint=lambda p: checkpoint.save(out / CHECKPOINT, p),
                checkpoint_every=run["checkpoint_every"],
            )
        except SamplingStopped as stop:
            checkpoint.save(out / CHECKPOINT, stop.progress)
            chains, stopped = stop.progress.result(), stop.cause
        try:
            reports = oracle.privacy_reports()
        except OwnerError:
            if stopped is None:
                raise
            reports = []
    except BaseException:
        oracle.disconnect()
        raise
    if stopped is None:
        oracle.close()
        (out / CHECKPOINT).unlink(missing_ok=True)
        info["complete"] = True
        _write_info(out, info)
    else:
        oracle.disconnect()
    return chains, reports, stopped


def _write_info(out: Path, info: dict[str, Any]) -> None:
    tmp = out / (RUN_INFO + ".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(out / RUN_INFO)


def _finish(
    out: Path,
    theta: np.ndarray,
    accepted: np.ndarray | None,
    privacy: dict[str, Any],
    reference: Reference | None,
    extra: dict[str, Any],
    stopped: OwnerError | None = None,
) -> RunResult:
    """Write samples, privacy, diagnostics and the trace plot of what was sampled: ``theta``
    ``(chains, draws, d)``, ``accepted`` ``(chains, draws)`` (None without an accept step)."""
    kept = theta.shape[1]
    diagnostics: dict[str, Any] = {"kept_draws": kept}
    if kept > 1:
        diagnostics.update(summarize(theta, accepted, reference))
    diagnostics.update(extra)
    if stopped is not None:
        diagnostics["stopped"] = str(stopped)
    arrays = {"theta": theta} if accepted is None else {"theta": theta, "accepted": accepted}
    np.savez_compressed(out / "samples.npz", **arrays)  # type: ignore[arg-type]  # numpy's stub
    if privacy:
        (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    (out / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    if kept:
        _trace_plot(out / "trace.png", theta, reference)
    return RunResult(out, privacy, diagnostics, theta, stopped)


def privacy_summary(
    reports: list[PrivacyReport],
    policies: list[Policy],
    algorithm: ChainAlgorithm,
    scenario: Scenario,
) -> dict[str, Any]:
    """The ``privacy.json`` content: each owner's own report of this run's session, and
    ``ledger_epsilon``, its ε across every session its ledger has seen. Gradient runs show the
    owner's σ as ``noise_multiplier`` with the sampling rate and clip they asked for; ``mu`` is
    null unless the owner's ε is the exact GDP one. With secure aggregation: s, t and the
    assumption ``epsilon`` rests on, and each owner's ε from its own noise alone."""
    sampler = scenario["sampler"]
    secure = requested(scenario["privacy"])
    gradient = algorithm.query == SGMCMC
    owners = []
    for report, policy in zip(reports, policies):
        spend = report.session
        assert spend is not None  # the reports were asked for this run's session
        noise = (
            {
                "noise_multiplier": policy.sigma,
                "sampling_rate": sampler["sampling_rate"],
                "clip": sampler["clip"],
            }
            if gradient
            else {"sigma": policy.sigma}
        )
        if secure is not None:  # the noise is s/√(K − t) (owner_fields), not σ
            noise.pop("noise_multiplier" if gradient else "sigma")
        owners.append(
            {
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
        )
    neighbour = _common([r.neighbour for r in reports])
    return {
        "delta": _common([r.delta for r in reports]),
        "neighbour": neighbour,
        "neighbour_meaning": NEIGHBOUR_MEANING.get(neighbour, "owners differ"),
        "algorithm": algorithm.name,
        "accounting": ACCOUNTING[algorithm.query],
        "trusted_curator": False,
        "release": "each owner's own ledger",
        **aggregation_fields(secure),
        "owners": owners,
    }


def _common(values: list[Any]) -> Any:
    """The value every owner shares (None when they differ or there are none)."""
    return values[0] if values and all(v == values[0] for v in values) else None


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _trace_plot(path: Path, theta: np.ndarray, reference) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = theta.shape[2]
    shown = min(d, 4)
    fig, axes = plt.subplots(shown, 1, figsize=(8, 2.2 * shown), squeeze=False)
    for j in range(shown):
        ax = axes[j, 0]
        for c in range(theta.shape[0]):
            ax.plot(theta[c, :, j], lw=0.6, alpha=0.8)
        if reference is not None:
            ax.axhline(reference.mean[j], color="k", ls="--", lw=1, label="reference mean")
        ax.set_ylabel(f"θ[{j}]")
    axes[0, 0].set_title(
        "trace of kept draws" + (f" (first {shown} of {d} dimensions)" if d > shown else "")
    )
    axes[-1, 0].set_xlabel("iteration")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
