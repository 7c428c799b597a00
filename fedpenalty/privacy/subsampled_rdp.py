"""Rényi DP of Poisson-subsampled mechanisms known only by their own RDP (docs/design.md §2.7).

A lattice owner's gradient answer is a Poisson-subsampled *discrete* Gaussian. The tight
subsampled-Gaussian analysis (Mironov, Talwar & Zhang 2019; dp-accounting) integrates the
continuous Gaussian's density and does not carry over, so these answers are accounted with
bounds that hold for any base mechanism of Rényi DP ε(ℓ) at integer orders ℓ:

* **Zhu & Wang 2019, Theorem 6** (Poisson sampling, add/remove neighbours, both directions)::

      e^{(α−1)ε'(α)} ≤ (1−q)^{α−1}(1 + (α−1)q) + C(α,2) q² (1−q)^{α−2} e^{ε(2)}
                        + 3 Σ_{ℓ=3..α} C(α,ℓ) q^ℓ (1−q)^{α−ℓ} e^{(ℓ−1)ε(ℓ)}

  Without the factor 3 this is Mironov et al.'s exact formula for the Gaussian (the tests check
  that against dp-accounting).
* **The ternary bound** (after Wang, Balle & Kasiviswanathan 2019, Theorem 9), for either
  relation, with ε(ℓ) the base mechanism's RDP between a dataset and the same dataset with one
  record added. With the differing record's coin shared, the two output laws are
  p = (1−q)r + q p′ and p̃ = (1−q)r + q q′ (r: the record not sampled; add/remove: q′ = r).
  p = p̃ + q(p′−q′), so E_p̃[(p/p̃)^α] = Σ_j C(α,j) q^j E_p̃[((p′−q′)/p̃)^j], whose j = 1 term
  is 0. p̃ ≥ (1−q)r bounds the j-th term by (1−q)^{1−j} E_r[|p′−q′|^j / r^j], and
  (a, b, c) ↦ |a−b|^j/c^{j−1} is jointly convex, so splitting the mixtures over the shared
  sample S leaves triples M(S∪x), M(S∪x′), M(S) — both pairs *add one record*. There
  |P₁−P₂|^j ≤ P₁^j + P₂^j gives 2e^{(j−1)ε(j)} and, for j = 2, (a−b)² ≤ 2(a−1)² + 2(b−1)²
  gives 4(e^{ε(2)}−1) (the other direction is the same with x and x′ swapped; add/remove's
  reverse direction expands r = p − q(p′−r) the same way)::

      e^{(α−1)ε'(α)} ≤ 1 + C(α,2) q²/(1−q) · min{4(e^{ε(2)}−1), 2e^{ε(2)}}
                        + 2 Σ_{j=3..α} C(α,j) q^j (1−q)^{1−j} e^{(j−1)ε(j)}

  Replace-one thus costs what add/remove does, to first order in q, as for the Gaussian.
* The base mechanism itself, ε'(α) ≤ ε(α): subsampling never hurts (joint quasi-convexity).

The reported RDP is the least of the bounds that apply, at the integer orders ``ORDERS``; ε at
δ uses dp-accounting's RDP → (ε, δ) conversion. Orders and RDP are dimensionless (nats).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from scipy.special import gammaln, logsumexp

from ..models.base import Neighbour, check_neighbour

__all__ = [
    "ORDERS",
    "epsilon_from_rdp",
    "gaussian_rdp",
    "subsampled_gaussian_rdp",
    "ternary_bound",
    "zhu_wang_bound",
]

#: Integer Rényi orders the bounds are evaluated at (the general bounds need integers).
ORDERS: tuple[int, ...] = (
    *range(2, 65),
    *(72, 80, 96, 112, 128, 160, 192, 256, 320, 384, 512, 768, 1024),
)


def _log_binomials(alpha: int) -> np.ndarray:
    """log C(α, ℓ) for ℓ = 0..α: ``(α + 1,)``."""
    ell = np.arange(alpha + 1)
    return gammaln(alpha + 1) - gammaln(ell + 1) - gammaln(alpha - ell + 1)


def zhu_wang_bound(base: np.ndarray, q: float, alpha: int, factor: float = 3.0) -> float:
    """Zhu & Wang's Theorem 6 at integer order ``alpha`` ≥ 2 for rate q ∈ (0, 1): the RDP ε'(α).

    ``base``: the base mechanism's RDP ε(ℓ) at ℓ = 0..α (entries 0 and 1 unused). ``factor``:
    the 3 of the theorem (1 gives Mironov et al.'s exact Gaussian formula, for tests only).
    """
    ell = np.arange(2, alpha + 1)
    log_q, log_1q = math.log(q), math.log1p(-q)
    terms = _log_binomials(alpha)[2:] + ell * log_q + (alpha - ell) * log_1q + (ell - 1) * base[2:]
    terms[1:] += math.log(factor)
    head = (alpha - 1) * log_1q + math.log1p((alpha - 1) * q)
    return float(logsumexp([head, *terms])) / (alpha - 1)


def ternary_bound(base: np.ndarray, q: float, alpha: int) -> float:
    """The ternary bound (module docstring) at integer order ``alpha`` ≥ 2, rate q ∈ (0, 1);
    ``base``: the add-one-record RDP ε(ℓ) at ℓ = 0..α."""
    log_q, log_1q = math.log(q), math.log1p(-q)
    log_c = _log_binomials(alpha)
    second = min(math.log(4.0) + math.log(math.expm1(base[2])), math.log(2.0) + base[2])
    terms = [0.0, log_c[2] + 2 * log_q - log_1q + second]
    if alpha >= 3:
        j = np.arange(3, alpha + 1)
        terms.extend(math.log(2.0) + log_c[3:] + j * log_q - (j - 1) * log_1q + (j - 1) * base[3:])
    return float(logsumexp(terms)) / (alpha - 1)


def gaussian_rdp(noise_multiplier: float, neighbour: Neighbour) -> np.ndarray:
    """RDP ε(α) = α·s²/(2σ²) of one Gaussian (continuous or lattice) answer at ``ORDERS``:
    sensitivity s = 1 per record (add/remove) or 2 (replace-one), noise σ in the same units."""
    scale = 2.0 if check_neighbour(neighbour) == "replace_one" else 1.0
    return np.asarray(ORDERS, dtype=float) * scale**2 / (2.0 * noise_multiplier**2)


@functools.lru_cache(maxsize=4096)
def subsampled_gaussian_rdp(q: float, noise_multiplier: float, neighbour: Neighbour) -> np.ndarray:
    """RDP at ``ORDERS`` of one Poisson-subsampled answer whose base mechanism has Gaussian
    Rényi divergences (a discrete Gaussian on a lattice has the same, docs/design.md §2.7): noise
    σ = ``noise_multiplier`` against a per-record contribution of 1. The least applicable bound
    of the module docstring; at q = 1 the base mechanism's own RDP. Read-only array."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling rate q must be in (0, 1], got {q!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    out = gaussian_rdp(noise_multiplier, neighbour)
    if q < 1.0:
        per_unit = 1.0 / (2.0 * noise_multiplier**2)  # add one record: ε(ℓ) = ℓ/(2σ²)
        for i, alpha in enumerate(ORDERS):
            base = np.arange(alpha + 1) * per_unit
            bounds = [out[i], ternary_bound(base, q, alpha)]
            if neighbour == "add_remove":
                bounds.append(zhu_wang_bound(base, q, alpha))
            out[i] = min(bounds)
    out.setflags(write=False)
    return out


def epsilon_from_rdp(rdp: np.ndarray, delta: float) -> float:
    """ε (nats) at δ of an RDP curve over ``ORDERS`` (dp-accounting's conversion)."""
    if not np.any(rdp):
        return 0.0
    eps, _ = compute_epsilon(list(ORDERS), list(np.asarray(rdp, dtype=float)), delta)
    return float(eps)
