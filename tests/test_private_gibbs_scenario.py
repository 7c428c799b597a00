"""scenarios/private_gibbs.py at its ``--quick`` settings (as tests/test_scenarios.py runs the
others): its files, the calibrations of its two private methods checked by independent
computations, and the direction of its headline."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
F, V = 5, 8


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("private_gibbs")
    spec = importlib.util.spec_from_file_location(
        "private_gibbs", ROOT / "scenarios/private_gibbs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["private_gibbs"] = module
    spec.loader.exec_module(module)
    with contextlib.redirect_stdout(io.StringIO()):
        assert module.main(["--quick", "--no-progress", "--out", str(folder)]) == 0
    assert (folder / "private_gibbs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = json.loads((folder / "private_gibbs.json").read_text())
    assert out["scenario"] == "private_gibbs" and "--quick" in out["command"]
    assert any("synthetic" in n for n in out["notes"])
    return out


def _rows(report: dict, method: str, variant: str) -> dict:
    runs = report["results"]["runs"]
    return {r["epsilon"]: r for r in runs if r["method"] == method and r["variant"] == variant}


def _groups(report: dict, variant: str) -> int:
    setup = report["settings"]["setup"]
    return setup["regions"] * setup["months"] if variant == "latent_class" else 1


def test_laplace_release_is_calibrated_to_its_pure_epsilon(report):
    """b = (Δ₁ + γw)/ε with Δ₁ = 2F (replace-one) and w = G·F·V counts, and the owner's pure ε
    (with the rounding term, composed by the accountant) is the target: at most ε, and within
    the sampler's 2⁻⁴⁰ scale rounding of it."""
    for variant in ("latent_class", "naive_bayes"):
        width = _groups(report, variant) * F * V
        for eps, row in _rows(report, "laplace", variant).items():
            assert row["scale_b"] == pytest.approx((2 * F + row["gamma"] * width) / eps)
            assert eps * (1 - 1e-9) <= row["owner_epsilon"] <= eps * (1 + 1e-12)


def test_ops_temperature_and_its_whole_chain_cost(report):
    """T = 2F·log(φ_max/a₀)/ε (replace-one, a₀ = 1/(100V)); the chain's worst case is
    iterations × (φ update + z sweep) = iterations·(2Δ_r + 4Δ_a)/T, i.e. ≈ 3·iterations·ε."""
    a0 = 1 / (100 * V)
    d_rep, d_add = F * math.log((1 - (V - 1) * a0) / a0), F * math.log(1 / a0)
    iterations = report["settings"]["setup"]["iterations"]
    for eps, row in _rows(report, "ops", "latent_class").items():
        t = row["ops_temperature"]
        assert t == pytest.approx(2 * d_rep / eps)
        worst = iterations * (2 * d_rep + 4 * d_add) / t
        assert row["ops_gibbs_worst_epsilon"] == pytest.approx(worst)


def test_more_epsilon_fits_better_and_laplace_wins_on_corpus_counts(report):
    """Latent-class model: both private methods fit the held-out groups better at ε = 10 than
    at ε = 1 (quick: by 0.24 and 0.13 nats per record; margin asserted 0.05). Naive Bayes
    (corpus-wide counts, the paper's high-data case): Laplace at ε = 1 is within 0.01 nats
    per record of the non-private chain (measured 0.002) and beats OPS (measured by 0.08;
    asserted 0.03) — more Laplace noise, or a colder OPS, would close that gap."""
    s = report["results"]["summary"]
    lat, nb = s["latent_class"], s["naive_bayes"]
    for m in ("laplace", "ops"):
        assert lat[m]["10.0"]["mean"] > lat[m]["1.0"]["mean"] + 0.05
    assert abs(nb["laplace"]["1.0"]["mean"] - nb["non_private"]) < 0.01
    assert nb["laplace"]["1.0"]["mean"] > nb["ops"]["1.0"]["mean"] + 0.03
