"""Private Gibbs on the latent-class model (docs/design.md §2.10, "A latent-class model"):
from the owners' summed exact counts the chain hits the exact posterior (by enumeration of
every class assignment), at temperature 1 and at the exponential mechanism's T = 2."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special

from fedpenalty.coordinator import latent_class_gibbs as lc
from fedpenalty.privacy.accountant import OwnerAccountant

SPEC = lc.LatentClassSpec(groups=6, classes=2, features=2, values=3, alpha=1.0, beta=0.7)


def _owners_counts() -> list[np.ndarray]:
    """Three owners' counts of 24 records in 6 groups drawn from two well-separated classes."""
    rng = np.random.default_rng(4)
    phi = np.array([[[0.7, 0.2, 0.1], [0.6, 0.3, 0.1]], [[0.1, 0.2, 0.7], [0.2, 0.2, 0.6]]])
    z = np.array([0, 0, 1, 1, 0, 1])
    records = []
    for g in range(SPEC.groups):
        for _ in range(4):
            x = [rng.choice(3, p=phi[z[g], f]) for f in range(SPEC.features)]
            records.append([g, *x])
    rec = np.array(records)
    return [lc.group_counts(part, SPEC) for part in np.array_split(rec[rng.permutation(24)], 3)]


def _log_beta(a: np.ndarray) -> np.ndarray:
    return special.gammaln(a).sum(axis=-1) - special.gammaln(a.sum(axis=-1))


def _exact(counts: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """By enumeration of the K^G assignments, π and φ integrated out of p(π, φ, z | n)^{1/T}:
    log p_T(z) = log B((α − 1 + m)/T + 1) + Σ_kf log B((β − 1 + N_kf)/T + 1) + const. Returns
    the co-assignment matrix P(z_g = z_h) ``(G, G)`` and E[φ_{z_0, f, v}] ``(F, V)``."""
    logs, co, phi0 = [], [], []
    for z in itertools.product(range(SPEC.classes), repeat=SPEC.groups):
        za = np.array(z)
        onehot = (za[:, None] == np.arange(SPEC.classes)).astype(float)
        n_kf = np.einsum("gk,gfv->kfv", onehot, counts)
        a_pi = (SPEC.alpha - 1 + onehot.sum(axis=0)) / temperature + 1
        a_phi = (SPEC.beta - 1 + n_kf) / temperature + 1
        logs.append(_log_beta(a_pi) + _log_beta(a_phi).sum())
        co.append((za[:, None] == za[None, :]).astype(float))
        phi0.append(a_phi[za[0]] / a_phi[za[0]].sum(axis=-1, keepdims=True))
    w = np.exp(np.array(logs) - special.logsumexp(logs))
    return np.einsum("z,zgh->gh", w, np.array(co)), np.einsum("z,zfv->fv", w, np.array(phi0))


def _chain(counts: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """8 chains × 2,500 kept iterations: per draw the co-assignments ``(D, G, G)`` and
    φ_{z_0} ``(D, F, V)``, ordered chain by chain (for batch means)."""
    rng = np.random.default_rng(17)
    state = lc.init(rng, 8, SPEC)
    co, phi0 = [], []
    for t in range(2700):
        state = lc.step(rng, state, counts, SPEC, temperature)
        if t >= 200:
            co.append(state.z[:, :, None] == state.z[:, None, :])
            phi0.append(state.phi[np.arange(8), state.z[:, 0]])
    co_a = np.array(co).transpose(1, 0, 2, 3).reshape(-1, SPEC.groups, SPEC.groups)
    phi_a = np.array(phi0).transpose(1, 0, 2, 3).reshape(-1, SPEC.features, SPEC.values)
    return co_a.astype(float), phi_a


def _mcse(draws: np.ndarray, batches: int = 40) -> np.ndarray:
    means = np.array([b.mean(axis=0) for b in np.array_split(draws, batches)])
    return means.std(axis=0, ddof=1) / math.sqrt(batches)


def test_counts_are_sums_over_owners_with_the_stated_sensitivity():
    """Σ_k counts = the counts of the pooled records; one record moves F counts."""
    parts = _owners_counts()
    total = sum(parts)
    assert total.sum() == 24 * SPEC.features
    assert lc.count_sensitivity(SPEC, "add_remove", 1) == SPEC.features
    assert lc.count_sensitivity(SPEC, "replace_one", 1) == 2 * SPEC.features
    one = lc.group_counts(np.array([[3, 2, 0]]), SPEC)
    assert np.abs(one).sum() == SPEC.features
    assert lc.count_sensitivity(SPEC, "add_remove", 2) == pytest.approx(np.linalg.norm(one))


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_exact_counts_give_the_exact_posterior(temperature):
    """Tolerance: every co-assignment probability and E[φ_{z_0}] within 5 batch-means MCSE
    (+ 0.002 for the MCSE's own error) of the enumeration — 15 + 6 quantities, a false alarm
    below 1e-4 overall. The chain at the other temperature misses the reference by more (the
    test's power: a conditional that drops the tempering, or tempers the wrong factor, fails)."""
    counts = sum(_owners_counts())
    co_ref, phi_ref = _exact(counts, temperature)
    co, phi0 = _chain(counts, temperature)
    iu = np.triu_indices(SPEC.groups, 1)
    co_err = np.abs(co.mean(axis=0) - co_ref)[iu]
    co_tol = 5 * _mcse(co)[iu] + 0.002
    assert np.all(co_err < co_tol), (co_err, co_tol)
    phi_err = np.abs(phi0.mean(axis=0) - phi_ref)
    assert np.all(phi_err < 5 * _mcse(phi0) + 0.002)
    other_co, _ = _exact(counts, 3.0 - temperature)
    assert np.any(np.abs(co.mean(axis=0) - other_co)[iu] > co_tol)


def test_truncation_keeps_every_emission_probability_above_the_floor():
    """With a₀ = 0.05 every φ_kfv drawn is ≥ a₀ (what the exponential-mechanism bound uses)."""
    spec = lc.LatentClassSpec(6, 2, 2, 3, floor=0.05)
    rng = np.random.default_rng(2)
    state = lc.init(rng, 4, spec)
    counts = sum(_owners_counts())
    for _ in range(50):
        state = lc.step(rng, state, counts, spec)
        assert state.phi.min() >= 0.05


def test_exponential_mechanism_accounting_matches_an_independent_computation():
    """Eq. 19 per update, computed here by hand for F = 5 features of V = 8 values truncated at
    a₀ = 1/800: Δ_add = 5 log 800, Δ_replace = 5 log 793. At the OPS temperature for ε = 1 the
    paper's worst case for 200 iterations is 400ε (add/remove: the z sweep and the φ update cost
    ε each); replace-one pays the z sweep twice (a record may move between two groups)."""
    spec = lc.LatentClassSpec(504, 10, 5, 8, floor=1 / 800)
    add, rep = 5 * math.log(800), 5 * math.log(793)
    assert lc.update_epsilons(spec, "add_remove") == pytest.approx(
        {"phi": 2 * add, "z_sweep": 2 * add, "pi": 0.0}
    )
    assert lc.update_epsilons(spec, "replace_one", 3.0) == pytest.approx(
        {"phi": 2 * rep / 3, "z_sweep": 4 * add / 3, "pi": 0.0}
    )
    t = lc.ops_temperature(spec, "add_remove", 1.0)
    assert t == pytest.approx(2 * add)
    acc = OwnerAccountant("add_remove").compose(*lc.gibbs_events(spec, "add_remove", t, 200, 1))
    assert acc.epsilon(1e-5) == pytest.approx(400.0)
    t = lc.ops_temperature(spec, "replace_one", 0.5)
    acc = OwnerAccountant("replace_one").compose(*lc.gibbs_events(spec, "replace_one", t, 50, 4))
    assert acc.epsilon(1e-5) == pytest.approx(200 * (2 * rep + 4 * add) / t)
    assert lc.ops_temperature(spec, "add_remove", 1e6) == 1.0
    with pytest.raises(ValueError, match="floor a0 > 0"):
        lc.update_epsilons(lc.LatentClassSpec(5, 2, 2, 3), "add_remove")


def test_pairwise_moves_leave_the_truncated_dirichlet_invariant():
    """The fallback for rows that keep rejecting (OPS temperatures): 4,000 chains of 30 pairwise
    passes from a valid start match exact rejection draws of Dir(2, 1, 50) truncated at 0.05
    (kept ≈ 2 % of the time) in mean and sd within 5 standard errors; the untruncated mean
    (0.019 for the second component) is far outside that."""
    rng = np.random.default_rng(8)
    conc = np.array([2.0, 1.0, 50.0])
    g = rng.gamma(conc, size=(400_000, 3))
    exact = g / g.sum(axis=1, keepdims=True)
    exact = exact[(exact >= 0.05).all(axis=1)]
    phi = np.tile([0.3, 0.3, 0.4], (4000, 1))
    for _ in range(30):
        phi = lc.pairwise_moves(rng, phi, np.tile(conc, (4000, 1)), 0.05)
    assert phi.min() >= 0.05
    se = np.sqrt(exact.var(axis=0) / len(exact) + phi.var(axis=0) / len(phi))
    assert np.all(np.abs(phi.mean(axis=0) - exact.mean(axis=0)) < 5 * se)
    assert np.all(np.abs(phi.std(axis=0) - exact.std(axis=0)) < 5 * se)
    assert abs(phi.mean(axis=0)[1] - 1 / 53) > 20 * se[1]
