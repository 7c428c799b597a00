"""How a charge is laid out in ledger rows (pure numpy; ``Ledger`` runs the SQL).

A charge releases answers of K owners to M keys. It is stored as

* **answer blocks** — one row per group of owners that answered the same keys (in the usual
  request: one row, every owner and key): the keys ``(M', 2)`` (chain, iteration), the M'
  query digests and the answers ``(K', M', w)``, all little-endian bytes;
* **spend lines** — the μ of owner k's answer to key j is affine in the key's step,
  μ_kj = slope_k·step_j + offset_k (a log-ratio answer: (Δ_k/‖θ'−θ‖·‖θ'−θ‖ + γ)/σ_k; a
  statistic answer: step 1), with slope and offset fixed while a session's owners keep their
  policies. So a (session, group, slope, offset) line keeps four running sums of the steps —
  count, Σ step, Σ step², max step — and each member's spend follows exactly:
  answers = n, Σμ² = a²·Σs² + 2ab·Σs + b²·n, max μ = a·max s + b (a, b ≥ 0).

A charge therefore writes a few hundred bytes of spend however many owners answer, and its
answers once (docs/design.md §4).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

#: one digest per key (SHA-256)
DIGEST_BYTES = 32


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class AffineMus:
    """The μ of every answer of a charge: μ_kj = ``slope[k]``·``steps[j]`` + ``offset[k]``;
    slope, offset ``(K,)`` finite and ≥ 0, steps ``(M,)`` finite and ≥ 0."""

    slope: np.ndarray
    offset: np.ndarray
    steps: np.ndarray

    def matrix(self) -> np.ndarray:
        """``(K, M)`` every μ_kj."""
        return self.slope[:, None] * self.steps[None, :] + self.offset[:, None]

    def __getitem__(self, owners: slice | np.ndarray) -> AffineMus:
        """The same for the owners ``owners`` (a slice, indices or a mask)."""
        return AffineMus(self.slope[owners], self.offset[owners], self.steps)


@dataclass(frozen=True)
class StepSums:
    """Running sums of the steps of a line's keys: count, Σ step, Σ step², max step."""

    count: int
    total: float
    squares: float
    largest: float

    @staticmethod
    def of(steps: np.ndarray) -> StepSums:
        values = steps.tolist()  # a request has a few keys: Python floats are cheaper
        # Σ s² added in order, as a generator would, without its frames
        squares = sum(map(operator.mul, values, values))
        return StepSums(len(values), sum(values), squares, max(values, default=0.0))

    def plus(self, other: StepSums) -> StepSums:
        return StepSums(
            self.count + other.count,
            self.total + other.total,
            self.squares + other.squares,
            max(self.largest, other.largest),
        )


@dataclass
class PendingLine:
    """Charges on one spend line not yet added to its members' totals, and why that is safe.

    A writer's per-owner totals T_k are exact after ``fold``; between folds the line's step
    sums grow and each member's Σμ² is T_k + a_k²·S2 + 2a_kb_k·S1 + b_k²·n (``line_spend``).
    ``weights`` (w2, w1, w0) are the largest a_k²/d_k, 2a_kb_k/d_k, b_k²/d_k over the members,
    d_k = cap_k − T_k their headroom at the fold, so ``used`` = w2·S2 + w1·S1 + w0·n ≤ 1
    proves every member within its cap with a few float operations per charge, however many
    owners (docs/design.md §4). ``limits`` and ``caps_version``: the caps it was built for.
    """

    line: int
    slots: np.ndarray
    slope: np.ndarray
    offset: np.ndarray
    weights: tuple[float, float, float]
    limits: np.ndarray
    caps_version: int
    sums: StepSums = StepSums(0, 0.0, 0.0, 0.0)
    used: float = 0.0

    @staticmethod
    def start(
        line: int,
        slots: np.ndarray,
        mus: AffineMus,
        headroom: np.ndarray,
        limits: np.ndarray,
        caps_version: int,
    ) -> PendingLine:
        a, b = mus.slope, mus.offset
        weights = (np.inf, np.inf, np.inf)  # some member is at its cap: check every charge
        if (headroom > 0).all():
            w2, w1, w0 = (float(np.max(w / headroom)) for w in (a * a, 2 * a * b, b * b))
            weights = (w2, w1, w0)
        return PendingLine(line, slots, a, b, weights, limits, caps_version)

    def add(self, sums: StepSums, used: float) -> None:
        """Record ``sums`` more on the line (committed), ``used`` the bound after them."""
        self.sums, self.used = self.sums.plus(sums), used

    def cost(self, sums: StepSums) -> float:
        """What ``sums`` more would add to ``used``."""
        w2, w1, w0 = self.weights
        return w2 * sums.squares + w1 * sums.total + w0 * sums.count

    def spend(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each member's pending answers, Σμ², max μ (``line_spend``)."""
        return line_spend(self.sums, self.slope, self.offset)


def span(iterations: np.ndarray) -> tuple[int, int]:
    """The lowest and highest of a non-empty int array (Python's min and max: a request has
    a few keys, and numpy's reductions cost more than the work)."""
    values = iterations.tolist()
    return min(values), max(values)


def mu_squared(
    slope: np.ndarray, offset: np.ndarray, count: Any, total: Any, squares: Any
) -> np.ndarray:
    """Σ_j (a·s_j + b)² = a²·Σs² + 2ab·Σs + b²·n for keys of ``count`` n, step sum ``total``
    and sum of squared steps ``squares`` (scalars, or one per owner)."""
    return slope * slope * squares + 2.0 * slope * offset * total + offset * offset * count


def line_spend(
    sums: StepSums, slope: np.ndarray, offset: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each member's spend on one line: answers ``(K',)`` int, Σμ² ``(K',)``, max μ ``(K',)``."""
    n = sums.count
    mu2 = mu_squared(slope, offset, n, sums.total, sums.squares)
    max_mu = slope * sums.largest + offset if n else np.zeros_like(slope)
    return np.full(len(slope), n, dtype=np.int64), mu2, max_mu


def gdp_add(mus: AffineMus, new: np.ndarray) -> np.ndarray:
    """``(3, K)`` what a charge adds to each owner: answers, Σμ², max μ over its ``new``
    ``(K, M)`` answers."""
    if new.all():
        answers, mu2, max_mu = line_spend(StepSums.of(mus.steps), mus.slope, mus.offset)
        return np.stack([answers.astype(float), mu2, max_mu])
    steps = mus.steps
    n = new.sum(axis=1)
    total, squares = new @ steps, new @ (steps * steps)
    largest = np.where(new, steps[None, :], 0.0).max(axis=1, initial=0.0)
    a, b = mus.slope, mus.offset
    mu2 = mu_squared(a, b, n, total, squares)
    return np.stack([n.astype(float), mu2, np.where(n > 0, a * largest + b, 0.0)])


#: rows or columns of an array: every one (a view), or a mask or indices
Index = slice | np.ndarray
EVERY = slice(None)


def key_groups(new: np.ndarray) -> list[tuple[Index, Index]]:
    """The new answers ``(K, M)`` as (owners, keys) pairs, one per set of owners that answered
    the same keys, in key order of first appearance; (``EVERY``, ``EVERY``) when all are new."""
    if new.all():
        return [(EVERY, EVERY)]
    groups: dict[bytes, list[int]] = {}
    for j in np.flatnonzero(new.any(axis=0)).tolist():
        groups.setdefault(new[:, j].tobytes(), []).append(j)
    return [(np.frombuffer(m, dtype=bool).copy(), np.array(js)) for m, js in groups.items()]


def block_fields(
    chains: np.ndarray, iterations: np.ndarray, digests: list[bytes], payloads: np.ndarray
) -> tuple[int, int, bytes, bytes, bytes]:
    """An answer block's columns for keys (chains[j], iterations[j]) ``(M',)`` with their
    digests and answers ``(K', M', w)``: first and last iteration, keys, digests, payload."""
    keys = np.empty((len(chains), 2), dtype="<i8")
    keys[:, 0], keys[:, 1] = chains, iterations
    payload = b""  # a simulated ledger's float answers: none stored
    if payloads.size:
        payload = payloads.astype(payloads.dtype.newbyteorder("<"), copy=False).tobytes()
    return *span(iterations), keys.tobytes(), b"".join(digests), payload


def read_block(
    members: np.ndarray, keys: bytes, digests: bytes, payload: bytes
) -> list[tuple[int, int, int, bytes, bytes]]:
    """Every (owner id, chain, iteration, digest, answer bytes) of a stored block."""
    pairs = np.frombuffer(keys, dtype="<i8").reshape(-1, 2).tolist()
    count = len(pairs)
    width = len(payload) // (len(members) * count)  # bytes of one answer
    out = []
    for k, owner_id in enumerate(members.tolist()):
        row = payload[k * count * width : (k + 1) * count * width]
        for j, (chain, iteration) in enumerate(pairs):
            digest = digests[j * DIGEST_BYTES : (j + 1) * DIGEST_BYTES]
            out.append((owner_id, chain, iteration, digest, row[j * width : (j + 1) * width]))
    return out
