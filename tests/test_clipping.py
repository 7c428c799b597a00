"""Per-record clipping (docs/design.md §2.8): the kinds ``clipped_log_ratio`` and
``clipped_gradient`` — one answer's sensitivity is 2c (replace_one) or c (add_remove) whatever
the step, its noise sd σ·c, so each answer is charged μ = 2/σ or 1/σ on the owner's ledger;
the answers are the clipped sums; simulated owners count how often the clip binds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from owners import kernel
from test_samplers import Z, z_scores

from fedpenalty.common import Policy
from fedpenalty.coordinator.driver import sample
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.coordinator.oracle import Answers
from fedpenalty.errors import ConfigError, InvalidRequest, ReplayConflict
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerHost, OwnerNode
from fedpenalty.owner.compute import clipped_gradient as clipped_gradient_module
from fedpenalty.owner.node import SimulationDiagnostics
from fedpenalty.owner.server import ServerThread

MODEL = build_model({"name": "gaussian_mean", "dim": 2, "data_bound": 3.0, "theta_bound": 2.0})
RECORDS = MODEL.simulate_records(np.random.default_rng(1), np.array([0.3, -0.2]), 200)
THETA = np.array([[0.5, -0.2], [-0.3, 0.9], [1.0, 1.0]])
FAR = np.array([[-2.0, 2.0], [2.0, -2.0], [-2.0, -2.0]])  # steps of 2.7 to 4.2, far past max_step


def owner(tmp_path, sigma: float = 2.0, name: str = "alice", **policy: Any) -> OwnerNode:
    """A simulated owner (seeded float noise, simulation counters) of RECORDS."""
    terms = Policy(**{"sigma": sigma, "budget_epsilon": 500.0, "delta": 1e-5, **policy})
    ledger = Ledger(tmp_path / f"{name}.sqlite", synchronous="NORMAL")
    return OwnerNode(name, MODEL, RECORDS, terms, ledger, rng=np.random.default_rng(3))


def session_mu_squared(host: OwnerHost, session: str) -> float:
    [report] = host.privacy_reports(session)
    assert report.session is not None
    return report.session.mu**2


def loglik(x: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """ℓ(x, θ) of gaussian_mean with noise_sd 1, written out here: ``(C, n)``."""
    return -0.5 * ((x[None, :, :] - theta[:, None, :]) ** 2).sum(axis=2)


def clipped_ratio_sums(theta: np.ndarray, theta_prop: np.ndarray, clip: float) -> np.ndarray:
    x = MODEL.prepare_records(RECORDS)
    return np.clip(loglik(x, theta_prop) - loglik(x, theta), -clip, clip).sum(axis=1)


def clipped_gradient_sums(theta: np.ndarray, clip: float) -> np.ndarray:
    x = MODEL.prepare_records(RECORDS)
    grads = x[None, :, :] - theta[:, None, :]  # ∇_θ ℓ = x − θ  (C, n, d)
    norms = np.linalg.norm(grads, axis=2, keepdims=True)
    return (grads * np.minimum(1.0, clip / norms)).sum(axis=1)


@pytest.mark.parametrize(("neighbour", "delta"), [("replace_one", 2.0), ("add_remove", 1.0)])
@pytest.mark.parametrize("kind", ["clipped_log_ratio", "clipped_gradient"])
def test_one_clipped_answer_is_charged_delta_over_sigma_whatever_the_clip_and_step(
    tmp_path, neighbour, delta, kind
):
    sigma = 2.0
    oracle = InProcessOracle([owner(tmp_path, sigma, neighbour=neighbour)])
    oracle.open_session(kind, 20, session="s")
    arrays: dict[str, Any] = {"theta": THETA, "clip": 0.7}
    if kind == "clipped_log_ratio":
        arrays["theta_prop"] = FAR  # a huge step: admitted, charged the same
    first = oracle.query(kind, 0, np.arange(3), **arrays)
    assert list(first.noise_sd) == pytest.approx([sigma * 0.7])
    expected = 3 * (delta / sigma) ** 2
    assert session_mu_squared(oracle.host, "s") == pytest.approx(expected, rel=1e-12)
    arrays["clip"] = 5.0
    oracle.query(kind, 1, np.arange(3), **arrays)  # another clip: the same μ per answer
    assert session_mu_squared(oracle.host, "s") == pytest.approx(2 * expected, rel=1e-12)
    again = oracle.query(kind, 1, np.arange(3), **arrays)  # replayed, not charged again
    np.testing.assert_array_equal(
        again.values, oracle.query(kind, 1, np.arange(3), **arrays).values
    )
    assert session_mu_squared(oracle.host, "s") == pytest.approx(2 * expected, rel=1e-12)
    with pytest.raises(ReplayConflict):  # another clip is another query
        oracle.query(kind, 1, np.arange(3), **{**arrays, "clip": 4.0})


def test_answers_are_the_clipped_sums_and_their_noise_scales_with_the_clip(tmp_path):
    """With a negligible noise multiplier the answers are the clipped sums (to 1e-9); with
    seeded noise two clips of one key differ in noise only by the factor of the clips."""
    tiny = InProcessOracle([owner(tmp_path, sigma=1e-12, name="tiny", budget_epsilon=1e40)])
    tiny.open_session("clipped_log_ratio", 10, session="s")
    got = tiny.query("clipped_log_ratio", 0, np.arange(3), theta=THETA, theta_prop=FAR, clip=0.5)
    exact = clipped_ratio_sums(THETA, FAR, 0.5)
    assert np.abs(exact).max() > 10  # the sums are far from 0 ...
    assert np.abs(exact).max() < 200 * 0.5 + 1e-9  # ... and the clip binds: |Σ| ≤ n·c
    np.testing.assert_allclose(got.values[0], exact, atol=1e-9, rtol=0)
    tiny_gradient = InProcessOracle(
        [owner(tmp_path, sigma=1e-12, name="tiny2", budget_epsilon=1e40)]
    )
    tiny_gradient.open_session("clipped_gradient", 10, session="g")
    got = tiny_gradient.query("clipped_gradient", 0, np.arange(3), theta=THETA, clip=0.8)
    np.testing.assert_allclose(got.values[0], clipped_gradient_sums(THETA, 0.8), atol=1e-9)

    noise = []
    for k, clip in enumerate([0.5, 3.0]):  # the same seed, session and key: the same normals
        oracle = InProcessOracle([owner(tmp_path, sigma=2.0, name=f"seeded{k}")])
        oracle.open_session("clipped_log_ratio", 10, session="s")
        answers = oracle.query(
            "clipped_log_ratio", 0, np.arange(3), theta=THETA, theta_prop=FAR, clip=clip
        )
        noise.append((answers.values[0] - clipped_ratio_sums(THETA, FAR, clip)) / clip)
    assert np.all(np.abs(noise[0]) > 1e-3)
    np.testing.assert_allclose(noise[0], noise[1], rtol=1e-9)


def test_a_bad_clip_is_refused_with_a_message_naming_it_and_charges_nothing(tmp_path):
    oracle = InProcessOracle([owner(tmp_path, max_clip=4.0, min_clip=0.01)])
    oracle.open_session("clipped_log_ratio", 10, session="s")
    bad = {
        0.0: "clip must be a positive finite number",
        -1.0: "clip must be a positive finite number",
        float("nan"): "clip must be a positive finite number",
        True: "clip must be a positive finite number",
        5.0: "clip 5 exceeds this owner's max_clip 4",
        0.001: "clip 0.001 is below this owner's min_clip 0.01",
    }
    for clip, message in bad.items():
        with pytest.raises(InvalidRequest, match=message):
            oracle.query(
                "clipped_log_ratio", 0, np.arange(3), theta=THETA, theta_prop=FAR, clip=clip
            )
    with pytest.raises(InvalidRequest, match="carries theta, theta_prop, clip"):
        oracle.query("clipped_log_ratio", 0, np.arange(3), theta=THETA, theta_prop=FAR)
    assert session_mu_squared(oracle.host, "s") == 0.0
    with pytest.raises(InvalidRequest, match="only penalty sessions declare a max_step"):
        oracle.open_session("clipped_log_ratio", 10, session="t", max_step=0.1)
    with pytest.raises(ConfigError, match=r"privacy.ratio_noise_multiplier × privacy.min_clip"):
        Policy(sigma=1.0, min_clip=1e-300, noise={"penalty_clipped": 1e-10})


def test_simulated_owners_count_the_records_whose_clip_binds(tmp_path):
    """Crafted records: at θ = 0 the gradient x has norm |x|; a clip of 1.2 binds on exactly
    the records with |x| > 1.2; the ratio at θ′ = (1, 0) is x₁ − ½, clipped at 1 it binds
    where |x₁ − ½| > 1."""
    records = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0], [-2.0, 0.5], [0.4, 0.3], [2.5, -1.0]])
    ledger = Ledger(tmp_path / "c.sqlite", synchronous="NORMAL")
    node = OwnerNode(
        "carol",
        MODEL,
        records,
        Policy(sigma=1.0, budget_epsilon=100.0),
        ledger,
        rng=np.random.default_rng(0),
        simulation=True,
    )
    oracle = InProcessOracle([node])
    oracle.open_session("clipped_gradient", 10, session="g")
    zero = np.zeros((1, 2))
    oracle.query("clipped_gradient", 0, np.arange(1), theta=zero, clip=1.2)
    norms = np.linalg.norm(records, axis=1)
    counts = node.simulation_diagnostics().by_kind
    assert counts["gradient_clipped"] == [int((norms > 1.2).sum()), 6] == [4, 6]
    oracle.close()
    oracle = InProcessOracle([node])
    oracle.open_session("clipped_log_ratio", 10, session="r")
    oracle.query(
        "clipped_log_ratio",
        0,
        np.arange(1),
        theta=zero,
        theta_prop=np.array([[1.0, 0.0]]),
        clip=1.0,
    )
    ratio = records[:, 0] - 0.5
    assert counts["penalty_clipped"] == [int((np.abs(ratio) > 1.0).sum()), 6] == [3, 6]
    assert node.simulation_diagnostics().clip_binds == 0  # the log_ratio kind's counters
    report = oracle.simulation_diagnostics()
    assert report is not None
    assert report["clip_hits"]["penalty_clipped"]["fraction"] == pytest.approx(0.5)
    assert report["clip_hits"]["gradient_clipped"]["fraction"] == pytest.approx(4 / 6)


def test_clipped_kinds_are_answered_over_grpc_with_lattice_noise(tmp_path):
    sigma = 2.0
    node = OwnerNode(
        "dave",
        MODEL,
        RECORDS,
        Policy(sigma=sigma, budget_epsilon=500.0),
        Ledger(tmp_path / "d.sqlite", synchronous="NORMAL"),
    )  # a deployed owner: exact lattice noise, fresh per attempt
    host = OwnerHost([node])
    with ServerThread(host) as server:
        oracle = GrpcOracle([server.address], MODEL, retry_seconds=2)
        oracle.open_session("clipped_gradient", 20, session="g")
        got = oracle.query("clipped_gradient", 0, np.arange(3), theta=THETA, clip=0.8)
        assert got.values.shape == (1, 3, 2) and list(got.noise_sd) == pytest.approx([sigma * 0.8])
        assert np.all(np.abs(got.values[0] - clipped_gradient_sums(THETA, 0.8)) < 6 * sigma * 0.8)
        mu_squared = session_mu_squared(host, "g")
        assert 3 * (2 / sigma) ** 2 <= mu_squared == pytest.approx(3 * (2 / sigma) ** 2, rel=1e-5)
        again = oracle.query("clipped_gradient", 0, np.arange(3), theta=THETA, clip=0.8)
        np.testing.assert_array_equal(again.values, got.values)
        oracle.close()
        oracle = GrpcOracle([server.address], MODEL, retry_seconds=2)
        oracle.open_session("clipped_log_ratio", 20, session="r")
        got = oracle.query(
            "clipped_log_ratio", 0, np.arange(3), theta=THETA, theta_prop=FAR, clip=0.5
        )
        assert got.values.shape == (1, 3) and list(got.noise_sd) == pytest.approx([sigma * 0.5])
        assert np.all(np.abs(got.values[0] - clipped_ratio_sums(THETA, FAR, 0.5)) < 6 * sigma * 0.5)
        mu_squared = session_mu_squared(host, "r")
        assert 3 * (2 / sigma) ** 2 <= mu_squared == pytest.approx(3 * (2 / sigma) ** 2, rel=1e-5)
        oracle.close()


# --- penalty with sampler.ratio_clip ---------------------------------------------------------
GAUSS1 = build_model(
    {"name": "gaussian_mean", "dim": 1, "data_bound": 4.0, "theta_bound": 3.0, "prior_sd": 2.0}
)


class MisdeclaredClippedNoise:
    """An oracle whose owners' clipped ratios come back declaring ``factor`` × their noise sd."""

    def __init__(self, oracle: InProcessOracle, factor: float):
        self.oracle, self.factor = oracle, factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.oracle, name)

    def query(self, *args: Any, **kwargs: Any) -> Answers:
        answers = self.oracle.query(*args, **kwargs)
        return Answers(answers.values, answers.noise_sd * self.factor)


def clipped_penalty_run(
    records: list[np.ndarray], sigmas: list[float], sabotage: float | None = None
) -> tuple[Any, np.ndarray, list[OwnerNode]]:
    """Penalty MH with ratio_clip 1 (L·step = 7 × 0.12 = 0.84 < 1: the clip never binds) on
    GAUSS1 through simulated owners of noise multipliers ``sigmas``: the result, its z-scores
    against the closed-form posterior (test_samplers.z_scores) and the owners."""
    ledger = Ledger(":memory:")
    rngs = np.random.default_rng(1).spawn(len(records))
    nodes = [
        OwnerNode(
            f"o{k}",
            GAUSS1,
            r,
            Policy(sigma=s, max_step=0.12, budget_epsilon=1e9),
            ledger,
            rng,
            simulation=True,
        )
        for k, (r, s, rng) in enumerate(zip(records, sigmas, rngs))
    ]
    oracle = InProcessOracle(nodes)
    ref = GAUSS1.reference_posterior(np.concatenate(records))
    rng = np.random.default_rng(0)
    theta0 = ref.mean + 0.5 * ref.sd * rng.standard_normal((8, 1))
    oracle.open_session("clipped_log_ratio", 8 * 6600, session="clipped")
    used = oracle if sabotage is None else MisdeclaredClippedNoise(oracle, sabotage)
    algo = kernel("penalty", GAUSS1, oracle=used, step=0.12, ratio_clip=1.0)
    result = sample(algo, rng, theta0, iterations=6000, warmup=500, progress=False)
    return result, z_scores(result.theta, ref), nodes


@pytest.mark.slow  # two runs of 8 chains × 6,500 iterations: about 20 s
def test_penalty_with_a_ratio_clip_that_never_binds_hits_the_closed_form_posterior():
    """Z = 4.5 MCSE of mean and sd (the standard of test_samplers.py); noise multipliers
    0.5, 1, 1.5 at clip 1 give s² = 3.5, so the same check fails by > 2Z without the −s²/2
    penalty (the coordinator told the noise sd is 0)."""
    rng = np.random.default_rng(1)
    records = [GAUSS1.simulate_records(rng, np.array([0.4]), n) for n in (60, 100, 140)]
    result, z, nodes = clipped_penalty_run(records, [0.5, 1.0, 1.5])
    assert z.max() < Z, z
    assert 0.05 < result.acceptance_rate < 0.6
    counts = [node.simulation_diagnostics().by_kind["penalty_clipped"] for node in nodes]
    assert all(hits == 0 and evaluations > 0 for hits, evaluations in counts)
    _, z_missing, _ = clipped_penalty_run(records, [0.5, 1.0, 1.5], sabotage=0.0)
    assert z_missing.max() > 2 * Z, z_missing


def test_clipped_gradients_taken_in_chunks_of_records_give_the_same_sums(tmp_path, monkeypatch):
    """Records taken one at a time (a chunk of 7 components over 3 chains × 2 dims holds
    one record): the sums and clip-bound counts of the whole data."""
    monkeypatch.setattr(clipped_gradient_module, "CHUNK_COMPONENTS", 7)
    node = owner(tmp_path, sigma=1e-12, name="chunked", budget_epsilon=1e40)
    node.diagnostics = SimulationDiagnostics()
    oracle = InProcessOracle([node])
    oracle.open_session("clipped_gradient", 10, session="g")
    got = oracle.query("clipped_gradient", 0, np.arange(3), theta=THETA, clip=0.8)
    np.testing.assert_allclose(got.values[0], clipped_gradient_sums(THETA, 0.8), atol=1e-9)
    x = MODEL.prepare_records(RECORDS)
    norms = np.linalg.norm(x[None, :, :] - THETA[:, None, :], axis=2)
    assert node.diagnostics.by_kind["gradient_clipped"] == [int((norms > 0.8).sum()), 3 * 200]
