"""OWNER.toml: one deployed owner's model, data, privacy policy and server settings.

    [model]    the scenario's [model] table (fedpenalty.models.build_model)
    [data]     path = "records.csv"            one CSV or NPZ file (fedpenalty.data.load_records)
    [privacy]  sigma, max_step, budget_epsilon, delta, neighbour, max_answers_per_request,
               max_sampling_rate, max_clip (the owner's Policy; defaults are Policy's)
    [server]   name, listen, ledger, tls_cert, tls_key, tls_ca, synchronous,
               max_message_bytes

Relative paths are read from the TOML file's folder; the ledger defaults to
``<name>-ledger.sqlite`` beside the file and ``name`` to the file's stem. Unknown sections or
keys are errors that name them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import _one_of, _optional, _positive, _positive_int, _probability, _rate, _string
from ..data import load_records
from ..errors import ConfigError
from ..models import Model, build_model
from ..models.base import NEIGHBOURS
from . import Ledger, OwnerNode, Policy


_POLICY = Policy()
SCHEMA = {
    "data": {"path": (None, _string)},
    "privacy": {
        "sigma": (_POLICY.sigma, _positive), "max_step": (_POLICY.max_step, _positive),
        "budget_epsilon": (_POLICY.budget_epsilon, _positive), "delta": (_POLICY.delta, _probability),
        "neighbour": (_POLICY.neighbour, _one_of(*NEIGHBOURS)),
        "max_answers_per_request": (_POLICY.max_answers_per_request, _positive_int),
        "max_sampling_rate": (_POLICY.max_sampling_rate, _rate),
        "max_clip": (_POLICY.max_clip, _positive),
    },
    "server": {
        "name": (None, _optional(_string)), "listen": ("127.0.0.1:50051", _string),
        "ledger": (None, _optional(_string)), "tls_cert": (None, _optional(_string)),
        "tls_key": (None, _optional(_string)), "tls_ca": (None, _optional(_string)),
        "synchronous": ("FULL", _one_of("FULL", "NORMAL")),
        "max_message_bytes": (4 * 1024 * 1024, _positive_int)
    },
}


@dataclass(frozen=True)
class TlsFiles:
    """PEM files. A server uses ``cert``/``key`` and, with ``ca``, requires client
    certificates signed by it (mutual TLS). A client verifies servers against ``ca`` and
    presents ``cert``/``key``."""

    cert: Path
    key: Path
    ca: Path | None = None

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        try:
            return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes() if self.ca else None
        except OSError as exc:
            raise ConfigError(f"cannot read TLS file: {exc}") from exc


@dataclass(frozen=True)
class OwnerConfig:
    """A resolved OWNER.toml (paths absolute)."""

    name: str
    model: Model
    data_path: Path
    policy: Policy
    listen: str
    ledger: Path
    synchronous: str
    tls: TlsFiles | None
    max_message_bytes: int


def load_owner_config(path: str | Path, listen: str | None = None, ledger: str | None = None) -> OwnerConfig:
    """Read and validate OWNER.toml; ``listen``/``ledger`` override ``[server]``."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read owner file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    unknown = sorted(set(raw) - {"model", *SCHEMA})
    if unknown:
        raise ConfigError(f"{path}: unknown section [{unknown[0]}]; allowed: [model], [data], [privacy], [server]")
    for section in ("model", "data"):
        if not isinstance(raw.get(section), dict):
            raise ConfigError(f"{path}: needs a [{section}] table")
    try:
        model = build_model(raw["model"])
        values = {s: _section(s, raw.get(s, {})) for s in SCHEMA}
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    data, privacy, server = values["data"], values["privacy"], values["server"]
    if data["path"] is None:
        raise ConfigError(f"{path}: [data] needs path = \"records.csv\" (one CSV or NPZ file)")
    base = path.parent
    name = server["name"] or path.stem
    tls_keys = [server[k] for k in ("tls_cert", "tls_key")]
    if any(tls_keys) and not all(tls_keys) or server["tls_ca"] and not all(tls_keys):
        raise ConfigError(f"{path}: TLS needs both server.tls_cert and server.tls_key (and server.tls_ca for mTLS)")
    tls = TlsFiles(base / server["tls_cert"], base / server["tls_key"],
                   base / server["tls_ca"] if server["tls_ca"] else None) if all(tls_keys) else None
    return OwnerConfig(
        name=name, model=model, data_path=base / data["path"], policy=Policy(**privacy),
        listen=listen or server["listen"], ledger=Path(ledger) if ledger else base / (server["ledger"] or f"{name}-ledger.sqlite"),
        synchronous=server["synchronous"], tls=tls, max_message_bytes=server["max_message_bytes"],
    )


def _section(section: str, given: Any) -> dict[str, Any]:
    if not isinstance(given, dict):
        raise ConfigError(f"[{section}] must be a table of keys")
    keys = SCHEMA[section]
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise ConfigError(f"unknown key {section}.{unknown[0]}; allowed keys in [{section}]: {', '.join(keys)}")
    return {k: check(f"{section}.{k}", given[k]) if k in given else default for k, (default, check) in keys.items()}


def build_node(config: OwnerConfig, ledger: Ledger) -> OwnerNode:
    """The owner node of ``config`` on ``ledger`` (its data loaded and validated; noise from
    fresh OS entropy)."""
    return OwnerNode(config.name, config.model, load_records(config.data_path, config.model), config.policy, ledger)
