"""A whole run from a scenario: owners, session, chains, reports and the run directory.

This is the I/O edge around the pure core. ``run_scenario`` (``fedpenalty simulate``) builds
the owners from the scenario — in this process, or as local owner-host processes reached over
loopback gRPC — and ``run_deployed`` (``fedpenalty run``) reaches owners that run elsewhere;
both connect through an oracle, run the sampler with checkpoints and write

* ``samples.npz`` — ``theta`` ``(chains, draws, d)``, ``accepted`` ``(chains, draws)``;
* ``privacy.json`` — per owner, from its own ledger: answers, μ, ε at δ (exact and the paper's
  bound), budget, and ``ledger_epsilon`` (its spend across all sessions);
* ``diagnostics.json`` — acceptance, bulk ESS, split R-hat, moments, error vs reference;
* ``config.toml`` — the fully resolved scenario; ``trace.png`` — a trace plot;
* ``run.json`` — how to reach the owners again and the session id; ``checkpoint.npz`` — while
  a run is unfinished: its chain state (``resume_run`` continues it).

An owner that refuses (budget) or cannot be reached stops the run: what was sampled is kept and
written, with a checkpoint, and ``RunResult.stopped`` holds the owner's error.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .cluster.local import LocalCluster
from .config import Scenario, load_scenario
from .coordinator import checkpoint
from .coordinator.driver import ChainResult, Progress, SamplingStopped, planned_answers, sample
from .coordinator.grpc_oracle import GrpcOracle
from .coordinator.oracle import InProcessOracle, Oracle
from .coordinator.reference import reference_posterior
from .data import load_records, synthetic_owners
from .diagnostics import summarize
from .errors import ConfigError, OwnerError
from .models import Model, build_model
from .owner import Ledger, OwnerNode, Policy, PrivacyReport
from .owner.owner_config import TlsFiles

CHECKPOINT, RUN_INFO = "checkpoint.npz", "run.json"


@dataclass(frozen=True)
class RunResult:
    """A finished or stopped run. ``privacy`` is empty when the owners could not report;
    ``stopped`` is the owner error that ended the run early (None when it completed)."""

    out: Path
    privacy: dict[str, Any]
    diagnostics: dict[str, Any]
    chains: ChainResult
    stopped: OwnerError | None = None


def owner_records(scenario: Scenario, model: Model, rng: np.random.Generator) -> list[np.ndarray]:
    data = scenario["data"]
    if data["source"] == "files":
        return [load_records(p, model) for p in data["paths"]]
    n = data["n_per_owner"]
    n_per_owner = n if isinstance(n, list) else [n] * data["owners"]
    true_theta = np.broadcast_to(np.asarray(data["true_theta"], dtype=float), (model.dim,))
    return synthetic_owners(model, rng, true_theta, n_per_owner)


def owner_policies(scenario: Scenario, owners: int) -> list[Policy]:
    p = scenario["privacy"]
    sigmas = p["sigma"] if isinstance(p["sigma"], list) else [p["sigma"]] * owners
    max_step = p["max_step"] if p["max_step"] is not None else scenario["sampler"]["step"]
    return [Policy(sigma=s, max_step=max_step, budget_epsilon=p["budget_epsilon"], delta=p["delta"],
                   neighbour=p["neighbour"]) for s in sigmas]


def default_out_dir(scenario: Scenario) -> Path:
    return Path("runs") / f"{scenario['sampler']['algorithm']}-{time.strftime('%Y%m%d-%H%M%S')}"


def chain_start(scenario: Scenario, model: Model) -> tuple[np.random.Generator, np.ndarray]:
    """The coordinator's chain RNG and initial points ``(chains, d)`` (data independent)."""
    sampler = scenario["sampler"]
    rng = np.random.default_rng(np.random.SeedSequence(scenario["run"]["seed"]).spawn(3)[2])
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
    run the sampler and write the run directory."""
    model = build_model(scenario["model"])
    sampler, run = scenario["sampler"], scenario["run"]
    out = _new_run_dir(scenario, out)
    data_seed, owner_seed, _ = np.random.SeedSequence(run["seed"]).spawn(3)
    records = owner_records(scenario, model, np.random.default_rng(data_seed))
    reference = reference_posterior(model, np.concatenate(records), progress=run["progress"])
    if sampler["algorithm"] == "exact_mh":
        rng, theta0 = chain_start(scenario, model)
        chains = sample("exact_mh", model, rng, theta0, records=np.concatenate(records),
                        iterations=sampler["iterations"], warmup=sampler["warmup"], step=sampler["step"],
                        progress=run["progress"])
        return _finish(scenario, out, chains, [], [], reference)
    policies = owner_policies(scenario, len(records))
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
                                     hosts=run["owner_hosts"] or os.cpu_count() or 1)
        try:
            oracle = GrpcOracle(cluster.addresses, model, retry_seconds=run["retry_seconds"])
        except BaseException:
            cluster.stop()
            raise
        cleanup = cluster.stop
    try:
        chains, reports, stopped = _sample_owners(scenario, model, oracle, out, sum(map(len, records)),
                                                  {"mode": "simulate", "transport": run["transport"]})
    finally:
        cleanup()
    extra = {}
    if nodes:
        diag = [node.simulation_diagnostics() for node in nodes]
        extra["simulation_only"] = {
            "note": "data-dependent counters kept by simulated owners only; deployed owners never release them",
            "clip_binds": [d.clip_binds for d in diag],
            "log_ratio_terms": [d.log_ratio_terms for d in diag],
        }
    return _finish(scenario, out, chains, reports, policies, reference, stopped, extra)


def run_deployed(scenario: Scenario, owners: list[str], tls: TlsFiles | None = None,
                 out: str | Path | None = None) -> RunResult:
    """``fedpenalty run``: the coordinator against owner hosts at ``owners`` (HOST:PORT); the
    owners' own policies govern σ and budgets, and their data never leave them."""
    model = build_model(scenario["model"])
    if scenario["sampler"]["algorithm"] == "exact_mh":
        raise ConfigError("exact_mh needs the pooled records of a trusted curator; deployed owners never send them")
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
    return _finish(scenario, out, chains, reports, [d.policy for d in described], None, stopped)


def _sample_owners(scenario: Scenario, model: Model, oracle: Oracle, out: Path, n_total: int,
                   info: dict[str, Any], resume: Progress | None = None
                   ) -> tuple[ChainResult, list[PrivacyReport], OwnerError | None]:
    """Open (or resume) the session, sample with checkpoints, collect the owners' reports.
    Returns the kept draws, the reports (empty if some owner cannot report) and the owner
    error that stopped the run early, if any. The oracle is closed (session closed) when the
    run completed, and only disconnected (session left open for a resume) when it stopped."""
    sampler, run = scenario["sampler"], scenario["run"]
    algorithm = sampler["algorithm"]
    plan = planned_answers(algorithm, sampler["chains"], sampler["iterations"], sampler["warmup"], sampler["block"])
    stopped: OwnerError | None = None
    try:
        info["session"] = oracle.open_session(algorithm, plan, info.get("session"))
        _write_info(out, info)
        rng, theta0 = chain_start(scenario, model)
        try:
            chains = sample(algorithm, model, rng, theta0, oracle=oracle, n_total=n_total, block=sampler["block"],
                            iterations=sampler["iterations"], warmup=sampler["warmup"], step=sampler["step"],
                            progress=run["progress"], resume=resume,
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


def _finish(scenario: Scenario, out: Path, chains: ChainResult, reports: list[PrivacyReport],
            policies: list[Policy], reference, stopped: OwnerError | None = None,
            extra: dict[str, Any] | None = None) -> RunResult:
    """Write samples, privacy, diagnostics and the trace plot of what was sampled."""
    algorithm = scenario["sampler"]["algorithm"]
    privacy = privacy_summary(reports, policies, algorithm) if reports or algorithm == "exact_mh" else {}
    kept = chains.theta.shape[1]
    diagnostics: dict[str, Any] = {"kept_draws": kept}
    if kept > 1:
        diagnostics.update(summarize(chains.theta, chains.accepted, reference))
        diagnostics["queried_fraction"] = float(chains.queried.mean())
        diagnostics["mean_noise_variance"] = chains.noise_var
    diagnostics.update(extra or {})
    if stopped is not None:
        diagnostics["stopped"] = str(stopped)
    np.savez_compressed(out / "samples.npz", theta=chains.theta, accepted=chains.accepted)
    if privacy:
        (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    (out / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    if kept:
        _trace_plot(out / "trace.png", chains.theta, reference)
    return RunResult(out, privacy, diagnostics, chains, stopped)


def privacy_summary(reports: list[PrivacyReport], policies: list[Policy], algorithm: str) -> dict[str, Any]:
    """The ``privacy.json`` content: each owner's own report of this run's session, and
    ``ledger_epsilon``, its ε across every session its ledger has seen."""
    owners = []
    for report, policy in zip(reports, policies):
        spend = report.session
        owners.append({
            "owner": report.owner, "n": report.n, "sigma": policy.sigma, "delta": report.delta,
            "answers": spend.answers, "mu": spend.mu, "epsilon": spend.epsilon,
            "epsilon_paper_bound": _finite_or_none(spend.epsilon_paper_bound),
            "ledger_epsilon": report.total.epsilon, "budget_epsilon": report.budget_epsilon,
            "budget_left": report.budget_left,
        })
    return {
        "delta": _common([r.delta for r in reports]),
        "neighbour": _common([r.neighbour for r in reports]),
        "algorithm": algorithm,
        "accounting": "exact composition of Gaussian answers as μ-GDP (analytic Gaussian ε(δ)); "
                      "epsilon_paper_bound: classical Gaussian mechanism + advanced composition (null: not applicable); "
                      "ledger_epsilon: the owner's spend across all its sessions, as its ledger reports it",
        "trusted_curator": algorithm == "exact_mh",
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
