"""DP-SGFS through owners (docs/design.md §2.11): the ``grad_fisher`` answer (clipped gradients
and their outer products, each record's vector of norm ≤ clip), its float and lattice noise,
its per-owner charge against an independent dp-accounting computation, and the scenario
checks. All seeds are fixed."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest

from fedpenalty.cli import main
from fedpenalty.common import Policy
from fedpenalty.coordinator import sgfs
from fedpenalty.kinds import KINDS
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.compute.grad_fisher import fisher_width, grad_fisher_sum
from fedpenalty.owner.compute.gradient import clipped_gradients
from fedpenalty.owner.noise.lattice import lattice_gradient_multiplier
from fedpenalty.owner.noise.sources import NoiseKey
from fedpenalty.privacy.subsampled_rdp import epsilon_from_rdp, subsampled_gaussian_rdp

MODEL = build_model({"name": "gaussian_mean", "dim": 3})
RECORDS = MODEL.simulate_records(np.random.default_rng(4), np.array([0.3, -0.2, 0.1]), 200)
KIND = KINDS["grad_fisher"]


def test_each_records_vector_has_norm_at_most_the_clip_and_decodes_to_both_sums():
    """‖z(x)‖ ≤ clip for every record (the sensitivity the charge assumes; equality for a
    clipped gradient along an axis), and √2·z[:d], √2·clip·z[d:] summed are Σg and the upper
    triangle of Σggᵀ of the clipped gradients."""
    clip, theta = 0.5, np.array([[0.0, 0.1, -0.3]])
    mask = np.eye(len(RECORDS), dtype=bool)  # one record per "chain"
    per_record = grad_fisher_sum(MODEL, RECORDS, np.repeat(theta, len(RECORDS), 0), mask, clip)
    assert per_record.shape == (len(RECORDS), fisher_width(3)) == (200, 9)
    assert np.all(np.linalg.norm(per_record, axis=1) <= clip * (1 + 1e-12))
    axis = grad_fisher_sum(MODEL, np.array([[5.0, 0.0, 0.0]]), np.zeros((1, 3)), mask[:1, :1], clip)
    assert np.linalg.norm(axis) == pytest.approx(clip, rel=1e-12)
    total = grad_fisher_sum(MODEL, RECORDS, theta, np.ones((1, len(RECORDS)), bool), clip)
    grads, scale = clipped_gradients(MODEL, RECORDS, theta, clip)
    g = grads[0] * scale[0][:, None]
    np.testing.assert_allclose(math.sqrt(2) * total[0, :3], g.sum(axis=0), atol=1e-12)
    outer = sgfs.from_upper(math.sqrt(2) * clip * total[:, 3:], 3)[0]
    np.testing.assert_allclose(outer, g.T @ g, atol=1e-12)


def _lattice_host(neighbour: str) -> OwnerHost:
    policy = Policy(sigma=0.8, budget_epsilon=1e9, max_sampling_rate=1.0, neighbour=neighbour,
                    max_answers_per_request=10**6)  # fmt: skip
    node = OwnerNode("o", MODEL, RECORDS, policy, Ledger(":memory:"),
                     noise_key=NoiseKey.derive(b"k", "o"))  # fmt: skip
    return OwnerHost([node])


def test_lattice_answers_have_the_declared_noise_around_the_exact_sums():
    """A deployed (lattice) owner at q = 1, 3,000 chains at one θ: answer − exact sum has mean
    0 (5 standard errors) and sd σ·clip within 6% on every one of the 9 components (relative sd
    of a 3,000-sample sd: 1.3%; σ/2 or √2σ noise is off by ≥ 29%)."""
    host = _lattice_host("replace_one")
    host.open_session("s", KIND.ledger_name, 10**6, 1.0)
    m, clip = 3000, 2.0
    theta = np.tile([[0.1, 0.0, -0.1]], (m, 1))
    answers = KIND.ask(host, "s", 0, np.arange(m), {"theta": theta, "clip": clip})[0]
    exact = grad_fisher_sum(MODEL, RECORDS, theta[:1], np.ones((1, 200), bool), clip)
    noise = answers - exact
    assert noise.shape == (m, 9)
    assert np.all(np.abs(noise.mean(axis=0)) < 5 * 0.8 * clip / np.sqrt(m))
    assert np.all(np.abs(noise.std(axis=0, ddof=1) / (0.8 * clip) - 1) < 0.06)


@pytest.mark.parametrize("neighbour", ["replace_one", "add_remove"])
def test_lattice_answers_are_charged_at_the_multiplier_of_their_width(neighbour):
    """Lattice answers are charged by the general subsampled bound at σ lowered for rounding
    of all d + d(d+1)/2 = 9 components (not the gradient's 3)."""
    host = _lattice_host(neighbour)
    q = 0.1
    host.open_session("s", KIND.ledger_name, 100, q)
    for it in range(5):
        KIND.ask(host, "s", it, np.arange(4), {"theta": np.zeros((4, 3)), "clip": 1.0})
    report = host.privacy_reports("s")[0]
    sigma_eff = lattice_gradient_multiplier(0.8, 9)
    expected = epsilon_from_rdp(20 * subsampled_gaussian_rdp(q, sigma_eff, neighbour), 1e-5)
    assert report.session is not None
    assert report.session.epsilon == pytest.approx(expected, rel=1e-12)
    assert sigma_eff < lattice_gradient_multiplier(0.8, 3)


# ------------------------------------------------------------------ a run through the CLI
OWNERS, CHAINS, ITERATIONS, WARMUP, Q, CLIP, SIGMA = 3, 2, 30, 10, 0.5, 2.0, 20.0


def simulate(capsys, tmp_path, *extra: str) -> tuple[int, str, str]:
    args = ["run.transport='inprocess'", f"data.owners={OWNERS}", "data.n_per_owner=400",
            f"sampler.iterations={ITERATIONS}", f"sampler.warmup={WARMUP}",
            f"sampler.chains={CHAINS}", f"sampler.sampling_rate={Q}", f"sampler.clip={CLIP}",
            f"privacy.sigma={SIGMA}", "privacy.budget_epsilon=1000", "sampler.step=1e-4",
            "sampler.algorithm='sgfs'", *extra]  # fmt: skip
    sets = [x for a in args for x in ("--set", a)]
    code = main(["simulate", *sets, "--no-progress", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    return code, out, err


def _dp_accounting_epsilon(answers: int, neighbour: str) -> float:
    """dp-accounting directly: PLD (interval 1e-4, pessimistic), Poisson(q)-sampled Gaussian of
    noise multiplier σ per unit clip, composed ``answers`` times."""
    relation = dp_accounting.NeighboringRelation
    rel = relation.REPLACE_ONE if neighbour == "replace_one" else relation.ADD_OR_REMOVE_ONE
    acc = dp_accounting.pld.PLDAccountant(rel, value_discretization_interval=1e-4)
    one = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA))
    acc.compose(dp_accounting.SelfComposedDpEvent(one, answers))
    return float(acc.get_epsilon(1e-5))


@pytest.mark.parametrize("neighbour", ["replace_one", "add_remove"])
def test_each_owners_epsilon_is_dp_accountings_for_its_answers(capsys, tmp_path, neighbour):
    code, out, err = simulate(capsys, tmp_path, f"privacy.neighbour='{neighbour}'")
    assert code == 0, err
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    answers = CHAINS * (ITERATIONS + WARMUP)
    expected = _dp_accounting_epsilon(answers, neighbour)
    assert len(privacy["owners"]) == OWNERS and not privacy["trusted_curator"]
    for owner in privacy["owners"]:
        assert owner["answers"] == answers
        assert owner["epsilon"] == pytest.approx(expected, rel=1e-9)
    diagnostics = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    # the owners' gradient noise on G: 2·Σ_k (σ·clip)²/q² (the √2 of the scaled answer)
    assert diagnostics["mean_noise_variance"] == pytest.approx(2 * OWNERS * (SIGMA * CLIP / Q) ** 2)
    assert "sgfs on gaussian_mean" in out and "noise mult." in out


@pytest.mark.parametrize(
    "setting, key",
    [
        ("sampler.fisher_decay=2.0", "sampler.fisher_decay"),
        ("sampler.fisher_bound=-1.0", "sampler.fisher_bound"),
        ("sampler.sampling_rate=0.0", "sampler.sampling_rate"),
        ("privacy.aggregation='secure'", "privacy.aggregation"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(capsys, tmp_path, setting, key):
    extra = ("privacy.total_noise_sd=5.0",) if "secure" in setting else ()
    code, _, err = simulate(capsys, tmp_path, setting, *extra)
    assert code != 0 and key in err, err
    assert not (tmp_path / "run" / "samples.npz").exists()
