"""The lattice mechanism (docs/design.md §2.7): exact values rounded to γℤ plus exact
discrete-Gaussian noise, so that every released answer is an exact multiple of γ; the
sensitivity and noise multiplier that rounding costs. Units: σ and γ in answer units.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from .exact import discrete_gaussian
from .sources import WordSource

#: An owner host's lattice step γ lies 2^LATTICE_BITS to 2^(LATTICE_BITS + 1) below the smallest
#: σ of its owners, so rounding adds at most √w·2^−LATTICE_BITS to an answer's μ = Δ/σ.
LATTICE_BITS = 20
#: Largest |x|/γ that ``to_lattice`` accepts and largest |n| that ``from_lattice`` converts.
LATTICE_LIMIT, FLOAT_EXACT_LIMIT = 1 << 62, 1 << 53


def _check_gamma(gamma: float) -> float:
    gamma = float(gamma)
    if not (math.isfinite(gamma) and gamma > 0 and math.frexp(gamma)[0] == 0.5):
        raise ValueError(f"γ must be a positive finite power of two, got {gamma!r}")
    return gamma


def to_lattice(x: npt.ArrayLike, gamma: float) -> np.ndarray:
    """Nearest lattice multiple n (int64) of each x, x ≈ n·γ; ties go to the even multiple.

    γ must be a power of two (x/γ is then exact); |x|/γ ≥ 2^62, NaN and ±inf are refused.
    """
    gamma = _check_gamma(gamma)
    x = np.asarray(x, dtype=float)
    if not np.isfinite(x).all():
        raise ValueError("values to put on the lattice must be finite (got NaN or inf)")
    with np.errstate(over="ignore"):  # an overflow to inf is refused just below
        scaled = x / gamma
    if x.size and np.abs(scaled).max() >= LATTICE_LIMIT:
        raise ValueError(f"|x|/γ must be < 2^62, got {np.abs(scaled).max():.3g}")
    return np.rint(scaled).astype(np.int64)


def from_lattice(n: npt.ArrayLike, gamma: float) -> np.ndarray:
    """n·γ as float64, exact: γ is a power of two and |n| < 2^53 (both validated)."""
    gamma = _check_gamma(gamma)
    n = np.asarray(n)
    if n.dtype.kind not in "iu":
        raise ValueError(f"lattice multiples must be integers, got dtype {n.dtype}")
    if n.size and np.abs(n).max() >= FLOAT_EXACT_LIMIT:
        raise ValueError("|n| must be < 2^53 for n·γ to be an exact float")
    with np.errstate(over="ignore"):  # an overflow to inf is refused just below
        out = n.astype(float) * gamma
    if not np.isfinite(out).all():
        raise ValueError("n·γ overflows float64")
    return out


def lattice_sensitivity(delta: float, gamma: float, width: int) -> float:
    """The L2 sensitivity to account for answers rounded to γℤ: Δ + γ√w (rounded up).

    Rounding moves each component by at most γ/2, so for neighbouring exact answers a, b
    (‖a − b‖ ≤ Δ): ‖R(a) − R(b)‖ ≤ ‖a − b‖ + ‖R(a) − a‖ + ‖R(b) − b‖ ≤ Δ + γ√w. Dividing by γ
    gives the lattice-unit sensitivity for the discrete Gaussian's ρ = Δ_γ²/(2(σ/γ)²).
    """
    gamma = _check_gamma(gamma)
    if not (math.isfinite(delta) and delta >= 0) or width < 1:
        raise ValueError(f"need finite Δ >= 0 and width >= 1, got Δ={delta!r}, w={width!r}")
    return math.nextafter(delta + gamma * math.sqrt(width), math.inf)


def lattice_gradient_multiplier(sigma: float, width: int) -> float:
    """The noise multiplier to account for lattice gradient answers (rounded down).

    A gradient answer adds N_ℤ-noise of sd σ·C (C the clip) to a sum rounded to γℤ^w with
    γ ≤ σ·C·2^−LATTICE_BITS (the host's choice), so adding one record moves it by at most
    C + γ√w ≤ C(1 + √w·σ·2^−LATTICE_BITS): against a per-record contribution of C the noise
    multiplier is σ/(1 + √w·σ·2^−LATTICE_BITS), whatever the clip.
    """
    if not (math.isfinite(sigma) and sigma > 0) or width < 1:
        raise ValueError(f"need finite σ > 0 and width >= 1, got σ={sigma!r}, w={width!r}")
    return math.nextafter(sigma / (1.0 + math.sqrt(width) * sigma * 2.0**-LATTICE_BITS), 0.0)


def noisy_lattice_answers(
    source: WordSource,
    session: str,
    kind: str,
    iteration: npt.ArrayLike,
    values: npt.ArrayLike,
    sigma: npt.ArrayLike,
    gamma: float,
    *,
    owners: npt.ArrayLike | None = None,
    chains: npt.ArrayLike | None = None,
) -> np.ndarray:
    """Released answers γ·(to_lattice(values) + n), n exact discrete Gaussian: float64 (K, M, w).

    ``noisy_lattice_multiples`` times γ: every entry returned is an exact multiple of γ.
    """
    gamma = _check_gamma(gamma)
    multiples = noisy_lattice_multiples(
        source, session, kind, iteration, values, sigma, gamma, owners=owners, chains=chains
    )
    return from_lattice(multiples, gamma)


def noisy_lattice_multiples(
    source: WordSource,
    session: str,
    kind: str,
    iteration: npt.ArrayLike,
    values: npt.ArrayLike,
    sigma: npt.ArrayLike,
    gamma: float,
    *,
    owners: npt.ArrayLike | None = None,
    chains: npt.ArrayLike | None = None,
) -> np.ndarray:
    """Noisy answers in lattice units: to_lattice(values) + n, n exact discrete Gaussian, int64
    (K, M, w) (secure aggregation masks these integers, docs/design.md §2.6).

    values ``(K, M, w)``: owner k's exact answers for M chains, width w. sigma ``(K,)``: each
    owner's noise σ in answer units (the sampler uses lattice_scale(σ/γ) ≥ σ/γ). gamma: lattice
    step, a power of two. owners ``(K,)``: key indices into ``source`` (default 0..K−1); chains
    ``(M,)`` (default 0..M−1); iteration: one for all M keys, or ``(M,)``, one per key.
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 3:
        raise ValueError(f"values must be (K, M, w), got shape {values.shape}")
    n_owners, n_chains, width = values.shape
    sigma = np.asarray(sigma, dtype=float)
    if sigma.shape != (n_owners,) or not (np.isfinite(sigma) & (sigma > 0)).all():
        raise ValueError(f"sigma must be finite, > 0 and of shape ({n_owners},)")
    gamma = _check_gamma(gamma)
    owners = np.arange(n_owners) if owners is None else np.asarray(owners)
    chains = np.arange(n_chains) if chains is None else np.asarray(chains)
    if owners.shape != (n_owners,) or chains.shape != (n_chains,):
        raise ValueError("owners must be (K,) and chains (M,)")
    exact = to_lattice(values, gamma)
    noise = discrete_gaussian(
        source,
        session,
        kind,
        (sigma / gamma)[:, None, None],
        owner=owners[:, None, None],
        chain=chains[None, :, None],
        iteration=np.broadcast_to(np.asarray(iteration), (n_chains,))[None, :, None],
        component=np.arange(width)[None, None, :],
    )
    return exact + noise
