"""Exact samplers on counter-based words (docs/design.md §2.7): the discrete Gaussian and
Bernoulli(exp(−x)) of Canonne, Kamath & Steinke 2020 (Algorithms 1–3), and keyed uniforms for
Poisson subsampling.

Units: the samplers work in lattice units (multiples of γ) and return int64. Each sample reads
only its own counter-addressed words (``sources.WordSource``): a scalar reference for small
batches and a vectorised state machine for large ones give identical values.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from .sources import MAX_CHAIN, MAX_COMPONENT, MAX_STREAM_WORDS, WordSource

#: Words one sample may consume before the sampler gives up (RuntimeError). A discrete
#: Gaussian sample needs ≈ 15 words on average (≈ 20 at σ/γ = 1) with a tail decaying like
#: e^-0.07·words, so the cap is reached with probability ≈ e^-1000. It also bounds every loop
#: counter by 2^14, which keeps all integer arithmetic below 2^63.
MAX_WORDS = 1 << 14
#: Accepted range of σ/γ for the exact sampler.
SCALE_MIN, SCALE_MAX = 2.0**-20, 2.0**40
#: Batches up to this many samples run the scalar reference sampler (pure Python, ≈ 15 µs a
#: sample); larger ones the vectorised machine, whose ≈ 100 numpy steps a batch cost more
#: below ≈ 1,500 samples (measured). Same words, same values.
SCALAR_BATCH = 1024
#: The vectorised machine hands its last few unfinished samples to the scalar reference.
STRAGGLERS = 16

_U64 = np.uint64
_MAX64 = _U64(2**64 - 1)
_SCALE_BITS = 41  # the sampler's σ/γ is a / 2^k with a ∈ [2^40, 2^41]


def _scale_parts(sigma_over_gamma: float | Fraction | npt.ArrayLike) -> tuple[np.ndarray, ...]:
    """(a, k) uint64 with a/2^k = ⌈(σ/γ)·2^k⌉/2^k ≥ σ/γ and a ∈ [2^40, 2^41] (see lattice_scale)."""
    if isinstance(sigma_over_gamma, (Fraction, int)) and not isinstance(sigma_over_gamma, bool):
        s = Fraction(sigma_over_gamma)
        if not SCALE_MIN <= s <= SCALE_MAX:
            raise ValueError(f"σ/γ must be in [2^-20, 2^40], got {float(s)!r}")
        e = s.numerator.bit_length() - s.denominator.bit_length()
        e -= Fraction(2) ** e > s  # now 2^e ≤ s < 2^(e+1)
        k = _SCALE_BITS - 1 - e
        a = -((-s.numerator << k) // s.denominator)
        return np.asarray(a, dtype=_U64), np.asarray(k, dtype=_U64)
    scale = np.asarray(sigma_over_gamma, dtype=float)
    bad = ~((scale >= SCALE_MIN) & (scale <= SCALE_MAX))  # True for NaN too
    if bad.any():
        raise ValueError(f"σ/γ must be finite and in [2^-20, 2^40], got {scale[bad].ravel()[:3]}")
    mantissa, exponent = np.frexp(scale)  # σ/γ = mantissa·2^exponent, mantissa ∈ [1/2, 1)
    a = np.ceil(np.ldexp(mantissa, _SCALE_BITS)).astype(_U64)
    return a, (_SCALE_BITS - exponent).astype(_U64)


def lattice_scale(sigma_over_gamma: float | Fraction) -> Fraction:
    """The exact σ'/γ the sampler uses for a requested σ/γ: a / 2^k ≥ σ/γ, a ∈ [2^40, 2^41].

    k = 40 − ⌊log2(σ/γ)⌋ and a = ⌈(σ/γ)·2^k⌉, so σ/γ ≤ σ'/γ < (σ/γ)(1 + 2^-40): the noise is
    never smaller than requested. The sampler is exact for σ'²/γ² = a² / 2^(2k).
    """
    a, k = _scale_parts(sigma_over_gamma)
    if a.ndim:
        raise ValueError("lattice_scale takes one scale")
    return Fraction(int(a), 1 << int(k))


def _addresses(source: WordSource, *arrays: npt.ArrayLike) -> tuple[tuple[int, ...], list]:
    """Broadcast (owner, chain, iteration, component, extra…) and flatten each to ``(N,)``;
    the four address arrays become int64 and are validated."""
    arrays = np.broadcast_arrays(*(np.asarray(x) for x in arrays))
    names = ("owner", "chain", "iteration", "component")
    for name, x in zip(names, arrays[:4], strict=True):
        if x.dtype.kind not in "iu":
            raise ValueError(f"{name} must be integers, got dtype {x.dtype}")
    address = np.stack(arrays[:4]).reshape(4, -1).astype(np.int64)
    if address.size:
        low, high = address.min(axis=1), address.max(axis=1)
        limits = (len(source), MAX_CHAIN, 2**63 - 1, MAX_COMPONENT)
        for name, lo, hi, limit in zip(names, low.tolist(), high.tolist(), limits, strict=True):
            if lo < 0 or hi >= limit:
                raise ValueError(f"{name} must be in [0, {limit}), got values in [{lo}, {hi}]")
    return arrays[0].shape, list(address) + [x.ravel() for x in arrays[4:]]


class _Streams:
    """Per-sample word streams of one batch: each sample reads its own words in order."""

    def __init__(
        self, source: WordSource, purpose: str, session: str, kind: str, address: list[np.ndarray]
    ):
        owner, chain, iteration, component = address
        self._fetch = lambda rows, chunk: source.sample_words(
            purpose,
            session,
            kind,
            owner[rows],
            chain[rows],
            iteration[rows],
            component[rows],
            chunk,
        )
        self._width = source.chunk_words
        n = address[0].size
        self._loaded = np.zeros(n, dtype=np.int64)
        self._pos = np.zeros(n, dtype=np.int64)
        self._buf = self._fetch(np.arange(n), self._loaded)

    def take(self, idx: np.ndarray) -> np.ndarray:
        """The next word of each sample in ``idx`` (distinct indices): uint64 ``(len(idx),)``."""
        pos = self._pos[idx]
        chunk = pos // self._width
        stale = chunk != self._loaded[idx]
        if stale.any():
            if pos.max() >= MAX_WORDS:
                raise RuntimeError(f"a noise sample used {MAX_WORDS} words (probability ≈ e^-1000)")
            rows = idx[stale]
            self._buf[rows] = self._fetch(rows, chunk[stale])
            self._loaded[rows] = chunk[stale]
        self._pos[idx] = pos + 1
        return self._buf[idx, pos % self._width]

    def scalar(self, rows: list[int], sample: Callable[[Callable[[], int], int], int]) -> list[int]:
        """``sample(word, i)`` — the scalar reference — for each row i, where ``word()`` yields
        sample i's words from its first. A sample that runs past the words fetched so far is
        rerun from its first word once its next chunk is fetched: same words, same value; the
        chunks all such samples need come from one source call per wave."""
        words: dict[int, list[int]] = {i: [] for i in rows}
        first = np.array(rows, dtype=np.int64)
        have = self._loaded[first] == 0  # the vectorised buffer may still hold chunk 0
        for i, row in zip(first[have].tolist(), self._buf[first[have]].tolist(), strict=True):
            words[i] = row
        pending: list[int] = first[~have].tolist()
        results: dict[int, int] = {}
        while True:
            if pending:
                chunks = [len(words[i]) // self._width for i in pending]
                if max(chunks) * self._width >= MAX_WORDS:
                    raise RuntimeError(
                        f"a noise sample used {MAX_WORDS} words (probability ≈ e^-1000)"
                    )
                fetched = self._fetch(np.array(pending), np.array(chunks)).tolist()
                for i, more in zip(pending, fetched, strict=True):
                    words[i] = words[i] + more
            todo, pending = [i for i in rows if i not in results], []
            if not todo:
                return [results[i] for i in rows]
            for i in todo:
                try:
                    results[i] = sample(iter(words[i]).__next__, i)
                except StopIteration:  # ran out of fetched words: fetch a chunk, rerun
                    pending.append(i)


# Scalar reference: CKS 2020 Algorithms 1–3 as plain Python on one sample's words. Used for
# small batches; the vectorised _Machine below runs the same algorithm on the same words.


def _below_one(word: Callable[[], int], m: int) -> int:
    """Uniform integer in [0, m), 1 ≤ m < 2^63, by exact rejection of 64-bit words.

    Accept a word iff it is < 2^64 − (2^64 mod m), the largest multiple of m; the rejection
    chance is < m/2^64 ≤ 2^-7 (m < 2^57 here). The value is word mod m.
    """
    limit = 2**64 - 2**64 % m
    while (w := word()) >= limit:
        pass
    return w % m


def _alg1_one(word: Callable[[], int], p: int, m: int, first: int = 1) -> bool:
    """Algorithm 1: Bernoulli(exp(−x)) for x = p/m ∈ [0, 1]. K ← first; while
    Bernoulli(x/K) — i.e. Unif[0, m·K) < p — K ← K + 1; return K odd. (For x = 1 the first
    coin Bernoulli(1/1) is always heads, so callers start at K = 2 and draw no word for it.)"""
    k = first
    while _below_one(word, m * k) < p:
        k += 1
    return k % 2 == 1


def _bexp_one(word: Callable[[], int], n: int, d: int) -> bool:
    """Bernoulli(exp(−n/d)): ⌊n/d⌋ trials of Bernoulli(e^-1), then Algorithm 1 on the fraction."""
    whole, frac = divmod(n, d)
    for _ in range(whole):
        if not _alg1_one(word, 1, 1, first=2):
            return False
    return _alg1_one(word, frac, d)


def _square_one(word: Callable[[], int], r: int, a: int) -> bool:
    """Bernoulli(exp(−r²/(2a²))), r < a: Algorithm 1 whose coin Bernoulli(x/K) is the product
    Bernoulli(r/a) ∧ Bernoulli(r/(2aK)) (short-circuit), keeping every integer below 2^57."""
    k = 1
    while _below_one(word, a) < r and _below_one(word, 2 * a * k) < r:
        k += 1
    return k % 2 == 1


def dlap_one(word: Callable[[], int], a: int, k: int) -> int:
    """One exact sample y, P(y) ∝ exp(−|y|·2^k/a) on ℤ (CKS 2020 Algorithm 2, t = a, s = 2^k):
    U ← Unif[0, a) kept with probability exp(−U/a); V ← the number of Bernoulli(e^-1) successes
    before a failure; |y| = ⌊(V·a + U)/2^k⌋; a sign bit; (−, 0) is rejected. V < 2^14 (the
    word cap) and a < 2^41 keep V·a + U below 2^63."""
    while True:
        while True:
            u = _below_one(word, a)
            if _alg1_one(word, u, a):
                break
        v = 0
        while _alg1_one(word, 1, 1, first=2):
            v += 1
        negative = word() >> 63
        y = (v * a + u) >> k
        if negative and y == 0:
            continue
        return -y if negative else y


def _dgauss_one(word: Callable[[], int], a: int, k: int) -> int:
    """One exact discrete Gaussian sample with σ' = a/2^k, a ∈ [2^40, 2^41] (Algorithm 3).

    Algorithm 3 with t = σ' (any t > 0 is valid; t = σ' makes σ'²/t = σ'): Y ← DLap(t); accept
    with probability exp(−(|Y| − σ')²/(2σ'²)). Algorithm 2, DLap(t): U ← Unif[0, a) kept with
    probability exp(−U/a); V ← number of Bernoulli(e^-1) successes before a failure;
    |Y| = ⌊(V·a + U) / 2^k⌋; a sign bit; reject (−, 0). With D = |2^k|Y| − a| = q·a + r the
    bias is D²/(2a²) = q²/2 + qr/a + r²/(2a²), three non-negative terms: accept iff
    Bernoulli(exp(−(q²a + 2qr)/(2a))) and Bernoulli(exp(−r²/(2a²))). q ≤ V + 1 < 2^14 (the
    word cap), so every integer stays below 2^63.
    """
    while True:
        y = dlap_one(word, a, k)
        q, r = divmod(abs((abs(y) << k) - a), a)
        if _bexp_one(word, q * q * a + 2 * q * r, 2 * a) and _square_one(word, r, a):
            return y


def _below(word: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised ``_below_one`` for one word each: (accepted, word mod m)."""
    rem = (_MAX64 % m + _U64(1)) % m
    return word <= _MAX64 - rem, word % m


# Phases of one sample's state machine. Every handler consumes exactly one word per sample.
(_DRAW_U, _EXP_U, _GEOM, _SIGN, _EXP_INT, _EXP_FRAC, _SQ_A, _SQ_B) = range(8)
_DONE = -1


class _Machine:
    """``_dgauss_one`` (or ``_bexp_one``) vectorised over samples with masks, uint64 throughout.

    Each sample is a state machine whose every step consumes exactly one of its own words, in
    the scalar reference's order, so both paths return identical values for identical words.
    """

    def __init__(self, streams: _Streams, n: int, gauss: bool):
        self.take, self.gauss = streams.take, gauss
        self.phase = np.zeros(n, dtype=np.int8)
        (
            self.a,
            self.k,
            self.u,
            self.kk,
            self.v,
            self.neg,
            self.y,
            self.r,
            self.m,
            self.f,
            self.d,
        ) = (np.zeros(n, dtype=_U64) for _ in range(11))
        self.out = np.zeros(n, dtype=np.int64)

    def run(self, scalar: Callable[[list[int]], list[int]]) -> np.ndarray:
        """Step every live sample until at most ``STRAGGLERS`` remain, then hand those to
        ``scalar`` — the scalar reference, which re-reads their words from the start and so
        returns the same values — instead of paying numpy's per-step overhead for a few."""
        handlers = (
            self._draw_u,
            self._exp_u,
            self._geom,
            self._sign,
            self._exp_int,
            self._exp_frac,
            self._sq_a,
            self._sq_b,
        )
        live = np.flatnonzero(self.phase != _DONE)
        with np.errstate(over="ignore"):  # uint64 wrap-around is never relied upon
            while live.size > STRAGGLERS:
                phase = self.phase[live]
                by_phase = live[np.argsort(phase, kind="stable")]
                bounds = np.cumsum(np.bincount(phase, minlength=len(handlers))).tolist()
                for handler, lo, hi in zip(handlers, [0, *bounds[:-1]], bounds, strict=True):
                    if hi > lo:
                        handler(by_phase[lo:hi])
                live = live[self.phase[live] != _DONE]
        self.out[live] = scalar(live.tolist())
        return self.out

    def _coin_step(
        self, idx: np.ndarray, m: np.ndarray, p: np.ndarray | np.uint64
    ) -> tuple[np.ndarray, ...]:
        """One Algorithm-1 coin Bern(p/m) at counter K = kk: (heads, stopped, stopped with K odd).

        Heads advance K; a tails stops Algorithm 1, whose result is 1 iff K is odd.
        """
        ok, value = _below(self.take(idx), m)
        heads = ok & (value < p)
        self.kk[idx[heads]] += _U64(1)
        stopped = ok & ~heads
        return heads, stopped, stopped & ((self.kk[idx] & _U64(1)) == 1)

    def _draw_u(self, idx: np.ndarray) -> None:
        ok, u = _below(self.take(idx), self.a[idx])
        j = idx[ok]
        self.u[j], self.kk[j], self.phase[j] = u[ok], 1, _EXP_U

    def _exp_u(self, idx: np.ndarray) -> None:  # Algorithm 1, x = U/a: keep U w.p. exp(−U/a)
        _, stopped, odd = self._coin_step(idx, self.a[idx] * self.kk[idx], self.u[idx])
        keep = idx[odd]
        self.v[keep], self.kk[keep], self.phase[keep] = 0, 2, _GEOM
        self.phase[idx[stopped & ~odd]] = _DRAW_U

    def _geom(self, idx: np.ndarray) -> None:  # V: count Bern(e^-1) successes (Alg. 1, x = 1;
        # its first coin Bern(1/1) is always heads, so K starts at 2)
        _, stopped, odd = self._coin_step(idx, self.kk[idx], _U64(1))
        success = idx[odd]
        self.v[success] += _U64(1)
        self.kk[success] = 2
        self.phase[idx[stopped & ~odd]] = _SIGN

    def _sign(self, idx: np.ndarray) -> None:
        neg = self.take(idx) >> _U64(63)
        a, k = self.a[idx], self.k[idx]
        y = (self.v[idx] * a + self.u[idx]) >> k
        restart = (neg == 1) & (y == 0)
        self.phase[idx[restart]] = _DRAW_U
        keep = ~restart
        j, a, y = idx[keep], a[keep], y[keep]
        self.neg[j], self.y[j] = neg[keep], y
        scaled = y << k[keep]
        dist = np.where(scaled >= a, scaled - a, a - scaled)
        q, r = dist // a, dist % a
        self.r[j] = r
        q2, qr = q * q, q * r  # q ≤ V + 1 < 2^14, r < 2^41
        rest = (q2 & _U64(1)) * a + _U64(2) * (qr % a)  # x1 = q²/2 + qr/a = m + f/(2a)
        self.m[j] = (q2 >> _U64(1)) + qr // a + rest // (_U64(2) * a)
        self.f[j], self.d[j] = rest % (_U64(2) * a), _U64(2) * a
        self.start_exp(j)

    def start_exp(self, j: np.ndarray) -> None:
        """Begin Bern(exp(−(m + f/d))): m trials of Bern(e^-1), then Algorithm 1 on f/d."""
        has_int = self.m[j] > 0
        self.kk[j] = np.where(has_int, 2, 1)
        self.phase[j] = np.where(has_int, _EXP_INT, _EXP_FRAC)

    def _exp_int(self, idx: np.ndarray) -> None:
        _, stopped, odd = self._coin_step(idx, self.kk[idx], _U64(1))
        success = idx[odd]
        self.m[success] -= _U64(1)
        self.kk[success] = 2
        frac = success[self.m[success] == 0]
        self.kk[frac], self.phase[frac] = 1, _EXP_FRAC
        self._exp_end(idx[stopped & ~odd], False)

    def _exp_frac(self, idx: np.ndarray) -> None:
        _, stopped, odd = self._coin_step(idx, self.d[idx] * self.kk[idx], self.f[idx])
        self._exp_end(idx[odd], True)
        self._exp_end(idx[stopped & ~odd], False)

    def _exp_end(self, j: np.ndarray, success: bool) -> None:
        if not self.gauss:
            self.out[j], self.phase[j] = int(success), _DONE
        elif success:
            self.kk[j], self.phase[j] = 1, _SQ_A
        else:
            self.phase[j] = _DRAW_U

    def _sq_a(self, idx: np.ndarray) -> None:  # first factor Bern(r/a) of the coin Bern(x2/K)
        ok, value = _below(self.take(idx), self.a[idx])
        heads = ok & (value < self.r[idx])
        self.phase[idx[heads]] = _SQ_B
        self._sq_end(idx[ok & ~heads])

    def _sq_b(self, idx: np.ndarray) -> None:  # second factor Bern(r/(2aK))
        heads, stopped, _ = self._coin_step(idx, _U64(2) * self.a[idx] * self.kk[idx], self.r[idx])
        self.phase[idx[heads]] = _SQ_A
        self._sq_end(idx[stopped])

    def _sq_end(self, j: np.ndarray) -> None:  # Algorithm 1 on x2 stopped at K: accept iff odd
        odd = (self.kk[j] & _U64(1)) == 1
        accept = j[odd]
        y = self.y[accept].astype(np.int64)
        self.out[accept] = np.where(self.neg[accept] == 1, -y, y)
        self.phase[accept] = _DONE
        self.phase[j[~odd]] = _DRAW_U


def discrete_gaussian(
    source: WordSource,
    session: str,
    kind: str,
    sigma_over_gamma: float | Fraction | npt.ArrayLike,
    *,
    owner: npt.ArrayLike,
    chain: npt.ArrayLike,
    iteration: npt.ArrayLike,
    component: npt.ArrayLike = 0,
) -> np.ndarray:
    """Exact discrete Gaussian samples n (int64, lattice multiples), P(n) ∝ exp(−n²/(2σ'²)).

    σ' = ``lattice_scale(σ/γ)`` ≥ σ/γ, σ/γ ∈ [2^-20, 2^40] (a float array gives one scale per
    sample; a Fraction or int is exact). The shape is the broadcast of the scale and the
    address arrays; sample (owner, chain, iteration, component) reads only its own
    counter-addressed words, so its value does not depend on the rest of the batch.
    """
    a, k = _scale_parts(sigma_over_gamma)
    shape, (o, c, it, co, a, k) = _addresses(source, owner, chain, iteration, component, a, k)
    streams = _Streams(source, "gauss", session, kind, [o, c, it, co])
    a_list, k_list = a.tolist(), k.tolist()

    def scalar(rows: list[int]) -> list[int]:
        return streams.scalar(rows, lambda word, i: _dgauss_one(word, a_list[i], k_list[i]))

    if o.size <= SCALAR_BATCH:
        return np.array(scalar(list(range(o.size))), dtype=np.int64).reshape(shape)
    machine = _Machine(streams, o.size, True)
    machine.a[:], machine.k[:] = a, k
    return machine.run(scalar).reshape(shape)


def bernoulli_exp(
    source: WordSource,
    session: str,
    kind: str,
    numerator: npt.ArrayLike,
    denominator: npt.ArrayLike,
    *,
    owner: npt.ArrayLike,
    chain: npt.ArrayLike,
    iteration: npt.ArrayLike,
    component: npt.ArrayLike = 0,
) -> np.ndarray:
    """Exact Bernoulli(exp(−numerator/denominator)) (CKS Algorithm 1), bool of the broadcast
    shape; 0 ≤ numerator < 2^63, 1 ≤ denominator ≤ 2^42 (integers). Own stream ("bernoulli")."""
    n, d = np.asarray(numerator), np.asarray(denominator)
    if n.dtype.kind not in "iu" or d.dtype.kind not in "iu":
        raise ValueError("numerator and denominator must be integers")
    if (n < 0).any() or (d < 1).any() or (d > 2**42).any():
        raise ValueError("need 0 <= numerator and 1 <= denominator <= 2^42")
    shape, (o, c, it, co, n, d) = _addresses(source, owner, chain, iteration, component, n, d)
    streams = _Streams(source, "bernoulli", session, kind, [o, c, it, co])
    n_list, d_list = n.tolist(), d.tolist()

    def scalar(rows: list[int]) -> list[int]:
        return streams.scalar(rows, lambda word, i: int(_bexp_one(word, n_list[i], d_list[i])))

    if o.size <= SCALAR_BATCH:
        return np.array(scalar(list(range(o.size))), dtype=bool).reshape(shape)
    machine = _Machine(streams, o.size, False)
    n, d = n.astype(_U64), d.astype(_U64)
    machine.m[:], machine.f[:], machine.d[:] = n // d, n % d, d
    machine.start_exp(np.arange(o.size))
    return machine.run(scalar).reshape(shape).astype(bool)


# --------------------------------------------------------------------------- subsampling


def uniforms(
    source: WordSource,
    session: str,
    kind: str,
    count: int,
    *,
    owner: npt.ArrayLike,
    chain: npt.ArrayLike,
    iteration: npt.ArrayLike,
) -> np.ndarray:
    """Keyed uniform doubles in [0, 1) for Poisson subsampling: shape (…, count).

    Record i's uniform is (word_i >> 11)·2^-53 — 53 random bits — where word_i is word i of the
    ("uniform", session, kind, owner, chain, iteration) stream, so record i's inclusion does
    not depend on how many records are drawn. [U < q] is Bernoulli(⌈q·2^53⌉/2^53).
    """
    if not 0 <= count <= MAX_STREAM_WORDS:
        raise ValueError(f"count must be in [0, 2^35], got {count}")
    shape, (o, c, it, _) = _addresses(source, owner, chain, iteration, 0)
    words = source.stream_words("uniform", session, kind, o, c, it, count)
    return np.ldexp((words >> _U64(11)).astype(float), -53).reshape((*shape, count))


def poisson_sample(
    source: WordSource,
    session: str,
    kind: str,
    q: float,
    count: int,
    *,
    owner: npt.ArrayLike,
    chain: npt.ArrayLike,
    iteration: npt.ArrayLike,
) -> np.ndarray:
    """Keyed Poisson sampling of ``count`` records: bool ``(…, count)``, record i included iff
    U_i + 2^−53 ≤ q for its keyed uniform U_i = k·2^−53 (``uniforms``), i.e. with probability
    ⌊q·2^53⌋/2^53 ≤ q — never more than the rate the owner accounts. A key's sample does not
    depend on anything drawn before it, so a resumed run draws the same records."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    u = uniforms(source, session, kind, count, owner=owner, chain=chain, iteration=iteration)
    return u + 2.0**-53 <= q
