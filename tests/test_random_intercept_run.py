"""``--set model.name=random_intercept`` runs: the model's default table picks penalty_hier, the
run's outputs name μ, log τ and each b_k, diagnostics.json compares with the closed-form
reference, privacy.json charges two answers per owner per chain and iteration; the refusals;
resume and the gRPC transport give the in-process draws (docs/design.md §6, "Hierarchical
models")."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedpenalty import simulation
from fedpenalty.config import load_scenario
from fedpenalty.coordinator import penalty_hier
from fedpenalty.errors import ConfigError
from fedpenalty.refusals import PlanRefused

#: A smaller world than the embedded default, scaled with it: 10,000 records per owner (data
#: sd 0.01), so the owner effects' box and the radii are 10× the default's.
SMALL = {
    "model.name": "random_intercept",
    "model.tau_min": 0.005,
    "model.tau_max": 0.05,
    "model.b_bound": 0.31,
    "model.true_tau": 0.02,
    "data.n_per_owner": 10_000,
    "sampler.step": 0.014,
    "privacy.budget_epsilon": 1e6,  # the small world costs more per answer
    "run.transport": "inprocess",
    "run.progress": False,
}


def run(tmp_path, name: str, **overrides):
    return simulation.simulate(None, {**SMALL, **overrides}, tmp_path / name)


def test_the_model_alone_selects_penalty_hier_and_its_table():
    s = load_scenario(None, ["model.name='random_intercept'"])
    assert s["sampler"]["algorithm"] == "penalty_hier"
    assert s["privacy"]["sigma"] == 0.8 and s["sampler"]["step"] == 0.0014
    assert s.origins["sampler.algorithm"] == "the random_intercept model's default"


@pytest.mark.slow
def test_a_run_mixes_and_matches_the_closed_form_reference(tmp_path):
    """The embedded default's run lengths (about 30 s): 4 chains × 4000 draws (+500 warmup)
    on 4 owners at σ = 0.8 nats. Every coordinate's split R-hat < 1.05 and |mean − reference
    mean| < 0.5 reference sd: with a bulk ESS ≥ ~100 the Monte Carlo error of a mean is ≤ 0.1
    sd, so 0.5 sd is 5 MCSE; an owner answering at another's φ, or a wrong prior term, moves μ
    or b_k by more than a posterior sd."""
    result = run(tmp_path, "run")
    d = result.diagnostics
    assert d["param_names"] == ["mu", "log_tau", *(f"b[owner-{k}]" for k in range(4))]
    assert d["reference"]["source"] == "closed_form"
    assert max(d["rhat"]) < 1.05, d["rhat"]
    assert max(d["error"]["mean_in_sd"]) < 0.5, d["error"]["mean_in_sd"]
    assert list(result.tree["posterior"]["theta"].coords["param"].values) == d["param_names"]
    owners = result.privacy["owners"]
    assert [o["answers"] for o in owners] == [2 * 4 * 4500] * 4
    assert all(0 < o["epsilon"] < o["budget_epsilon"] for o in owners)
    assert result.theta.shape == (4, 4000, 6)


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"sampler.algorithm": "penalty"}, "sampler.algorithm"),
        ({"sampler.algorithm": "dp_hmc"}, "sampler.algorithm"),
        ({"privacy.aggregation": "secure", "privacy.total_noise_sd": 1.0}, "privacy.aggregation"),
        ({"data.true_theta": [0.1, 0.2]}, "data.true_theta"),
        ({"data.true_theta": 0.5}, "data.true_theta"),  # outside |μ| ≤ mu_bound = 0.25
        ({"data.paths": ["a.csv"] * 4}, "data.source"),
        ({"sampler.init_scale": 1.5}, "sampler.init_scale"),
        ({"privacy.max_step": 0.001}, "privacy.max_step"),  # below sampler.step = 0.0014
    ],
)
def test_what_a_hierarchical_model_cannot_run_is_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load_scenario(None, {"model.name": "random_intercept", **overrides})


def test_penalty_hier_with_a_flat_model_is_refused_naming_the_keys():
    with pytest.raises(ConfigError, match=r"sampler\.algorithm.*model\.name"):
        load_scenario(None, {"sampler.algorithm": "penalty_hier"})


def test_a_resumed_run_gives_the_uninterrupted_draws(tmp_path, monkeypatch):
    """Ctrl-C after 130 iterations (warmup 60: radii adapted and frozen), checkpoints every
    25: the resumed run re-asks from iteration 125 (the owners replay) and its draws, radii
    and each owner's ε equal an uninterrupted run's."""
    settings = {"sampler.iterations": 120, "sampler.warmup": 60, "run.checkpoint_every": 25}
    reference = run(tmp_path, "reference", **settings)
    step, calls = penalty_hier.step, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 130:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(penalty_hier, "step", interrupted)
    stopped = run(tmp_path, "stopped", **settings)
    assert stopped.stopped is not None and stopped.theta.shape[1] == 70
    monkeypatch.setattr(penalty_hier, "step", step)
    resumed = simulation.resume_simulation(tmp_path / "stopped", progress=False)
    assert resumed.stopped is None
    np.testing.assert_array_equal(resumed.theta, reference.theta)
    assert resumed.diagnostics["step_adaptation"] == reference.diagnostics["step_adaptation"]
    spent = [o["epsilon"] for o in resumed.privacy["owners"]]
    assert spent == [o["epsilon"] for o in reference.privacy["owners"]]


def test_grpc_owner_hosts_give_the_in_process_draws(tmp_path):
    """Two gRPC owner-host processes (2 owners each, each receiving its own owners' θ rows):
    the same draws and the same ε per owner as in process."""
    settings = {"sampler.iterations": 60, "sampler.warmup": 30}
    inprocess = run(tmp_path, "inprocess", **settings)
    grpc = run(tmp_path, "grpc", **settings, **{"run.transport": "grpc", "run.owner_hosts": 2})
    np.testing.assert_array_equal(grpc.theta, inprocess.theta)
    names = ["mu", "log_tau", *(f"b[owner-{k}]" for k in range(4))]
    assert grpc.diagnostics["param_names"] == names and grpc.theta.shape == (4, 60, 6)
    assert [o["answers"] for o in grpc.privacy["owners"]] == [2 * 4 * 90] * 4
    eps = [o["epsilon"] for o in grpc.privacy["owners"]]
    assert eps == pytest.approx([o["epsilon"] for o in inprocess.privacy["owners"]], rel=1e-12)


@pytest.mark.slow
def test_ray_actors_give_the_in_process_draws(tmp_path, ray_session):
    """Two Ray actors (2 owners each; the per-owner θ rows split between them): the same draws,
    answers and ε per owner as in process, and the same diagnostics."""
    settings = {"sampler.iterations": 40, "sampler.warmup": 20}
    inprocess = run(tmp_path, "inprocess", **settings)
    ray = run(tmp_path, "ray", **settings, **{"run.transport": "ray", "run.ray_actors": 2})
    np.testing.assert_array_equal(ray.theta, inprocess.theta)
    assert ray.privacy["owners"] == inprocess.privacy["owners"]
    assert [o["answers"] for o in ray.privacy["owners"]] == [2 * 4 * 60] * 4
    assert ray.diagnostics == inprocess.diagnostics


def test_a_plan_past_the_budget_is_refused_counting_two_answers_per_iteration(tmp_path):
    """At session open the refusal's largest warmup + iterations is its answers per owner over
    chains × 2 (both sub-steps ask every owner), and nothing is sampled."""
    settings = {"privacy.budget_epsilon": 10.0, "sampler.iterations": 4000}
    with pytest.raises(PlanRefused, match=r"2 answers per iteration") as refused:
        run(tmp_path, "refused", **settings)
    said = str(refused.value)
    most = int(re.search(r"at most (\d+) per owner", said).group(1))  # type: ignore[union-attr]
    assert f"sampler.iterations ≤ {most // 8} with 4 chains" in said
    assert not (tmp_path / "refused").exists()
