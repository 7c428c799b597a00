"""A kernel, a model and a transport written outside the package, each added with ONE registry
line, run end to end through ``fedpenalty.simulation.simulate`` (docs/design.md §6 recipes).

Each toy is a module written under ``tmp_path`` and imported from there, as a user's own module
would be: a random-walk penalty MH variant (fixed-length steps, no adaptation), a 1-d Gaussian
mean with known variance on the public models API (``fedpenalty.models.api``), and a transport
that wraps the in-process owners and counts every query. The draws must land on the exact
posterior mean, and the toy transport must have carried every answer the owners charged.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from fedpenalty.config import load_scenario
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.transports import TRANSPORTS
from fedpenalty.models import MODELS, build_model
from fedpenalty.run_session import run_seeds
from fedpenalty.simulation import owner_records, simulate

TOY_KERNEL = '''
"""A random-walk penalty MH variant: every proposal moves one coordinate by exactly ±step."""

import numpy as np

from fedpenalty.coordinator import mh
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainAlgorithm, NoSettings, SamplingAlgorithm


def move(rng, state, model, step, ratio):
    """One MH iteration of every chain: θ' = θ ± step·e_j (symmetric), owners' noisy ratio."""
    c, d = state.theta.shape
    theta_prop = state.theta.copy()
    theta_prop[np.arange(c), rng.integers(d, size=c)] += step * rng.choice([-1.0, 1.0], size=c)
    log_u = np.log(rng.random(c))
    queried = model.in_theta_space(theta_prop)
    idx = np.flatnonzero(queried)
    accepted, noise_var = np.zeros(c, dtype=bool), np.zeros(c)
    theta, log_prior = state.theta.copy(), state.log_prior.copy()
    if idx.size:
        lam, s2 = ratio(state.iteration, idx, state.theta[idx], theta_prop[idx])
        lp_prop = model.log_prior(theta_prop[idx])
        acc = log_u[idx] < lp_prop - state.log_prior[idx] + lam - 0.5 * s2
        accepted[idx], noise_var[idx] = acc, s2
        theta[idx[acc]], log_prior[idx[acc]] = theta_prop[idx[acc]], lp_prop[acc]
    info = mh.MHInfo(accepted, queried, noise_var, np.zeros(c))
    return mh.MHState(theta, log_prior, state.iteration + 1), mh.record(info)


def build(model, data, *, step):
    ratio = mh.oracle_ratio(data.require_oracle("toy_walk"))
    return SamplingAlgorithm(
        lambda rng, theta0: mh.init(theta0, model),
        lambda rng, state: move(rng, state, model, step, ratio),
        mh.INFO,
    )


TOY_WALK = ChainAlgorithm(
    "toy_walk",
    "random-walk penalty MH: fixed-length coordinate steps",
    build,
    NoSettings,
    mh.MHState,
    ALGORITHMS["penalty"].query,
    max_step=lambda sampler: sampler["step"],
)
'''

TOY_MODEL = '''
"""x ~ N(θ, noise_sd²), θ ∈ [-theta_bound, theta_bound], records clipped to ±data_bound."""

import math

import numpy as np

from fedpenalty.models.api import Configured, Model, Param, Reference, as_theta, validate_raw


class ToyMean(Configured, Model):
    name = "toy_mean"
    PARAMS = {
        "noise_sd": Param(1.0, "positive", "known observation sd σ"),
        "data_bound": Param(3.0, "positive", "records satisfy |x| ≤ data_bound"),
        "theta_bound": Param(2.0, "positive", "Θ = [-theta_bound, theta_bound]"),
        "prior_sd": Param(10.0, "positive", "prior sd of θ (prior mean 0)"),
    }

    def _setup(self):
        p = self._params
        self.dim, self.theta_bound, self.sd = 1, p["theta_bound"], p["noise_sd"]
        self.bound, self.prior_sd = p["data_bound"], p["prior_sd"]

    @property
    def column_names(self):
        return ["x"]

    def prepare_records(self, raw):
        return np.clip(validate_raw(raw, self.column_names, self.name), -self.bound, self.bound)

    def simulate_records(self, rng, theta, n):
        x = float(np.ravel(theta)[0]) + self.sd * rng.standard_normal((int(n), 1))
        return np.clip(x, -self.bound, self.bound)

    @property
    def lipschitz(self):
        return (self.bound + self.theta_bound) / self.sd**2

    def log_lik(self, records, theta):
        z = (records[None, :, 0] - as_theta(theta, 1)) / self.sd
        return -0.5 * z * z - 0.5 * math.log(2 * math.pi * self.sd**2)

    def grad_log_lik(self, records, theta):
        return ((records[None, :, 0] - as_theta(theta, 1)) / self.sd**2)[:, :, None]

    def log_prior(self, theta):
        return -0.5 * (as_theta(theta, 1)[:, 0] / self.prior_sd) ** 2

    def grad_log_prior(self, theta):
        return -as_theta(theta, 1) / self.prior_sd**2

    def reference_posterior(self, records):
        """The conjugate normal posterior (truncation to Θ ignored: far in its tails here)."""
        precision = 1 / self.prior_sd**2 + len(records) / self.sd**2
        mean = records[:, 0].sum() / self.sd**2 / precision
        return Reference(np.array([mean]), np.array([precision**-0.5]), "closed_form")
'''

TOY_TRANSPORT = '''
"""The in-process owners behind an oracle that counts every query it carries."""

from collections import Counter

from fedpenalty.coordinator.oracle import Oracle
from fedpenalty.coordinator.transport_base import Launched, Transport
from fedpenalty.coordinator.transports import TRANSPORTS

#: Every launched oracle, for the test to read its counts.
LAUNCHED = []


class CountingOracle(Oracle):
    """``inner``'s owners; ``asked[kind]`` counts the chain answers asked of each owner."""

    def __init__(self, inner):
        self.inner, self.asked = inner, Counter()

    def query(self, kind, iteration, chains, substep=0, **arrays):
        self.asked[kind] += len(chains)
        return self.inner.query(kind, iteration, chains, substep, **arrays)

    def describe(self):
        return self.inner.describe()

    def open_kinds(self, terms, session=None, secure=None):
        return self.inner.open_kinds(terms, session, secure)

    def privacy_reports(self):
        return self.inner.privacy_reports()

    def reachable_reports(self):
        return self.inner.reachable_reports()

    def close(self):
        self.inner.close()

    def disconnect(self):
        self.inner.disconnect()

    def simulation_diagnostics(self):
        return self.inner.simulation_diagnostics()


def launch(setup):
    launched = TRANSPORTS["inprocess"].launch(setup)
    LAUNCHED.append(CountingOracle(launched.oracle))
    return Launched(LAUNCHED[-1], launched.stop)


TOY_COUNTING = Transport("toy_counting", "in-process owners, every query counted", launch)
'''

N_PER_OWNER, OWNERS = 2000, 2
SCENARIO = {
    "model.name": "toy_mean",
    "sampler.algorithm": "toy_walk",
    "run.transport": "toy_counting",
    "data.owners": OWNERS,
    "data.n_per_owner": N_PER_OWNER,
    "data.true_theta": 0.3,
    "sampler.step": 0.01,
    "sampler.warmup": 500,
    "sampler.iterations": 2000,
    "sampler.chains": 4,
    "sampler.init_scale": 0.1,
    "privacy.budget_epsilon": 1000.0,
    "run.seed": 3,
}


@pytest.fixture
def toys(tmp_path, monkeypatch):
    """The three toy modules, written under tmp_path and imported from there."""
    folder = tmp_path / "toys"
    folder.mkdir()
    sources = {"toy_kernel": TOY_KERNEL, "toy_model": TOY_MODEL, "toy_transport": TOY_TRANSPORT}
    for name, source in sources.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(folder))
    yield {name: importlib.import_module(name) for name in sources}
    for name in sources:
        sys.modules.pop(name, None)


def test_a_toy_kernel_model_and_transport_run_end_to_end(toys, tmp_path, monkeypatch):
    # the one registry line each takes
    monkeypatch.setitem(ALGORITHMS, "toy_walk", toys["toy_kernel"].TOY_WALK)
    monkeypatch.setitem(MODELS, "toy_mean", toys["toy_model"].ToyMean)
    monkeypatch.setitem(TRANSPORTS, "toy_counting", toys["toy_transport"].TOY_COUNTING)

    result = simulate(None, SCENARIO, out=tmp_path / "run", progress=False)

    assert result.stopped is None
    assert result.theta.shape == (4, 2000, 1)
    # the exact posterior mean from the owners' records (the model's closed form, checked
    # against the formula here): precision 1/10² + n/1², mean (Σx/1²)/precision
    records = _pooled_records(result.out)
    precision = 1 / 10.0**2 + len(records)
    exact_mean, exact_sd = records[:, 0].sum() / precision, precision**-0.5
    reference = result.diagnostics["reference"]
    assert reference["mean"] == pytest.approx([exact_mean], rel=1e-9)
    assert reference["source"] == "closed_form"
    # 0.25 posterior sd ≈ 0.004: several Monte Carlo standard errors of these draws
    assert result.diagnostics["mcse_mean"][0] < 0.1 * exact_sd
    assert abs(result.theta.mean() - exact_mean) < 0.25 * exact_sd
    assert abs(result.theta.std() - exact_sd) < 0.25 * exact_sd
    # the toy transport carried every query: each owner charged exactly the answers it saw
    (oracle,) = toys["toy_transport"].LAUNCHED
    assert set(oracle.asked) == {"log_ratio"}
    owners = result.privacy["owners"]
    assert len(owners) == OWNERS
    assert all(o["answers"] == oracle.asked["log_ratio"] for o in owners)
    assert oracle.asked["log_ratio"] == 4 * 2500  # chains × iterations: no proposal left Θ


def _pooled_records(out):
    """Every owner's records of the run in ``out``, made again from its resolved scenario."""
    scenario = load_scenario(out / "config.toml")
    model = build_model(scenario["model"])
    return owner_records(scenario, model, run_seeds(scenario)[0]).pooled()
