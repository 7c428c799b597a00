"""Räisä, Koskela & Honkela, "Differentially private Hamiltonian Monte Carlo": the Gaussian
experiment (its code's ``gauss`` problem and ``params/dp-hmc_gauss.py``,
``params/dp-penalty_gauss.py``), reproduced with this project's kernels.

    python scenarios/dp_hmc_paper.py [--quick] [--out DIR] [--seed 0] [--repeats R]
                                     [--no-progress]

The problem, as the paper's code builds it: a 10-D Gaussian likelihood N(x; θ, Σ) with known
Σ = Q D Qᵀ (D's eigenvalues Gamma(0.5) draws, Q from the QR of a uniform matrix), n = 100,000
records drawn at θ = (0, 3, 0, …, 0), prior N(0, 100² I); one data holder; replace-one
neighbours; δ = 0.1/n; ε ∈ {2, 4, 6, 8, 10, 12, 15}; 4 chains; the first half of each chain
discarded. The draws of Σ and the data are this script's (numpy), not the paper's (JAX), so
Σ's conditioning differs. The number of iterations is what the budget allows, split over the
chains, exactly as the paper's ``adp_iters`` computes it:

* ``dp_hmc`` (``coordinator/dp_hmc.py``): τ = 0.1, τ_g = 0.25, step η = 0.00015 scaled by
  u ~ U(0, 1) each iteration (jitter 1; the paper: a scrambled Halton sequence), L = 12, ratio
  clip 6 per unit of ‖θ′ − θ‖ with noise sd 2τ√n·6‖θ′ − θ‖, gradient clip 10 with noise sd
  2τ_g√n·10; μ² = 1/(τ²n) per ratio and 1/(τ_g²n) per gradient; the paper counts L + 1
  gradients per iteration (its default), the kernel asks L per iteration plus one at the start,
  so it spends a little less than the target (both ε are reported);
* ``penalty`` (``coordinator/mh.py``'s step): τ = 0.05, ratio clip 10 per unit distance, a
  proposal uniform in the ball of radius 0.00245 (the paper: Gaussian, sd 0.0007 per
  coordinate, of mean length 0.0022 as this ball's), μ² = 1/(τ²n) per ratio.

The paper's figure shows, per ε, MMD, the total mean error ‖mean − posterior mean‖, R-hat,
acceptance and clipped fractions, as boxplots over 10 repeats; this script reports the mean
error (against the closed-form posterior mean, not 1,000 draws), acceptance, the clipped
fractions and the iterations, mean ± sd over repeats. Every ε is the analytic-Gaussian ε(δ) of
the answers' composed μ (``fedpenalty.privacy``), checked against the paper's own ``adp_delta``
formula (written out below).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import special

from fedpenalty import reporting
from fedpenalty.coordinator import dp_hmc, mh
from fedpenalty.coordinator.adapt import StepAdaptation
from fedpenalty.coordinator.driver import sample
from fedpenalty.privacy import epsilon_for_delta, mu_for_epsilon

NAME = "dp_hmc_paper"
DIM, N, PRIOR_SD, GAMMA_SHAPE = 10, 100_000, 100.0, 0.5
DELTA, CHAINS = 0.1 / N, 4
HMC = {"tau": 0.1, "tau_g": 0.25, "eta": 0.00015, "L": 12, "r_clip": 6.0, "grad_clip": 10.0}
PENALTY = {"tau": 0.05, "r_clip": 10.0, "radius": 0.00245, "paper_prop_sd": 0.0007}


@dataclass(frozen=True)
class Setup:
    epsilons: tuple[float, ...]
    repeats: int


FULL = Setup((2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0), 5)
QUICK = Setup((4.0, 10.0), 1)


class PaperGauss:
    """The paper's ``GaussModel`` as the kernels see a model: θ ∈ R^10 (Θ a box of ±1,000, 10
    prior sds: unbounded in effect), prior N(0, 100² I), records x ~ N(θ, Σ)."""

    def __init__(self, rng: np.random.Generator):
        self.dim, self.theta_bound = DIM, 1000.0
        eigen = rng.gamma(GAMMA_SHAPE, size=DIM)
        q, _ = np.linalg.qr(rng.uniform(size=(DIM, DIM)))
        self.cov = q @ np.diag(eigen) @ q.T
        self.precision = np.linalg.inv(self.cov)
        self.true_mean = np.r_[0.0, 3.0, np.zeros(DIM - 2)]

    def log_prior(self, theta: np.ndarray) -> np.ndarray:
        return -0.5 * np.sum(theta**2, axis=1) / PRIOR_SD**2

    def grad_log_prior(self, theta: np.ndarray) -> np.ndarray:
        return -theta / PRIOR_SD**2

    def in_theta_space(self, theta: np.ndarray) -> np.ndarray:
        return (np.abs(theta) <= self.theta_bound).all(axis=-1)

    def posterior(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Closed-form posterior mean ``(d,)`` and covariance ``(d, d)``."""
        precision = len(records) * self.precision + np.eye(DIM) / PRIOR_SD**2
        cov = np.linalg.inv(precision)
        return cov @ (self.precision @ records.sum(axis=0)), cov


def clipped_gradient(model: PaperGauss, records: np.ndarray, clip: float, sd: float, rng):
    """The data holder's Σ_x clip(Σ⁻¹(x − θ)) + N(0, sd² I); also counts clipped records.
    With y = Σ⁻¹x and v = Σ⁻¹θ each record's gradient is y − v, its norm² ‖y‖² − 2yᵀv + ‖v‖²
    and the clipped sum Σ_x s_x (y_x − v) with s_x = min(1, clip/‖y_x − v‖): O(n d) per chain."""
    y = records @ model.precision
    y2 = np.sum(y**2, axis=1)
    counts: list[float] = []

    def grad(iteration: int, substep: int, chains: np.ndarray, theta: np.ndarray):
        v = theta @ model.precision  # (m, d)
        norm = np.sqrt(np.maximum(y2[:, None] - 2 * y @ v.T + np.sum(v**2, axis=1), 0.0))
        scale = np.minimum(1.0, clip / np.maximum(norm, 1e-300))  # (n, m)
        counts.append(float((norm > clip).mean()))
        clipped = scale.T @ y - scale.sum(axis=0)[:, None] * v
        noise = sd * rng.standard_normal(theta.shape)
        return clipped + noise, np.full(len(chains), sd**2)

    return grad, counts


def clipped_ratio(model: PaperGauss, records: np.ndarray, r_clip: float, tau: float, rng):
    """The paper's ratio: each record's ℓ(x, θ′) − ℓ(x, θ) clipped to ±r_clip·‖θ′ − θ‖, summed,
    plus N(0, (2τ√n r_clip ‖θ′ − θ‖)²) (sensitivity 2 r_clip ‖θ′ − θ‖: μ = 1/(τ√n))."""
    counts: list[float] = []

    def ratio(iteration: int, chains: np.ndarray, theta: np.ndarray, theta_prop: np.ndarray):
        a = (theta_prop - theta) @ model.precision  # (m, d)
        b = 0.5 * (
            np.einsum("md,de,me->m", theta_prop, model.precision, theta_prop)
            - np.einsum("md,de,me->m", theta, model.precision, theta)
        )
        diff = records @ a.T - b  # (n, m)
        clip = r_clip * np.linalg.norm(theta_prop - theta, axis=1)
        counts.append(float((np.abs(diff) > clip).mean()))
        sd = 2.0 * tau * math.sqrt(len(records)) * clip
        lam = np.clip(diff, -clip, clip).sum(axis=0) + sd * rng.standard_normal(len(chains))
        return lam, sd**2

    return ratio, counts


def paper_delta(k: float, epsilon: float, mu_half: float) -> float:
    """The paper's ``adp_delta``: δ(ε) of k iterations whose privacy-loss mean is ``mu_half``
    each (μ²/2 per iteration), with erfc as its code writes it."""
    mu = k * mu_half
    term1 = special.erfc((epsilon - mu) / (2 * math.sqrt(mu)))
    term2 = math.exp(epsilon) * special.erfc((epsilon + mu) / (2 * math.sqrt(mu)))
    return 0.5 * (term1 - term2)


def paper_iterations(epsilon: float, mu2_per_iteration: float) -> int:
    """The paper's ``adp_iters``: the largest k with ``paper_delta`` ≤ δ (bisection)."""
    low, high = 1, 2
    while paper_delta(high, epsilon, mu2_per_iteration / 2) < DELTA:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (
            (mid, high)
            if paper_delta(mid, epsilon, mu2_per_iteration / 2) <= DELTA
            else (
                low,
                mid,
            )
        )
    return low


def budget_iterations(epsilon: float, mu2_per_iteration: float) -> int:
    """The same question through this project's accountant: ⌊μ(ε, δ)² / μ² per iteration⌋."""
    return int(mu_for_epsilon(epsilon, DELTA) ** 2 / mu2_per_iteration)


def hmc_mu2() -> tuple[float, float]:
    """μ² of one ratio and of one gradient answer (the paper's ``rho_l``, ``rho_g`` × 2)."""
    return 1.0 / (HMC["tau"] ** 2 * N), 1.0 / (HMC["tau_g"] ** 2 * N)


def starts(model: PaperGauss, sd: float, rng: np.random.Generator) -> np.ndarray:
    """The paper's ``get_start_point``: the true θ plus N(0, 1) × the mean posterior sd."""
    return model.true_mean + sd * rng.standard_normal((CHAINS, DIM))


def run_hmc(model, records, epsilon, seed) -> dict[str, Any]:
    r_mu2, g_mu2 = hmc_mu2()
    total = paper_iterations(epsilon, r_mu2 + (HMC["L"] + 1) * g_mu2)
    iters = total // CHAINS
    rng, noise = np.random.default_rng(seed), np.random.default_rng(seed + 10_000)
    grad_sd = 2 * HMC["tau_g"] * math.sqrt(N) * HMC["grad_clip"]
    grad, g_counts = clipped_gradient(model, records, HMC["grad_clip"], grad_sd, noise)
    ratio, r_counts = clipped_ratio(model, records, HMC["r_clip"], HMC["tau"], noise)
    algo = dp_hmc.kernel(
        model,  # type: ignore[arg-type]
        grad,
        ratio,
        StepAdaptation.start(HMC["eta"]),
        leapfrog_steps=int(HMC["L"]),
        step_jitter=1.0,
        adapt=False,
    )
    mean, cov = model.posterior(records)
    theta0 = starts(model, float(np.sqrt(np.diag(cov)).mean()), rng)
    result = sample(
        algo, rng, theta0, iterations=iters - iters // 2, warmup=iters // 2, progress=False
    )
    answers = CHAINS * iters  # per kind, in the paper's count
    spent_mu2 = answers * r_mu2 + (CHAINS * (HMC["L"] * iters + 1)) * g_mu2
    return {
        **measures(result, mean, iters, r_counts, g_counts),
        "epsilon_spent": epsilon_for_delta(math.sqrt(spent_mu2), DELTA),
        "epsilon_paper_count": epsilon_for_delta(
            math.sqrt(answers * (r_mu2 + (HMC["L"] + 1) * g_mu2)), DELTA
        ),
        "iterations_check": budget_iterations(epsilon, r_mu2 + (HMC["L"] + 1) * g_mu2),
        "iterations_total": total,
    }


def run_penalty(model, records, epsilon, seed) -> dict[str, Any]:
    r_mu2 = 1.0 / (PENALTY["tau"] ** 2 * N)
    total = paper_iterations(epsilon, r_mu2)
    iters = total // CHAINS
    rng, noise = np.random.default_rng(seed), np.random.default_rng(seed + 10_000)
    ratio, r_counts = clipped_ratio(model, records, PENALTY["r_clip"], PENALTY["tau"], noise)
    algo = mh.kernel(model, ratio, StepAdaptation.start(PENALTY["radius"]))  # type: ignore[arg-type]
    mean, cov = model.posterior(records)
    theta0 = starts(model, float(np.sqrt(np.diag(cov)).mean()), rng)
    result = sample(
        algo, rng, theta0, iterations=iters - iters // 2, warmup=iters // 2, progress=False
    )
    return {
        **measures(result, mean, iters, r_counts, []),
        "epsilon_spent": epsilon_for_delta(math.sqrt(CHAINS * iters * r_mu2), DELTA),
        "iterations_check": budget_iterations(epsilon, r_mu2),
        "iterations_total": total,
    }


def measures(result, mean, iters, r_counts, g_counts) -> dict[str, Any]:
    """The paper's figure's numbers of one run (kept half of the chains)."""
    pooled = result.theta.reshape(-1, DIM)
    return {
        "iterations_per_chain": iters,
        "mean_error": float(np.linalg.norm(pooled.mean(axis=0) - mean)),
        "acceptance": result.acceptance_rate,
        "clipped_ratio_fraction": float(np.mean(r_counts)) if r_counts else None,
        "clipped_gradient_fraction": float(np.mean(g_counts)) if g_counts else None,
    }


RUNS = {"dp_hmc": run_hmc, "penalty": run_penalty}


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(__doc__ or NAME, "ε ∈ {4, 10}, one repeat")
    parser.add_argument("--repeats", type=int, help="repeats per ε (default 5; the paper: 10)")
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    if args.repeats:
        setup = replace(setup, repeats=args.repeats)
    rows = []
    total = len(setup.epsilons) * setup.repeats * len(RUNS)
    with reporting.progress(total, NAME, not args.no_progress) as bar:
        for r in range(setup.repeats):
            model = PaperGauss(np.random.default_rng(args.seed + r))
            records = np.random.default_rng(args.seed + r + 1).multivariate_normal(
                model.true_mean, model.cov, size=N
            )
            for epsilon in setup.epsilons:
                for name, run in RUNS.items():
                    row = run(model, records, epsilon, args.seed + 100 * r)
                    rows.append({"algorithm": name, "epsilon": epsilon, "repeat": r, **row})
                    bar.update()
    keys = ("mean_error", "acceptance", "clipped_ratio_fraction", "clipped_gradient_fraction")
    table = reporting.over_repeats(rows, ("algorithm", "epsilon"), (*keys, "epsilon_spent"))
    print(
        reporting.headline(
            "Gaussian experiment (10-D, n = 100,000): mean ± sd over repeats",
            [
                {
                    **t,
                    "iterations": next(
                        r["iterations_per_chain"]
                        for r in rows
                        if r["algorithm"] == t["algorithm"] and r["epsilon"] == t["epsilon"]
                    ),
                }
                for t in table
            ],
            [
                ("algorithm", "algorithm"),
                ("epsilon", "ε"),
                ("iterations", "iterations/chain"),
                ("mean_error", "mean error"),
                ("acceptance", "acceptance"),
                ("clipped_ratio_fraction", "clipped r"),
                ("clipped_gradient_fraction", "clipped ∇"),
                ("epsilon_spent", "ε spent"),
            ],
        )
    )
    fig, axes = reporting.figure(1, 2, width=11.0)
    for name in RUNS:
        mine = [t for t in table if t["algorithm"] == name]
        eps = [t["epsilon"] for t in mine]
        errors = [t["mean_error"]["values"] for t in mine]
        reporting.errorbar(axes[0][0], eps, errors, label=name)
        reporting.errorbar(axes[0][1], eps, [t["acceptance"]["values"] for t in mine], label=name)
    axes[0][0].set(
        xlabel="ε (δ = 1e-6)", ylabel="‖mean − posterior mean‖", yscale="log", title="Mean error"
    )
    axes[0][1].set(xlabel="ε (δ = 1e-6)", ylabel="acceptance", title="Acceptance")
    axes[0][0].legend()
    settings = {
        "setup": setup.__dict__,
        "dp_hmc": HMC,
        "penalty": PENALTY,
        "n": N,
        "dim": DIM,
        "delta": DELTA,
        "chains": CHAINS,
        "seed": args.seed,
    }
    notes = [
        "Σ and the records are drawn with numpy, not the paper's JAX keys: the posterior's "
        "conditioning differs from the paper's",
        "dp_hmc asks L gradients per iteration plus one at the start (the paper: L + 1 per "
        "iteration); the runs are as long as the paper's, so epsilon_spent is below ε",
    ]
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=sys.argv[1:] if argv is None else argv,
        settings=settings,
        results={"runs": rows, "table": table},
        notes=notes,
        fig=fig,
    )
    print(f"wrote {json_path}\nwrote {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
