"""Foulds, Geumlek, Welling & Chaudhuri (2016) §4–5 reproduced on SYNTHETIC data of the Iraq war
logs' shape (the war-log data is not available): private Gibbs from one Laplace release of the
owners' statistics, against the exponential-mechanism view (OPS), by held-out log-likelihood.

    python scenarios/private_gibbs.py [--quick] [--out DIR] [--seed 0] [--no-progress]

Data: 7 regions × 72 months = 504 groups (the paper's time step × region pairs), 390,000
records (≈ the Iraq logs) split at random among 4 owners, each with F = 5 categorical
features of V = 8 values (the paper's type, category and three binned casualty counts, padded
to a common V), drawn from a 3-class latent-class model whose class per region switches once
(a "surge"). The model fitted is the latent-class model of docs/design.md §2.10 (a class per
group, naive-Bayes emissions) with K = 10 classes, as the paper's prediction experiment — its
HMM's Markov chain between months is not modelled. 10 % of the groups are held out per split.

Methods, all 200 Gibbs iterations with the first 100 burn-in (the paper's):

* ``non_private``: Gibbs on the exact counts; test log-likelihood averaged over the kept draws;
* ``laplace``: each owner releases its per-group counts ONCE with exact discrete Laplace noise
  on the lattice (owner/noise/laplace.py; L1 sensitivity 2F under replace-one, scale chosen so
  that the pure ε with its rounding term is the target), the coordinator runs Gibbs on the sum
  (negative counts set to 0); averaged over the kept draws. Four owners each add noise: the sum
  carries 4 times the variance of the paper's single curator;
* ``ops``: Gibbs at temperature T = 2Δ/ε on the exact counts, emissions truncated at
  a₀ = 1/(100V) (the paper's M = 100); the final draw only. Its ε holds only if the chain has
  converged; ``ops_gibbs_worst_epsilon`` is what the whole chain costs per owner seen as the
  exponential mechanism (eq. 19, every update), which the paper quotes as ≤ 400ε.

The Laplace ε is what each owner's own ledger reports (owner/ledger.py, in memory): every
release is charged there as one pure-ε release of the ``laplace_stats`` kind (docs/design.md
§2.10, "The Laplace release"), (Δ₁ + γw)/b′ as the owner computes it, and read back through its
accountant. OPS's figures are its calibrations composed by the owners' accountant class
(privacy/accountant.py): no owner answers an OPS chain.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import special

from fedpenalty import reporting
from fedpenalty.common import SpendReport
from fedpenalty.coordinator import latent_class_gibbs as lc
from fedpenalty.kinds import KINDS
from fedpenalty.owner.ledger import Charge, Ledger, Opening
from fedpenalty.owner.noise.laplace import laplace_lattice_release, laplace_release_epsilon
from fedpenalty.owner.noise.lattice import LATTICE_BITS
from fedpenalty.owner.noise.sources import NoiseKey, word_source
from fedpenalty.privacy.accountant import OwnerAccountant

NAME = "private_gibbs"
NEIGHBOUR, DELTA, OWNERS, TRUE_CLASSES, FEATURES, VALUES = "replace_one", 1e-5, 4, 3, 5, 8
VARIANTS = ("naive_bayes", "latent_class")


@dataclass(frozen=True)
class Setup:
    regions: int
    months: int
    records: int
    classes: int
    iterations: int
    burn_in: int
    splits: int
    epsilons: tuple[float, ...]


FULL = Setup(7, 72, 390_000, 10, 200, 100, 3, (0.1, 0.3, 1.0, 3.0, 10.0))
QUICK = Setup(7, 12, 30_000, 4, 60, 30, 1, (1.0, 10.0))


def synthetic(setup: Setup, rng: np.random.Generator) -> np.ndarray:
    """Records ``(n, 1 + F)``: group (region·months + month), then F feature values. Each
    region is in class 0 until its surge month, class 1 after, with 15 % of months in class 2;
    group sizes vary (Gamma(2) weights)."""
    groups = setup.regions * setup.months
    surge = rng.integers(setup.months // 3, 2 * setup.months // 3, size=setup.regions)
    month = np.arange(groups) % setup.months
    z = np.where(month < surge[np.arange(groups) // setup.months], 0, 1)
    z = np.where(rng.uniform(size=groups) < 0.15, 2, z)
    phi = rng.dirichlet(np.full(VALUES, 0.5), size=(TRUE_CLASSES, FEATURES))
    weights = rng.gamma(2.0, size=groups)
    g = rng.choice(groups, size=setup.records, p=weights / weights.sum())
    u = rng.uniform(size=(setup.records, FEATURES, 1))
    x = (np.cumsum(phi[z[g]], axis=2) < u).sum(axis=2).clip(max=VALUES - 1)
    return np.column_stack([g, x])


def test_log_lik(state: lc.LatentState, counts: np.ndarray) -> float:
    """Mean over chains of the held-out log-likelihood per record, z_g summed out:
    Σ_g log Σ_k π_k Π φ_kfv^{n[g,f,v]} / Σ n / F."""
    logp = np.log(state.pi)[:, None, :] + np.einsum("gfv,ckfv->cgk", counts, np.log(state.phi))
    per_chain = special.logsumexp(logp, axis=2).sum(axis=1)
    return float(per_chain.mean() / (counts.sum() / FEATURES))


def run_chain(
    rng: np.random.Generator,
    counts: np.ndarray,
    test: np.ndarray,
    spec: lc.LatentClassSpec,
    setup: Setup,
    temperature: float = 1.0,
) -> tuple[float, float]:
    """(test log-lik averaged over the kept draws, test log-lik of the final draw)."""
    state = lc.init(rng, 1, spec)
    kept = []
    for t in range(setup.iterations):
        state = lc.step(rng, state, counts, spec, temperature)
        if t >= setup.burn_in:
            kept.append(test_log_lik(state, test))
    return float(np.mean(kept)), kept[-1]


def laplace_counts(
    owner_counts: np.ndarray, epsilon: float, spec: lc.LatentClassSpec, seed: int
) -> tuple[np.ndarray, dict[str, float]]:
    """Σ_k of each owner's one lattice Laplace release of its counts ``(K, G, F, V)``, at the
    scale b whose pure ε with the rounding term, (Δ₁ + γw)/b', is at most ``epsilon``."""
    delta1 = lc.count_sensitivity(spec, NEIGHBOUR, 1)
    width = int(np.prod(owner_counts.shape[1:]))
    gamma = 2.0 ** (math.floor(math.log2(delta1 / epsilon)) - LATTICE_BITS)
    scale = (delta1 + gamma * width) / epsilon
    spent = laplace_release_epsilon(delta1, scale, gamma, width)
    keys = [NoiseKey.derive(seed, f"owner-{k}") for k in range(len(owner_counts))]
    released = laplace_lattice_release(
        word_source(keys, simulation=True),
        f"split-{seed}-eps-{epsilon}",
        "private_gibbs_laplace",
        owner_counts.reshape(len(owner_counts), width),
        np.full(len(owner_counts), scale),
        gamma,
    )
    owner_eps = ledger_epsilon(released, spent, f"split-{seed}-eps-{epsilon}")
    info = {"scale_b": scale, "gamma": gamma, "owner_epsilon": max(owner_eps)}
    return released.sum(axis=0).reshape(owner_counts.shape[1:]), info


def ledger_epsilon(released: np.ndarray, spent: float, session: str) -> list[float]:
    """Each owner's ε at δ as its own ledger reports it after charging its one release
    ``released`` ``(K, w)`` as a ``laplace_stats`` answer of pure ε ``spent``: a session of
    one planned answer, one charge (the answers stored with it), read back."""
    owners = [f"owner-{k}" for k in range(len(released))]
    kind, k = KINDS["laplace_stats"], len(owners)
    ledger = Ledger(":memory:")
    try:
        ledger.open_sessions([Opening(o) for o in owners], session, kind.ledger_name, 1)
        digest = hashlib.sha256(kind.digest_tag).digest()
        zero = np.zeros(1, dtype=np.int64)
        every, limits = np.ones((k, 1), dtype=bool), np.full(k, np.inf)
        payloads = released[:, None, :]
        charge = Charge(
            session,
            owners,
            zero,
            zero,
            [digest],
            payloads,
            None,
            every,
            limits,
            limits,
            np.full(k, DELTA),
            pure=np.full(k, spent),
        )
        ledger.charge(charge)
        reports = ledger.reports(owners, None)
    finally:
        ledger.close()
    return [SpendReport.of(r.total, r.sampled, DELTA, NEIGHBOUR).epsilon for r in reports]


def variant_rows(
    setup: Setup,
    spec: lc.LatentClassSpec,
    owner_counts: np.ndarray,
    test: np.ndarray,
    rng: np.random.Generator,
    key: int,
) -> list[dict]:
    """Every method at every ε for one model (``spec``) on the owners' training counts
    ``(K, G', F, V)``, scored on the held-out counts ``test``."""
    mean, _ = run_chain(rng, owner_counts.sum(axis=0), test, spec, setup)
    rows = [{"method": "non_private", "epsilon": None, "test_log_lik": mean}]
    truncated = replace(spec, floor=1 / (100 * VALUES))
    for eps in setup.epsilons:
        noisy, info = laplace_counts(owner_counts, eps, spec, key)
        mean, _ = run_chain(rng, noisy, test, spec, setup)
        rows.append({"method": "laplace", "epsilon": eps, "test_log_lik": mean, **info})
        temperature = lc.ops_temperature(truncated, NEIGHBOUR, eps)
        _, last = run_chain(rng, owner_counts.sum(axis=0), test, truncated, setup, temperature)
        worst = OwnerAccountant(NEIGHBOUR).compose(
            *lc.gibbs_events(truncated, NEIGHBOUR, temperature, setup.iterations, 1)
        )
        rows.append(
            {
                "method": "ops",
                "epsilon": eps,
                "test_log_lik": last,
                "ops_temperature": temperature,
                "ops_gibbs_worst_epsilon": worst.epsilon(DELTA),
            }
        )
    return rows


def one_split(setup: Setup, records: np.ndarray, split: int, seed: int, bar: Any) -> list[dict]:
    """Both models (``VARIANTS``) on one train/test split of the groups: the latent-class model
    on per-group counts, and naive Bayes (one class) on corpus-wide counts."""
    groups = setup.regions * setup.months
    rng = np.random.default_rng([seed, split])
    held = rng.uniform(size=groups) < 0.1
    spec = lc.LatentClassSpec(groups, setup.classes, FEATURES, VALUES, alpha=1.0, beta=1.0)
    owner_of = rng.integers(OWNERS, size=len(records))
    owner_counts = np.stack([lc.group_counts(records[owner_of == k], spec) for k in range(OWNERS)])
    owner_counts[:, held] = 0.0  # the held-out groups are not in anyone's training data
    test = lc.group_counts(records, spec) * held[:, None, None]
    corpus = owner_counts.sum(axis=1, keepdims=True)
    nb = lc.LatentClassSpec(1, 1, FEATURES, VALUES, alpha=1.0, beta=1.0)
    rows = []
    for variant, model, counts in (
        ("latent_class", spec, owner_counts),
        ("naive_bayes", nb, corpus),
    ):
        key = seed * 1000 + split * 10 + len(rows)
        rows += [
            {"variant": variant, "split": split, **r}
            for r in variant_rows(setup, model, counts, test, rng, key)
        ]
        bar.update(1)
    return rows


def summary(rows: list[dict], setup: Setup) -> dict[str, Any]:
    """Per model, method and ε: the mean test log-likelihood and its mean difference to the
    non-private chain of the same split (``gap``) ± SE over splits (paired: the held-out groups
    differ between splits, which moves every method alike); OPS's whole-chain ε over its ε."""
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        base = {r["split"]: r["test_log_lik"] for r in mine if r["method"] == "non_private"}
        v: dict[str, Any] = {"non_private": float(np.mean(list(base.values())))}
        for m in ("laplace", "ops"):
            v[m] = {}
            for eps in setup.epsilons:
                at = [r for r in mine if r["method"] == m and r["epsilon"] == eps]
                gaps = [r["test_log_lik"] - base[r["split"]] for r in at]
                se = float(np.std(gaps, ddof=1) / math.sqrt(len(gaps))) if len(gaps) > 1 else None
                mean = float(np.mean([r["test_log_lik"] for r in at]))
                v[m][str(eps)] = {"mean": mean, "gap": float(np.mean(gaps)), "gap_se": se}
        worst = [r["ops_gibbs_worst_epsilon"] / r["epsilon"] for r in mine if r["method"] == "ops"]
        v["ops_gibbs_worst_over_epsilon"] = float(np.mean(worst))
        out[variant] = v
    return out


def plot(s: dict[str, Any], setup: Setup) -> Any:
    fig, axes = reporting.figure(1, 2, width=6.0, height=4.5)
    eps = list(setup.epsilons)
    for ax, variant in zip(axes[0], VARIANTS):
        v = s[variant]
        for m, marker in (("laplace", "o"), ("ops", "s")):
            gaps = [v[m][str(e)]["gap"] for e in eps]
            ses = [v[m][str(e)]["gap_se"] or 0.0 for e in eps]
            ax.errorbar(eps, gaps, yerr=ses, marker=marker, capsize=3, label=m)
        ax.axhline(0.0, color="k", ls="--", label=f"non-private ({v['non_private']:.3f})")
        ax.set(
            xscale="log",
            xlabel="ε per owner (pure)",
            ylabel="held-out log-lik per record − non-private",
            title=f"{variant.replace('_', ' ')} (synthetic war-log shape)",
        )
        ax.legend(fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(
        __doc__ or NAME, "84 groups, 30,000 records, K = 4, 60 iterations, ε ∈ {1, 10}, 1 split"
    )
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    records = synthetic(setup, np.random.default_rng(args.seed))
    runs = setup.splits * len(VARIANTS)
    with reporting.progress(runs, NAME, not args.no_progress) as bar:
        rows = [
            r for s in range(setup.splits) for r in one_split(setup, records, s, args.seed, bar)
        ]
    s = summary(rows, setup)
    settings = {
        "setup": setup.__dict__,
        "owners": OWNERS,
        "features": FEATURES,
        "values": VALUES,
        "true_classes": TRUE_CLASSES,
        "neighbour": NEIGHBOUR,
        "ops_a0": 1 / (100 * VALUES),
        "seed": args.seed,
        "data": "synthetic, of the Iraq war logs' shape (the real data is not available)",
    }
    notes = [
        "synthetic data: the war-log data is not available",
        "laplace: four owners each add noise (the paper's single curator adds it once)",
        "ops: its ε holds only if the chain converged; the whole chain costs "
        "ops_gibbs_worst_epsilon seen as the exponential mechanism (eq. 19)",
        "laplace ε: each owner's own ledger (in memory) charges its one release as a pure-ε "
        "laplace_stats answer and reports it (owner_epsilon: the largest over owners); ops ε: "
        "calibrations composed by OwnerAccountant, no owner answers an OPS chain",
    ]
    json_path, png_path = reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=settings,
        results={"runs": rows, "summary": s},
        notes=notes,
        fig=plot(s, setup),
    )
    print(headline(s, setup))
    print(f"wrote {json_path} and {png_path}")
    return 0


def headline(s: dict[str, Any], setup: Setup) -> str:
    parts = []
    for variant in VARIANTS:
        v = s[variant]
        rows = [
            {
                "epsilon": e,
                "laplace": f"{v['laplace'][str(e)]['gap']:+.4f}",
                "ops": f"{v['ops'][str(e)]['gap']:+.4f}",
            }
            for e in setup.epsilons
        ]
        title = (
            f"{variant}: held-out log-likelihood per record minus the non-private chain's "
            f"({v['non_private']:.4f}); OPS's whole chain as the exponential mechanism: "
            f"{v['ops_gibbs_worst_over_epsilon']:.0f}·ε"
        )
        columns = [("epsilon", "ε"), ("laplace", "laplace"), ("ops", "ops")]
        parts.append(reporting.headline(title, rows, columns))
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
