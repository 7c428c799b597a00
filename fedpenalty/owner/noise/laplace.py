"""Exact discrete Laplace noise on the lattice, and the pure ε of one Laplace release
(docs/design.md §2.10, "The Laplace release").

A Laplace release of an owner's statistic sum Σ S(x) ``(w,)`` survives finite computers as the
Gaussian answers of §2.7 do: the exact sum is clipped to ±2⁵²γ (data-independent, 1-Lipschitz)
and rounded to γℤ, and noise is drawn *exactly* from the discrete Laplace on γℤ,
P(n) ∝ exp(−|n|γ/b'), b' = γ·``lattice_scale(b/γ)`` ≥ b (never less noise than declared), from
the owner's counter-addressed words (ChaCha20 when deployed). Rounding moves each component by
at most γ/2, so neighbouring sums whose L1 distance is at most Δ₁ are released from lattice
points at L1 distance at most Δ₁ + γw: the release is pure ε = (Δ₁ + γw)/b' (the ratio of two
discrete Laplace pmfs shifted by m lattice units is at most exp(|m|γ/b'), summed over
components).

The sampler is Algorithm 2 of Canonne, Kamath & Steinke 2020 with t = b'/γ = a/2^k — the same
inner loop that ``exact._dgauss_one`` runs before its Gaussian acceptance step — as a scalar
reference on each sample's own words (a release has w numbers per owner, drawn once).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from .exact import _addresses, _scale_parts, _Streams, dlap_one, lattice_scale
from .lattice import LATTICE_BITS, _check_gamma, from_lattice, to_lattice
from .sources import WordSource

#: |exact value| is clipped to LIMIT·γ before rounding (as ``mechanism.LATTICE_LIMIT``): a
#: data-independent bound under which the released n·γ (|n| < 2⁵³ with overwhelming
#: probability at b/γ ≤ 2⁴⁰) stays an exact float.
LIMIT = 2.0**52


def discrete_laplace(
    source: WordSource,
    session: str,
    kind: str,
    scale_over_gamma: float | Fraction | npt.ArrayLike,
    *,
    owner: npt.ArrayLike,
    chain: npt.ArrayLike,
    iteration: npt.ArrayLike,
    component: npt.ArrayLike = 0,
) -> np.ndarray:
    """Exact discrete Laplace samples n (int64, lattice multiples), P(n) ∝ exp(−|n|/t'),
    t' = ``lattice_scale(b/γ)`` ≥ b/γ ∈ [2^-20, 2^40]; the broadcast shape of the scale and the
    address arrays. Sample (owner, chain, iteration, component) reads only its own words of the
    ("laplace", ``session``, ``kind``) stream."""
    a, k = _scale_parts(scale_over_gamma)
    shape, (o, c, it, co, a, k) = _addresses(source, owner, chain, iteration, component, a, k)
    streams = _Streams(source, "laplace", session, kind, [o, c, it, co])
    a_list, k_list = a.tolist(), k.tolist()
    rows = list(range(o.size))
    values = streams.scalar(rows, lambda word, i: dlap_one(word, a_list[i], k_list[i]))
    return np.array(values, dtype=np.int64).reshape(shape)


def laplace_lattice_release(
    source: WordSource,
    session: str,
    kind: str,
    values: npt.ArrayLike,
    scale: npt.ArrayLike,
    gamma: float,
    *,
    owners: npt.ArrayLike | None = None,
) -> np.ndarray:
    """Each owner's one release ``(K, w)`` float64: its exact ``values`` ``(K, w)`` clipped to
    ±``LIMIT``·γ, rounded to γℤ, plus exact discrete Laplace noise of scale ``scale`` ``(K,)``
    (answer units), keyed (owner, chain 0, iteration 0, component) — every entry an exact
    multiple of γ. ``owners``: key indices into ``source`` (default 0..K−1)."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 2:
        raise ValueError(f"values must be (K, w), got shape {values.shape}")
    scale = np.asarray(scale, dtype=float)
    if scale.shape != (len(values),) or not (np.isfinite(scale) & (scale > 0)).all():
        raise ValueError(f"scale must be finite, > 0 and of shape ({len(values)},)")
    owners = np.arange(len(values)) if owners is None else np.asarray(owners)
    first = np.zeros(1, dtype=np.int64)
    return np.concatenate(
        [
            laplace_answers(source, session, kind, v[None], float(b), gamma, o, first, first)
            for v, b, o in zip(values, scale, owners.tolist())
        ]
    ).reshape(values.shape)


def laplace_answers(
    source: WordSource,
    session: str,
    kind: str,
    values: npt.ArrayLike,
    scale: float,
    gamma: float,
    owner: int,
    chains: np.ndarray,
    iterations: np.ndarray,
) -> np.ndarray:
    """One owner's released answers ``(M, w)`` to the keys (``chains``, ``iterations``) ``(M,)``
    each: its exact ``values`` ``(M, w)`` clipped to ±``LIMIT``·γ, rounded to γℤ, plus exact
    discrete Laplace noise of scale ``scale`` (answer units), keyed (``owner``, chain,
    iteration, component) — every entry an exact multiple of γ."""
    gamma = _check_gamma(gamma)
    values = np.asarray(values, dtype=float)
    bound = LIMIT * gamma
    exact = to_lattice(np.clip(values, -bound, bound), gamma)
    noise = discrete_laplace(
        source,
        session,
        kind,
        scale / gamma,
        owner=owner,
        chain=np.asarray(chains)[:, None],
        iteration=np.asarray(iterations)[:, None],
        component=np.arange(values.shape[1])[None, :],
    )
    return from_lattice(exact + noise, gamma)


def laplace_gamma(scale: float) -> float:
    """The lattice step of a Laplace release at ``scale`` (answer units): the power of two
    2²⁰ to 2²¹ times below it (as the Gaussian answers' γ, docs/design.md §2.7)."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale!r}")
    return 2.0 ** (math.floor(math.log2(scale)) - LATTICE_BITS)


def owner_release_epsilon(l1_sensitivity: float, scale: float, width: int) -> float:
    """Pure ε (nats) of one owner's Laplace release at ``scale`` on its own lattice
    (``laplace_gamma``): ``laplace_release_epsilon``."""
    return laplace_release_epsilon(l1_sensitivity, scale, laplace_gamma(scale), width)


def calibrated_scale(l1_sensitivity: float, width: int, epsilon: float) -> float:
    """The Laplace scale b (answer units) whose release (``owner_release_epsilon``, rounding
    term included) costs at most ``epsilon`` nats: b = (Δ₁ + γw)/ε, raised until it fits."""
    if not (math.isfinite(epsilon) and epsilon > 0) or not l1_sensitivity > 0:
        raise ValueError(f"need epsilon > 0 and Δ₁ > 0, got {epsilon!r}, {l1_sensitivity!r}")
    scale = l1_sensitivity / epsilon
    for _ in range(64):
        spent = owner_release_epsilon(l1_sensitivity, scale, width)
        if spent <= epsilon:
            return scale
        scale = math.nextafter(scale * spent / epsilon, math.inf)
    raise ValueError(f"no Laplace scale found for ε = {epsilon!r}")


def laplace_release_epsilon(l1_sensitivity: float, scale: float, gamma: float, width: int) -> float:
    """Pure ε (nats) of one lattice Laplace release of ``width`` components at scale ``scale``
    (answer units) whose exact value has L1 sensitivity ``l1_sensitivity``:
    (Δ₁ + γ·w)/b', b' = γ·``lattice_scale(b/γ)`` ≥ b, rounded up."""
    gamma = _check_gamma(gamma)
    if not (math.isfinite(l1_sensitivity) and l1_sensitivity >= 0) or width < 1:
        raise ValueError(f"need finite Δ₁ >= 0 and width >= 1, got {l1_sensitivity!r}, {width!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale!r}")
    t = lattice_scale(scale / gamma)
    shifted = (Fraction(l1_sensitivity) + Fraction(gamma) * width) / Fraction(gamma)
    return math.nextafter(float(shifted / t), math.inf)
