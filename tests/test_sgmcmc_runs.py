"""SG-MCMC runs end to end: ``fedpenalty simulate`` with ``sgld``, ``sghmc`` and ``sgnht`` asks
the owners for gradients, and ``privacy.json`` carries each owner's ε as its ledger accounts it
(dp-accounting PLD); plans past the budget are refused; the owners' noise excess is reported and
warned about; the new ``[sampler]`` keys are validated; SG states survive a checkpoint."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from owners import kernel

from fedpenalty.cli import main
from fedpenalty.common import Policy
from fedpenalty.config import load_scenario
from fedpenalty.coordinator import checkpoint, sghmc, sgld, sgnht
from fedpenalty.coordinator.driver import Progress, SamplingStopped, sample
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import OwnerUnavailable
from fedpenalty.models import build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.privacy import subsampled

Q, SIGMA, CLIP, CHAINS, ITERATIONS, WARMUP, OWNERS = 0.05, 2.0, 1.0, 2, 60, 20, 3
# gaussian_mean (closed-form reference), 3 owners × 400 records; s² = 3 (σ·clip/q)² = 4800, so the
# owners' SGLD share (η/2)² s²/η = 1200 η fits under the Langevin noise for η < 1/1200, and their
# SGHMC/SGNHT share η s²/(2·friction·√η) = 480 √η for η < 1/480² (friction 5).
SMALL = [
    "--set",
    "run.transport='inprocess'",
    "--set",
    f"data.owners={OWNERS}",
    "--set",
    "data.n_per_owner=400",
    "--set",
    f"sampler.iterations={ITERATIONS}",
    "--set",
    f"sampler.warmup={WARMUP}",
    "--set",
    f"sampler.chains={CHAINS}",
    "--set",
    f"sampler.sampling_rate={Q}",
    "--set",
    f"sampler.clip={CLIP}",
    "--set",
    f"privacy.sigma={SIGMA}",
    "--set",
    "privacy.budget_epsilon=1000",
    "--set",
    "sampler.friction=5.0",
    "--no-progress",
]


def simulate(capsys, tmp_path, algorithm: str, *extra: str) -> tuple[int, str, str]:
    code = main(
        [
            "simulate",
            *SMALL,
            "--set",
            f"sampler.algorithm='{algorithm}'",
            *extra,
            "--out",
            str(tmp_path / "run"),
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("algorithm,step", [("sgld", 2e-4), ("sghmc", 2e-6), ("sgnht", 2e-6)])
def test_simulate_reports_each_owners_pld_epsilon(capsys, tmp_path, algorithm, step):
    code, out, err = simulate(capsys, tmp_path, algorithm, "--set", f"sampler.step={step}")
    assert code == 0, err
    assert "excess_noise_ratio" not in err  # the owners' noise fits under the design noise
    run = tmp_path / "run"
    privacy = json.loads((run / "privacy.json").read_text())
    answers = CHAINS * (ITERATIONS + WARMUP)
    expected = subsampled.epsilon(
        subsampled.SubsampledGaussian(Q, SIGMA, answers),
        1e-5,
        neighbour="replace_one",
        accountant="pld",
    )
    assert (
        privacy["neighbour"] == "replace_one"
        and privacy["delta"] == 1e-5
        and not privacy["trusted_curator"]
    )
    assert "PLD" in privacy["accounting"]
    assert len(privacy["owners"]) == OWNERS
    for owner in privacy["owners"]:
        assert owner["answers"] == answers and owner["accountant"] == "pld"
        assert owner["epsilon"] == pytest.approx(expected, rel=1e-9)
        assert (
            owner["noise_multiplier"] == SIGMA
            and owner["sampling_rate"] == Q
            and owner["clip"] == CLIP
        )
        assert owner["epsilon_paper_bound"] is None and owner["mu"] is None
    diagnostics = json.loads((run / "diagnostics.json").read_text())
    assert diagnostics["acceptance_rate"] is None and diagnostics["excess_noise_ratio"] == 0.0
    assert diagnostics["mean_noise_variance"] == pytest.approx(OWNERS * (SIGMA * CLIP / Q) ** 2)
    for key in ("ess_bulk", "rhat", "error", "reference"):
        assert diagnostics[key] is not None
    with np.load(run / "samples.npz") as samples:
        assert samples["theta"].shape == (CHAINS, ITERATIONS, 1) and "accepted" not in samples.files
    assert (
        f"{algorithm} on gaussian_mean" in out and "noise mult." in out and "no accept step" in out
    )


def test_excess_owner_noise_is_reported_and_warned(capsys, tmp_path):
    # η = 2e-3: (η/2)² s² = 4.8e-3 > η, an excess ratio of 1200 η − 1 = 1.4 on every step
    code, _, err = simulate(capsys, tmp_path, "sgld", "--set", "sampler.step=2e-3")
    assert code == 0
    diagnostics = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    assert diagnostics["excess_noise_ratio"] == pytest.approx(1200 * 2e-3 - 1, rel=1e-9)
    assert diagnostics["excess_noise_fraction"] == 1.0
    assert (
        "warning" in err and "excess_noise_ratio 1.4" in err and "hotter than the posterior" in err
    )


def test_decaying_step_reports_the_largest_excess(capsys, tmp_path):
    # η_t = 2e-3 (1 + t)^-1: only the first steps exceed (1200 η_t > 1 while t < 1.4)
    code, _, err = simulate(
        capsys,
        tmp_path,
        "sgld",
        "--set",
        "sampler.step=2e-3",
        "--set",
        "sampler.step_schedule='polynomial'",
        "--set",
        "sampler.step_decay_gamma=1.0",
    )
    assert code == 0
    diagnostics = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    assert diagnostics["excess_noise_ratio"] == pytest.approx(1.4, rel=1e-9)
    assert diagnostics["excess_noise_fraction"] == pytest.approx(2 / (ITERATIONS + WARMUP))
    assert "excess_noise_ratio" in err


def test_a_plan_past_the_budget_is_refused_before_any_answer(capsys, tmp_path):
    answers = CHAINS * (ITERATIONS + WARMUP)
    needed = subsampled.epsilon(
        subsampled.SubsampledGaussian(Q, SIGMA, answers), 1e-5, neighbour="replace_one"
    )
    code, _, err = simulate(
        capsys,
        tmp_path,
        "sgld",
        "--set",
        "sampler.step=2e-4",
        "--set",
        f"privacy.budget_epsilon={needed * 0.9}",
    )
    assert code == 2 and "refused the run at session open" in err and "sgmcmc" in err
    assert "privacy.budget_epsilon ≥" in err and "privacy.sigma (noise multiplier) ≥" in err
    assert not (tmp_path / "run").exists()  # nothing sampled: no run directory is left


@pytest.mark.parametrize(
    "setting,message",
    [
        ("sampler.sampling_rate=0", "sampler.sampling_rate must be a number in (0, 1]"),
        ("sampler.sampling_rate=1.5", "sampler.sampling_rate must be a number in (0, 1]"),
        ("sampler.clip=-1.0", "sampler.clip must be a positive finite number"),
        ("sampler.friction=0", "sampler.friction must be a positive finite number"),
        (
            "sampler.step_schedule='cosine'",
            "sampler.step_schedule must be one of 'constant', 'polynomial'",
        ),
        (
            "sampler.step_decay_gamma=-0.5",
            "sampler.step_decay_gamma must be a positive finite number",
        ),
        ("sampler.step_decay_b=0", "sampler.step_decay_b must be a positive finite number"),
        ("sampler.stepsize=0.1", "unknown key sampler.stepsize"),
    ],
)
def test_bad_sampler_keys_are_named(capsys, tmp_path, setting, message):
    code, _, err = simulate(capsys, tmp_path, "sgld", "--set", setting)
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "algorithm,friction,step,rule",
    [("sghmc", 20.0, 0.01, "at most 1"), ("sgnht", 6.0, 0.01, "below 0.5")],
)
def test_friction_too_large_for_the_step_is_named(algorithm, friction, step, rule):
    with pytest.raises(
        ValueError,
        match=f"sampler.friction × √\\(first step\\) = .* must be {rule} for {algorithm}",
    ):
        load_scenario(
            None,
            [
                f"sampler.algorithm='{algorithm}'",
                f"sampler.friction={friction}",
                f"sampler.step={step}",
            ],
        )
    # a decaying schedule is checked at its first (largest) step: η_0 = a b^-γ = 0.01 · 100^-1
    load_scenario(
        None,
        [
            f"sampler.algorithm='{algorithm}'",
            f"sampler.friction={friction}",
            f"sampler.step={step}",
            "sampler.step_schedule='polynomial'",
            "sampler.step_decay_b=100",
            "sampler.step_decay_gamma=1",
        ],
    )


def test_sgmcmc_ignores_the_mh_max_step_check():
    s = load_scenario(
        None, ["sampler.algorithm='sgld'", "sampler.step=1e-3", "privacy.max_step=1e-4"]
    )
    assert s["sampler"]["step"] == 1e-3
    with pytest.raises(ValueError, match=r"exceeds privacy\.max_step"):
        load_scenario(None, ["sampler.step=1e-3", "privacy.max_step=1e-4"])


@pytest.mark.parametrize(
    "state",
    [
        sgld.SGLDState(np.array([[0.1, 0.2]]), 7),
        sghmc.SGHMCState(np.array([[0.1, 0.2]]), np.array([[1.5, -2.0]]), 7),
        sgnht.SGNHTState(np.array([[0.1, 0.2]]), np.array([[1.5, -2.0]]), np.array([0.3]), 7),
    ],
)
def test_checkpoint_round_trips_sgmcmc_states(tmp_path, state):
    rng = np.random.default_rng(3)
    progress = Progress(
        9,
        4,
        state,
        rng.bit_generator.state,
        rng.normal(size=(1, 6, 2)),
        None,
        np.ones((1, 6), dtype=bool),
        12.5,
        9,
        0.25,
        3,
    )
    checkpoint.save(tmp_path / "c.npz", progress)
    loaded = checkpoint.load(tmp_path / "c.npz")
    assert type(loaded.state) is type(state) and loaded.accepted is None
    for field in ("theta", "momentum", "thermostat"):
        if hasattr(state, field):
            np.testing.assert_array_equal(getattr(loaded.state, field), getattr(state, field))
    assert loaded.state.iteration == 7 and loaded.excess_max == 0.25 and loaded.excess_steps == 3
    np.testing.assert_array_equal(loaded.theta, progress.theta)
    assert (loaded.done, loaded.warmup, loaded.noise_sum, loaded.noise_count) == (9, 4, 12.5, 9)
    assert loaded.rng_state == progress.rng_state and math.isfinite(loaded.result().noise_var)


def test_grpc_and_inprocess_transports_give_the_same_sgld_run(capsys, tmp_path):
    """The default transport (owner host processes on loopback gRPC) asks the same questions and
    gets the same answers as in-process owners with the same seeds."""
    runs = {}
    for transport in ("grpc", "inprocess"):
        out = tmp_path / transport
        code = main(
            [
                "simulate",
                *SMALL,
                "--set",
                "sampler.algorithm='sgld'",
                "--set",
                "sampler.step=2e-4",
                "--set",
                f"run.transport='{transport}'",
                "--set",
                "run.owner_hosts=2",
                "--out",
                str(out),
            ]
        )
        _, err = capsys.readouterr()
        assert code == 0, err
        with np.load(out / "samples.npz") as samples:
            runs[transport] = (samples["theta"], json.loads((out / "privacy.json").read_text()))
    np.testing.assert_array_equal(runs["grpc"][0], runs["inprocess"][0])
    assert [o["epsilon"] for o in runs["grpc"][1]["owners"]] == [
        o["epsilon"] for o in runs["inprocess"][1]["owners"]
    ]


class _FailOnce:
    """An oracle that is unreachable once, at ``fail_at``, and otherwise forwards."""

    def __init__(self, oracle, fail_at: int):
        self.oracle, self.fail_at = oracle, fail_at

    def gradient(self, iteration, chains, theta, clip):
        if iteration == self.fail_at:
            self.fail_at = -1
            raise OwnerUnavailable("simulated outage", "owner-0")
        return self.oracle.gradient(iteration, chains, theta, clip)


@pytest.mark.parametrize("kernel_name", ["sgld", "sghmc", "sgnht"])
def test_a_stopped_sgmcmc_run_resumes_from_its_checkpoint_to_the_uninterrupted_chain(
    tmp_path, kernel_name
):
    model = build_model({"name": "gaussian_mean", "dim": 2})
    data_rng = np.random.default_rng(1)
    records = [model.simulate_records(data_rng, np.array([0.3, -0.2]), 200) for _ in range(2)]
    policy = Policy(sigma=2.0, budget_epsilon=1e6, max_sampling_rate=0.1, max_clip=1.0)

    def run(name: str, fail_at: int | None = None):
        ledger = Ledger(tmp_path / f"{name}.sqlite")
        nodes = [
            OwnerNode(f"owner-{k}", model, r, policy, ledger, np.random.default_rng(10 + k))
            for k, r in enumerate(records)
        ]
        oracle = InProcessOracle(nodes)
        oracle.open_session("sgmcmc", 2 * 50, session="run", sampling_rate=0.1)
        asked = oracle if fail_at is None else _FailOnce(oracle, fail_at)
        saved: list[int] = []

        def answered() -> int:
            return sum(e.count for e in ledger.sampled("owner-0"))

        algo = kernel(
            kernel_name, model, oracle=asked, step=1e-4, sampling_rate=0.1, clip=1.0, friction=5.0
        )
        kwargs = dict(
            iterations=40,
            warmup=10,
            progress=False,
            checkpoint=lambda p: checkpoint.save(tmp_path / f"{name}.npz", p),
            checkpoint_every=8,
        )
        try:
            rng = np.random.default_rng(7)
            try:
                return sample(algo, rng, np.zeros((2, 2)), **kwargs), None
            except SamplingStopped as stop:
                saved += [stop.progress.done, answered()]
            resume = checkpoint.load(tmp_path / f"{name}.npz")
            result = sample(
                algo, np.random.default_rng(0), np.zeros((2, 2)), resume=resume, **kwargs
            )
            return result, (*saved, resume.done, answered())
        finally:
            ledger.close()

    full, _ = run("full")
    resumed, (stopped_at, answers_at_stop, checkpointed_at, answers_at_end) = run(
        "stopped", fail_at=37
    )
    assert (stopped_at, answers_at_stop, checkpointed_at) == (37, 2 * 37, 32)
    assert answers_at_end == 2 * 50  # iterations 32..36 were replayed, not charged again
    np.testing.assert_array_equal(resumed.theta, full.theta)
    assert resumed.accepted is None and resumed.noise_var == full.noise_var
