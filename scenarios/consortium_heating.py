"""How much energy a noisy gradient puts into a DP-HMC trajectory on the consortium's records
(scenarios/README.md, consortium, "Why").

    python scenarios/consortium_heating.py [--quick] [--out DIR] [--seed 0] [--no-progress]

Trajectories of L = 3 leapfrog steps start from independent draws of the reference
posterior's marginals (mean and sd per coordinate) with M⁻¹ the reference variances scaled so
the smallest is 1 and a step of 0.3 of the narrowest sd (ε_w = 0.3 in posterior sds); the
force is the pooled records' exact gradient (no clip) plus noise of sd g per coordinate, set
to 0 in the prior-only α and log τ as DP-HMC does (docs/design.md §2.9). Per g: the mean
energy error ΔH against the noise-free trajectories', beside (L − ½) ε_w² g² Σ sd_i²/2 (the
kicks' momentum variance — two half kicks and L − 1 full ones — summed over the coordinates
the likelihood touches, sd_i their reference sds), and the mean acceptance probability
min(1, e^{−ΔH}). g = 365 is s × gradient clip of consortium.py's dp_hmc at ε = 4.

Writes ``consortium_heating.json`` and ``consortium_heating.png``.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from fedpenalty import reporting
from fedpenalty.coordinator import dp_hmc
from fedpenalty.coordinator.adapt import MassAdaptation
from fedpenalty.errors import FedPenaltyError
from fedpenalty.extras import require

NAME = "consortium_heating"


@dataclass(frozen=True)
class Probe:
    noise: tuple[float, ...] = (0.0, 10.0, 30.0, 100.0, 365.0)  # g, nats per unit of θ
    trajectories: int = 400
    leapfrog: int = 3
    step: float = 0.3  # ε_w, in units of the narrowest posterior sd


FULL, QUICK = Probe(), Probe(trajectories=100)


def pooled(folder: Path) -> tuple[Any, np.ndarray]:
    """The consortium's model and its owners' records, pooled ``(N, p)``."""
    import consortium
    from consortium_model import GroupInterceptsRegression

    model = GroupInterceptsRegression(**{k: v for k, v in consortium.MODEL.items() if k != "name"})
    parts = []
    for path in consortium.owners_data(folder):
        with np.load(path) as owner:
            parts.append(np.column_stack([owner[c] for c in model.column_names]))
    return model, model.prepare_records(np.concatenate(parts))


def energy_errors(model, records, ref, probe: Probe, g: float, seed: int) -> np.ndarray:
    """ΔH ``(m,)`` of the trajectories that stayed inside Θ, at gradient noise sd ``g``, from
    the reference ``ref``'s marginals."""
    rng = np.random.default_rng(seed)
    exact = dp_hmc.pooled_gradient(model, records, np.inf, g, rng)
    grad = dp_hmc.without(exact, model.prior_only_coordinates)
    inv_mass = ref.sd**2 / ref.sd.min() ** 2
    theta = ref.mean + ref.sd * rng.standard_normal((probe.trajectories, model.dim))
    state = dp_hmc.init(theta, model, grad)
    state = replace(state, metric=replace(MassAdaptation.identity(model.dim), inv_mass=inv_mass))
    p0 = dp_hmc.momentum(rng.standard_normal(theta.shape), inv_mass)
    eps = np.full(len(theta), probe.step * ref.sd.min())
    t = dp_hmc.leapfrog(state, model, grad, p0, eps, probe.leapfrog)
    q, p, start, p_start = t.q[t.alive], t.p[t.alive], theta[t.alive], p0[t.alive]
    log_lik = model.log_lik(records, q).sum(axis=1) - model.log_lik(records, start).sum(axis=1)
    kinetic = dp_hmc.kinetic_energy(p, inv_mass) - dp_hmc.kinetic_energy(p_start, inv_mass)
    return kinetic - (model.log_prior(q) - model.log_prior(start) + log_lik)


def measure(model, records, probe: Probe, seed: int, bar) -> list[dict[str, float]]:
    """Per noise sd: mean ΔH, its increase over g = 0, the formula's and the acceptance."""
    ref = model.reference_posterior(records)
    lik = np.ones(model.dim, dtype=bool)
    lik[list(model.prior_only_coordinates)] = False
    spread = float(np.sum(ref.sd[lik] ** 2))
    rows, base = [], None
    for g in probe.noise:
        dh = energy_errors(model, records, ref, probe, g, seed)
        bar.update()
        base = float(dh.mean()) if base is None else base
        rows.append({
            "noise_sd": g,
            "mean_energy_error": float(dh.mean()),
            "increase": float(dh.mean()) - base,
            "formula": (probe.leapfrog - 0.5) * probe.step**2 * g * g * spread / 2,
            "acceptance": float(np.mean(np.minimum(1.0, np.exp(-dh)))),
            "trajectories": int(dh.size),
        })  # fmt: skip
    return rows


def plot(rows: list[dict]) -> Any:
    fig, axes = reporting.figure(1, 1, width=5.0, height=4.0)
    ax, noisy = axes[0, 0], [r for r in rows if r["noise_sd"] > 0]
    g = [r["noise_sd"] for r in noisy]
    ax.plot(g, [r["increase"] for r in noisy], "o-", label="measured ΔH − ΔH(g = 0)")
    ax.plot(g, [r["formula"] for r in noisy], "k--", label="(L − ½) ε_w² g² Σ sd²/2")
    ax.set(xscale="log", yscale="log", xlabel="gradient noise sd g", ylabel="energy error (nats)")
    ax.legend(fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = reporting.scenario_parser(__doc__ or NAME, "100 trajectories per noise level")
    args = parser.parse_args(argv)
    try:
        require("statsmodels", f"scenarios/{NAME}.py (statsmodels' RAND HIE records)")
    except FedPenaltyError as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # consortium, consortium_model
    probe = QUICK if args.quick else FULL
    with (
        tempfile.TemporaryDirectory() as tmp,
        reporting.progress(len(probe.noise), NAME, not args.no_progress) as bar,
    ):
        model, records = pooled(Path(tmp))
        rows = measure(model, records, probe, args.seed, bar)
    notes = ["trajectories start from the reference's marginals, not its joint law, so ΔH at "
             "g = 0 is not 0: the increase over it is what the noise adds"]  # fmt: skip
    reporting.write_report(
        args.out,
        NAME,
        argv=list(argv if argv is not None else sys.argv[1:]),
        settings=asdict(probe),
        results=rows,
        notes=notes,
        fig=plot(rows),
    )
    for r in rows:
        print(" ".join(f"{k} {reporting.cell(v)}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
