"""Noise keys and counter-based word sources (docs/design.md §2.7).

Sources (``WordSource``): ``ChaChaSource`` (ChaCha20 keystream via ``cryptography``/OpenSSL,
keys from OS entropy: the deployed default) and ``PhiloxSource`` (numpy's Philox-4x64-10,
vectorised over owners: seeded, for simulation only). A word depends only on the owner's key
and its address, never on what was drawn before it.
"""

from __future__ import annotations

import hmac
import math
import operator
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
#: The address space of a word: chains, components and words of one long stream.
MAX_CHAIN, MAX_COMPONENT, MAX_STREAM_WORDS = 1 << 29, 1 << 24, 1 << 35

_U64 = np.uint64
_CHACHA_BLOCK_WORDS = 8  # a ChaCha20 block is 64 bytes
_PURPOSES = ("gauss", "bernoulli", "uniform", "laplace")


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
