"""Wang, Fienberg & Smola (2015) and Li, Chen, Liu & Carin (2019), reproduced on real data:
Bayesian logistic regression on the Wisconsin breast-cancer records split across owners — test
accuracy and log predictive density against ε, and the admissible DP-SGLD step against ε.

    python scenarios/wang_logistic.py [--quick] [--out DIR] [--seed 0] [--repeats R]
                                      [--no-progress]

Data: scikit-learn's copy of the breast-cancer data (569 tumours; y = 1 benign), four
features (mean radius, mean texture, mean smoothness, mean concave points) standardised with
the training split's mean and sd (a preprocessing step that is not accounted, as in the
papers), divided by 4, with a constant 0.5 as intercept feature (d = 5; the model clips
‖x‖ ≤ 1). A fixed stratified 80/20 split gives 455 training and 114 test records; the
training records are split over 4 owners (10/20/30/40 %, a new split per repeat).

Methods, each calibrated to the per-owner target ε at δ = 1e-5 (replace-one), 2 chains ×
(1,000 warmup + 1,000 kept) iterations through ``fedpenalty simulate`` with in-process owners
(two chains, not four: at a fixed ε a DP-SGLD chain travels about η·T_chain ∝ 1/chains, since
the admissible step η falls like 1/answers):

* ``exact_mh`` — non-private (trusted curator);
* ``ops`` — 4 draws of the tempered posterior (Wang et al.'s ρ = ε/(4B) per draw at ε/4;
  tempered exact MH, trusted curator);
* ``hybrid`` — Wang et al.'s Algorithm 3: OPS at ε/2 starts the chains, DP-SGLD at ε/2;
* ``sgld_wang`` — DP-SGLD with Wang et al.'s noise multiplier and admissible step;
* ``sgld`` — DP-SGLD with the exact accountant (PLD; Li et al.): the noise multiplier for the
  planned answers and the step at which the owners' noise fits the Langevin noise;
* ``sgfs`` — DP-SGFS (docs/design.md §2.11) at sgld's noise multiplier (its answers are
  charged alike), F = C·I and the largest step at which the owners' noise fits the design
  noise 4C²/η;
* ``penalty`` — σ_k = 1 (s² = 4) and the proposal radius at which the planned answers are
  exactly (ε, δ) in the worst case;
* ``objpert`` — Wang et al.'s OBJPERT baseline: one objective-perturbation release at the full
  ε (pure ε, δ = 0; Chaudhuri et al.'s Alg. 2, Λ from the prior, raised by its rule), a
  CENTRAL-DP reference on the pooled records (trusted curator), its one "draw" the point
  estimate.

Prediction: the posterior predictive p(y = 1 | x) = mean over draws of sigmoid(xᵀθ); accuracy
at threshold ½ and the log predictive density (1/m) Σ log p(y_i | x_i) on the test records.
A chain that never leaves its data-independent start (θ ≈ 0) has an LPD of about log ½ = −0.69
and an accuracy set by the sign of its random start: read the LPD first.
Second panel (Li et al.'s Figure 1): the admissible DP-SGLD step against ε, Wang et al.'s
bound against the accountant's, for this scenario's q, answers, clip and owners.

Writes ``wang_logistic.json`` and ``wang_logistic.png`` (error bars ± one sd over repeats).
"""

from __future__ import annotations

import functools
import math
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from fedpenalty import reporting
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.errors import FedPenaltyError
from fedpenalty.extras import require
from fedpenalty.models import build_model
from fedpenalty.privacy import calibrate_sigma
from fedpenalty.privacy.wang import StepComparison, compare_admissible_steps

NAME = "wang_logistic"
FEATURES = ("mean radius", "mean texture", "mean smoothness", "mean concave points")
SCALE, INTERCEPT, SPLIT_SEED = 4.0, 0.5, 0
SHARES = (0.1, 0.2, 0.3, 0.4)
MODEL = {"name": "logistic", "dim": 5, "data_bound": 1.0, "theta_bound": 25.0, "prior_sd": 10.0}
DELTA, NEIGHBOUR = 1e-5, "replace_one"
SAMPLING_RATE, CLIP, MAX_SGLD_STEP = 0.1, 1.0, 1e-2
PENALTY_SIGMA, EXACT_RADIUS, OPS_CHAINS, OPS_DRAWS = 1.0, 1.5, 2, 2
METHODS = ("ops", "hybrid", "sgld_wang", "sgld", "penalty", "objpert", "sgfs")
LABELS = {"objpert": "objpert (central DP)"}


@dataclass(frozen=True)
class Setup:
    epsilons: tuple[float, ...]
    step_epsilons: tuple[float, ...]
    chains: int
    warmup: int
    iterations: int
    repeats: int


FULL = Setup((0.5, 1.0, 2.0, 4.0, 8.0), (0.25, 0.5, 1.0, 2.0, 4.0, 8.0), 2, 1000, 1000, 2)
QUICK = Setup((2.0,), (1.0, 2.0), 2, 300, 300, 1)


@dataclass(frozen=True)
class Data:
    """Training records per owner ``(n_k, 6)`` (x0..x4, y) as NPZ ``paths`` and the test
    records ``test`` ``(m, 6)``, prepared (clipped) by the model."""

    paths: list[str]
    test: np.ndarray
    n_train: int


def features(x: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    return np.column_stack([np.full(len(x), INTERCEPT), (x - mean) / sd / SCALE])


def owners_data(seed: int, folder: Path) -> Data:
    """The fixed train/test split, the training records split over the owners by ``seed``."""
    from sklearn.datasets import load_breast_cancer  # the [scenarios] extra (checked in main)
    from sklearn.model_selection import train_test_split

    raw = load_breast_cancer()
    cols = [list(raw.feature_names).index(f) for f in FEATURES]
    x_tr, x_te, y_tr, y_te = train_test_split(
        raw.data[:, cols], raw.target, test_size=0.2, random_state=SPLIT_SEED, stratify=raw.target
    )
    mean, sd = x_tr.mean(axis=0), x_tr.std(axis=0)
    model = build_model(MODEL)
    train = model.prepare_records(np.column_stack([features(x_tr, mean, sd), y_tr]))
    test = model.prepare_records(np.column_stack([features(x_te, mean, sd), y_te]))
    order = np.random.default_rng(seed).permutation(len(train))
    cuts = np.cumsum([round(s * len(train)) for s in SHARES])[:-1]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, part in enumerate(np.split(order, cuts)):
        path = folder / f"owner-{k}.npz"
        columns = {f"x{j}": train[part, j] for j in range(MODEL["dim"])}
        np.savez(path, **columns, y=train[part, -1])
        paths.append(str(path))
    return Data(paths, test, len(train))


def answers(setup: Setup) -> int:
    sampler = {"chains": setup.chains, "warmup": setup.warmup, "iterations": setup.iterations}
    return ALGORITHMS["sgld"].planned_answers(sampler)


@functools.cache
def steps(epsilon: float, planned: int) -> StepComparison:
    """Wang et al.'s and the accountant's noise multiplier and admissible step at ε."""
    return compare_admissible_steps(
        epsilon, DELTA, SAMPLING_RATE, planned, CLIP, owners=len(SHARES), neighbour=NEIGHBOUR
    )


def scenario(data: Data, setup: Setup, algorithm: str, seed: int) -> dict[str, dict[str, Any]]:
    return {
        "model": dict(MODEL),
        "data": {"paths": data.paths},
        "privacy": {"delta": DELTA, "neighbour": NEIGHBOUR},
        "sampler": {
            "algorithm": algorithm,
            "chains": setup.chains,
            "warmup": setup.warmup,
            "iterations": setup.iterations,
            "init_scale": 0.02,
        },
        "run": {"transport": "inprocess", "progress": False, "seed": seed},
    }


def gradient(raw: dict, epsilon: float, sigma: float, step: float) -> dict:
    # max_step limits MH radii only; gradient answers ignore it (it must exceed min_step)
    raw["privacy"].update(sigma=sigma, budget_epsilon=epsilon * 1.001, max_step=1.0)
    raw["sampler"].update(step=min(step, MAX_SGLD_STEP), sampling_rate=SAMPLING_RATE, clip=CLIP)
    return raw


def calibrate(method: str, raw: dict, epsilon: float, setup: Setup) -> dict:
    """``raw`` calibrated for ``method`` at the per-owner target ``epsilon``."""
    planned = answers(setup)
    if method == "sgld":
        c = steps(epsilon, planned)
        return gradient(raw, epsilon, c.accountant_noise_multiplier, c.accountant_step)
    if method == "sgld_wang":
        c = steps(epsilon, planned)
        return gradient(raw, epsilon, c.wang_noise_multiplier, c.wang_step)
    if method == "sgfs":  # design noise 4C²/η ≥ the owners' 2·K(σC/q)²
        sigma = steps(epsilon, planned).accountant_noise_multiplier
        step = 0.99 * 2.0 * SAMPLING_RATE**2 / (len(SHARES) * sigma**2)
        raw = gradient(raw, epsilon, sigma, step)
        raw["sampler"]["fisher_bound"] = CLIP
        return raw
    if method == "hybrid":  # the library calibrates its noise to ε/2; the step fits that noise
        raw = gradient(raw, epsilon, 1.0, steps(epsilon / 2, planned).accountant_step)
        raw["privacy"]["epsilon"] = epsilon
        return raw
    if method == "ops":
        raw["privacy"].update(epsilon=epsilon)
        raw["sampler"].update(chains=OPS_CHAINS, iterations=OPS_DRAWS, warmup=0)
        return raw
    if method == "objpert":  # one release at the full ε: its one draw is the point estimate
        raw["privacy"].update(epsilon=epsilon)
        raw["sampler"].update(chains=1, iterations=1, warmup=0)
        return raw
    model = build_model(MODEL)  # penalty: radius at which the planned answers are (ε, δ)
    per_unit = calibrate_sigma(
        epsilon, DELTA, planned, float(model.log_ratio_sensitivity(1.0, NEIGHBOUR))
    )
    raw["privacy"].update(sigma=PENALTY_SIGMA, budget_epsilon=epsilon * 1.001)
    raw["sampler"]["step"] = PENALTY_SIGMA / per_unit
    return raw


def predictive(theta: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Accuracy and log predictive density of the draws ``theta`` ``(C, T, d)`` on ``test``."""
    model = build_model(MODEL)
    draws = theta.reshape(-1, theta.shape[-1])
    log_lik = model.log_lik(test, draws)  # (S, m)
    lpd = special.logsumexp(log_lik, axis=0) - math.log(len(draws))
    p1 = special.expit(test[:, :-1] @ draws.T).mean(axis=1)
    return {"accuracy": float(np.mean((p1 > 0.5) == (test[:, -1] > 0.5))), "lpd": float(lpd.mean())}


def measure(sim: reporting.Simulated, test: np.ndarray) -> dict[str, Any]:
    d, p = sim.result.diagnostics, sim.result.privacy
    eps = [o["epsilon"] for o in p.get("owners", [])]
    return {
        **predictive(sim.result.theta, test),
        "epsilon_per_owner": eps,
        "epsilon_max": max(eps) if eps else None,
        "noise_multiplier": p["owners"][0].get("noise_multiplier") if eps else None,
        "step": sim.scenario["sampler"]["step"],
        "acceptance": d.get("acceptance_rate"),
        "ess_bulk_min": min(d["ess_bulk"]) if "ess_bulk" in d else None,  # objpert: one draw
        "rhat_max": max(d["rhat"]) if d.get("rhat") else None,
        "mean_error_in_sd_max": max(d["error"]["mean_in_sd"]) if "error" in d else None,
        "excess_noise_ratio": d.get("excess_noise_ratio"),
        "seconds": sim.seconds,
        "stopped_attempts": list(sim.stopped),
    }


def run_repeat(setup: Setup, repeat: int, seed: int, folder: Path, bar) -> list[dict]:
    data = owners_data(seed, folder / f"data-{repeat}")
    raw = scenario(data, setup, "exact_mh", seed)
    raw["sampler"]["step"] = EXACT_RADIUS
    sim = reporting.simulate(raw, folder / f"{repeat}-exact")
    bar.update()
    rows = [
        {
            "method": "exact_mh",
            "repeat": repeat,
            "target_epsilon": None,
            **measure(sim, data.test),
            "scenario": sim.scenario.sections,
        }
    ]
    for method in METHODS:
        algorithm = "sgld" if method == "sgld_wang" else method
        for eps in setup.epsilons:
            raw = calibrate(method, scenario(data, setup, algorithm, seed), eps, setup)
            sim = reporting.simulate(raw, folder / f"{repeat}-{method}-{eps:g}")
            bar.update()
            rows.append(
                {
                    "method": method,
                    "repeat": repeat,
                    "target_epsilon": eps,
                    **measure(sim, data.test),
                    "scenario": sim.scenario.sections,
                }
            )
    return rows


def step_curve(setup: Setup, bar) -> list[dict]:
    """Li et al.'s Figure 1: the admissible step against ε, Wang et al.'s and the accountant's."""
    rows = []
    for eps in setup.step_epsilons:
        c = steps(eps, answers(setup))
        rows.append(
            {
                "epsilon": eps,
                "wang_step": c.wang_step,
                "accountant_step": c.accountant_step,
                "gain": c.gain,
                "wang_noise_multiplier": c.wang_noise_multiplier,
                "accountant_noise_multiplier": c.accountant_noise_multiplier,
                "wang_exact_epsilon": c.wang_exact_epsilon,
            }
        )
        bar.update()
    return rows


def plot(rows: list[dict], curve: list[dict], setup: Setup) -> Any:
    fig, axes = reporting.figure(1, 3, width=5.2, height=4.2)
    eps = setup.epsilons
    exact = [r for r in rows if r["method"] == "exact_mh"]
    for ax, key, label in (
        (axes[0, 0], "accuracy", "test accuracy"),
        (axes[0, 1], "lpd", "log predictive density per test record"),
    ):
        for m in METHODS:
            reporting.errorbar(
                ax,
                eps,
                [
                    [r[key] for r in rows if r["method"] == m and r["target_epsilon"] == e]
                    for e in eps
                ],
                label=LABELS.get(m, m),
            )
        ax.axhline(
            np.mean([r[key] for r in exact]),
            color="k",
            ls="--",
            lw=1,
            label="exact_mh (non-private)",
        )
        reporting.log_x(ax, eps)
        ax.set(xlabel="target ε per owner (δ = 1e-5)", ylabel=label)
    axes[0, 0].legend(fontsize=8)
    axes[0, 0].set_title("breast cancer, 4 owners, d = 5")
    ax = axes[0, 2]
    e = [r["epsilon"] for r in curve]
    ax.plot(e, [r["accountant_step"] for r in curve], "o-", label="exact accountant (PLD)")
    ax.plot(e, [r["wang_step"] for r in curve], "s-", label="Wang et al. (Thm 4)")
    reporting.log_x(ax, e)
    ax.set(
        yscale="log",
        xlabel="ε per owner (δ = 1e-5)",
        ylabel="admissible SGLD step η",
        title="Li et al. Fig. 1: admissible step",
    )
    ax.legend(fontsize=8)
    return fig


def summary(rows: list[dict], setup: Setup) -> list[dict]:
    out = []
    for m in ("exact_mh", *METHODS):
        for eps in [None] if m == "exact_mh" else list(setup.epsilons):
            mine = [r for r in rows if r["method"] == m and r["target_epsilon"] == eps]
            out.append(
                {
                    "method": LABELS.get(m, m),
                    "target_epsilon": eps,
                    **{
                        k: reporting.spread(r[k] for r in mine)
                        for k in ("accuracy", "lpd", "epsilon_max", "rhat_max")
                    },
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(
        __doc__ or NAME, "ε = 2 (steps at ε ∈ {1, 2}), 2 chains × 600 steps, 1 repeat"
    )
    parser.add_argument("--repeats", type=int, help="repeats (seeds seed, seed+1, …)")
    args = parser.parse_args(argv)
    try:
        require("sklearn", f"scenarios/{NAME}.py (scikit-learn's breast-cancer records)")
    except FedPenaltyError as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    setup = QUICK if args.quick else FULL
    if args.repeats:
        setup = replace(setup, repeats=args.repeats)
    runs = setup.repeats * (1 + len(METHODS) * len(setup.epsilons)) + len(setup.step_epsilons)
    rows: list[dict] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(runs, NAME, not args.no_progress) as bar,
    ):
        curve = step_curve(setup, bar)
        for repeat in range(setup.repeats):
            rows += run_repeat(setup, repeat, args.seed + repeat, Path(tmp), bar)
    settings = {
        "setup": setup.__dict__,
        "features": FEATURES,
        "feature_scale": SCALE,
        "intercept_feature": INTERCEPT,
        "split_seed": SPLIT_SEED,
        "owner_shares": SHARES,
        "model": MODEL,
        "delta": DELTA,
        "neighbour": NEIGHBOUR,
        "sampling_rate": SAMPLING_RATE,
        "clip": CLIP,
        "max_sgld_step": MAX_SGLD_STEP,
        "penalty_sigma": PENALTY_SIGMA,
        "exact_radius": EXACT_RADIUS,
        "ops_draws": OPS_CHAINS * OPS_DRAWS,
        "gradient_answers_per_owner": answers(setup),
        "seeds": [args.seed + r for r in range(setup.repeats)],
    }
    notes = [
        "x axis: the per-owner target; epsilon_per_owner is each owner's ledger ε (hybrid: OPS "
        "part + ledger; sgld_wang spends far less than its target: Wang et al.'s calibration is "
        "loose)",
        "features standardised with the training split's mean and sd: not accounted",
        "error bars: ± one sd over repeats (new owner split, noise and chains per repeat; fixed "
        "test set)",
    ]
    results = {"summary": summary(rows, setup), "step_curve": curve, "runs": rows}
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results=results,
        notes=notes,
        fig=plot(rows, curve, setup),
    )
    print(headlines(results))
    print(f"wrote {json_path} and {png_path}")
    return 0


def headlines(results: dict[str, Any]) -> str:
    """Test accuracy and LPD per method and target (mean ± sd over repeats), and Li et al.'s
    admissible steps, as tables."""
    return "\n".join(
        [
            reporting.headline(
                "Test accuracy and log predictive density per method and per-owner target ε "
                "(ledger ε of the owner that spent most)",
                results["summary"],
                [
                    ("method", "method"),
                    ("target_epsilon", "target ε"),
                    ("accuracy", "accuracy"),
                    ("lpd", "LPD"),
                    ("epsilon_max", "ledger ε"),
                    ("rhat_max", "R-hat (max)"),
                ],
            ),
            reporting.headline(
                "Li et al. Fig. 1: the DP-SGLD step each calibration admits",
                results["step_curve"],
                [
                    ("epsilon", "ε"),
                    ("wang_step", "Wang et al. η"),
                    ("accountant_step", "accountant η"),
                    ("gain", "gain"),
                    ("wang_exact_epsilon", "Wang's noise really spends ε"),
                ],
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
