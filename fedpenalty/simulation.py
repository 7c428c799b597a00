"""A whole run from a scenario: owners, session, chains, reports and the run directory.

This is the I/O edge around the pure core: it builds owner nodes from the scenario, connects
the coordinator to them through a transport, runs the sampler and writes

* ``samples.npz`` — ``theta`` ``(chains, draws, d)``, ``accepted`` ``(chains, draws)``;
* ``privacy.json`` — per owner: answers, μ, ε at δ (exact and the paper's bound), budget;
* ``diagnostics.json`` — acceptance, bulk ESS, split R-hat, moments, error vs reference;
* ``config.toml`` — the fully resolved scenario; ``trace.png`` — a trace plot.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import Scenario
from .coordinator.driver import ChainResult, planned_answers, sample
from .coordinator.oracle import InProcessOracle
from .coordinator.reference import reference_posterior
from .data import load_records, synthetic_owners
from .diagnostics import summarize
from .models import Model, build_model
from .owner import Ledger, OwnerNode, Policy, PrivacyReport


@dataclass(frozen=True)
class RunResult:
    out: Path
    privacy: dict[str, Any]
    diagnostics: dict[str, Any]
    chains: ChainResult


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


def run_scenario(scenario: Scenario, out: str | Path | None = None) -> RunResult:
    """Run a scenario with in-process owners and write its run directory."""
    model = build_model(scenario["model"])
    sampler, run = scenario["sampler"], scenario["run"]
    out = Path(out or run["out"] or default_out_dir(scenario))
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"run directory {out} exists and is not empty; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(scenario.to_toml())

    data_seed, owner_seed, chain_seed = np.random.SeedSequence(run["seed"]).spawn(3)
    records = owner_records(scenario, model, np.random.default_rng(data_seed))
    policies = owner_policies(scenario, len(records))
    algorithm = sampler["algorithm"]
    chain_rng = np.random.default_rng(chain_seed)
    scale = sampler["init_scale"] * model.theta_bound
    theta0 = chain_rng.uniform(-scale, scale, size=(sampler["chains"], model.dim))
    common = dict(iterations=sampler["iterations"], warmup=sampler["warmup"], step=sampler["step"],
                  progress=run["progress"])

    nodes: list[OwnerNode] = []
    reports: list[PrivacyReport] = []
    if algorithm == "exact_mh":
        chains = sample(algorithm, model, chain_rng, theta0, records=np.concatenate(records), **common)
    else:
        ledger = Ledger(out / "ledger.sqlite", synchronous="NORMAL")
        nodes = [OwnerNode(f"owner-{k}", model, r, policy, ledger, np.random.default_rng(s), simulation=True)
                 for k, (r, policy, s) in enumerate(zip(records, policies, owner_seed.spawn(len(records))))]
        oracle = InProcessOracle(nodes)
        oracle.open_session(algorithm, planned_answers(algorithm, sampler["chains"], sampler["iterations"],
                                                       sampler["warmup"], sampler["block"]))
        try:
            chains = sample(algorithm, model, chain_rng, theta0, oracle=oracle, n_total=sum(map(len, records)),
                            block=sampler["block"], **common)
        finally:
            reports = oracle.privacy_reports()
            oracle.close()
            ledger.close()

    privacy = privacy_summary(scenario, reports, policies, algorithm)
    reference = reference_posterior(model, np.concatenate(records), progress=run["progress"])
    diagnostics = summarize(chains.theta, chains.accepted, reference)
    diagnostics["queried_fraction"] = float(chains.queried.mean())
    diagnostics["mean_noise_variance"] = chains.noise_var
    if nodes:
        diag = [node.simulation_diagnostics() for node in nodes]
        diagnostics["simulation_only"] = {
            "note": "data-dependent counters kept by simulated owners only; deployed owners never release them",
            "clip_binds": [d.clip_binds for d in diag],
            "log_ratio_terms": [d.log_ratio_terms for d in diag],
        }
    np.savez_compressed(out / "samples.npz", theta=chains.theta, accepted=chains.accepted)
    (out / "privacy.json").write_text(json.dumps(privacy, indent=2))
    (out / "diagnostics.json").write_text(json.dumps(diagnostics, indent=2))
    _trace_plot(out / "trace.png", chains.theta, reference)
    return RunResult(out, privacy, diagnostics, chains)


def privacy_summary(scenario: Scenario, reports: list[PrivacyReport], policies: list[Policy],
                    algorithm: str) -> dict[str, Any]:
    """The ``privacy.json`` content: each owner's own report of this run's session."""
    owners = []
    for report, policy in zip(reports, policies):
        spend = report.session
        owners.append({
            "owner": report.owner, "n": report.n, "sigma": policy.sigma, "answers": spend.answers, "mu": spend.mu,
            "epsilon": spend.epsilon, "epsilon_paper_bound": _finite_or_none(spend.epsilon_paper_bound),
            "budget_epsilon": report.budget_epsilon, "budget_left": report.budget_left,
        })
    return {
        "delta": scenario["privacy"]["delta"],
        "neighbour": scenario["privacy"]["neighbour"],
        "algorithm": algorithm,
        "accounting": "exact composition of Gaussian answers as μ-GDP (analytic Gaussian ε(δ)); "
                      "epsilon_paper_bound: classical Gaussian mechanism + advanced composition (null: not applicable)",
        "trusted_curator": algorithm == "exact_mh",
        "owners": owners,
    }


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
