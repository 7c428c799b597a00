"""Models users write (docs/design.md §6, "Writing a model"): selection by "module:Class" and by
entry point, the errors of bad names, the model code digest, and the refusal of a session
whose model differs from the owner's."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedpenalty.common import OwnerDescription, Policy
from fedpenalty.config import load_scenario
from fedpenalty.coordinator.grpc_oracle import GrpcOracle
from fedpenalty.coordinator.inprocess import InProcessOracle
from fedpenalty.errors import ConfigError, InvalidRequest, UnknownSession
from fedpenalty.kinds import KINDS, KindTerms
from fedpenalty.models import GaussianMean, build_model, check_owner_models, model_digest
from fedpenalty.models.compat import ModelIdentity
from fedpenalty.models.registry import ENTRY_POINT_GROUP
from fedpenalty.owner import Ledger, OwnerNode, wire
from fedpenalty.owner.host import OwnerHost
from fedpenalty.owner.owner_config import build_node, load_owner_config
from fedpenalty.owner.server import ServerThread
from fedpenalty.owner.session_request import SessionRequest
from fedpenalty.proto import owner_pb2_grpc as pb_grpc

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "user_model"
LAPLACE = "laplace_location:LaplaceLocation"

_MODEL_SOURCE = """
import numpy as np
from fedpenalty.models.api import Configured, Model, Param, as_theta, validate_raw


class Shift(Configured, Model):
    PARAMS = {"theta_bound": Param(3.0, "positive")}

    def _setup(self):
        self.dim, self.theta_bound = 1, self.params()["theta_bound"]

    @property
    def column_names(self):
        return ["x"]

    def prepare_records(self, raw):
        return np.clip(validate_raw(raw, self.column_names, self.name), -5, 5)

    def log_lik(self, records, theta):
        return -0.5 * (records[:, 0][None, :] - as_theta(theta, 1)) ** 2

    def grad_log_lik(self, records, theta):
        return (records[:, 0][None, :] - as_theta(theta, 1))[:, :, None]

    def log_prior(self, theta):
        return np.zeros(as_theta(theta, 1).shape[0])

    def grad_log_prior(self, theta):
        return np.zeros_like(as_theta(theta, 1))

NOT_A_MODEL = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A fresh user module ``usermod_<n>`` in ``tmp_path`` (on sys.path): its name."""
    name = f"usermod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(_MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_module_class_name_builds_the_user_model(user_module):
    model = build_model({"name": f"{user_module}:Shift", "theta_bound": 2.0})
    assert type(model).__name__ == "Shift" and model.name == f"{user_module}:Shift"
    assert model.params() == {"theta_bound": 2.0}
    assert model.lipschitz is None
    assert build_model({"name": model.name, **model.params()}) == model


def test_the_scenario_files_folder_is_searched(tmp_path, monkeypatch):
    """A model module next to the scenario file loads though neither it nor the working
    directory is on sys.path."""
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "nextdoor.py").write_text(_MODEL_SOURCE)
    (folder / "scenario.toml").write_text('[model]\nname = "nextdoor:Shift"\ntheta_bound = 1.5\n')
    monkeypatch.chdir(tmp_path)
    try:
        scenario = load_scenario(folder / "scenario.toml")
        assert scenario["model"] == {"name": "nextdoor:Shift", "theta_bound": 1.5}
    finally:
        sys.modules.pop("nextdoor", None)
    with pytest.raises(ConfigError, match="no module named 'nextdoor'"):
        build_model({"name": "nextdoor:Shift"})  # outside the scenario's folder


def test_the_example_model_loads_from_its_folder(monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    try:
        model = build_model({"name": LAPLACE})
    finally:
        sys.modules.pop("laplace_location", None)
    assert model.name == LAPLACE and model.lipschitz is None
    x = model.prepare_records(np.array([[0.5], [20.0]]))
    assert x[1, 0] == model.params()["data_bound"]  # clipped into the data domain
    theta = np.array([[0.0], [0.3]])
    g = model.grad_log_lik(x, theta)
    eps = 1e-6
    fd = (model.log_lik(x, theta + eps) - model.log_lik(x, theta - eps)) / (2 * eps)
    np.testing.assert_allclose(g[:, :, 0], fd, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("no_such_module_xyz:Model", ["no module named 'no_such_module_xyz'", "model.name"]),
        ("{mod}:Shfit", ["has no attribute 'Shfit'", "Shift", "model.name"]),
        ("{mod}:NOT_A_MODEL", ["not a subclass", "Model", "model.name"]),
        ("{mod}:", ["'package.module:Class'", "model.name"]),
        ("no_such_entry_point", ["unknown model name", "gaussian_mean", "package.module:Class"]),
    ],
)
def test_bad_names_are_clear_config_errors(user_module, name, words):
    with pytest.raises(ConfigError) as err:
        build_model({"name": name.format(mod=user_module)})
    for word in words:
        assert word in str(err.value)


def test_a_model_that_does_not_implement_the_interface_is_named(tmp_path, monkeypatch):
    (tmp_path / "halfmod.py").write_text(
        "from fedpenalty.models.api import Model\nclass Half(Model):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"does not implement: .*log_lik"):
        build_model({"name": "halfmod:Half"})
    sys.modules.pop("halfmod", None)


def test_bad_model_name_in_a_scenario_names_the_key():
    with pytest.raises(ConfigError, match=r"model\.name"):
        load_scenario(overrides=["model.name='no_such_module_xyz:Thing'"])


def test_entry_point_selects_a_model(user_module, monkeypatch):
    ep = importlib.metadata.EntryPoint("shift", f"{user_module}:Shift", ENTRY_POINT_GROUP)

    def entry_points(group=None, **kw):
        assert group == ENTRY_POINT_GROUP
        return importlib.metadata.EntryPoints([ep])

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    model = build_model({"name": "shift"})
    assert type(model).__name__ == "Shift" and model.name == "shift"
    scenario = load_scenario(overrides=["model.name='shift'", "data.source='synthetic'"])
    assert scenario["model"] == {"name": "shift", "theta_bound": 3.0}


def test_digest_changes_with_the_source(user_module, tmp_path):
    model = build_model({"name": f"{user_module}:Shift"})
    first = model_digest(model)
    assert first == model_digest(type(model)) and len(first) == 64
    path = tmp_path / f"{user_module}.py"
    path.write_text(path.read_text().replace("-0.5 *", "-0.25 *"))
    assert model_digest(model) == first  # the code loaded has not changed
    del sys.modules[user_module]
    edited = build_model({"name": f"{user_module}:Shift"})
    assert type(edited) is not type(model) and model_digest(edited) != first
    assert model_digest(GaussianMean()) == model_digest(GaussianMean(dim=2))
    assert model_digest(GaussianMean()) != first


# --- the owner decides which model code touches its data ---------------------------------------

OWNER_MODEL = GaussianMean(dim=1, data_bound=3.0, theta_bound=2.0)


def _owner(tmp_path, model=OWNER_MODEL, name="alice"):
    records = model.simulate_records(np.random.default_rng(0), np.array([0.3]), 200)
    ledger = Ledger(tmp_path / f"{name}-ledger.sqlite", synchronous="NORMAL")
    policy = Policy(sigma=1.0, max_step=0.05, budget_epsilon=100.0)
    return OwnerNode(name, model, records, policy, ledger, np.random.default_rng(1))


def _terms():
    return [KindTerms("log_ratio", 10)]


def _other_models(user_module):
    """The owner's model with another parameter, another name, and other code (same name and
    parameters, but a digest of different source)."""
    other_code = ModelIdentity(OWNER_MODEL.name, ModelIdentity.of(OWNER_MODEL).params, "0" * 64)
    return [
        ("params", ModelIdentity.of(GaussianMean(dim=1, data_bound=2.0, theta_bound=2.0))),
        ("name", ModelIdentity.of(build_model({"name": f"{user_module}:Shift"}))),
        ("digest", other_code),
    ]


def test_describe_carries_the_model_digest(tmp_path):
    (described,) = OwnerHost([_owner(tmp_path)]).describe()
    assert described.model_digest == model_digest(OWNER_MODEL)
    assert wire.owner_description(wire.owner_info(described)) == described


def test_the_owner_refuses_a_session_for_another_model_in_process(tmp_path, user_module):
    node = _owner(tmp_path)
    host = OwnerHost([node])
    for what, asked in _other_models(user_module):
        with pytest.raises(InvalidRequest) as err:
            host.open(SessionRequest.several(f"s-{what}", _terms(), model=asked))
        message = str(err.value)
        own = ModelIdentity.of(OWNER_MODEL)
        assert f"this owner runs model {own}" in message and f"asks for model {asked}" in message
        assert err.value.owner == "alice"
        with pytest.raises(UnknownSession):  # nothing was opened
            node.require_session(f"s-{what}", "penalty")
    oracle = InProcessOracle([node], OWNER_MODEL)  # the same model: opens and answers
    oracle.open_kinds(_terms(), session="same")
    answers = oracle.query(
        "log_ratio", 0, np.array([0]), theta=np.zeros((1, 1)), theta_prop=np.full((1, 1), 0.01)
    )
    assert answers.values.shape == (1, 1)
    with pytest.raises(InvalidRequest, match="asks for model"):
        InProcessOracle([_owner(tmp_path, name="bob")], GaussianMean(dim=2)).open_kinds(_terms())


def test_an_older_client_naming_no_model_is_accepted(tmp_path):
    host = OwnerHost([_owner(tmp_path)])
    host.open(SessionRequest.several("old", _terms()))  # no model: the owner runs its own
    assert wire.model_identity(wire.open_message(SessionRequest.several("old", _terms()))) is None


def test_the_owner_refuses_another_model_over_grpc(tmp_path, user_module):
    with ServerThread(OwnerHost([_owner(tmp_path)])) as server:
        for what, asked in _other_models(user_module):
            message = wire.open_message(SessionRequest.several(what, _terms(), model=asked))
            assert wire.model_identity(message) == asked  # the identity survives the wire
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.OwnerStub(channel)
                with pytest.raises(grpc.RpcError) as err:
                    stub.OpenSession(message, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"asks for model {asked}" in err.value.details()
            assert f"runs model {ModelIdentity.of(OWNER_MODEL)}" in err.value.details()
        oracle = GrpcOracle([server.address], OWNER_MODEL)
        try:
            assert oracle.describe()[0].model_digest == model_digest(OWNER_MODEL)
            oracle.open_kinds(_terms(), session="same")  # the scenario's own model: opens
        finally:
            oracle.disconnect()


def test_the_coordinator_never_imports_a_described_user_model(tmp_path, user_module, monkeypatch):
    """With a user model in the scenario, a description naming another module path, or the
    same path with other code, is refused by comparison alone: nothing is imported."""
    model = build_model({"name": f"{user_module}:Shift"})
    mark = tmp_path / "imported"
    (tmp_path / "probe_mod.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('imported')\nclass Shift: pass\n"
    )

    def no_import(*args, **kwargs):
        raise AssertionError(f"the check imported {args[0]!r}")

    monkeypatch.setattr(importlib, "import_module", no_import)
    digest = model_digest(model)
    described = [
        ("probe_mod:Shift", digest, "serves model 'probe_mod:Shift'"),
        (model.name, "f" * 64, "different versions of the model's code"),
    ]
    for name, code, words in described:
        owner = OwnerDescription("mallory", name, model.params(), 1, 10, Policy(), code)
        with pytest.raises(ConfigError, match=re.escape(words)):
            check_owner_models([owner], model)
    check_owner_models(
        [OwnerDescription("alice", model.name, model.params(), 1, 10, Policy(), digest)], model
    )
    assert not mark.exists() and "probe_mod" not in sys.modules


def test_an_owner_toml_names_a_user_model_beside_it(tmp_path, monkeypatch):
    """OWNER.toml selects a user's model as "module:Class" (its module beside the file, which
    neither sys.path nor the working directory holds); the owner then describes it and refuses
    a session for the built-in model the coordinator might assume."""
    folder = tmp_path / "hospital"
    folder.mkdir()
    (folder / "owner_model.py").write_text(_MODEL_SOURCE)
    (folder / "records.csv").write_text("x\n" + "\n".join(str(v / 10) for v in range(50)) + "\n")
    (folder / "OWNER.toml").write_text(
        '[model]\nname = "owner_model:Shift"\ntheta_bound = 2.5\n\n'
        '[data]\npath = "records.csv"\n\n[privacy]\nsigma = 1.0\nmax_step = 0.05\n'
    )
    monkeypatch.chdir(tmp_path)
    try:
        config = load_owner_config(folder / "OWNER.toml")
        node = build_node(config, Ledger(tmp_path / "ledger.sqlite", synchronous="NORMAL"))
        (described,) = OwnerHost([node]).describe()
        assert (described.model, described.model_params) == (
            "owner_model:Shift",
            {"theta_bound": 2.5},
        )
        assert described.model_digest == model_digest(config.model)
        with pytest.raises(InvalidRequest, match=r"'owner_model:Shift'.*asks for model 'gaussian"):
            OwnerHost([node]).open(
                SessionRequest.several("s", _terms(), model=ModelIdentity.of(GaussianMean()))
            )
    finally:
        sys.modules.pop("owner_model", None)
    bad = folder / "BAD.toml"
    bad.write_text(
        (folder / "OWNER.toml").read_text().replace("owner_model:Shift", "owner_model:Nope")
    )
    with pytest.raises(ConfigError, match=r"BAD\.toml: \[model\] module 'owner_model' has no"):
        load_owner_config(bad)
    sys.modules.pop("owner_model", None)


# --- the example a new user copies -------------------------------------------------------------

SHORT_RUN = ["--set", "sampler.iterations=300", "--set", "sampler.warmup=100"]


def _simulate_example(tmp_path, scenario: str, *extra: str) -> subprocess.CompletedProcess:
    """``fedpenalty simulate SCENARIO`` run from examples/user_model, as its README says, by a
    console script (which, unlike ``python -m``, puts no working directory on sys.path)."""
    script = "import sys; from fedpenalty.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", script, "simulate", scenario, "--out", str(tmp_path / "run"),
         *SHORT_RUN, *extra],
        cwd=EXAMPLE, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_example_without_a_clip_is_refused_naming_the_keys(tmp_path):
    """The example model declares no Lipschitz bound: penalty MH on unclipped log ratios is
    refused, and the message says which key to set."""
    scenario = tmp_path / "noclip.toml"
    text = (EXAMPLE / "scenario.toml").read_text()
    scenario.write_text("\n".join(x for x in text.splitlines() if "ratio_clip" not in x))
    done = _simulate_example(tmp_path, str(scenario), "--set", "data.n_per_owner=200")
    assert done.returncode != 0
    assert "sampler.ratio_clip" in done.stderr and "lipschitz" in done.stderr


def test_the_example_runs_from_its_folder(tmp_path):
    done = _simulate_example(tmp_path, "scenario.toml")
    assert done.returncode == 0, done.stderr[-2000:]
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert privacy  # every owner's ε, from its ledger
    assert (tmp_path / "run" / "diagnostics.json").exists()


def test_owner_host_processes_ignore_a_fedpenalty_folder_in_the_working_directory(tmp_path):
    """A user who runs the default simulation from inside another checkout (a ``fedpenalty``
    folder in the working directory) gets the installed package in the owners' host processes
    too, not the folder's: before ``python -P`` the hosts imported the folder's copy."""
    shadow = tmp_path / "fedpenalty"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise ImportError("the shadowing checkout was imported")')
    script = "import sys; from fedpenalty.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-P", "-c", script, "simulate", "--out", str(tmp_path / "run"),
         "--no-progress", "--set", "run.transport='grpc'", "--set", "data.n_per_owner=1000",
         "--set", "sampler.iterations=20", "--set", "sampler.warmup=10"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    logs = "".join(p.read_text() for p in (tmp_path / "run").rglob("host-*.log"))
    assert "shadowing checkout" not in logs


def test_lipschitz_is_checked_only_when_declared(user_module):
    """A model without L builds, and what needs L refuses it naming the keys; a declared L
    must still be a finite positive number."""
    model = build_model({"name": f"{user_module}:Shift"})
    with pytest.raises(ConfigError, match=r"sampler\.ratio_clip.*lipschitz"):
        model.log_ratio_sensitivity(0.1, "replace_one")
    with pytest.raises(InvalidRequest, match=r"sampler\.ratio_clip.*lipschitz"):
        KINDS["log_ratio"].check_model(model, 10, "alice")
    KINDS["log_ratio"].check_model(OWNER_MODEL, 10, "alice")  # a built-in model declares L

    class Unbounded(type(model)):  # type: ignore[misc]
        name = "unbounded"

        @property
        def lipschitz(self) -> float:
            return float("inf")

    with pytest.raises(ConfigError, match="Lipschitz bound overflows"):
        Unbounded()
