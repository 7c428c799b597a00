"""One source of defaults (issue 21, items 1, 2 and 6): a scenario file of one's own, ``--set``
and the embedded default resolve through the same layers (the generic defaults, the model's
table, the (model, sampler) table of fedpenalty/model_defaults.toml, the file, ``--set``); a
refused plan names the keys that drive its spend and where each value came from; the advice
for an owner that has spent before fits what it has left."""

from __future__ import annotations

import contextlib
import io
import json
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from fedpenalty.cli import main
from fedpenalty.common import LOG_RATIO, SGMCMC, Policy
from fedpenalty.config import FROM_FILE, FROM_SET, GENERIC, load_scenario, model_defaults
from fedpenalty.coordinator import private_gibbs
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainAlgorithm
from fedpenalty.coordinator.baseline_algorithms import HYBRID
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.diagnostics import ESS_PER_CHAIN, RHAT_LIMIT
from fedpenalty.errors import BudgetExhausted
from fedpenalty.models import HIERARCHICAL, MODELS, ExpFamModel, build_model
from fedpenalty.owner import Ledger, OwnerNode
from fedpenalty.privacy import GaussianSpend
from fedpenalty.privacy.owner_epsilon import owner_epsilon
from fedpenalty.privacy.subsampled import SubsampledGaussian, calibrate_noise_multiplier
from fedpenalty.refusals import budget_refusal, plan_needs, plan_needs_kinds
from fedpenalty.simulation import noise_levels

INPROCESS = ["--set", "run.transport='inprocess'", "--no-progress"]
#: Samplers that ask the owners, and so have a (model, sampler) table for every model they run.
ASKING = [name for name, a in ALGORITHMS.items() if isinstance(a, ChainAlgorithm) and a.deployable]


def runs(model: str) -> list[str]:
    """The asking samplers ``model`` can run (penalty_expfam needs sufficient statistics; a
    hierarchical model runs penalty_hier only)."""
    if model in HIERARCHICAL:
        return ["penalty_hier"]
    expfam = issubclass(MODELS[model], ExpFamModel)
    gibbs = model in private_gibbs.SUPPORTED  # private_gibbs: the models it has conditionals for
    return [
        a for a in ASKING if (a != "penalty_expfam" or expfam) and (a != "private_gibbs" or gibbs)
    ]


def simulate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_model_has_a_table_for_each_sampler_it_runs():
    defaults = model_defaults()
    assert set(defaults) == set(MODELS) | set(HIERARCHICAL)
    for name, entry in defaults.items():
        cls = MODELS[name] if name in MODELS else HIERARCHICAL[name]
        assert set(entry["model"]) == set(cls.defaults())
        tables = {key for key in entry if key not in ("model", "data", "sampler")}
        assert tables <= set(ALGORITHMS), tables
        assert set(runs(name)) <= tables, (name, tables)


@pytest.mark.parametrize(
    "model,algorithm", [(m, a) for m in sorted(MODELS) for a in runs(m)], ids=str
)
def test_every_default_plan_fits_the_default_budget_with_margin(model, algorithm):
    """The worst case each owner checks at session open, by the owners' own accountants,
    stays below 95% of the default budget (ε = 10 at δ = 1e-5). The tightest is logistic under
    penalty (worst case 9.14, every step at the full radius; its measured run spends 6.0): at a
    fixed budget its chains mix only with enough records, and its ESS margin is thin already."""
    s = load_scenario(None, [f"model.name='{model}'", f"sampler.algorithm='{algorithm}'"])
    chain = ALGORITHMS[algorithm]
    assert isinstance(chain, ChainAlgorithm) and chain.query is not None
    privacy, sampler = s["privacy"], s["sampler"]
    policy = Policy(
        sigma=privacy["sigma"],
        max_step=sampler["step"],
        budget_epsilon=privacy["budget_epsilon"],
        delta=privacy["delta"],
        neighbour=privacy["neighbour"],
    )
    answers = chain.planned_answers(sampler)
    if len(chain.asks(sampler)) > 1:  # several kinds, each at its own level ([privacy.noise])
        policy = replace(policy, noise=noise_levels(privacy["noise"]))
        terms = chain.kind_terms(sampler)
        epsilon = plan_needs_kinds(terms, build_model(s["model"]), policy, False, 0.0).epsilon
    elif chain.query == SGMCMC:  # every answer is a subsampled Gaussian at (q, σ)
        event = SubsampledGaussian(sampler["sampling_rate"], privacy["sigma"], answers)
        epsilon, _ = owner_epsilon(GaussianSpend(), [event], policy.delta, policy.neighbour)
    else:  # every answer at the largest sensitivity the session allows
        options = chain.session_options(sampler)
        model_ = build_model(s["model"])
        epsilon = plan_needs(chain.query, model_, policy, answers, options, False).epsilon
    assert epsilon < 0.95 * privacy["budget_epsilon"], epsilon


#: The models with a (model, hybrid) table: not yet logistic, whose OPS starts are exact-MH
#: runs on the pooled records and whose SGLD at the σ of ε/2 mixes only on ~50,000 records per
#: owner (minutes a run, and half an hour for its first reference posterior).
HYBRID_TABLES = ["bernoulli", "gaussian_mean", "poisson"]


def test_the_hybrid_tables_are_the_documented_ones():
    assert sorted(m for m, entry in model_defaults().items() if "hybrid" in entry) == HYBRID_TABLES


@pytest.mark.parametrize("model", HYBRID_TABLES)
def test_hybrid_has_a_table_that_fits_the_budget_and_the_sgld_noise(model):
    """``--set sampler.algorithm=hybrid`` takes the (model, hybrid) table, not the generic step
    0.05 and sampling rate 0.01 on a million records (88.8 sd off, excess noise ratio 2e5):
    ε_ops + ε_sgld = privacy.epsilon ≤ 90% of the default budget, the owners' accountant
    charges the calibrated σ at most ε/2, and the owners' noise fits SGLD's dynamics
    (η K (σ C)² / 4 ≤ 1, so no excess noise warning)."""
    s = load_scenario(None, [f"model.name='{model}'", "sampler.algorithm='hybrid'"])
    HYBRID.check(s.sections, build_model(s["model"]))
    privacy, sampler = s["privacy"], s["sampler"]
    for key in ("privacy.epsilon", "sampler.step", "data.n_per_owner", "sampler.sampling_rate"):
        assert s.origin(key) == f"the default of hybrid on {model}", key
    assert privacy["epsilon"] <= 0.9 * privacy["budget_epsilon"]
    answers = HYBRID.planned_answers(sampler)
    q, delta, neighbour = sampler["sampling_rate"], privacy["delta"], privacy["neighbour"]
    sigma = calibrate_noise_multiplier(
        privacy["epsilon"] / 2, delta, q, answers, neighbour=neighbour
    )
    event = SubsampledGaussian(q, sigma, answers)
    epsilon_sgld, _ = owner_epsilon(GaussianSpend(), [event], delta, neighbour)
    assert epsilon_sgld <= privacy["epsilon"] / 2 * (1 + 1e-6), epsilon_sgld
    owner_noise = s["data"]["owners"] * (sigma * sampler["clip"]) ** 2
    assert sampler["step"] * owner_noise / 4 <= 0.95, sampler["step"] * owner_noise / 4


@dataclass(frozen=True)
class Run:
    """A finished ``fedpenalty simulate``: its exit code, what it printed, its run folder."""

    code: int
    out: str
    err: str
    folder: Path


@pytest.fixture(scope="module")
def default_file_run(tmp_path_factory) -> Run:
    """The embedded default scenario, run once in process from a file that names only its model:
    shared by the test of that file and by the penalty switch on gaussian_mean, which resolves
    to the same scenario (each test asserts it), so the same run (~30 s) is not made twice."""
    folder = tmp_path_factory.mktemp("default")
    path = folder / "mine.toml"
    path.write_text('[model]\nname = "gaussian_mean"\n')
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["simulate", str(path), *INPROCESS, "--out", str(folder / "run")])
    return Run(code, out.getvalue(), err.getvalue(), folder / "run")


def test_a_file_with_only_the_model_name_is_the_default_scenario(default_file_run):
    run = default_file_run
    assert load_scenario(run.folder.parent / "mine.toml") == load_scenario(None)
    assert run.code == 0, run.err
    privacy = json.loads((run.folder / "privacy.json").read_text())
    assert all(o["epsilon"] < 10 for o in privacy["owners"])
    assert "have not mixed" not in run.out + run.err
    # the resolved scenario written to the run is complete: it reloads to the same scenario
    resolved = tomllib.loads((run.folder / "config.toml").read_text())
    assert resolved["sampler"]["step"] == 0.00125 and resolved["data"]["n_per_owner"] == 10**6
    written, default = load_scenario(run.folder / "config.toml"), load_scenario(None)
    assert {k: v for k, v in written.sections.items() if k != "run"} == {
        k: v for k, v in default.sections.items() if k != "run"
    }


def test_a_file_with_only_iterations_and_warmup_runs_at_the_models_step(capsys, tmp_path):
    path = tmp_path / "longer.toml"
    path.write_text("[sampler]\niterations = 3000\nwarmup = 500\n")
    scenario = load_scenario(path)
    assert scenario.origin("sampler.iterations") == FROM_FILE
    assert scenario.origin("sampler.step") == "the default of penalty on gaussian_mean"
    assert scenario.origin("data.n_per_owner") == "the gaussian_mean model's default"
    code, _, err = simulate(capsys, str(path), *INPROCESS, "--out", str(tmp_path / "run"))
    assert code == 0, err
    with np.load(tmp_path / "run" / "samples.npz") as samples:
        assert samples["theta"].shape == (4, 3000, 1)
    diagnostics = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    assert diagnostics["warnings"] == [] and diagnostics["error"]["mean_in_sd"][0] < 3


#: The runs of the sampler switch (model, sampler): every sampler on the default model, the
#: other models' defaults of the samplers the issue names, and the baseline hybrid, which ran
#: at the generic step (88.8 sd off) before. dp_hmc starts tens of posterior sds from the mode
#: there and mixes after its warmup descent (docs/design.md §2.9 "Far starts"; it did not
#: before). The switch over the default transport (gRPC owner processes): below.
SWITCHES = [
    *[("gaussian_mean", a) for a in runs("gaussian_mean")],
    *[(m, a) for m in ("bernoulli", "poisson") for a in ("penalty", "sgld")],
    ("gaussian_mean", "hybrid"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model,algorithm", SWITCHES, ids=str)
def test_switching_the_sampler_brings_defaults_that_fit_and_mix(
    capsys, request, tmp_path, model, algorithm
):
    """``--set sampler.algorithm=NAME`` (and ``model.name``) on the embedded default, as a user
    types it: the run fits each owner's default budget and mixes — split R-hat ≤ RHAT_LIMIT
    and bulk ESS at least 1.5 × the "not mixed" threshold (ESS_PER_CHAIN per chain), so no
    warning — and its mean lies within 4 reference sd of the exact posterior (fixed seed; the
    penalty chains are exact and land within ~0.1 sd, SG-MCMC is approximate: its
    discretisation inflates the sd by a few per cent, which 4 sd leaves room for while a chain
    run at another sampler's step, 41 sd off before, fails)."""
    out = tmp_path / "run"
    switch = ["--set", f"sampler.algorithm={algorithm}", "--set", f"model.name={model}"]
    if load_scenario(None, switch[1::2]) == load_scenario(None):  # penalty on gaussian_mean
        run = request.getfixturevalue("default_file_run")  # the same scenario, already run
        code, stdout, err, out = run.code, run.out, run.err, run.folder
    else:
        code, stdout, err = simulate(capsys, *switch, *INPROCESS, "--out", str(out))
    assert code == 0, err
    assert "have not mixed" not in stdout + err
    privacy = json.loads((out / "privacy.json").read_text())
    assert all(o["epsilon"] <= o["budget_epsilon"] for o in privacy["owners"])
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    chains = tomllib.loads((out / "config.toml").read_text())["sampler"]["chains"]
    assert max(diagnostics["rhat"]) <= RHAT_LIMIT, diagnostics
    assert min(diagnostics["ess_bulk"]) >= 1.5 * ESS_PER_CHAIN * chains, diagnostics
    assert max(diagnostics["error"]["mean_in_sd"]) < 4, diagnostics
    assert not diagnostics.get("excess_noise_ratio"), diagnostics


@pytest.mark.slow
def test_switching_to_sgld_over_grpc_draws_what_the_mixing_in_process_run_draws(capsys, tmp_path):
    """The switch to SGLD over the default transport (local gRPC owner processes) ran at the
    penalty step before. Over gRPC the owner processes answer at sgld's defaults: the resolved
    scenario is sgld's on gaussian_mean, every owner's noise multiplier, clip, rate and ε are
    the in-process run's, and the draws are bit for bit the in-process run's (a step, noise or
    seed the processes took from elsewhere changes them). The in-process switch above runs
    these defaults at full length and checks they mix, so here 20 + 60 steps suffice (the
    full-length run over gRPC took ~45 s of the suite for the same draws)."""
    switch = ["--set", "sampler.algorithm=sgld", "--set", "model.name=gaussian_mean"]
    short = ["--set", "sampler.warmup=20", "--set", "sampler.iterations=60", "--no-progress"]
    read = {}
    for transport in ("grpc", "inprocess"):
        out = tmp_path / transport
        where = ["--set", f"run.transport='{transport}'"]
        code, _, err = simulate(capsys, *switch, *short, *where, "--out", str(out))
        assert code == 0, err
        config = tomllib.loads((out / "config.toml").read_text())
        privacy = json.loads((out / "privacy.json").read_text())
        with np.load(out / "samples.npz") as samples:
            read[transport] = (config, privacy["owners"], samples["theta"])
    config, owners, theta = read["grpc"]
    expected = load_scenario(None, ["sampler.algorithm=sgld", "model.name=gaussian_mean"])
    for key in ("step", "clip", "sampling_rate"):
        assert config["sampler"][key] == expected["sampler"][key], key
    assert config["privacy"]["sigma"] == expected["privacy"]["sigma"]
    assert (
        config["sampler"]["step"] != model_defaults()["gaussian_mean"]["penalty"]["sampler"]["step"]
    )
    assert theta.shape == (4, 60, 1)
    np.testing.assert_array_equal(theta, read["inprocess"][2])
    assert {o["n"] for o in owners} == {expected["data"]["n_per_owner"]}
    fields = ("n", "noise_multiplier", "sampling_rate", "clip", "answers", "epsilon")
    assert [{f: o[f] for f in fields} for o in owners] == [
        {f: o[f] for f in fields} for o in read["inprocess"][1]
    ]


def test_a_step_the_user_sets_stays_theirs(tmp_path):
    sgld = model_defaults()["gaussian_mean"]["sgld"]
    path = tmp_path / "mine.toml"
    path.write_text('[sampler]\nalgorithm = "sgld"\nstep = 1e-7\n')
    s = load_scenario(path)
    assert s["sampler"]["step"] == 1e-7 and s.origin("sampler.step") == FROM_FILE
    # the keys the file leaves out are sgld's on gaussian_mean, not penalty's or the generic
    assert s["sampler"]["clip"] == sgld["sampler"]["clip"]
    assert s["privacy"]["sigma"] == sgld["privacy"]["sigma"]
    assert s.origin("privacy.sigma") == "the default of sgld on gaussian_mean"
    # a kernel's own key left unset names the settings class that declares its default
    assert s.origin("sampler.friction") == (
        "the default in fedpenalty/coordinator/sgmcmc.py (MomentumSettings)"
    )
    assert s.origin("sampler.chains") == GENERIC
    over = load_scenario(path, ["sampler.step=2e-7", "privacy.sigma=3.0"])
    assert over["sampler"]["step"] == 2e-7 and over.origin("sampler.step") == FROM_SET
    assert over["privacy"]["sigma"] == 3.0
    # switching by --set on the default keeps a step given by --set, whatever the order
    s = load_scenario(None, ["sampler.step=3e-7", "sampler.algorithm=sgld"])
    assert s["sampler"]["step"] == 3e-7 and s["sampler"]["clip"] == sgld["sampler"]["clip"]


def test_a_refused_plan_names_the_keys_and_where_their_values_came_from(capsys, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[model]\nname = "gaussian_mean"\n[sampler]\nstep = 0.05\n')
    out = tmp_path / "run"
    code, _, err = simulate(
        capsys, str(path), *INPROCESS, "--set", "sampler.warmup=100", "--out", str(out)
    )
    assert code == 2 and "refused the run at session open" in err and not out.exists()
    assert len(err.strip().splitlines()) == 1
    for cause in (
        "sampler.step = 0.05 (from your file)",
        "sampler.warmup = 100 (from --set)",
        "sampler.iterations = 4000 (the gaussian_mean model's default)",
        f"sampler.chains = 4 ({GENERIC})",
        f"privacy.sigma = 1 ({GENERIC})",
    ):
        assert cause in err, err


#: The owner's max_step: each answer at it is charged μ = 2 L STEP / σ = 0.08 (L = 8).
STEP = 0.005


def _spent_owner(tmp_path, budget: float, **policy) -> OwnerNode:
    """An owner of gaussian_mean records whose ledger (``tmp_path``/ledger.sqlite) is kept
    across the nodes made here, so a node made again has the spend of the earlier ones."""
    model = build_model({"name": "gaussian_mean"})
    records = model.simulate_records(np.random.default_rng(0), np.array([0.2]), 500)
    settings = {"sigma": 1.0, "max_step": STEP, "budget_epsilon": budget, **policy}
    ledger = Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL")
    return OwnerNode(
        "owner-0", model, records, Policy(**settings), ledger, np.random.default_rng(1)
    )


def _admits(tmp_path, answers: int, max_step: float = STEP, **policy) -> bool:
    """Whether the owner, with everything it has spent, admits a plan of ``answers``."""
    node = _spent_owner(tmp_path, **{"budget": 10.0, **policy})
    oracle = InProcessOracle([node])
    try:
        oracle.open_session("penalty", answers, max_step=max_step)
        oracle.close()  # admitted: closed again, so its plan reserves nothing
        return True
    except BudgetExhausted:
        return False
    finally:
        node.ledger.close()


def test_the_advice_for_an_owner_that_spent_before_fits_what_it_has_left(tmp_path):
    """An owner spends ε 7.6 of its 10 in an earlier session (every answer at its
    max_step); the next plan it refuses gets advice computed from the ε it has left: every
    change suggested is admitted by the owner itself, and a little more than the suggested
    answers is refused."""
    node = _spent_owner(tmp_path, 10.0)
    oracle = InProcessOracle([node])
    oracle.open_session("penalty", 400, max_step=STEP)
    rng = np.random.default_rng(2)
    for t in range(400):
        theta = rng.uniform(-1, 1, size=(1, 1))
        oracle.log_ratio(t, np.array([0]), theta, theta + STEP)
    oracle.close()
    node.ledger.close()
    node = _spent_owner(tmp_path, 10.0)
    with pytest.raises(BudgetExhausted) as info:
        InProcessOracle([node]).open_session("penalty", 2000, max_step=STEP)
    node.ledger.close()
    left = info.value.epsilon_left
    assert 1 < left < 9  # it has spent part of its budget, not all of it
    spent = node.policy.budget_epsilon - left
    needs = plan_needs(LOG_RATIO, node.model, node.policy, 2000, {"max_step": STEP}, False, spent)
    message = str(budget_refusal(info.value, needs, node.policy, LOG_RATIO, 4, False))
    assert f"the ε {left:.3g} it has left" in message
    per_chain = int(re.search(r"sampler\.iterations ≤ (\d+) with 4 chains", message).group(1))
    sigma = float(re.search(r"privacy\.sigma ≥ ([0-9.e+-]+)", message).group(1))
    step = float(
        re.search(r"sampler\.step \(and privacy\.max_step, if set\) ≤ ([0-9.e+-]+)", message).group(
            1
        )
    )
    budget = float(re.search(r"privacy\.budget_epsilon ≥ ([0-9.e+-]+)", message).group(1))
    assert per_chain >= 1
    assert _admits(tmp_path, 4 * per_chain)
    assert not _admits(tmp_path, 4 * (per_chain + 2))
    assert _admits(tmp_path, 2000, sigma=sigma)
    assert _admits(tmp_path, 2000, max_step=step)
    assert _admits(tmp_path, 2000, budget=budget)
