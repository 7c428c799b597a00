"""OWNER.toml: one deployed owner's model, data, privacy policy and server settings.

    [model]    the scenario's [model] table (fedpenalty.models.build_model): the model this
               owner runs; name = a built-in model, an entry point of fedpenalty.models or
               "package.module:Class" (a module beside OWNER.toml is found); sessions for any
               other model (name, parameters, code digest) are refused
    [data]     path = "records.csv"            one CSV or NPZ file (fedpenalty.data.load_records)
    [privacy]  each kind's noise level, named for what it is: log_ratio_sd (sd of a
               log-likelihood-ratio answer), stat_sd (sd of each statistic component),
               gradient_noise_multiplier (gradient noise sd / clip) — or, as before, sigma
               (every kind's level; with kind keys that differ, the kinds not named);
               max_step, budget_epsilon, delta, neighbour, max_answers_per_request,
               max_sampling_rate, max_clip, min_step, min_clip, max_record_evaluations,
               min_charged_step, total_noise_sd, colluders, min_peers, unauthenticated_peers
               (the owner's Policy; defaults are Policy's)
    [server]   name, listen, ledger, tls_cert, tls_key, tls_ca, allowed_clients,
               synchronous, max_message_bytes, peer_ca, allowed_peers, secure_sessions_per_day

Relative paths are read from the TOML file's folder; the ledger defaults to
``<name>-ledger.sqlite`` beside the file and ``name`` to the file's stem. Unknown sections or
keys are errors that name them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from ..common import Policy
from ..data import read_records
from ..errors import ConfigError
from ..kinds import KINDS
from ..models import Model, build_model, search_folders
from ..schema import (
    NonEmptyStr,
    PositiveInt,
    Section,
    one_of,
    read_toml,
    refusal,
    validate_file,
)
from .key_requests import DEFAULT_SESSIONS_PER_DAY, KeyRequests
from .ledger import Ledger
from .node import OwnerNode
from .peer_auth import PeerAuth

log = logging.getLogger("fedpenalty.owner")

#: Names a client certificate must carry (a SAN DNS name or the subject CN) to be let in.
ClientNames = Annotated[
    list[Annotated[str, Field(strict=True, min_length=1)]],
    refusal('a list of client certificate names (e.g. ["coordinator.example.org"])'),
]


#: Owner identities accepted as secure-aggregation peers (owner names, as their certificates'
#: SAN URIs urn:fedpenalty:owner:<name> carry them).
OwnerNames = Annotated[
    list[Annotated[str, Field(strict=True, min_length=1)]],
    refusal('a list of owner names (e.g. ["hospital-b", "hospital-c"])'),
]


class DataSection(Section):
    path: NonEmptyStr = Field(
        description="one CSV or NPZ file of the owner's records, relative "
        'to this file (e.g. "records.csv")'
    )


class ServerSection(Section):
    name: NonEmptyStr | None = Field(
        default=None, description="the owner's name (default: the file's stem)"
    )
    listen: NonEmptyStr = Field(
        default="127.0.0.1:50051", description="HOST:PORT the server listens on"
    )
    ledger: NonEmptyStr | None = Field(
        default=None, description="the owner's SQLite ledger (default: <name>-ledger.sqlite)"
    )
    tls_cert: NonEmptyStr | None = Field(default=None, description="PEM certificate of the server")
    tls_key: NonEmptyStr | None = Field(default=None, description="PEM private key of the server")
    tls_ca: NonEmptyStr | None = Field(
        default=None, description="PEM CA that signs client certificates (mutual TLS)"
    )
    allowed_clients: ClientNames = Field(
        default=[],
        description="mutual TLS: the client certificate names (SAN DNS name or subject CN) "
        "that may connect",
    )
    synchronous: Annotated[str, one_of("FULL", "NORMAL")] = Field(
        default="FULL", description="SQLite synchronous mode of the ledger"
    )
    max_message_bytes: PositiveInt = Field(
        default=4 * 1024 * 1024, description="largest gRPC message received or sent"
    )
    peer_ca: NonEmptyStr | None = Field(
        default=None,
        description="secure aggregation: PEM CA that issues the owners' server certificates, "
        "each naming its owners as SAN URIs urn:fedpenalty:owner:<name>",
    )
    allowed_peers: OwnerNames = Field(
        default=[],
        description="secure aggregation: the owners (names) accepted as peers; set, the owner "
        "signs its session keys with its TLS key and joins a secure session only when every "
        "other owner's key is signed under a peer_ca certificate naming that owner, one of these",
    )
    secure_sessions_per_day: PositiveInt = Field(
        default=DEFAULT_SESSIONS_PER_DAY,
        description="secure aggregation: new sessions a client may ask session keys for in any "
        "24 hours; past it, refused before any key is made (each is a try at a masking graph)",
    )


class OwnerFile(Section):
    model: dict[str, Any] = Field(description="the scenario's [model] table")
    data: DataSection = Field(description="the owner's records")
    privacy: Policy = Field(default=Policy(), description="the owner's policy (common.Policy)")
    server: ServerSection = ServerSection()


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
            ca = self.ca.read_bytes() if self.ca else None
            return self.cert.read_bytes(), self.key.read_bytes(), ca
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
    allowed_clients: tuple[str, ...]
    max_message_bytes: int
    peer_ca: Path | None = None
    allowed_peers: tuple[str, ...] = ()
    source: Path | None = None  # the OWNER.toml it was read from
    secure_sessions_per_day: int = DEFAULT_SESSIONS_PER_DAY

    def check_servable(self) -> None:
        """``ConfigError`` naming what to change when ``listen`` is not HOST:PORT or a file a
        server needs does not exist (checked before a ledger is made)."""
        check_listen(self.listen, f"{self.source}: server.listen (or --listen)")
        tls = self.tls
        files = {
            "data.path": self.data_path,
            "server.tls_cert": tls.cert if tls else None,
            "server.tls_key": tls.key if tls else None,
            "server.tls_ca": tls.ca if tls else None,
            "server.peer_ca": self.peer_ca,
        }
        for key, file in files.items():
            if file is not None and not file.is_file():
                raise ConfigError(
                    f"{self.source}: {key}: no file at {file.resolve()} (relative paths are read "
                    "from the owner file's folder)"
                )

    def key_requests(self) -> KeyRequests:
        """How many new secure sessions a client may ask this owner's keys for, per day."""
        return KeyRequests(self.secure_sessions_per_day)

    def peer_auth(self) -> PeerAuth | None:
        """How this owner authenticates secure-aggregation peers (None: it does not)."""
        if not self.allowed_peers or self.tls is None or self.peer_ca is None:
            return None
        return PeerAuth.load(self.tls.cert, self.tls.key, self.peer_ca, self.allowed_peers)


def load_owner_config(
    path: str | Path, listen: str | None = None, ledger: str | None = None
) -> OwnerConfig:
    """Read and validate OWNER.toml; ``listen``/``ledger`` override ``[server]``."""
    path = Path(path)
    hint = "; pass the owner's OWNER.toml, and a ledger file with --ledger"
    raw = read_toml(path, "owner file", hint)
    named = None
    try:
        named = noise_level(raw)
        owner = validate_file(OwnerFile, raw)
        with search_folders(path.parent):
            model = build_model(owner.model)
    except ConfigError as exc:
        message = (
            str(exc) if named is None else str(exc).replace("privacy.sigma", f"privacy.{named}")
        )
        raise ConfigError(f"{path}: {message}") from exc
    server, base = owner.server, path.parent
    name, cert, key, ca = server.name or path.stem, server.tls_cert, server.tls_key, server.tls_ca
    if (cert is None) != (key is None) or (ca and not cert):
        raise ConfigError(
            f"{path}: TLS needs both server.tls_cert and server.tls_key "
            "(and server.tls_ca for mTLS)"
        )
    tls = (
        None
        if cert is None or key is None
        else TlsFiles(base / cert, base / key, base / ca if ca else None)
    )
    if bool(server.allowed_peers) != bool(server.peer_ca) or (server.peer_ca and tls is None):
        raise ConfigError(
            f"{path}: peer authentication needs server.allowed_peers, server.peer_ca and the "
            "server's own server.tls_cert and server.tls_key (its session keys are signed with it)"
        )
    return OwnerConfig(
        name=name,
        model=model,
        data_path=base / owner.data.path,
        policy=owner.privacy,
        listen=listen or server.listen,
        ledger=Path(ledger) if ledger else base / (server.ledger or f"{name}-ledger.sqlite"),
        synchronous=server.synchronous,
        tls=tls,
        allowed_clients=tuple(server.allowed_clients),
        max_message_bytes=server.max_message_bytes,
        source=path,
        **_peer_settings(server, base),
    )


def _peer_settings(server: ServerSection, base: Path) -> dict[str, Any]:
    """``OwnerConfig``'s secure-aggregation server settings (``peer_ca`` read from ``base``)."""
    return {
        "peer_ca": base / server.peer_ca if server.peer_ca else None,
        "allowed_peers": tuple(server.allowed_peers),
        "secure_sessions_per_day": server.secure_sessions_per_day,
    }


#: OWNER.toml's names of the noise level, one per query kind (``QueryKind.noise_key``).
NOISE_KEYS = {kind.noise_key: kind for kind in KINDS.values()}


def noise_level(raw: dict[str, Any]) -> str | None:
    """Read the ``[privacy]`` noise levels of ``raw`` into ``sigma`` and ``noise`` (in place),
    whichever names they have (``NOISE_KEYS`` or ``sigma``, with a log line naming the new
    keys). One level under every name given: ``sigma`` (as before; the one kind key named is
    returned, for error messages). Levels that differ: each named kind's level in ``noise``
    (by ledger name) and ``sigma``, as given or the default, for the kinds not named."""
    privacy = raw.get("privacy")
    if not isinstance(privacy, dict):
        return None
    if "noise" in privacy:
        raise ConfigError(
            f"unknown key privacy.noise; name each kind's noise level: {', '.join(NOISE_KEYS)}"
        )
    given = {key: privacy.pop(key) for key in list(privacy) if key in NOISE_KEYS}
    if "sigma" in privacy and not given:
        log.info(
            "privacy.sigma is this owner's noise level for every query kind; it may be "
            "named for what it is: %s",
            "; ".join(f"{k} ({kind.sigma_meaning})" for k, kind in NOISE_KEYS.items()),
        )
    levels = dict(given, **({"sigma": privacy["sigma"]} if "sigma" in privacy else {}))
    if len({repr(v) for v in levels.values()}) > 1:
        privacy["noise"] = {NOISE_KEYS[k].ledger_name: _level(k, v) for k, v in given.items()}
        log.info(
            "%s: each kind answers at its own noise level; %s for the kinds not named",
            ", ".join(f"privacy.{k} = {v!r}" for k, v in given.items()),
            f"privacy.sigma = {privacy.get('sigma', Policy().sigma)!r}",
        )
        return None
    if not given:
        return None
    privacy["sigma"] = next(iter(given.values()))
    return next(iter(given))


def _level(key: str, value: Any) -> float:
    """OWNER.toml's ``privacy.<key>`` noise level: a positive finite number (``ConfigError``)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ConfigError(f"privacy.{key} must be a positive finite number, got {value!r}")
    return float(value)


def check_listen(listen: str, key: str) -> None:
    """``ConfigError`` naming ``key`` unless ``listen`` is HOST:PORT with a port in 0..65535
    (0: the system picks one)."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            f"{key}: {listen!r} is not HOST:PORT with a port from 0 to 65535, e.g. "
            "127.0.0.1:50051 (this machine only) or 0.0.0.0:50051 (every interface)"
        )


def build_node(config: OwnerConfig, ledger: Ledger) -> OwnerNode:
    """The owner node of ``config`` on ``ledger`` (its data loaded and validated; noise from
    fresh OS entropy). The owner's log says how many records were clipped into the model's
    data domain (that count is the owner's alone: it is never sent)."""
    loaded = read_records(config.data_path, config.model)
    log.info(
        "%s",
        clipped_line(
            config.name, config.data_path, config.model.name, len(loaded.records), loaded.clipped
        ),
    )
    return OwnerNode(config.name, config.model, loaded.records, config.policy, ledger)


def clipped_line(owner: str, path: Path, model: str, records: int, clipped: int) -> str:
    """The owner's own line on its records: how many of the ``records`` in ``path`` were
    clipped into the ``model``'s data domain when loaded."""
    return (
        f"owner {owner!r}: {clipped} of {records} records in {path} were clipped into the "
        f"{model} model's data domain when loaded ([model] data_bound or count_bound)"
    )
