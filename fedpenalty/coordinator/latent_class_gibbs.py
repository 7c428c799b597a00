"""Private Gibbs for a latent-class model whose statistics are per-group counts (docs/design.md
§2.10, "A latent-class model").

The model (Foulds et al. §5's war-log model without its Markov chain between time steps): public
groups g = 0 … G−1 (e.g. region × month), each with a latent class z_g ∈ {0 … K−1},
π ~ Dir(α·1_K), z_g | π ~ Cat(π); every record r of group g has F categorical features
x_rf ∈ {0 … V−1} drawn independently given the class (naive Bayes), x_rf | z_g ~ Cat(φ_{z_g f}),
φ_kf ~ Dir(β·1_V), optionally truncated to φ_kfv ≥ a₀ (the box the exponential-mechanism
accounting needs).

The data enter only through the counts n[g, f, v] = #{records of group g with x_f = v}, a sum
over owners of each owner's counts (``group_counts``): the latent variables belong to groups,
not records, so no owner samples anything per record; each owner releases its counts once
with noise (scenarios/private_gibbs.py: the lattice Laplace release of owner/noise/laplace.py)
and the coordinator runs every Gibbs update on Σ_k n̂_k
(negative noisy counts are set to 0). With exact counts it is exact Gibbs for the posterior.

``temperature`` T ≥ 1 samples p(π, φ, z | n)^{1/T} instead (the exponential mechanism's view,
eq. 14 and 19 of the paper: every factor, prior included, raised to 1/T), whose per-update ε is
``update_epsilons``. Shapes: C chains, counts ``(G, F, V)``, z ``(C, G)``, π ``(C, K)``,
φ ``(C, K, F, V)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from ..models.base import Neighbour, check_neighbour
from ..privacy import events

#: Rejection draws of a truncated Dirichlet before a row falls back to pairwise moves from its
#: current value (``pairwise_moves``); without a current value (the prior), a ValueError.
MAX_REJECTIONS = 20


@dataclass(frozen=True)
class LatentClassSpec:
    """K classes, F features of V values each, over G groups; Dirichlet concentrations α (of
    π) and β (of each φ_kf); truncation a₀ ∈ [0, 1/V) of every φ_kfv (0: none)."""

    groups: int
    classes: int
    features: int
    values: int
    alpha: float = 1.0
    beta: float = 1.0
    floor: float = 0.0

    def __post_init__(self) -> None:
        for name in ("groups", "classes", "features", "values"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not (self.alpha > 0 and self.beta > 0 and 0 <= self.floor < 1 / self.values):
            raise ValueError("need alpha > 0, beta > 0 and 0 <= floor < 1/values")


@dataclass(frozen=True)
class LatentState:
    """The chains' classes ``z`` ``(C, G)``, π ``(C, K)`` and φ ``(C, K, F, V)``."""

    z: np.ndarray
    pi: np.ndarray
    phi: np.ndarray


def group_counts(records: np.ndarray, spec: LatentClassSpec) -> np.ndarray:
    """One owner's statistic: n[g, f, v] ``(G, F, V)`` from its records ``(n, 1 + F)`` int
    (column 0 the group, then the F feature values). A record adds one count per feature, so
    the L1 sensitivity is F (add/remove) or 2F (replace-one) and the L2 one √F or √(2F)."""
    rec = np.asarray(records)
    if rec.ndim != 2 or rec.shape[1] != 1 + spec.features:
        raise ValueError(f"records must be (n, {1 + spec.features}), got {rec.shape}")
    g, x = rec[:, 0], rec[:, 1:]
    if rec.size and (
        g.min() < 0 or g.max() >= spec.groups or x.min() < 0 or x.max() >= spec.values
    ):
        raise ValueError("a record's group or feature value is out of range")
    counts = np.zeros((spec.groups, spec.features, spec.values))
    f = np.broadcast_to(np.arange(spec.features), x.shape)
    np.add.at(counts, (np.broadcast_to(g[:, None], x.shape), f, x), 1.0)
    return counts


def count_sensitivity(spec: LatentClassSpec, neighbour: Neighbour, norm: int) -> float:
    """Sensitivity of Σ_records counts in L``norm`` (1 or 2): one record moves F counts by one
    (add/remove), or F down and F up (replace-one)."""
    check_neighbour(neighbour)
    moved = spec.features * (2 if neighbour == "replace_one" else 1)
    return float(moved) if norm == 1 else math.sqrt(moved)


def dirichlet(
    rng: np.random.Generator, conc: np.ndarray, floor: float, current: np.ndarray | None = None
) -> np.ndarray:
    """Dirichlet(conc) along the last axis truncated to every component ≥ ``floor``: exact
    draws by rejection; a row that keeps rejecting (a component whose truncated mass is tiny, as
    at OPS's temperatures) instead takes ``pairwise_moves`` from its ``current`` value. The
    failure does not depend on the current value, so the kernel is a state-independent mixture
    of two kernels that each leave the truncated law invariant."""
    g = rng.gamma(conc)
    out = g / g.sum(axis=-1, keepdims=True)
    for _ in range(MAX_REJECTIONS):
        bad = (out < floor).any(axis=-1)
        if not bad.any():
            return out
        g = rng.gamma(conc[bad])
        out[bad] = g / g.sum(axis=-1, keepdims=True)
    if current is None:
        raise ValueError(f"a Dirichlet truncated at {floor} kept rejecting: lower the floor")
    bad = (out < floor).any(axis=-1)
    out[bad] = pairwise_moves(rng, current[bad], conc[bad], floor)
    return out


def pairwise_moves(
    rng: np.random.Generator, phi: np.ndarray, conc: np.ndarray, floor: float
) -> np.ndarray:
    """One Gibbs pass over the pairs (i, i + 1 mod V) of rows ``phi`` ``(N, V)`` (each ≥
    ``floor``) for the truncated Dirichlet(conc): with s = φ_i + φ_j fixed, φ_i/s ~
    Beta(a_i, a_j) truncated to [floor/s, 1 − floor/s], drawn by inverting the CDF."""
    phi = phi.copy()
    v = phi.shape[-1]
    for i in range(v):
        j = (i + 1) % v
        s = phi[:, i] + phi[:, j]
        lo, hi = floor / s, 1.0 - floor / s
        a, b = conc[:, i], conc[:, j]
        p_lo, p_hi = special.betainc(a, b, lo), special.betainc(a, b, hi)
        u = special.betaincinv(a, b, p_lo + rng.uniform(size=len(s)) * (p_hi - p_lo))
        u = np.clip(u, lo, hi)
        phi[:, i], phi[:, j] = u * s, (1.0 - u) * s
    return phi


def tempered(conc: np.ndarray, temperature: float) -> np.ndarray:
    """The Dirichlet whose density is Dir(conc)^{1/T} normalised: (conc − 1)/T + 1."""
    return (conc - 1.0) / temperature + 1.0


def draw_params(
    rng: np.random.Generator,
    z: np.ndarray,
    counts: np.ndarray,
    spec: LatentClassSpec,
    temperature: float = 1.0,
    phi_now: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """π | z ~ Dir(α + m), m_k = #{g: z_g = k}, and φ_kf | z, n ~ Dir(β + Σ_{g: z_g=k} n[g, f])
    (truncated at a₀; ``phi_now`` the current φ for ``dirichlet``'s fallback), each tempered by
    ``temperature``: (π ``(C, K)``, φ ``(C, K, F, V)``)."""
    onehot = (z[:, :, None] == np.arange(spec.classes)).astype(float)  # (C, G, K)
    m = onehot.sum(axis=1)
    pi = dirichlet(rng, tempered(spec.alpha + m, temperature), 0.0)
    by_class = np.einsum("cgk,gfv->ckfv", onehot, counts)
    conc = tempered(spec.beta + by_class, temperature)
    v = spec.values
    now = None if phi_now is None else phi_now.reshape(-1, v)
    phi = dirichlet(rng, conc.reshape(-1, v), spec.floor, now).reshape(conc.shape)
    return pi, phi


def draw_classes(
    rng: np.random.Generator,
    pi: np.ndarray,
    phi: np.ndarray,
    counts: np.ndarray,
    temperature: float = 1.0,
) -> np.ndarray:
    """z_g | π, φ, n: P(z_g = k) ∝ (π_k Π_{f,v} φ_kfv^{n[g,f,v]})^{1/T}, every group at once
    (given π and φ the groups are independent): ``(C, G)``."""
    logp = np.log(pi)[:, None, :] + np.einsum("gfv,ckfv->cgk", counts, np.log(phi))
    logp = logp / temperature
    prob = np.exp(logp - special.logsumexp(logp, axis=2, keepdims=True))
    u = rng.uniform(size=prob.shape[:2])[..., None]
    return np.minimum((prob.cumsum(axis=2) < u).sum(axis=2), prob.shape[2] - 1)


def init(rng: np.random.Generator, chains: int, spec: LatentClassSpec) -> LatentState:
    """Classes drawn uniformly; π and φ from the prior (truncated)."""
    z = rng.integers(spec.classes, size=(chains, spec.groups))
    pi = dirichlet(rng, np.full((chains, spec.classes), spec.alpha), 0.0)
    phi = dirichlet(
        rng, np.full((chains, spec.classes, spec.features, spec.values), spec.beta), spec.floor
    )
    return LatentState(z, pi, phi)


def step(
    rng: np.random.Generator,
    state: LatentState,
    counts: np.ndarray,
    spec: LatentClassSpec,
    temperature: float = 1.0,
) -> LatentState:
    """One Gibbs iteration of every chain on the (noisy) summed counts ``(G, F, V)``: (π, φ) | z,
    then z | π, φ. Negative noisy counts are set to 0 (a projection onto what counts can be)."""
    n = np.maximum(np.asarray(counts, dtype=float), 0.0)
    pi, phi = draw_params(rng, state.z, n, spec, temperature, state.phi)
    z = draw_classes(rng, pi, phi, n, temperature)
    return LatentState(z, pi, phi)


# --- the exponential-mechanism view (paper §4.1, eq. 19) -------------------------------------


def log_lik_bound(spec: LatentClassSpec, neighbour: Neighbour) -> float:
    """Δ log p: the most one record changes log p(π, φ, z, X) at fixed (π, φ, z), given every
    φ_kfv ∈ [a₀, 1 − (V − 1)a₀]. Add/remove: a record's own term Σ_f log φ, so F·log(1/a₀);
    replace-one: two records' terms at any classes, F·log(φ_max/a₀). Needs a₀ > 0."""
    check_neighbour(neighbour)
    a0 = spec.floor
    if a0 <= 0:
        raise ValueError(
            "the exponential-mechanism view needs the emission probabilities truncated: set the "
            "floor a0 > 0 (the sensitivity is unbounded without it)"
        )
    top = 1.0 - (spec.values - 1) * a0
    return spec.features * math.log((top if neighbour == "replace_one" else 1.0) / a0)


def update_epsilons(
    spec: LatentClassSpec, neighbour: Neighbour, temperature: float = 1.0
) -> dict[str, float]:
    """Pure ε of each update of one Gibbs iteration seen as the exponential mechanism (eq. 19:
    ε = 2Δ/T for a draw ∝ p^{1/T}): ``phi`` (the block φ | z, X: 2Δ/T), ``z_sweep`` (every
    z_g | π, φ, X: group g's update reads only group g's records, so the sweep composes in
    parallel — 2Δ_add/T when one group changes (add/remove), twice that under replace-one,
    whose record may move between two groups) and ``pi`` (π | z reads no data: 0)."""
    add = log_lik_bound(spec, "add_remove")
    groups_touched = 2 if neighbour == "replace_one" else 1
    return {
        "phi": 2 * log_lik_bound(spec, neighbour) / temperature,
        "z_sweep": 2 * groups_touched * add / temperature,
        "pi": 0.0,
    }


def ops_temperature(spec: LatentClassSpec, neighbour: Neighbour, epsilon: float) -> float:
    """The temperature at which ONE draw from p(π, φ, z | X)^{1/T} is ε-DP (Theorem 2:
    2Δ/T = ε), never below 1 (at T = 1 the draw is already (2Δ)-DP)."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    return max(1.0, 2 * log_lik_bound(spec, neighbour) / epsilon)


def gibbs_events(
    spec: LatentClassSpec,
    neighbour: Neighbour,
    temperature: float,
    iterations: int,
    chains: int,
) -> tuple[events.SelfComposed, ...]:
    """What every owner releases when ``chains`` chains publish ``iterations`` Gibbs iterations
    each (per owner: a neighbour of one owner's records changes the same updates): each
    update's pure ε, self-composed ``iterations``·``chains`` times (``events.EpsilonDelta``)."""
    count = iterations * chains
    eps = update_epsilons(spec, neighbour, temperature)
    return tuple(
        events.SelfComposed(events.EpsilonDelta(e, 0.0), count) for e in eps.values() if e > 0
    )
