"""``fedpenalty init DIR``: a deployment on one machine, under mutual TLS, ready to serve.

It writes what the parties of a real study make on their own machines (README, "Deploying
owners on separate machines"), with every name pointing at this machine:

* a study CA (``ca.crt``, ``ca.key``); per owner a server certificate whose SANs are
  ``localhost``, ``127.0.0.1`` and its owner identity ``urn:fedpenalty:owner:<name>``
  (secure-aggregation peers, ``owner.peer_auth``); the coordinator's client certificate
  (``coordinator.crt``, named ``coordinator``); private keys are readable by their owner only;
* per owner an OWNER.toml serving on 127.0.0.1 at its own port (``port``, ``port`` + 1, …),
  its records as CSV (synthetic, from the model's generator at θ = ``TRUE_THETA``);
* ``scenario.toml``, the coordinator's scenario, sized for these owners: every chain mixes
  and one run's worst case (at the owners' ``max_step``) is 0.81 of each owner's budget in μ,
  so a second run still fits (the first spends about a third of the worst case in μ²).

The contents are pure data (``owner_file``, ``SCENARIO``); ``write_deployment`` is the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from .certificates import CertificateAuthority
from .data import save_csv
from .errors import ConfigError
from .models import build_model

OWNERS = ("hospital-a", "hospital-b", "hospital-c")
COORDINATOR = "coordinator"
DEFAULT_PORT = 50051
#: Records per owner (3 million in all: posterior sd 5.8e-4) and the θ that generates them.
RECORDS = 1_000_000
TRUE_THETA = 0.05
#: Significant digits of the records in the CSV files (far below the noise of the answers).
DIGITS = 8
MODEL: dict[str, Any] = {
    "name": "gaussian_mean",
    "dim": 1,
    "noise_sd": 1.0,
    "data_bound": 3.0,
    "theta_bound": 2.0,
    "prior_mean": 0.0,
    "prior_sd": 10.0,
}
#: The proposal radius, 1.7 posterior sds: at a fixed worst-case spend (∝ step × √answers),
#: shorter steps and more iterations mixed better here than 2.4, 3.5 or 4.9 sds (bulk ESS
#: 1,190–1,740 against 950–1,280, 670–760 and 300–430 in process, 3–8 seeds each). Owners
#: answer no longer step (privacy.max_step).
STEP = 0.001
SCENARIO: dict[str, Any] = {
    "model": MODEL,
    "sampler": {
        "algorithm": "penalty",
        "chains": 4,
        "iterations": 5000,
        "warmup": 800,
        "step": STEP,
        "init_scale": 0.01,
    },
    # owners still starting (each reads a million records: 45 s on a busy 2-core machine)
    # are retried this long
    "run": {"retry_seconds": 120.0, "seed": 0},
}
SCENARIO_HEADER = """\
# The coordinator's scenario for the owners `fedpenalty init` wrote beside it: penalty MH on
# their Gaussian mean. [model] must match the owners' files; each owner's [privacy] (its
# OWNER.toml) governs its noise and budget. Run it with the command `fedpenalty init` printed.
"""
OWNER_HEADER = """\
# One owner of a deployment on this machine (`fedpenalty init`), as in the README's
# OWNER.toml: its model, records, privacy policy, and a server under mutual TLS on 127.0.0.1.
"""


def owner_file(name: str, port: int) -> dict[str, Any]:
    """The OWNER.toml of owner ``name`` serving on 127.0.0.1:``port``."""
    return {
        "model": MODEL,
        "data": {"path": f"{name}.csv"},
        "privacy": {
            "log_ratio_sd": 1.0,
            "max_step": STEP,
            "budget_epsilon": 10.0,
            "delta": 1e-5,
            "neighbour": "replace_one",
            "total_noise_sd": 1.0,
            "colluders": 0,
        },
        "server": {
            "name": name,
            "listen": f"127.0.0.1:{port}",
            "ledger": f"{name}-ledger.sqlite",
            "tls_cert": f"{name}.crt",
            "tls_key": f"{name}.key",
            "tls_ca": "ca.crt",
            "allowed_clients": [COORDINATOR],
            "peer_ca": "ca.crt",
            "allowed_peers": [o for o in OWNERS if o != name],
        },
    }


@dataclass(frozen=True)
class Deployment:
    """What ``write_deployment`` wrote: the ``folder``, each owner's address (HOST:PORT, owner
    order) and the ledgers of an earlier deployment it left in place."""

    folder: Path
    addresses: tuple[str, ...]
    kept_ledgers: tuple[str, ...]

    def run_command(self) -> str:
        """The coordinator's command, run in ``folder``."""
        return (
            f"fedpenalty run scenario.toml --owners {','.join(self.addresses)} "
            "--tls-cert coordinator.crt --tls-key coordinator.key --tls-ca ca.crt"
        )


def check_port(port: int) -> None:
    """``ConfigError`` unless the owners' ports ``port`` … ``port`` + 2 are valid."""
    if not 1 <= port <= 65536 - len(OWNERS):
        raise ConfigError(
            f"--port {port}: the owners serve on --port and the next {len(OWNERS) - 1} ports; "
            f"give a port from 1 to {65536 - len(OWNERS)}"
        )


def write_deployment(folder: Path, port: int = DEFAULT_PORT, force: bool = False) -> Deployment:
    """Write the deployment into ``folder`` (new or empty; with ``force``, its files are
    replaced and anything else, such as owners' ledgers, is left as it is)."""
    check_port(port)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file: name a new or empty folder for the deployment")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise ConfigError(
            f"{folder} is not empty: name a new or empty folder, or pass --force to replace the "
            "files fedpenalty init writes there"
        )
    folder.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority(folder, "fedpenalty one-machine study CA")
    ca.leaf(COORDINATOR, COORDINATOR, dns=(COORDINATOR,))
    model = build_model(MODEL)
    seeds = np.random.SeedSequence(0).spawn(len(OWNERS))
    addresses = []
    for k, (name, seed) in enumerate(zip(OWNERS, seeds)):
        ca.leaf(name, name, dns=("localhost",), ips=("127.0.0.1",), owners=(name,))
        records = model.simulate_records(
            np.random.default_rng(seed), np.array([TRUE_THETA]), RECORDS
        )
        save_csv(folder / f"{name}.csv", records, model, DIGITS)
        text = OWNER_HEADER + tomli_w.dumps(owner_file(name, port + k))
        (folder / f"{name}.toml").write_text(text)
        addresses.append(f"127.0.0.1:{port + k}")
    (folder / "scenario.toml").write_text(SCENARIO_HEADER + tomli_w.dumps(SCENARIO))
    kept = tuple(f"{n}-ledger.sqlite" for n in OWNERS if (folder / f"{n}-ledger.sqlite").exists())
    return Deployment(folder, tuple(addresses), kept)
