"""SIMULATION ONLY: seeded counter-based noise of simulated owners (docs/design.md §2.7) —
float normals and Poisson samples addressed by (session, kind, owner, chain, iteration), and
the SplitMix64 words that simulated secure-aggregation masks use. Not cryptographic.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

_U64 = np.uint64


def _philox_key(seed: bytes, *labels: str) -> np.ndarray:
    """A 128-bit Philox key (2 uint64) from an owner's seed material and labels."""
    digest = hashlib.sha256(seed + b"".join(struct.pack("<I", len(x)) + x.encode() for x in labels))
    return np.frombuffer(digest.digest()[:16], dtype="<u8").astype(np.uint64)


def _word(value: int) -> np.ndarray:
    """A 0-d uint64 array: as an operand of a small array's ufunc it costs less than a numpy
    scalar (about 0.25 µs a call), with the same result."""
    return np.array(value, dtype=_U64)


_MIX1, _MIX2 = _word(0xBF58476D1CE4E5B9), _word(0x94D049BB133111EB)
_GOLDEN = _word(0x9E3779B97F4A7C15)
_SHIFT_30, _SHIFT_27, _SHIFT_31, _SHIFT_11 = _word(30), _word(27), _word(31), _word(11)


def splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64), elementwise, in place (``x`` an array;
    one scratch array for the shifts)."""
    scratch = np.right_shift(x, _SHIFT_30)
    x ^= scratch
    x *= _MIX1
    x ^= np.right_shift(x, _SHIFT_27, out=scratch)
    x *= _MIX2
    x ^= np.right_shift(x, _SHIFT_31, out=scratch)
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
        if len(set(iterations.tolist())) == 1:  # one iteration (the usual): mix it once
            first = _splitmix_int(int(iterations[0]) & _WORD)
            mixed = [_splitmix_int(first ^ (c & _WORD)) for c in chains.tolist()]
        else:
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


def _normals(
    keys: np.ndarray, chains: np.ndarray, iterations: np.ndarray, width: int
) -> np.ndarray:
    """``SeededNormals``' values ``(P, M, width)`` of keys ``(P, 2)`` at (chains[j],
    iterations[j]) ``(M,)``, read-only."""
    uniform = np.right_shift(keyed_words(keys, chains, iterations, width), _SHIFT_11)
    uniform = uniform.astype(float)
    uniform += 0.5
    uniform *= 2.0**-53
    special.ndtri(uniform, out=uniform)
    uniform.flags.writeable = False
    return uniform


#: a lookahead block holds about this many normals at most (64 KiB), and at most this many
#: iterations: past ~8,000 values per block, drawing per iteration costs no more per value
LOOKAHEAD_VALUES, LOOKAHEAD_ITERATIONS = 8192, 32


def lookahead_iterations(per_iteration: int) -> int:
    """How many iterations one lookahead block draws when one iteration asks ``per_iteration``
    values (1: none ahead)."""
    return max(1, min(LOOKAHEAD_ITERATIONS, LOOKAHEAD_VALUES // max(per_iteration, 1)))


@dataclass(frozen=True)
class Lookahead:
    """Every owner's normals at iterations ``first`` … ``first + len(block) − 1`` for one
    (session, kind, chains, width): ``block`` ``(B, K, M, width)``, read-only."""

    first: int
    block: np.ndarray

    @classmethod
    def draw(
        cls, keys: np.ndarray, chains: np.ndarray, first: int, width: int, count: int
    ) -> Lookahead:
        """The block of ``count`` iterations from ``first``: the very values ``_normals`` gives
        per iteration (a value depends on its address alone)."""
        m = len(chains)
        iterations = np.repeat(np.arange(first, first + count, dtype=np.int64), m)
        values = _normals(keys, np.tile(chains, count), iterations, width)
        block = np.ascontiguousarray(values.reshape(len(keys), count, m, width).swapaxes(0, 1))
        block.flags.writeable = False
        return cls(first, block)

    def holds(self, iteration: int) -> bool:
        return self.first <= iteration < self.first + len(self.block)


class SeededNormals:
    """SIMULATION ONLY: each owner's float standard normals addressed by (session, kind, owner,
    chain, iteration, component), so that a value never depends on what was drawn before it —
    a resumed simulation draws exactly what an uninterrupted one does (docs/design.md §2.7).

    The value is Φ⁻¹(U) for U = (w >> 11 + ½)·2⁻⁵³ ∈ (0, 1) from the ``keyed_words`` word w of
    the owner's key (hashed from its seed, session and kind) at (chain, iteration), word index
    = component: computed for the asked keys only, for all owners at once — the cost per
    iteration is a few array operations whatever the number of owners.

    Because a value is a function of its address alone, the usual request (every owner, the
    same chains, one iteration, at or past the last block's) is served from a block drawn for
    the coming iterations at once (``Lookahead``): the same values, for one set of
    array operations per block instead of per iteration (docs/design.md §4).
    """

    def __init__(self, seeds: Sequence[bytes]):
        self._seeds = list(seeds)
        self._keys: dict[tuple[str, str], np.ndarray] = {}
        self._ahead: dict[tuple[str, str, int, bytes], Lookahead] = {}
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
        keys (chains[j], iterations[j]) ``(M,)``, read-only (it may be a lookahead block's
        view)."""
        keys = self._key_table(session, kind)
        if owners is not None:
            return _normals(keys[owners], chains, iterations, width)
        asked = iterations.tolist()
        if not asked or asked.count(asked[0]) != len(asked):  # one iteration: the usual
            return _normals(keys, chains, iterations, width)
        iteration = asked[0]
        where = (session, kind, width, chains.tobytes())
        ahead = self._ahead.get(where)
        if ahead is not None and ahead.holds(iteration):
            return ahead.block[iteration - ahead.first]
        count = lookahead_iterations(keys.shape[0] * len(chains) * width)
        if count <= 1 or (ahead is not None and iteration < ahead.first):  # none, or backwards
            return _normals(keys, chains, iterations, width)
        if len(self._ahead) >= 64:  # kept for a few (session, kind, chains) at most
            self._ahead.clear()
        ahead = self._ahead[where] = Lookahead.draw(keys, chains, iteration, width, count)
        return ahead.block[0]

    def _key_table(self, session: str, label: str) -> np.ndarray:
        """Every owner's 128-bit key for (session, label) ``(K, 2)`` uint64 (kept, 64 at most)."""
        table = self._keys.get((session, label))
        if table is None:
            if len(self._keys) >= 64:
                self._keys.clear()
            table = self._keys[(session, label)] = np.stack(
                [_philox_key(seed, session, label) for seed in self._seeds]
            )
        return table

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
    return seed_materials([rng])[0]


#: ``SeedSequence.generate_state``'s hash constants (numpy/random/bit_generator.pyx)
_INIT_B, _MULT_B, _XSHIFT = np.uint32(0x8B51F9DD), np.uint32(0x58F38DED), np.uint32(16)


def seed_materials(rngs: Sequence[np.random.Generator]) -> list[bytes]:
    """``seed_material`` of every generator of ``rngs``, byte for byte, computed for all the
    seeded ones at once: ``generate_state(4, uint64)`` of each ``SeedSequence`` is a fixed
    hash of its 4-word pool, here applied to the pools ``(K, 4)`` as array operations
    (docs/design.md §4 "Many owners"). A generator without one gives ``rng.bytes(32)``."""
    seqs = [getattr(rng.bit_generator, "seed_seq", None) for rng in rngs]
    seeded = [k for k, s in enumerate(seqs) if isinstance(s, np.random.SeedSequence)]
    out = [b""] * len(rngs)
    if seeded:
        pools = np.array([seqs[k].pool for k in seeded], dtype=np.uint32)  # type: ignore[union-attr]
        if pools.shape[1] != 4:
            raise ValueError("seed_materials: a SeedSequence pool of 4 words is expected")
        words = np.empty((len(seeded), 8), dtype=np.uint32)
        hash_const = _INIT_B
        with np.errstate(over="ignore"):
            for i in range(8):
                value = pools[:, i % 4] ^ hash_const
                hash_const = hash_const * _MULT_B
                value *= hash_const
                value ^= value >> _XSHIFT
                words[:, i] = value
        material = words.view(np.uint64).astype("<u8")
        for row, k in enumerate(seeded):
            out[k] = material[row].tobytes()
    for k, s in enumerate(seqs):
        if not isinstance(s, np.random.SeedSequence):
            out[k] = rngs[k].bytes(32)
    return out
