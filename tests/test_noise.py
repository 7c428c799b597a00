"""Exact lattice noise (fedpenalty.owner.noise): sources, samplers, lattice helpers, uniforms.

Statistical tests use fixed keys (so they are deterministic) and state their tolerances: a
χ² p-value threshold of 1e-4, or 5 standard errors for moments and frequencies. Each would
fail on a real bug: a wrong scale, a lost low bit, a shared stream or a batch-dependent draw.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from fedpenalty.owner.noise import exact as sampler
from fedpenalty.owner.noise import sources
from fedpenalty.owner.noise.exact import bernoulli_exp, discrete_gaussian, lattice_scale, uniforms
from fedpenalty.owner.noise.lattice import (
    from_lattice,
    lattice_sensitivity,
    noisy_lattice_answers,
    to_lattice,
)
from fedpenalty.owner.noise.sources import (
    ChaChaSource,
    NoiseKey,
    PhiloxSource,
    philox4x64,
    word_source,
)

SEED = 20240601
KEYS = [NoiseKey.derive(SEED, f"owner-{i}") for i in range(6)]
SOURCES = {"philox": PhiloxSource(KEYS), "chacha": ChaChaSource(KEYS)}
GAMMA = 2.0**-32


def draws(source, sigma_over_gamma, n, session="s", kind="log_ratio", owner=0, iteration=0):
    """n samples at n distinct chains of one owner (one cipher call a chunk for ChaCha)."""
    return discrete_gaussian(
        source,
        session,
        kind,
        sigma_over_gamma,
        owner=owner,
        chain=np.arange(n),
        iteration=iteration,
    )


def dg_pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Support |n| ≤ 40σ + 10 (outside mass < e^-800) and the exact normalised pmf on it."""
    half = int(40 * sigma) + 10
    support = np.arange(-half, half + 1)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma**2))
    return support, weights / weights.sum()


def chi2(samples: np.ndarray, sigma: float):
    """χ² goodness of fit of integer samples to the discrete Gaussian with scale sigma; cells
    are the integers with expected count ≥ 5 and the two tails beyond them."""
    support, pmf = dg_pmf(sigma)
    half = support[-1]
    assert np.abs(samples).max() <= half
    observed = np.bincount(samples + half, minlength=support.size)
    expected = pmf * samples.size
    central = np.flatnonzero(expected >= 5)
    lo, hi = central[0], central[-1] + 1
    f_obs = np.concatenate([[observed[:lo].sum()], observed[lo:hi], [observed[hi:].sum()]])
    f_exp = np.concatenate([[expected[:lo].sum()], expected[lo:hi], [expected[hi:].sum()]])
    return stats.chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum())


# --------------------------------------------------------------------------- word sources


@pytest.mark.parametrize(
    "key, counter",
    [
        (0, 0),
        (5, 7),
        (2**128 - 1, 2**64 - 1),
        (0x0123456789ABCDEF_FEDCBA9876543210, 2**255 + 3),
        (1, 2**256 - 2),
    ],
)
def test_philox_equals_numpys_generator(key, counter):
    """The vectorised Philox is numpy's own: Philox(key, counter).random_raw() yields blocks
    at counter + 1, counter + 2, … (carries across the four 64-bit words included)."""
    reference = np.random.Philox(key=key, counter=counter).random_raw(12)

    def words(x: int, n: int) -> list[int]:
        return [(x >> (64 * i)) & (2**64 - 1) for i in range(n)]

    counters = np.array([words((counter + 1 + b) % 2**256, 4) for b in range(3)], np.uint64)
    ours = philox4x64(counters, np.array(words(key, 2), np.uint64))
    np.testing.assert_array_equal(ours.ravel(), reference)


def test_philox_broadcasts_over_owners_and_counters():
    keys = np.array([[1, 2], [3, 4]], np.uint64)[:, None, :]  # 2 owners
    counters = np.arange(12, dtype=np.uint64).reshape(3, 4)  # 3 counters
    out = philox4x64(counters, keys)
    assert out.shape == (2, 3, 4)
    for o in range(2):
        for c in range(3):
            np.testing.assert_array_equal(out[o, c], philox4x64(counters[c], keys[o, 0]))


def test_cryptography_chacha20_nonce_is_counter_then_rfc7539_nonce():
    """RFC 7539 §2.3.2 block-function vector: key 00..1f, nonce 000000090000004a00000000,
    block counter 1 — passed to ``cryptography`` as 4-byte little-endian counter ‖ nonce."""
    nonce = (1).to_bytes(4, "little") + bytes.fromhex("000000090000004a00000000")
    block = Cipher(algorithms.ChaCha20(bytes(range(32)), nonce), None).encryptor().update(bytes(64))
    assert block.hex() == (
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )


def test_chacha_layout_is_the_documented_keystream():
    """sample_words(chain c, chunk p) = ChaCha20 keystream at block counter 8c under nonce
    iteration ‖ component ‖ p and the (purpose, session, kind) subkey; stream_words at nonce
    iteration ‖ chain from block 0."""
    source = SOURCES["chacha"]
    owner, chain, iteration, component, chunk = 2, 5, 77, 3, 1
    got = source.sample_words(
        "gauss", "s", "k", *(np.array([x]) for x in (owner, chain, iteration, component, chunk))
    )
    subkey = sources._subkey(KEYS[owner], "chacha20", "gauss", "s", "k")
    nonce = (
        (8 * chain).to_bytes(4, "little")
        + iteration.to_bytes(8, "little")
        + component.to_bytes(3, "little")
        + bytes([chunk])
    )
    keystream = Cipher(algorithms.ChaCha20(subkey, nonce), None).encryptor().update(bytes(512))
    np.testing.assert_array_equal(got[0], np.frombuffer(keystream, "<u8"))
    got = source.stream_words(
        "uniform", "s", "k", np.array([owner]), np.array([chain]), np.array([iteration]), 10
    )
    subkey = sources._subkey(KEYS[owner], "chacha20", "uniform", "s", "k")
    nonce = bytes(4) + iteration.to_bytes(8, "little") + chain.to_bytes(4, "little")
    keystream = Cipher(algorithms.ChaCha20(subkey, nonce), None).encryptor().update(bytes(80))
    np.testing.assert_array_equal(got[0], np.frombuffer(keystream, "<u8"))


def test_one_cipher_call_per_owner_for_all_chains(monkeypatch):
    calls = []
    source = ChaChaSource(KEYS)
    original = source._keystream
    monkeypatch.setattr(source, "_keystream", lambda *a: calls.append(a) or original(*a))
    owner = np.repeat(np.arange(3), 4)
    chain = np.tile(np.arange(4), 3)
    zeros = np.zeros(12, dtype=np.int64)
    words = source.sample_words("gauss", "s", "k", owner, chain, zeros + 9, zeros, zeros)
    assert len(calls) == 3  # one per owner, covering its 4 chains
    assert len({w.tobytes() for w in words}) == 12


def test_distinct_keys_required_and_derivation_reproducible():
    assert NoiseKey.derive(SEED, "alice") == NoiseKey.derive(SEED, "alice")
    assert NoiseKey.derive(SEED, "alice") != NoiseKey.derive(SEED, "bob")
    assert NoiseKey.derive(SEED, "alice") != NoiseKey.derive(SEED + 1, "alice")
    assert NoiseKey.derive(b"1", "alice") != NoiseKey.derive(1, "alice")
    assert NoiseKey.from_os() != NoiseKey.from_os()
    assert KEYS[0].secret.hex() not in repr(KEYS[0]) and str(KEYS[0].secret) not in repr(KEYS[0])
    for source in (ChaChaSource, PhiloxSource):
        with pytest.raises(ValueError, match="share a noise key"):
            source([KEYS[0], KEYS[1], KEYS[0]])
    assert isinstance(word_source(KEYS), ChaChaSource)
    assert isinstance(word_source(KEYS, simulation=True), PhiloxSource)


# --------------------------------------------------------------------------- exact sampler


@pytest.mark.parametrize("name", ["philox", "chacha"])
@pytest.mark.parametrize("scale", [1.5, 3.0, 20.0])
def test_discrete_gaussian_pmf_chi2(name, scale):
    """20,000 draws against the exact normalised pmf: p-value > 1e-4 (a fixed key, so a
    deterministic pass); the same draws against σ/2 give a huge statistic, so the test has
    power against a wrong variance."""
    samples = draws(SOURCES[name], scale, 20_000, kind=f"chi2-{scale}")
    assert samples.dtype == np.int64
    assert chi2(samples, float(lattice_scale(scale))).pvalue > 1e-4
    assert chi2(samples, scale / 2).statistic > 1_000


@pytest.mark.parametrize("name", ["philox", "chacha"])
def test_variance_and_low_bits_at_large_scale(name):
    """σ/γ = 2^30: sample variance within 5 standard errors (√(2/N) ≈ 1% relative) of σ'²,
    mean within 5σ/√N, and the lowest bits uniform (a shift or rounding bug would lose them)."""
    n, scale = 20_000, 2.0**30
    samples = draws(SOURCES[name], scale, n, kind="variance")
    assert abs(samples.var() / scale**2 - 1) < 5 * math.sqrt(2 / n)
    assert abs(samples.mean()) < 5 * scale / math.sqrt(n)
    for bit in range(3):
        assert abs(((samples >> bit) & 1).mean() - 0.5) < 5 * 0.5 / math.sqrt(n)


def test_largest_scale_runs_and_is_centred():
    samples = draws(SOURCES["philox"], 2.0**40, 2_000, kind="max")
    assert abs(samples.std() / 2.0**40 - 1) < 5 / math.sqrt(2 * 2_000)


@pytest.mark.parametrize("name", ["philox", "chacha"])
def test_bernoulli_exp_frequencies(name):
    """Bernoulli(exp(−x)) for x = 0, 1/3, 1, 5/2, 7, 200/3: frequency within 5 binomial
    standard errors (plus 1e-9 for p ∈ {0, 1}) of exp(−x)."""
    n = 20_000
    fractions = [(0, 1), (1, 3), (1, 1), (5, 2), (7, 1), (200, 3)]
    num = np.repeat([f[0] for f in fractions], n).reshape(len(fractions), n)
    den = np.repeat([f[1] for f in fractions], n).reshape(len(fractions), n)
    coins = bernoulli_exp(
        SOURCES[name],
        "s",
        "bexp",
        num,
        den,
        owner=1,
        chain=np.arange(n),
        iteration=np.arange(len(fractions))[:, None],
    )
    for (p, q), row in zip(fractions, coins, strict=True):
        expected = math.exp(-p / q)
        assert abs(row.mean() - expected) <= 5 * math.sqrt(expected * (1 - expected) / n) + 1e-9


@pytest.mark.parametrize("name", ["philox", "chacha"])
def test_batch_invariance(name, monkeypatch):
    """A sample's value depends only on its key and address: not on the other samples in the
    batch (their number, order, addresses or scales) nor on the path — the scalar reference,
    the vectorised machine, or the machine handing its stragglers to the scalar path."""
    source = SOURCES[name]
    rng = np.random.default_rng(0)
    owner, chain, it = rng.integers(0, 6, 300), rng.integers(0, 50, 300), rng.integers(0, 4, 300)
    component = rng.integers(0, 3, 300)
    scale = rng.choice([1.0, 7.5, 2.0**20], 300)
    base = discrete_gaussian(
        source, "s", "k", scale, owner=owner, chain=chain, iteration=it, component=component
    )  # scalar path: a small batch
    order = rng.permutation(600)

    def more(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.concatenate([x, y])[order]

    batch = dict(
        owner=more(owner, rng.integers(0, 6, 300)),
        chain=more(chain, rng.integers(50, 99, 300)),
        iteration=more(it, rng.integers(0, 9, 300)),
        component=more(component, rng.integers(0, 9, 300)),
    )
    scales = more(scale, rng.uniform(1, 1e6, 300))
    monkeypatch.setattr(sampler, "SCALAR_BATCH", 0)
    for stragglers in (0, 16, 10**9):  # all vectorised, the usual hand-off, all scalar
        monkeypatch.setattr(sampler, "STRAGGLERS", stragglers)
        mixed = discrete_gaussian(source, "s", "k", scales, **batch)
        np.testing.assert_array_equal(mixed[np.argsort(order)[:300]], base)
        coins = bernoulli_exp(source, "s", "k", np.arange(600) % 11, 4, **batch)
        if stragglers == 0:
            reference = coins
        np.testing.assert_array_equal(coins, reference)
    monkeypatch.undo()
    for i in range(0, 300, 37):  # alone
        alone = discrete_gaussian(
            source,
            "s",
            "k",
            scale[i],
            owner=owner[i],
            chain=chain[i],
            iteration=it[i],
            component=component[i],
        )
        assert alone == base[i]
    fresh = type(source)([NoiseKey.derive(SEED, f"owner-{i}") for i in range(6)])  # a resume
    again = discrete_gaussian(
        fresh, "s", "k", scale, owner=owner, chain=chain, iteration=it, component=component
    )
    np.testing.assert_array_equal(again, base)


@pytest.mark.parametrize("name", ["philox", "chacha"])
def test_distinct_streams_are_independent(name):
    """Different owners, sessions, kinds or iterations give unrelated draws: few ties (a tie
    has probability ≈ 1/(2√π·20) ≈ 1.4% for σ/γ = 20) and |correlation| < 5/√N."""
    n, source = 5_000, SOURCES[name]
    base = draws(source, 20.0, n)
    others = [
        draws(source, 20.0, n, owner=1),
        draws(source, 20.0, n, session="t"),
        draws(source, 20.0, n, kind="suff_stats"),
        draws(source, 20.0, n, iteration=1),
    ]
    for other in others:
        assert (other == base).mean() < 0.03
        assert abs(np.corrcoef(base, other)[0, 1]) < 5 / math.sqrt(n)


def test_word_cap_raises_on_a_stuck_source(monkeypatch):
    monkeypatch.setattr(sampler, "MAX_WORDS", 256)

    class Stuck:
        """Every word is 2^64 − 1: the uniform draws reject forever."""

        chunk_words = 64

        def __len__(self):
            return 1

        def sample_words(self, purpose, session, kind, owner, *rest):
            return np.full((owner.size, 64), 2**64 - 1, dtype=np.uint64)

    for batch, stragglers in ((10**9, 16), (0, 0)):  # the scalar path, the vectorised one
        monkeypatch.setattr(sampler, "SCALAR_BATCH", batch)
        monkeypatch.setattr(sampler, "STRAGGLERS", stragglers)
        with pytest.raises(RuntimeError, match="words"):
            discrete_gaussian(Stuck(), "s", "k", 1.5, owner=0, chain=np.arange(50), iteration=0)


def test_lattice_scale_is_exact_and_never_smaller():
    assert lattice_scale(1.5) == Fraction(3, 2)
    assert lattice_scale(2.0**40) == 2**40
    third = lattice_scale(Fraction(1, 3))
    assert Fraction(1, 3) <= third < Fraction(1, 3) * (1 + Fraction(1, 2**40))
    rng = np.random.default_rng(1)
    for s in np.exp(rng.uniform(math.log(2.0**-20), math.log(2.0**40), 200)):
        exact = lattice_scale(float(s))
        assert exact == lattice_scale(Fraction(float(s)))  # float and rational paths agree
        assert Fraction(float(s)) <= exact < Fraction(float(s)) * (1 + Fraction(1, 2**40))
        a, k = sampler._scale_parts(float(s))
        assert 2**40 <= int(a) <= 2**41 and exact == Fraction(int(a), 2 ** int(k))


# --------------------------------------------------------------------------- lattice helpers


def test_lattice_round_trip_is_exact():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(10_000) * 10.0 ** rng.integers(-12, 5, 10_000)  # |x|/γ < 2^53
    n = to_lattice(x, GAMMA)
    y = from_lattice(n, GAMMA)
    np.testing.assert_array_equal(y / GAMMA, n)  # exact: γ is a power of two
    assert np.all(np.abs(y - x) <= GAMMA / 2)
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5]) * GAMMA
    np.testing.assert_array_equal(to_lattice(ties, GAMMA), [0, 2, 2, 0, -2])  # half to even


def test_rounding_sensitivity_bound():
    """‖R(a) − R(b)‖ ≤ ‖a − b‖ + γ√w even for points placed just either side of ties."""
    rng = np.random.default_rng(3)
    gamma, width = 2.0**-4, 5
    assert lattice_sensitivity(1.0, gamma, width) >= 1.0 + gamma * math.sqrt(width)
    worst = 0.0
    for _ in range(2_000):
        a = (rng.integers(-100, 100, width) + 0.5) * gamma - rng.uniform(0, 1e-3, width)
        b = a + rng.uniform(0, 2e-3, width)
        delta = float(np.linalg.norm(b - a))
        gap = np.linalg.norm(from_lattice(to_lattice(a, gamma) - to_lattice(b, gamma), gamma))
        assert gap <= lattice_sensitivity(delta, gamma, width)
        worst = max(worst, gap - delta)
    assert worst > 0.9 * gamma * math.sqrt(width)  # the bound is attained, hence needed


@pytest.mark.parametrize("name", ["philox", "chacha"])
def test_noisy_answers_are_exact_lattice_points(name):
    source = SOURCES[name]
    rng = np.random.default_rng(4)
    values = rng.standard_normal((6, 4, 2)) * 100
    sigma = np.array([1e-9, 1e-6, 1e-3, 1.0, 5.0, 100.0])
    answers = noisy_lattice_answers(source, "s", "log_ratio", 12, values, sigma, GAMMA)
    assert answers.shape == (6, 4, 2)
    assert np.all(np.floor(answers / GAMMA) == answers / GAMMA)
    assert np.all(np.abs(answers - values) < 10 * sigma[:, None, None] + GAMMA)
    noise_part = discrete_gaussian(
        source,
        "s",
        "log_ratio",
        (sigma / GAMMA)[:, None, None],
        owner=np.arange(6)[:, None, None],
        chain=np.arange(4)[None, :, None],
        iteration=12,
        component=np.arange(2),
    )
    np.testing.assert_array_equal(
        answers, from_lattice(to_lattice(values, GAMMA) + noise_part, GAMMA)
    )


# --------------------------------------------------------------------------- uniforms


@pytest.mark.parametrize("name", ["philox", "chacha"])
def test_uniforms(name):
    """53-bit uniforms in [0, 1); mean within 5 standard errors of 1/2; record i's uniform
    does not depend on how many records are drawn; owners and chains differ."""
    source, n = SOURCES[name], 20_000
    u = uniforms(source, "s", "gradient", n, owner=[0, 1], chain=[[0], [1]], iteration=3)
    assert u.shape == (2, 2, n)
    assert np.all((u >= 0) & (u < 1))
    np.testing.assert_array_equal(u * 2.0**53, np.floor(u * 2.0**53))
    assert abs(u.mean() - 0.5) < 5 / math.sqrt(12 * u.size)
    few = uniforms(source, "s", "gradient", 13, owner=1, chain=1, iteration=3)
    np.testing.assert_array_equal(few, u[1, 1, :13])
    flat = u.reshape(4, n)
    assert max(abs(np.corrcoef(flat)[i, j]) for i in range(4) for j in range(i)) < 5 / n**0.5


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_refused():
    source = SOURCES["philox"]
    with pytest.raises(ValueError, match="finite"):
        to_lattice([1.0, math.nan], GAMMA)
    with pytest.raises(ValueError, match="finite"):
        to_lattice([math.inf], GAMMA)
    for gamma in (0.3, 0.0, -0.5, math.inf, math.nan):
        with pytest.raises(ValueError, match="power of two"):
            to_lattice([1.0], gamma)
        with pytest.raises(ValueError, match="power of two"):
            from_lattice([1], gamma)
    with pytest.raises(ValueError, match="2\\^62"):
        to_lattice([1e30], 1.0)
    with pytest.raises(ValueError, match="2\\^53"):
        from_lattice([2**53], 1.0)
    with pytest.raises(ValueError, match="integers"):
        from_lattice([1.5], 1.0)
    for sigma in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="sigma"):
            noisy_lattice_answers(source, "s", "k", 0, np.zeros((1, 1, 1)), [sigma], GAMMA)
    for scale in (0.0, 2.0**-21, 2.0**40 * 1.01, math.nan, Fraction(-1, 2)):
        with pytest.raises(ValueError, match="σ/γ"):
            discrete_gaussian(source, "s", "k", scale, owner=0, chain=0, iteration=0)
    with pytest.raises(ValueError, match="σ/γ"):  # σ = 1 at γ = 2^-64 is σ/γ = 2^64
        noisy_lattice_answers(source, "s", "k", 0, np.zeros((1, 1, 1)), [1.0], 2.0**-64)
    with pytest.raises(ValueError, match="owner"):
        discrete_gaussian(source, "s", "k", 2.0, owner=6, chain=0, iteration=0)
    with pytest.raises(ValueError, match="chain"):
        discrete_gaussian(source, "s", "k", 2.0, owner=0, chain=-1, iteration=0)
    with pytest.raises(ValueError, match="component"):
        discrete_gaussian(source, "s", "k", 2.0, owner=0, chain=0, iteration=0, component=2**24)
    with pytest.raises(ValueError, match="integers"):
        discrete_gaussian(source, "s", "k", 2.0, owner=0, chain=0.5, iteration=0)
    with pytest.raises(ValueError, match="denominator"):
        bernoulli_exp(source, "s", "k", 1, 0, owner=0, chain=0, iteration=0)
    with pytest.raises(ValueError, match="count"):
        uniforms(source, "s", "k", -1, owner=0, chain=0, iteration=0)
    with pytest.raises(ValueError, match="32 bytes"):
        NoiseKey(b"short")
    with pytest.raises(ValueError, match=">= 0"):
        NoiseKey.derive(-1, "alice")
    with pytest.raises(ValueError, match="values"):
        noisy_lattice_answers(source, "s", "k", 0, np.zeros((2, 2)), [1.0, 1.0], GAMMA)
    with pytest.raises(ValueError, match="Δ"):
        lattice_sensitivity(math.nan, GAMMA, 1)


def test_seeded_normals_are_addressed_by_key_and_independent_across_windows():
    """Simulation noise: a key's value does not depend on what was asked before (another
    order, more chains, a fresh object) and consecutive windows are not shifted copies of each
    other (no autocorrelation at lags 1–128 beyond 5/√n; windows whose Philox streams overlapped
    by one counter block repeated values at a lag of about 60, and this test failed on them)."""
    from fedpenalty.owner.noise.seeded import SeededNormals

    seeds = [bytes([k]) * 32 for k in range(3)]
    its = np.arange(0, 2000)
    first = SeededNormals(seeds).normals("s", "penalty", np.arange(3), np.zeros(2000, int), its, 1)
    other = SeededNormals(seeds)
    other.normals("s", "penalty", np.arange(3), np.arange(7), np.full(7, 1500), 1)  # more chains
    again = other.normals("s", "penalty", np.array([2, 0]), np.zeros(2000, int), its[::-1], 1)
    np.testing.assert_array_equal(again[:, ::-1], first[[2, 0]])
    # a request of a few keys hashes its addresses in Python ints: the same words
    few = other.normals("s", "penalty", None, np.zeros(5, int), its[:5], 1)
    np.testing.assert_array_equal(few, first[:, :5])
    # a few chains at one iteration (the usual request) mix the iteration once: the same words
    chains = SeededNormals(seeds).normals("s", "penalty", None, np.arange(20), np.full(20, 9), 1)
    one = other.normals("s", "penalty", None, np.arange(7), np.full(7, 9), 1)
    np.testing.assert_array_equal(one, chains[:, :7])
    # the stream is a definition: these values were drawn before its code was made faster
    pinned = SeededNormals([bytes(32), bytes([1]) * 32])
    np.testing.assert_array_equal(
        pinned.normals("s", "penalty", None, np.arange(3), np.full(3, 7), 1)[:, :, 0],
        [
            [1.493214673133333, 1.1427424888753426, -0.01711469741286901],
            [1.0232689447808698, -0.8229127829007132, 1.0617248002045],
        ],
    )
    assert not np.array_equal(
        first,
        SeededNormals(seeds).normals("t", "penalty", np.arange(3), np.zeros(2000, int), its, 1),
    )
    wide = SeededNormals(seeds).normals(
        "s", "penalty", np.arange(3), np.zeros(64_000, int), np.arange(64_000), 1
    )
    x = wide[0, :, 0]
    assert abs(x.mean()) < 5 / np.sqrt(x.size) and abs(x.var() - 1) < 0.05
    lags = [abs(np.corrcoef(x[:-lag], x[lag:])[0, 1]) for lag in range(1, 129)]
    assert max(lags) < 5 / np.sqrt(x.size)  # 128 lags at 5 sd: a false alarm ≈ 1 in 10⁴


def test_seeded_poisson_samples_have_the_bernoulli_law_and_are_addressed_by_key():
    """Simulated gradient samples (Binomial count, then a uniform subset): each record in with
    probability q, independently — checked by the per-record frequency (5 sd over 4,000 keys)
    and by pairs of records (their joint frequency q², which a sample of fixed size m = qn
    would miss: it gives q·(m − 1)/(n − 1)); a key's sample does not depend on other keys."""
    from fedpenalty.owner.noise.seeded import SeededNormals

    seeds = [bytes([k]) * 32 for k in range(2)]
    n, q, keys = 40, 0.25, 4000
    draws = SeededNormals(seeds)
    hits = np.zeros((keys, n), dtype=bool)
    for it in range(keys):
        hits[it, draws.sample("s", "sgld", 0, 3, it, n, q)] = True
    sd = np.sqrt(q * (1 - q) / keys)
    assert np.abs(hits.mean(axis=0) - q).max() < 5 * sd
    counts = hits.sum(axis=1)
    assert abs(counts.var() - n * q * (1 - q)) < 0.1 * n * q * (1 - q)  # Binomial, not fixed m
    pair = (hits[:, 0] & hits[:, 1]).mean()
    assert abs(pair - q * q) < 5 * np.sqrt(q * q / keys)
    again = SeededNormals(seeds)
    again.sample("s", "sgld", 1, 0, 7, n, q)  # another owner and key first
    np.testing.assert_array_equal(
        again.sample("s", "sgld", 0, 3, 11, n, q), np.flatnonzero(hits[11])
    )
    other_chain = draws.sample("s", "sgld", 0, 4, 11, n, q)
    assert not np.array_equal(other_chain, np.flatnonzero(hits[11]))
