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

from .cluster.local import LocalCluster, default_owner_hosts
from .config import Scenario, load_scenario
from .coordinator import checkpoint
from .coordinator import baselines, sgmcmc
from .coordinator.driver import (SG_KERNELS, ChainResult, GradientSettings, Progress, SamplingStopped,
                                 planned_answers, sample, session_algorithm)
from .coordinator.grpc_oracle import GrpcOracle
from .coordinator.oracle import InProcessOracle, Oracle
from .coordinator.reference import reference_posterior
from .data import load_records, synthetic_owners
from .diagnostics import summarize
from .errors import ConfigError, OwnerError
from .models import Model, Reference, build_model
from .owner import Ledger, OwnerNode, Policy, PrivacyReport
from .owner.owner_config import TlsFiles

CHECKPOINT, RUN_INFO = "checkpoint.npz", "run.json"


#: How each owner's privacy is accounted, by algorithm (the ``accounting`` line of privacy.json).
_LEDGER = "ledger_epsilon: the owner's spend across all its sessions, as its ledger reports it"
ACCOUNTING = {
    "penalty": "exact composition of Gaussian answers as μ-GDP (analytic Gaussian ε(δ)); epsilon_paper_bound: "
               "classical Gaussian mechanism + advanced composition (null: not applicable); " + _LEDGER,
    "sgmcmc": "Poisson-subsampled Gaussian gradient answers (rate sampling_rate, noise sd noise_multiplier × clip) "
              "composed by dp-accounting's PLD accountant (pessimistic) in each owner's ledger; epsilon_paper_bound: "
              "not applicable; " + _LEDGER,
    "ops": "OPS (one draw from the tempered posterior at temperature rho per release): each draw is "
           "(epsilon / draws, 0)-DP (Wang et al. Thm 1 / Foulds et al. Thm 2), composed by basic composition",
    "noisy_stats_laplace": "one release of Σ S(x) + Laplace(L1 sensitivity / ε) per component: (ε, 0)-DP; the "
                           "conjugate draws are post-processing",
    "noisy_stats_gaussian": "one release of Σ S(x) + N(0, σ² I) with σ calibrated exactly (μ-GDP, analytic Gaussian) "
                            "to (ε, δ) for the L2 sensitivity; the conjugate draws are post-processing",
    "hybrid": "epsilon = epsilon_ops + epsilon_sgld by basic composition: epsilon_ops from the OPS starts (δ = 0, "
              "computed by the simulation on the pooled records), epsilon_sgld from each owner's ledger (PLD) for "
              "the DP-SGLD answers at the noise multiplier calibrated to ε/2",
}
NEIGHBOUR_MEANING = {"replace_one": "one record of this owner replaced by another",
                     "add_remove": "one record added to or removed from this owner's records"}


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
    return [Policy(sigma=s, max_step=max_step, budget_epsilon=p["budget_epsilon"], delta=p["delta"],
                   neighbour=p["neighbour"], max_sampling_rate=sampler["sampling_rate"], max_clip=sampler["clip"])
            for s in sigmas]


def gradient_settings(scenario: Scenario) -> GradientSettings:
    """The SG-MCMC settings of ``[sampler]``: step schedule, sampling rate, clip, friction."""
    sampler = scenario["sampler"]
    if sampler["step_schedule"] == "polynomial":
        schedule = sgmcmc.StepSchedule(sampler["step"], sampler["step_decay_b"], sampler["step_decay_gamma"])
    else:
        schedule = sgmcmc.StepSchedule.constant(sampler["step"])
    return GradientSettings(schedule, sampler["sampling_rate"], sampler["clip"], sampler["friction"])


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
    """Simulate: build the scenario's owners (in this process, or as local gRPC owner hosts),
    run the sampler or baseline and write the run directory."""
    model = build_model(scenario["model"])
    sampler, run = scenario["sampler"], scenario["run"]
    algorithm = sampler["algorithm"]
    out = _new_run_dir(scenario, out)
    data_seed, owner_seed, _, release_seed = _seeds(scenario)
    records = owner_records(scenario, model, np.random.default_rng(data_seed))
    reference = reference_posterior(model, np.concatenate(records), progress=run["progress"])
    release_rng = np.random.default_rng(release_seed)
    if algorithm == "exact_mh":
        rng, theta0 = chain_start(scenario, model)
        chains = sample("exact_mh", model, rng, theta0, records=np.concatenate(records),
                        iterations=sampler["iterations"], warmup=sampler["warmup"], step=sampler["step"],
                        progress=run["progress"])
        privacy = {"algorithm": "exact_mh", "trusted_curator": True, "owners": [],
                   "accounting": "non-private baseline: a trusted curator pools every record; no owner privacy"}
        return _finish(out, chains.theta, chains.accepted, privacy, reference, _chain_diagnostics(chains))
    if algorithm == "ops":
        return _run_ops(scenario, model, records, release_rng, out, reference)
    if algorithm == "noisy_stats":
        return _run_noisy_stats(scenario, model, records, release_rng, out, reference)
    theta0, sigma, ops_part = None, None, None
    if algorithm == "hybrid":
        answers = planned_answers("sgld", sampler["chains"], sampler["iterations"], sampler["warmup"])
        ops_part, sigma = baselines.hybrid_start(
            release_rng, model, np.concatenate(records), scenario["privacy"]["epsilon"], scenario["privacy"]["delta"],
            sampling_rate=sampler["sampling_rate"], answers=answers, chains=sampler["chains"],
            neighbour=scenario["privacy"]["neighbour"], ops_form=scenario["privacy"]["ops_form"],
            mh_steps=sampler["ops_mh_steps"])
        theta0 = np.atleast_2d(ops_part.theta)
    policies = owner_policies(scenario, len(records), sigma)
    seeds = owner_seed.spawn(len(records))
    nodes: list[OwnerNode] = []
    if run["transport"] == "inprocess":
        ledger = Ledger(out / "ledger.sqlite", synchronous="NORMAL")
        nodes = [OwnerNode(f"owner-{k}", model, r, policy, ledger, np.random.default_rng(s), simulation=True)
                 for k, (r, policy, s) in enumerate(zip(records, policies, seeds))]
        oracle: Oracle = InProcessOracle(nodes)
        cleanup = ledger.close
    else:
        cluster = LocalCluster.start(out / "owners", model, records, policies, seeds,
                                     hosts=run["owner_hosts"] or default_owner_hosts())
        try:
            oracle = GrpcOracle(cluster.addresses, model, retry_seconds=run["retry_seconds"])
        except BaseException:
            cluster.stop()
            raise
        cleanup = cluster.stop
    try:
        chains, reports, stopped = _sample_owners(scenario, model, oracle, out, sum(map(len, records)),
                                                  {"mode": "simulate", "transport": run["transport"]}, theta0=theta0)
    finally:
        cleanup()
    extra = _chain_diagnostics(chains)
    if nodes and algorithm in ("penalty", "penalty_expfam"):
        diag = [node.simulation_diagnostics() for node in nodes]
        extra["simulation_only"] = {
            "note": "data-dependent counters kept by simulated owners only; deployed owners never release them. "
                    "Owners answering from sufficient statistics evaluate no per-record terms: for records inside "
                    "the data domain the per-record clip cannot bind there",
            "answered_from_sufficient_statistics": [not node.per_record for node in nodes],
            "clip_binds": [d.clip_binds for d in diag],
            "log_ratio_terms": [d.log_ratio_terms for d in diag],
        }
    privacy = privacy_summary(reports, policies, algorithm, scenario["sampler"]) if reports else {}
    if privacy and ops_part is not None:
        _add_hybrid_start(privacy, ops_part)
    return _finish(out, chains.theta, chains.accepted, privacy, reference, extra, stopped)


def _run_ops(scenario: Scenario, model: Model, records: list[np.ndarray], rng: np.random.Generator, out: Path,
             reference: Reference) -> RunResult:
    """OPS on the pooled records (trusted curator): chains × iterations draws, each at
    ε/(chains × iterations), so that every owner spends privacy.epsilon."""
    sampler, p = scenario["sampler"], scenario["privacy"]
    draws = sampler["chains"] * sampler["iterations"]
    result = baselines.ops(rng, model, np.concatenate(records), p["epsilon"] / draws, form=p["ops_form"],
                           neighbour=p["neighbour"], samples=draws, mh_steps=sampler["ops_mh_steps"])
    theta = np.asarray(result.theta).reshape(sampler["chains"], sampler["iterations"], model.dim)
    privacy = _baseline_privacy(scenario, "ops", records, result.epsilon_per_owner, 0.0, trusted_curator=True,
                                release="computed by the simulation on every owner's records pooled (a trusted "
                                        "curator); no owner ledger is involved",
                                rho=result.rho, ops_form=result.form, draws=draws, method=result.method,
                                epsilon_per_draw=p["epsilon"] / draws)
    if result.method == "mh":
        privacy["note"] = ("this model has no closed-form tempered posterior: each draw is the last state of a "
                           "tempered exact-MH chain (sampler.ops_mh_steps steps after tuning); the guarantee is for an "
                           "exact draw")
    return _finish(out, theta, None, privacy, reference, {})


def _run_noisy_stats(scenario: Scenario, model: Model, records: list[np.ndarray], rng: np.random.Generator,
                     out: Path, reference: Reference) -> RunResult:
    """Each owner releases its noisy sufficient statistics once; chains × iterations conjugate
    draws given their sum."""
    sampler, p = scenario["sampler"], scenario["privacy"]
    result = baselines.noisy_stats(rng, model, records, p["epsilon"], neighbour=p["neighbour"],
                                   draws=sampler["chains"] * sampler["iterations"], mechanism=p["mechanism"],
                                   delta=p["delta"])
    theta = result.theta.reshape(sampler["chains"], sampler["iterations"], model.dim)
    privacy = _baseline_privacy(scenario, f"noisy_stats_{result.mechanism}", records, result.epsilon_per_owner,
                                result.delta, trusted_curator=False,
                                release="computed by the simulation from each owner's own records with the formulas "
                                        "of coordinator.baselines.noisy_stats (one release per owner); the owners' "
                                        "ledgers are not involved",
                                mechanism=result.mechanism, scale=result.scale, sensitivity=result.sensitivity,
                                mu=result.mu)
    return _finish(out, theta, None, privacy, reference, {})


def _baseline_privacy(scenario: Scenario, accounting: str, records: list[np.ndarray], epsilon: float, delta: float,
                      *, trusted_curator: bool, release: str, **per_owner: Any) -> dict[str, Any]:
    """privacy.json of a baseline whose release the simulation computes: every owner spends
    ``epsilon`` at ``delta``."""
    neighbour = scenario["privacy"]["neighbour"]
    return {
        "delta": delta, "neighbour": neighbour, "neighbour_meaning": NEIGHBOUR_MEANING[neighbour],
        "algorithm": scenario["sampler"]["algorithm"], "accounting": ACCOUNTING[accounting],
        "trusted_curator": trusted_curator, "release": release,
        "owners": [{"owner": f"owner-{k}", "n": len(r), "epsilon": epsilon, "delta": delta, **per_owner}
                   for k, r in enumerate(records)],
    }


def _add_hybrid_start(privacy: dict[str, Any], start: baselines.OPSResult) -> None:
    """Fold the OPS starts of ``hybrid`` into the owners' ledger report of its DP-SGLD part."""
    privacy["trusted_curator"] = True
    privacy["release"] = ("OPS starts: computed by the simulation on every owner's records pooled (a trusted "
                          "curator); DP-SGLD answers: through each owner's own ledger")
    privacy["ops_rho"] = start.rho
    for owner in privacy["owners"]:
        owner["epsilon_sgld"] = owner["epsilon"]
        owner["epsilon_ops"] = start.epsilon_per_owner
        owner["epsilon"] = owner["epsilon_sgld"] + start.epsilon_per_owner


def _chain_diagnostics(chains: ChainResult) -> dict[str, Any]:
    """The driver's own counters for diagnostics.json (SG-MCMC: the owners' noise excess)."""
    if not chains.theta.shape[1]:
        return {}
    out: dict[str, Any] = {"queried_fraction": float(chains.queried.mean()), "mean_noise_variance": chains.noise_var}
    if chains.accepted is None:
        out.update(excess_noise_ratio=chains.excess_noise_ratio, excess_noise_fraction=chains.excess_fraction)
    return out


def run_deployed(scenario: Scenario, owners: list[str], tls: TlsFiles | None = None,
                 out: str | Path | None = None) -> RunResult:
    """``fedpenalty run``: the coordinator against owner hosts at ``owners`` (HOST:PORT); the
    owners' own policies govern σ and budgets, and their data never leave them."""
    model = build_model(scenario["model"])
    algorithm = scenario["sampler"]["algorithm"]
    if algorithm in ("exact_mh", "ops", "hybrid"):
        raise ConfigError(f"{algorithm} needs the pooled records of a trusted curator; deployed owners never send them")
    if algorithm == "noisy_stats":
        raise ConfigError("noisy_stats runs in simulation only (fedpenalty simulate): deployed owners have no "
                          "one-shot statistics release")
    oracle = GrpcOracle(owners, model, tls, retry_seconds=scenario["run"]["retry_seconds"])
    try:
        out = _new_run_dir(scenario, out)
    except BaseException:
        oracle.disconnect()
        raise
    info = {"mode": "deployed", "owners": list(owners), "tls": None if tls is None else
            {"cert": str(tls.cert.resolve()), "key": str(tls.key.resolve()), "ca": str(tls.ca.resolve()) if tls.ca else None}}
    return _deployed(scenario, model, oracle, out, info, None)


def resume_run(out: str | Path, owners: list[str] | None = None, tls: TlsFiles | None = None) -> RunResult:
    """Continue a stopped or crashed ``fedpenalty run`` in ``out`` from its checkpoint (from the
    start when it has none). The owners replay what they already answered, so the resumed
    chain is the chain of an uninterrupted run, and nothing is charged twice."""
    out = Path(out)
    try:
        info = json.loads((out / RUN_INFO).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{out} is not a resumable run directory (no readable {RUN_INFO}: {exc})") from exc
    if info.get("mode") != "deployed":
        raise ConfigError(f"{out} is a simulation; only runs of `fedpenalty run` can be resumed")
    if info.get("session") is None or info.get("complete"):
        raise ConfigError(f"{out} holds a finished run (or one that never opened a session); nothing to resume")
    scenario = load_scenario(out / "config.toml")
    model = build_model(scenario["model"])
    progress = checkpoint.load(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    if tls is None and info["tls"] is not None:
        saved = info["tls"]
        tls = TlsFiles(Path(saved["cert"]), Path(saved["key"]), Path(saved["ca"]) if saved["ca"] else None)
    info["owners"] = owners or info["owners"]
    oracle = GrpcOracle(info["owners"], model, tls, retry_seconds=scenario["run"]["retry_seconds"])
    return _deployed(scenario, model, oracle, out, info, progress)


def _deployed(scenario: Scenario, model: Model, oracle: GrpcOracle, out: Path, info: dict[str, Any],
              resume: Progress | None) -> RunResult:
    described = oracle.describe()
    chains, reports, stopped = _sample_owners(scenario, model, oracle, out, sum(d.n for d in described), info,
                                              resume)
    algorithm = scenario["sampler"]["algorithm"]
    privacy = privacy_summary(reports, [d.policy for d in described], algorithm, scenario["sampler"]) if reports else {}
    return _finish(out, chains.theta, chains.accepted, privacy, None, _chain_diagnostics(chains), stopped)


def _sample_owners(scenario: Scenario, model: Model, oracle: Oracle, out: Path, n_total: int,
                   info: dict[str, Any], resume: Progress | None = None, theta0: np.ndarray | None = None
                   ) -> tuple[ChainResult, list[PrivacyReport], OwnerError | None]:
    """Open (or resume) the session, sample with checkpoints, collect the owners' reports.
    Returns the kept draws, the reports (empty if some owner cannot report) and the owner
    error that stopped the run early, if any. ``theta0`` ``(chains, d)`` overrides the
    data-independent starts (hybrid: the OPS draws). The oracle is closed (session closed) when
    the run completed, and only disconnected (session left open for a resume) when it stopped."""
    sampler, run = scenario["sampler"], scenario["run"]
    kernel = "sgld" if sampler["algorithm"] == "hybrid" else sampler["algorithm"]
    plan = planned_answers(kernel, sampler["chains"], sampler["iterations"], sampler["warmup"], sampler["block"])
    gradient = gradient_settings(scenario) if kernel in SG_KERNELS else None
    stopped: OwnerError | None = None
    try:
        rate = {} if gradient is None else {"sampling_rate": gradient.sampling_rate}
        info["session"] = oracle.open_session(session_algorithm(kernel), plan, info.get("session"), **rate)
        _write_info(out, info)
        rng, start = chain_start(scenario, model)
        try:
            chains = sample(kernel, model, rng, start if theta0 is None else theta0, oracle=oracle, n_total=n_total,
                            block=sampler["block"], iterations=sampler["iterations"], warmup=sampler["warmup"],
                            step=sampler["step"], gradient=gradient, progress=run["progress"], resume=resume,
                            checkpoint=lambda p: checkpoint.save(out / CHECKPOINT, p),
                            checkpoint_every=run["checkpoint_every"])
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
        _disconnect(oracle)
        raise
    if stopped is None:
        oracle.close()
        (out / CHECKPOINT).unlink(missing_ok=True)
        info["complete"] = True
        _write_info(out, info)
    else:
        _disconnect(oracle)
    return chains, reports, stopped


def _disconnect(oracle: Oracle) -> None:
    if isinstance(oracle, GrpcOracle):
        oracle.disconnect()


def _write_info(out: Path, info: dict[str, Any]) -> None:
    tmp = out / (RUN_INFO + ".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(out / RUN_INFO)


def _finish(out: Path, theta: np.ndarray, accepted: np.ndarray | None, privacy: dict[str, Any],
            reference: Reference | None, extra: dict[str, Any], stopped: OwnerError | None = None) -> RunResult:
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
    np.savez_compressed(out / "samples.npz", **arrays)
    if privacy:
        (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    (out / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    if kept:
        _trace_plot(out / "trace.png", theta, reference)
    return RunResult(out, privacy, diagnostics, theta, stopped)


def privacy_summary(reports: list[PrivacyReport], policies: list[Policy], algorithm: str,
                    sampler: dict[str, Any]) -> dict[str, Any]:
    """The ``privacy.json`` content: each owner's own report of this run's session, and
    ``ledger_epsilon``, its ε across every session its ledger has seen. Gradient runs show the
    owner's σ as ``noise_multiplier`` with the sampling rate and clip they asked for; ``mu`` is
    null unless the owner's ε is the exact GDP one."""
    gradient = algorithm in (*SG_KERNELS, "hybrid")
    owners = []
    for report, policy in zip(reports, policies):
        spend = report.session
        noise = ({"noise_multiplier": policy.sigma, "sampling_rate": sampler["sampling_rate"], "clip": sampler["clip"]}
                 if gradient else {"sigma": policy.sigma})
        owners.append({"owner": report.owner, "n": report.n, **noise, "delta": report.delta, "answers": spend.answers,
                       "mu": spend.mu if spend.accountant == "gdp" else None, "epsilon": spend.epsilon,
                       "accountant": spend.accountant,
                       "epsilon_paper_bound": _finite_or_none(spend.epsilon_paper_bound),
                       "ledger_epsilon": report.total.epsilon, "budget_epsilon": report.budget_epsilon,
                       "budget_left": report.budget_left})
    neighbour = _common([r.neighbour for r in reports])
    return {
        "delta": _common([r.delta for r in reports]),
        "neighbour": neighbour,
        "neighbour_meaning": NEIGHBOUR_MEANING.get(neighbour, "owners differ"),
        "algorithm": algorithm,
        "accounting": ACCOUNTING["hybrid" if algorithm == "hybrid" else "sgmcmc" if gradient else "penalty"],
        "trusted_curator": False,
        "release": "each owner's own ledger",
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
    axes[0, 0].set_title("trace of kept draws" + (f" (first {shown} of {d} dimensions)" if d > shown else ""))
    axes[-1, 0].set_xlabel("iteration")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
