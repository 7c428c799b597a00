"""Exact, counter-based lattice noise for owners' answers: pure numpy + ``cryptography``.

Why. Floating-point Gaussian samples lie on a data-independent grid of representable values,
so a float answer λ + ξ can reveal λ exactly (Mironov 2012, "On significance of the least
significant bits for differential privacy"). Owners therefore release lattice points only:
the exact value is rounded to the lattice γℤ and noise is drawn *exactly* from the discrete
Gaussian on γℤ (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential
Privacy", Algorithms 1–3), from cryptographically secure bits. Every released answer is then
an exact multiple of γ whose distribution is the one the accountant assumes.

Counter-based. All randomness is a pure function of (owner's noise key, purpose, session,
query kind, chain, iteration, component or record index, word index) — never of how many
answers came before — so a resumed run draws identical noise and one sample's value does not
depend on the batch it was drawn in.

Sources (``WordSource``): ``ChaChaSource`` (ChaCha20 keystream via ``cryptography``/OpenSSL,
keys from OS entropy: the deployed default) and ``PhiloxSource`` (numpy's Philox-4x64-10,
vectorised over owners: seeded, for simulation only). Units: σ and γ are in answer units; the
samplers work in lattice units (multiples of γ) and return int64.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import operator
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from scipy import special

KEY_BYTES = 32
#: Words one sample may consume before the sampler gives up (RuntimeError). A discrete
#: Gaussian sample needs ≈ 15 words on average (≈ 20 at σ/γ = 1) with a tail decaying like
#: e^-0.07·words, so the cap is reached with probability ≈ e^-1000. It also bounds every loop
#: counter by 2^14, which keeps all integer arithmetic below 2^63.
MAX_WORDS = 1 << 14
#: An owner host's lattice step γ lies 2^LATTICE_BITS to 2^(LATTICE_BITS + 1) below the smallest
#: σ of its owners, so rounding adds at most √w·2^−LATTICE_BITS to an answer's μ = Δ/σ.
LATTICE_BITS = 20
#: Accepted range of σ/γ for the exact sampler.
SCALE_MIN, SCALE_MAX = 2.0**-20, 2.0**40
#: Largest |x|/γ that ``to_lattice`` accepts and largest |n| that ``from_lattice`` converts.
LATTICE_LIMIT, FLOAT_EXACT_LIMIT = 1 << 62, 1 << 53
MAX_CHAIN, MAX_COMPONENT, MAX_STREAM_WORDS = 1 << 29, 1 << 24, 1 << 35
#: Batches up to this many samples run the scalar reference sampler (pure Python, ≈ 15 µs a
#: sample); larger ones the vectorised machine, whose ≈ 100 numpy steps a batch cost more
#: below ≈ 1,500 samples (measured). Same words, same values.
SCALAR_BATCH = 1024
#: The vectorised machine hands its last few unfinished samples to the scalar reference.
STRAGGLERS = 16

_U64 = np.uint64
_MAX64 = _U64(2**64 - 1)
_SCALE_BITS = 41  # the sampler's σ/γ is a / 2^k with a ∈ [2^40, 2^41]
_CHACHA_BLOCK_WORDS = 8  # a ChaCha20 block is 64 bytes
_PURPOSES = ("gauss", "bernoulli", "uniform")


# --------------------------------------------------------------------------- keys and sources


@dataclass(frozen=True)
class NoiseKey:
    """One owner's 32-byte noise key. Never share one between owners (see ``_distinct``)."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) != KEY_BYTES:
            raise ValueError(f"a noise key is {KEY_BYTES} bytes")

    @classmethod
    def from_os(cls) -> NoiseKey:
        """A fresh key from OS entropy: the deployed path."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def derive(cls, seed_material: bytes | int, owner_name: str) -> NoiseKey:
        """SIMULATION ONLY: a key derived (HKDF-SHA256) from a run seed and the owner's name.

        Reproducible from the seed, so whoever knows the seed knows every owner's noise and can
        subtract it: never use this for a deployed owner.
        """
        if isinstance(seed_material, bytes):
            ikm = b"bytes\x00" + seed_material
        else:
            seed = operator.index(seed_material)
            if seed < 0:
                raise ValueError(f"an integer seed must be >= 0, got {seed}")
            ikm = b"int\x00" + str(seed).encode()
        if not owner_name:
            raise ValueError("owner_name must be a non-empty string")
        hkdf = HKDF(
            algorithm=hashes.SHA256(),
            length=KEY_BYTES,
            salt=b"fedpenalty.noise.simulation.v1",
            info=owner_name.encode("utf-8"),
        )
        return cls(hkdf.derive(ikm))


class WordSource(Protocol):
    """Counter-based uniform 64-bit words under each owner's key (owners are indices).

    ``sample_words``: chunk ``chunk`` (words [chunk·L, (chunk+1)·L), L = ``chunk_words``) of
    each sample's short stream, addressed by (purpose, session, kind, owner, chain, iteration,
    component); all arrays ``(N,)`` int64, result ``(N, L)`` uint64. ``stream_words``: words
    [0, count) of each (purpose, session, kind, owner, chain, iteration) long stream, result
    ``(N, count)`` uint64. The words depend on nothing else.
    """

    chunk_words: int

    def __len__(self) -> int: ...

    def sample_words(
        self,
        purpose: str,
        session: str,
        kind: str,
        owner: np.ndarray,
        chain: np.ndarray,
        iteration: np.ndarray,
        component: np.ndarray,
        chunk: np.ndarray,
    ) -> np.ndarray: ...

    def stream_words(
        self,
        purpose: str,
        session: str,
        kind: str,
        owner: np.ndarray,
        chain: np.ndarray,
        iteration: np.ndarray,
        count: int,
    ) -> np.ndarray: ...


def _distinct(keys: Sequence[NoiseKey]) -> tuple[NoiseKey, ...]:
    # Two owners with one key would add identical noise to their answers at the same address,
    # so the difference of their answers would reveal λ_A − λ_B exactly: refuse shared keys.
    keys = tuple(keys)
    if not keys or not all(isinstance(k, NoiseKey) for k in keys):
        raise ValueError("a word source needs a non-empty sequence of NoiseKey, one per owner")
    if len({k.secret for k in keys}) != len(keys):
        raise ValueError("two owners share a noise key; every owner needs its own key")
    return keys


def _subkey(key: NoiseKey, generator: str, purpose: str, session: str, kind: str) -> bytes:
    """HMAC-SHA256 of the owner key over an unambiguous encoding of the stream's labels."""
    if purpose not in _PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}")
    parts = [s.encode("utf-8") for s in ("fedpenalty.noise.v1", generator, purpose, session, kind)]
    message = b"".join(struct.pack("<I", len(p)) + p for p in parts)
    return hmac.digest(key.secret, message, "sha256")


class _SubkeyCache:
    """Per-(purpose, session, kind) subkeys of every owner, computed once (bounded cache)."""

    def __init__(self, keys: tuple[NoiseKey, ...], generator: str):
        self._keys, self._generator = keys, generator
        self._cache: dict[tuple[str, str, str], list[bytes]] = {}

    def get(self, purpose: str, session: str, kind: str) -> list[bytes]:
        label = (purpose, session, kind)
        if label not in self._cache:
            if len(self._cache) >= 64:
                self._cache.clear()
            self._cache[label] = [_subkey(k, self._generator, *label) for k in self._keys]
        return self._cache[label]


class ChaChaSource:
    """Secure word source (the deployed default): ChaCha20 keystream under each owner's key.

    Layout. The (purpose, session, kind) labels enter a per-owner subkey (HMAC-SHA256 of the
    owner key). ``cryptography``'s 16-byte ChaCha20 nonce is a 4-byte little-endian block
    counter followed by a 12-byte nonce (RFC 7539), and the 32-bit counter may not wrap.
    sample_words: nonce = iteration (8 bytes) ‖ component (3) ‖ chunk (1; MAX_WORDS / 64 =
    256 chunks); counter = chain·8 + block, 8 blocks = 64 words a chunk — so one cipher call
    per owner returns chunk 0 of every chain of a scalar request (one call per component for
    wider answers; a call costs ≈ 5–10 µs of set-up, see scenarios/noise_cost.py).
    stream_words: nonce = iteration (8 bytes) ‖ chain (4); counter = word // 8.
    Every (label, address) maps injectively to (subkey, nonce, counter): no keystream reuse.
    """

    chunk_words = 64

    def __init__(self, keys: Sequence[NoiseKey]):
        self._keys = _distinct(keys)
        self._subkeys = _SubkeyCache(self._keys, "chacha20")

    def __len__(self) -> int:
        return len(self._keys)

    @staticmethod
    def _keystream(subkey: bytes, counter: int, nonce12: bytes, words: int) -> bytes:
        """``words`` 64-bit words of keystream (little-endian bytes) from block ``counter``."""
        nonce = struct.pack("<I", counter) + nonce12
        encryptor = Cipher(algorithms.ChaCha20(subkey, nonce), mode=None).encryptor()
        return encryptor.update(bytes(8 * words))

    def sample_words(
        self,
        purpose: str,
        session: str,
        kind: str,
        owner: np.ndarray,
        chain: np.ndarray,
        iteration: np.ndarray,
        component: np.ndarray,
        chunk: np.ndarray,
    ) -> np.ndarray:
        subkeys = self._subkeys.get(purpose, session, kind)
        width, blocks = self.chunk_words, self.chunk_words // _CHACHA_BLOCK_WORDS
        order = np.lexsort((chain, chunk, component, iteration, owner))
        o, it, co, ck, ch = (x[order] for x in (owner, iteration, component, chunk, chain))
        # one cipher call per run of nearby chains sharing (owner, iteration, component, chunk)
        new = np.ones(order.size, dtype=bool)
        new[1:] = (
            (o[1:] != o[:-1])
            | (it[1:] != it[:-1])
            | (co[1:] != co[:-1])
            | (ck[1:] != ck[:-1])
            | (ch[1:] - ch[:-1] > 8)
        )
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], order.size) - 1
        first, last = ch[starts], ch[ends]
        spans = last - first + 1
        parts = [
            self._keystream(
                subkeys[g_o],
                g_lo * blocks,
                struct.pack("<Q", g_it) + g_co.to_bytes(3, "little") + bytes([g_ck]),
                g_span * width,
            )
            for g_o, g_it, g_co, g_ck, g_lo, g_span in zip(
                o[starts].tolist(),
                it[starts].tolist(),
                co[starts].tolist(),
                ck[starts].tolist(),
                first.tolist(),
                spans.tolist(),
                strict=True,
            )
        ]
        rows = np.frombuffer(b"".join(parts), dtype="<u8").reshape(-1, width)
        group = np.cumsum(new) - 1  # each sorted sample's group; its row in ``rows``:
        row = (np.cumsum(spans) - spans)[group] + ch - first[group]
        out = np.empty((owner.size, width), dtype=_U64)
        out[order] = rows[row]
        return out

    def stream_words(
        self,
        purpose: str,
        session: str,
        kind: str,
        owner: np.ndarray,
        chain: np.ndarray,
        iteration: np.ndarray,
        count: int,
    ) -> np.ndarray:
        subkeys = self._subkeys.get(purpose, session, kind)
        padded = -(-count // _CHACHA_BLOCK_WORDS) * _CHACHA_BLOCK_WORDS
        parts = [
            self._keystream(subkeys[o], 0, struct.pack("<QI", it, c), padded)
            for o, c, it in zip(owner.tolist(), chain.tolist(), iteration.tolist(), strict=True)
        ]
        words = np.frombuffer(b"".join(parts), dtype="<u8").reshape(owner.size, padded)
        return words[:, :count].astype(_U64)


_PHILOX_M = np.array([[0xD2E7470EE14C6C93], [0xCA5A826395121157]], dtype=_U64)
_PHILOX_M_LO, _PHILOX_M_HI = _PHILOX_M & _U64(0xFFFFFFFF), _PHILOX_M >> _U64(32)
_PHILOX_W = np.array([[0x9E3779B97F4A7C15], [0xBB67AE8584CAA73B]], dtype=_U64)
_LOW32, _32 = _U64(0xFFFFFFFF), _U64(32)
_PHILOX_SLICE = 8192  # counters per pass: keeps the temporaries in cache


def philox4x64(counter: npt.ArrayLike, key: npt.ArrayLike) -> np.ndarray:
    """Philox-4x64-10 (Salmon et al. 2011) of ``counter`` ``(..., 4)`` under ``key`` ``(..., 2)``.

    uint64 in, uint64 ``(..., 4)`` out, vectorised over the broadcast leading axes. numpy's
    ``Philox(key=k, counter=c).random_raw()`` yields this function of c+1, c+2, … (it
    increments before it encrypts).
    """
    counter, key = np.asarray(counter, dtype=_U64), np.asarray(key, dtype=_U64)
    shape = np.broadcast_shapes(counter.shape[:-1], key.shape[:-1])
    n = math.prod(shape)
    counter = np.broadcast_to(counter, (*shape, 4)).reshape(n, 4)
    key = np.broadcast_to(key, (*shape, 2)).reshape(n, 2)
    out = np.empty((n, 4), dtype=_U64)
    for lo in range(0, n, _PHILOX_SLICE):
        out[lo : lo + _PHILOX_SLICE] = _philox_rounds(
            counter[lo : lo + _PHILOX_SLICE], key[lo : lo + _PHILOX_SLICE]
        )
    return out.reshape((*shape, 4))


def _philox_rounds(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The ten Philox rounds on ``(n, 4)`` counters and ``(n, 2)`` keys."""
    counter = np.ascontiguousarray(counter.T)
    keys = key.T.copy()  # (k0, k1) rows, bumped in place below
    mul, other = counter[0::2], counter[1::2]  # lanes (x0, x2) are multiplied by (M0, M1)
    for r in range(10):
        if r:
            keys += _PHILOX_W
        # 128-bit products mul·M from 32-bit partial products: (high, low) 64-bit halves
        m_lo, m_hi = mul & _LOW32, mul >> _32
        lo_lo, lo_hi, hi_lo = m_lo * _PHILOX_M_LO, m_lo * _PHILOX_M_HI, m_hi * _PHILOX_M_LO
        cross = (lo_lo >> _32) + (lo_hi & _LOW32) + (hi_lo & _LOW32)
        high = m_hi * _PHILOX_M_HI + (lo_hi >> _32) + (hi_lo >> _32) + (cross >> _32)
        low = mul * _PHILOX_M
        # (x0, x1, x2, x3) ← (hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0)
        mul, other = high[::-1] ^ other ^ keys, low[::-1]
    return np.stack([mul[0], other[0], mul[1], other[1]], axis=-1)


class PhiloxSource:
    """SIMULATION ONLY: seeded word source, numpy's Philox-4x64-10 vectorised over owners.

    Not a cryptographic generator; fast for thousands of simulated owners per process. Key =
    first 16 bytes of the per-(purpose, session, kind) HMAC subkey; counter = (block, chain,
    iteration, component) for sample_words (16 words = 4 blocks a chunk), (block, chain,
    iteration, 0) for stream_words; block = word // 4.
    """

    chunk_words = 16

    def __init__(self, keys: Sequence[NoiseKey]):
        self._keys = _distinct(keys)
        self._subkeys = _SubkeyCache(self._keys, "philox4x64")
        self._tables: dict[tuple[str, str, str], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def _key_table(self, purpose: str, session: str, kind: str) -> np.ndarray:
        label = (purpose, session, kind)
        if label not in self._tables:
            if len(self._tables) >= 64:
                self._tables.clear()
            raw = b"".join(s[:16] for s in self._subkeys.get(*label))
            self._tables[label] = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        return self._tables[label]

    def _words(self, key: np.ndarray, block: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        """Words of counters (block (N, B), *rest (N,)) → (N, 4B)."""
        columns = [block] + [np.broadcast_to(r[:, None], block.shape) for r in rest]
        counter = np.stack(columns, axis=-1).astype(_U64)
        return philox4x64(counter, key[:, None, :]).reshape(block.shape[0], -1)

    def sample_words(
        self,
        purpose: str,
        session: str,
        kind: str,
        owner: np.ndarray,
        chain: np.ndarray,
        iteration: np.ndarray,
        component: np.ndarray,
        chunk: np.ndarray,
    ) -> np.ndarray:
        per_chunk = self.chunk_words // 4
        block = chunk[:, None] * per_chunk + np.arange(per_chunk)
        key = self._key_table(purpose, session, kind)[owner]
        return self._words(key, block, chain, iteration, component)

    def stream_words(
        self,
        purpose: str,
        session: str,
        kind: str,
        owner: np.ndarray,
        chain: np.ndarray,
        iteration: np.ndarray,
        count: int,
    ) -> np.ndarray:
        block = np.broadcast_to(np.arange(-(-count // 4)), (owner.size, -(-count // 4)))
        key = self._key_table(purpose, session, kind)[owner]
        return self._words(key, block, chain, iteration, np.zeros_like(owner))[:, :count]


def word_source(keys: Sequence[NoiseKey], *, simulation: bool = False) -> WordSource:
    """The deployed default ``ChaChaSource``, or ``PhiloxSource`` when ``simulation``."""
    return PhiloxSource(keys) if simulation else ChaChaSource(keys)


# --------------------------------------------------------------------------- exact samplers


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
        q, r = divmod(abs((y << k) - a), a)
        if _bexp_one(word, q * q * a + 2 * q * r, 2 * a) and _square_one(word, r, a):
            return -y if negative else y


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


# --------------------------------------------------------------------------- lattice mechanism


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


# --------------------------------------------------------------------------- simulation noise


def _philox_key(seed: bytes, *labels: str) -> np.ndarray:
    """A 128-bit Philox key (2 uint64) from an owner's seed material and labels."""
    digest = hashlib.sha256(seed + b"".join(struct.pack("<I", len(x)) + x.encode() for x in labels))
    return np.frombuffer(digest.digest()[:16], dtype="<u8").astype(np.uint64)


_MIX1, _MIX2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_GOLDEN = _U64(0x9E3779B97F4A7C15)


def splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64), elementwise, in place."""
    x ^= x >> _U64(30)
    x *= _MIX1
    x ^= x >> _U64(27)
    x *= _MIX2
    x ^= x >> _U64(31)
    return x


_WORD = (1 << 64) - 1


def _splitmix_int(x: int) -> int:
    """``splitmix`` of one word as a Python int (cheaper than numpy for a few words)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _WORD
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _WORD
    return x ^ (x >> 31)


def _mixed_addresses(chains: np.ndarray, iterations: np.ndarray) -> np.ndarray:
    """mix(mix(iteration) ⊕ chain) of each address ``(M,)`` uint64 (``keyed_words``)."""
    if len(chains) <= 16:  # the usual request: a few chains, in Python ints
        pairs = zip(chains.tolist(), iterations.tolist())
        mixed = [_splitmix_int(_splitmix_int(i & _WORD) ^ (c & _WORD)) for c, i in pairs]
        return np.array(mixed, dtype=_U64)
    return splitmix(splitmix(iterations.astype(_U64)) ^ chains.astype(_U64))


def keyed_words(
    keys: np.ndarray, chains: np.ndarray, iterations: np.ndarray, count: int
) -> np.ndarray:
    """SIMULATION ONLY (not a cryptographic function): ``(P, M, count)`` uint64 words of each
    128-bit key ``keys`` ``(P, 2)`` at each address (chains[j], iterations[j]) ``(M,)``: word i
    = mix(mix(k₀ ⊕ a) ⊕ k₁ + (i + 1)·φ) with a = mix(mix(iteration) ⊕ chain) and mix SplitMix64's
    finaliser — a counter-based stream, vectorised over keys and addresses: a word does not
    depend on which others are asked for."""
    state = splitmix(keys[:, 0, None] ^ _mixed_addresses(chains, iterations)[None, :])
    state ^= keys[:, 1, None]
    if count == 1:
        state += _GOLDEN
        return splitmix(state)[:, :, None]
    steps = np.arange(1, count + 1, dtype=_U64) * _GOLDEN
    return splitmix(state[:, :, None] + steps)


class SeededNormals:
    """SIMULATION ONLY: each owner's float standard normals addressed by (session, kind, owner,
    chain, iteration, component), so that a value never depends on what was drawn before it —
    a resumed simulation draws exactly what an uninterrupted one does (docs/design.md §2.7).

    The value is Φ⁻¹(U) for U = (w >> 11 + ½)·2⁻⁵³ ∈ (0, 1) from the ``keyed_words`` word w of
    the owner's key (hashed from its seed, session and kind) at (chain, iteration), word index
    = component: computed for the asked keys only, for all owners at once — the cost per
    iteration is a few array operations whatever the number of owners, and nothing is cached
    but the keys.
    """

    def __init__(self, seeds: Sequence[bytes]):
        self._seeds = list(seeds)
        self._keys: dict[tuple[str, str], np.ndarray] = {}
        self._sampler = np.random.Generator(np.random.Philox(key=np.zeros(2, np.uint64)))

    def normals(
        self,
        session: str,
        kind: str,
        owners: np.ndarray | None,
        chains: np.ndarray,
        iterations: np.ndarray,
        width: int,
    ) -> np.ndarray:
        """Standard normals ``(K', M, width)`` of ``owners`` ``(K',)`` (None: every owner) for
        keys (chains[j], iterations[j]) ``(M,)``."""
        keys = self._key_table(session, kind)
        if owners is not None:
            keys = keys[owners]
        uniform = (keyed_words(keys, chains, iterations, width) >> _U64(11)).astype(float)
        uniform += 0.5
        uniform *= 2.0**-53
        return special.ndtri(uniform, out=uniform)

    def _key_table(self, session: str, label: str) -> np.ndarray:
        """Every owner's 128-bit key for (session, label) ``(K, 2)`` uint64 (kept, 64 at most)."""
        if (session, label) not in self._keys:
            if len(self._keys) >= 64:
                self._keys.clear()
            self._keys[(session, label)] = np.stack(
                [_philox_key(seed, session, label) for seed in self._seeds]
            )
        return self._keys[(session, label)]

    def sample(
        self, session: str, kind: str, owner: int, chain: int, iteration: int, n: int, q: float
    ) -> np.ndarray:
        """Owner ``owner``'s Poisson sample at rate ``q`` of its ``n`` records for one key:
        sorted distinct indices — a Binomial(n, q) count, then that many records uniformly
        without replacement, the law of n independent Bernoulli(q) coins in O(q·n) work.
        Drawn from Philox under its (seed, session, kind + "-sample") key at counter
        (0, iteration, chain, 0), so a key's sample never depends on other keys."""
        self._sampler.bit_generator.state = {
            "bit_generator": "Philox",
            "state": {
                "counter": np.array([0, iteration, chain, 0], dtype=np.uint64),
                "key": self._key_table(session, kind + "-sample")[owner],
            },
            "buffer": np.zeros(4, dtype=np.uint64),
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        count = int(self._sampler.binomial(n, q))
        return np.sort(self._sampler.choice(n, count, replace=False, shuffle=False))


def seed_material(rng: np.random.Generator) -> bytes:
    """32 bytes that identify a simulated owner's seeded generator (its ``SeedSequence``) —
    taken from the seed, not drawn, so the generator itself is left untouched."""
    seed_seq = getattr(rng.bit_generator, "seed_seq", None)
    if isinstance(seed_seq, np.random.SeedSequence):
        return seed_seq.generate_state(4, np.uint64).astype("<u8").tobytes()
    return rng.bytes(32)
