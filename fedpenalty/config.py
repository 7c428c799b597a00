"""Scenario files: parsing, defaults, validation and the resolved form written to a run.

A scenario is a TOML file with sections ``[model]``, ``[data]``, ``[privacy]``, ``[sampler]``
and ``[run]``. ``[sampler]`` and ``[run]`` are flat tables assembled from generic keys and the
keys each registry entry declares in its settings model (``assembled``). Every key has a
default: the generic one of the section models below, unless
the model's table or the (model, sampler) table of ``model_defaults.toml`` sets it
(``load_scenario``); an unknown section or key is an error that names it; a bad value is an
error that says what is allowed. ``--set section.key=value`` overrides are parsed as TOML
values (falling back to a bare string).
"""

from __future__ import annotations

import copy
import inspect
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import tomli_w
from pydantic import ConfigDict, Field, create_model, field_validator

from .coordinator.algorithms import ALGORITHMS, Algorithm
from .coordinator.base import ChainAlgorithm
from .coordinator.network import NetworkSection
from .coordinator.transports import TRANSPORTS
from .errors import ConfigError
from .kinds import KINDS, query_kind
from .models import (
    HIERARCHICAL,
    MODEL_NAMES,
    HierarchicalModel,
    Model,
    build_hierarchical,
    build_model,
    search_folders,
)
from .schema import (
    Bool,
    FiniteFloats,
    Neighbour,
    NonEmptyStr,
    NonNegativeInt,
    Paths,
    PositiveFloat,
    PositiveFloats,
    PositiveInt,
    PositiveInts,
    Probability,
    Section,
    entry_of,
    one_of,
    read_toml,
    validate_file,
)


class ModelTable(Section):
    """``name`` picks the model; every other key is the model's own (``build_model``)."""

    model_config = ConfigDict(extra="allow")
    name: Annotated[str, entry_of(MODEL_NAMES)] = Field(
        default="gaussian_mean",
        description="the likelihood: a built-in name, an entry point or 'package.module:Class'",
    )


class DataSection(Section):
    source: Annotated[str, one_of("synthetic", "files")] = Field(
        default="synthetic", description="'synthetic' (simulated records) or 'files' (paths)"
    )
    owners: PositiveInt = Field(
        default=4, description="number of owners for synthetic data (files: one owner per path)"
    )
    n_per_owner: PositiveInts = Field(
        default=1000, description="records per owner: one number or one per owner"
    )
    true_theta: FiniteFloats = Field(
        default=0.5,
        description="parameter that generates synthetic data: a number or one per dimension",
    )
    paths: Paths = Field(default=[], description="one CSV or NPZ file per owner (source = 'files')")


class PrivacySection(Section):
    delta: Probability = Field(
        default=1e-5, description="δ at which ε is reported and budgets are enforced"
    )
    sigma: PositiveFloats = Field(
        default=1.0,
        description="owner noise sd (sgld, sghmc, sgnht: noise multiplier, sd σ·clip): one "
        "number or one per owner",
    )
    budget_epsilon: PositiveFloat = Field(
        default=10.0, description="each owner refuses answers past this ε at δ"
    )
    max_step: PositiveFloat | None = Field(
        default=None, description="largest ‖θ'−θ‖ owners answer for (default: sampler.step)"
    )
    neighbour: Neighbour = Field(
        default="replace_one", description="neighbouring relation of the DP guarantee"
    )
    epsilon: PositiveFloat = Field(
        default=1.0,
        description="ops, noisy_stats, hybrid: each owner's target ε (at δ for noisy_stats with "
        "mechanism 'gaussian' and for hybrid; δ = 0 otherwise)",
    )
    mechanism: Annotated[str, one_of("laplace", "gaussian")] = Field(
        default="laplace",
        description="noisy_stats: noise of the one release (Laplace of L1 sensitivity, or "
        "exactly calibrated Gaussian)",
    )
    ops_form: Annotated[str, one_of("wang", "foulds")] = Field(
        default="wang",
        description="ops, hybrid: OPS temperature min{1, ε/(4B)} (wang; ε/(2B) for add_remove) "
        "or min{1, ε/(2C)} (foulds; replace_one only)",
    )
    aggregation: Annotated[str, one_of("none", "secure")] = Field(
        default="none",
        description="'secure': the coordinator learns only the sum of the owners' masked answers "
        "(docs/design.md §2.6); 'none': each owner's answer",
    )
    total_noise_sd: PositiveFloat | None = Field(
        default=None,
        description="secure aggregation: s, the noise sd of the honest owners' sum (units of "
        "sigma; for a clipped kind, sgld and dp_hmc a multiplier of the kind's clip: sd s·clip); "
        "each of K owners adds variance s²/(K − colluders)",
    )
    colluders: NonNegativeInt = Field(
        default=0,
        description="secure aggregation: t, owners assumed to collude with the coordinator "
        "(0 ≤ t < owners)",
    )
    noise: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="[privacy.noise]: the simulated owners' noise level of a query kind by its "
        "OWNER.toml key (e.g. ratio_noise_multiplier = 1.5), instead of sigma for that kind",
    )

    @field_validator("noise")
    @classmethod
    def _known_noise_keys(cls, noise: dict[str, float]) -> dict[str, float]:
        """Every key names a kind's noise level (``QueryKind.noise_key``)."""
        known = sorted(kind.noise_key for kind in KINDS.values())
        unknown = sorted(set(noise) - set(known))
        if unknown:
            raise ValueError(f"unknown noise keys {unknown}; known: {known}")
        return noise


class GenericSampler(Section):
    """The ``[sampler]`` keys of every algorithm; each registry entry adds its own
    (``SamplerSection``)."""

    algorithm: Annotated[str, entry_of(ALGORITHMS)] = Field(
        default="penalty",
        description="which sampler or baseline to run (coordinator/algorithms.py)",
    )
    iterations: PositiveInt = Field(default=1000, description="kept iterations per chain")
    warmup: NonNegativeInt = Field(
        default=500, description="discarded iterations per chain (still charged)"
    )
    chains: PositiveInt = Field(default=4, description="number of chains")
    step: PositiveFloat = Field(
        default=0.05,
        description="penalty, penalty_expfam, exact_mh: radius of the uniform-in-ball proposal; "
        "sgld, sghmc, sgnht, hybrid: the step η (units of θ²), or a in "
        "η_t = a (b + t)^−γ",
    )
    init_scale: PositiveFloat = Field(
        default=0.25, description="chains start uniform in init_scale × Θ (data independent)"
    )
    superchains: NonNegativeInt = Field(
        default=0,
        description="S ≥ 2: the chains form S superchains of chains/S consecutive chains that "
        "share a start (nested R-hat, docs/design.md §5); 0: every chain starts on its own",
    )


class GenericRun(Section):
    """The ``[run]`` keys of every transport; each registry entry adds its own
    (``RunSection``)."""

    transport: Annotated[str, entry_of(TRANSPORTS)] = Field(
        default="grpc",
        description="simulate: how the owners run (coordinator/transports.py): 'grpc' (local "
        "processes on loopback gRPC), 'inprocess' (fastest) or 'ray' (Ray actors)",
    )
    checkpoint_every: NonNegativeInt = Field(
        default=500, description="iterations between checkpoints of the chain (0: never)"
    )
    seed: NonNegativeInt = Field(
        default=0, description="seed of data simulation, owner noise and chains"
    )
    out: NonEmptyStr | None = Field(
        default=None, description="run directory (default: runs/<algorithm>-<time>)"
    )
    progress: Bool = Field(default=True, description="show a progress bar")


def assembled(name: str, generic: type[Section], entries: Iterable[Any]) -> type[Section]:
    """The flat section ``name``: the ``generic`` keys, then each entry's settings model's keys
    (``entry.options``) in registry order. A key any entry declares is accepted whichever entry
    the scenario selects, as in one flat table. ``TypeError`` when a key is declared twice
    other than through one shared settings class (two meanings, one key)."""
    fields: dict[str, Any] = {}
    origin: dict[str, type] = {key: generic for key in generic.model_fields}
    for entry in entries:
        for key, info in entry.options.model_fields.items():
            declared = _declaring(entry.options, key)
            if origin.setdefault(key, declared) is not declared:
                raise TypeError(
                    f"{name}: key {key!r} is declared by {origin[key].__qualname__} and by "
                    f"{declared.__qualname__}; declare it once, in a settings class both use"
                )
            fields.setdefault(key, (info.annotation, info))
    section: type[Section] = create_model(name, __base__=generic, __module__=__name__, **fields)
    return section


def _declaring(model: type[Section], key: str) -> type:
    """The class in ``model``'s hierarchy that declares the field ``key``."""
    return next(c for c in model.__mro__ if key in inspect.get_annotations(c))


#: ``[sampler]``: the generic keys and every algorithm's own (``ALGORITHMS``).
SamplerSection = assembled("SamplerSection", GenericSampler, ALGORITHMS.values())
#: ``[run]``: the generic keys and every transport's own (``TRANSPORTS``).
RunSection = assembled("RunSection", GenericRun, TRANSPORTS.values())
#: "section.key" → the registry entry's settings class that declares the key's default
#: (``Scenario.origin`` names it); generic keys are not listed.
DECLARED: dict[str, type] = {
    f"{section}.{key}": _declaring(entry.options, key)
    for section, generic, entries in (
        ("sampler", GenericSampler, ALGORITHMS.values()),
        ("run", GenericRun, TRANSPORTS.values()),
    )
    for entry in entries
    for key in entry.options.model_fields
    if key not in generic.model_fields
}


_SECTIONS: dict[str, Any] = {
    name: (section, section())
    for name, section in (
        ("model", ModelTable),
        ("data", DataSection),
        ("privacy", PrivacySection),
        ("sampler", SamplerSection),
        ("run", RunSection),
        ("network", NetworkSection),
    )
}
#: A scenario file: its sections, each with every key.
ScenarioFile: type[Section] = create_model(
    "ScenarioFile", __base__=Section, __module__=__name__, **_SECTIONS
)


SECTIONS = tuple(ScenarioFile.model_fields)


@dataclass(frozen=True)
class Scenario:
    """A fully resolved scenario: every section with every key."""

    sections: dict[str, dict[str, Any]]
    #: "section.key" → where its value came from (``load_scenario``); a key not named here has
    #: its generic default
    origins: dict[str, str] = field(default_factory=dict, compare=False)

    def __getitem__(self, section: str) -> dict[str, Any]:
        return self.sections[section]

    def origin(self, key: str) -> str:
        """Where the value of ``key`` ("section.key") came from, in words."""
        if key in self.origins:
            return self.origins[key]
        declared = DECLARED.get(key)
        if declared is None:
            return GENERIC
        path = declared.__module__.replace(".", "/")
        return f"the default in {path}.py ({declared.__qualname__})"

    def to_toml(self) -> str:
        """The resolved scenario as TOML (keys whose value is unset are written as comments)."""
        clean = {
            s: {k: v for k, v in keys.items() if v is not None} for s, keys in self.sections.items()
        }
        unset = [
            f"# {s}.{k} is unset (default applies)"
            for s, keys in self.sections.items()
            for k, v in keys.items()
            if v is None
        ]
        return ("\n".join(unset) + "\n\n" if unset else "") + tomli_w.dumps(clean)


#: Where a key's value came from when no layer set it (``Scenario.origin``).
GENERIC = "the generic default in fedpenalty/config.py"
FROM_FILE = "from your file"
FROM_SET = "from --set"


def model_defaults() -> dict[str, dict[str, Any]]:
    """``model_defaults.toml`` parsed: per model name, its own [model], [data] and [sampler]
    keys, and per algorithm name a table of that (model, sampler)'s [data], [privacy] and
    [sampler] keys."""
    text = resources.files("fedpenalty").joinpath("model_defaults.toml").read_text()
    return tomllib.loads(text)


def default_layers(model: str, algorithm: str) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The default layers of a scenario for ``model`` run by ``algorithm``, lowest first, each
    as (origin, sections): the model's table, then the (model, algorithm) table. Both come
    from ``model_defaults.toml``; an unknown name has none (validation names it)."""
    entry = model_defaults().get(model, {})
    own = {s: keys for s, keys in entry.items() if s in SECTIONS}
    paired = entry.get(algorithm, {}) if algorithm in ALGORITHMS else {}
    return [
        (f"the {model} model's default", own),
        (f"the default of {algorithm} on {model}", paired),
    ]


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` → (section, key, value); the value is read as TOML if it parses."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    lhs, raw = text.split("=", 1)
    section, key = lhs.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def parse_overrides(overrides: Sequence[str] | Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(section, key, value) of each override: ``--set`` strings (``parse_override``), or a
    mapping ``{"section.key": value}`` whose values are taken as they are."""
    if isinstance(overrides, str):
        overrides = [overrides]
    if not isinstance(overrides, Mapping):
        return [parse_override(item) for item in overrides]
    parsed = []
    for name, value in overrides.items():
        section, dot, key = str(name).partition(".")
        if not dot or not section or not key:
            raise ConfigError(f"overrides: {name!r} is not 'section.key' (e.g. 'sampler.step')")
        parsed.append((section, key, value))
    return parsed


def load_scenario(
    path: str | Path | Mapping[str, Any] | None = None,
    overrides: Sequence[str] | Mapping[str, Any] = (),
) -> Scenario:
    """Read a scenario file (or take a mapping of its sections, or none: the embedded default),
    apply overrides (``parse_overrides``), fill in the defaults, validate, resolve.

    Every key takes its value from the highest of these layers that sets it (docs/design.md
    §4): the generic defaults of the section models above, the model's table of
    ``model_defaults.toml``, its (model, sampler) table, the file, then ``--set``; the resolved
    scenario records where each value came from (``Scenario.origin``). ``--set
    model.name=NAME`` switches the model: a [model] table's other keys belong to the model it
    names, so they are dropped (NAME's defaults apply, then any ``model.*`` given)."""
    parsed = parse_overrides(overrides)
    names = [v for section, key, v in parsed if (section, key) == ("model", "name")]
    chosen = names[-1] if names and isinstance(names[-1], str) else None
    if path is None:
        raw: dict[str, Any] = {}
    else:
        raw = copy.deepcopy(dict(path)) if isinstance(path, Mapping) else _read_scenario(path)
    model = raw.get("model")
    if chosen is not None and isinstance(model, dict) and model.get("name") != chosen:
        raw["model"] = {"name": chosen}
    origins = {
        f"{section}.{key}": FROM_FILE
        for section, keys in raw.items()
        if isinstance(keys, dict)
        for key in keys
    }
    for section, key, value in parsed:
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(f"[{section}] must be a table")
        raw[section][key] = value
        origins[f"{section}.{key}"] = FROM_SET
    if isinstance(path, (str, Path)):  # a model module next to the scenario file imports
        with search_folders(Path(path).parent):
            return _resolve_layers(raw, origins)
    return _resolve_layers(raw, origins)


def _chosen(raw: dict[str, Any], section: str, key: str) -> str:
    """The name ``raw`` gives at ``section.key``, else the generic default's."""
    table = raw.get(section)
    value = table.get(key) if isinstance(table, dict) else None
    default = ScenarioFile.model_fields[section].default.model_dump()[key]
    return value if isinstance(value, str) else default


def _resolve_layers(raw: dict[str, Any], origins: dict[str, str]) -> Scenario:
    """``raw`` (the user's keys, from ``origins``) over the default layers of its model and
    algorithm, resolved."""
    model, algorithm = _chosen(raw, "model", "name"), _chosen(raw, "sampler", "algorithm")
    sampler = raw.get("sampler")
    if not (isinstance(sampler, dict) and isinstance(sampler.get("algorithm"), str)):
        own = model_defaults().get(model, {}).get("sampler", {})  # the model's own choice
        algorithm = own.get("algorithm", algorithm)
    merged: dict[str, Any] = {}
    layered: dict[str, str] = {}
    for origin, sections in default_layers(model, algorithm):
        for section, keys in sections.items():
            merged.setdefault(section, {}).update(keys)
            layered.update({f"{section}.{key}": origin for key in keys})
    for section, keys in raw.items():
        if isinstance(keys, dict) and isinstance(merged.get(section), dict):
            merged[section].update(keys)
        else:
            merged[section] = keys
    return replace(resolve(merged), origins={**layered, **origins})


#: The sections whose keys belong to the registry entry a scenario selects, and that selection.
_SELECTED: dict[str, tuple[str, Mapping[str, Any]]] = {
    "sampler": ("algorithm", ALGORITHMS),
    "run": ("transport", TRANSPORTS),
}


def unread_keys(scenario: Scenario) -> list[str]:
    """One line per key the user set (scenario file or ``--set``) that only another algorithm
    or transport than the selected one reads (``sampler.leapfrog_steps`` under penalty,
    ``run.ray_address`` in process): accepted, as the ``[sampler]`` and ``[run]`` tables are
    flat, but it changes nothing — most likely a mistake worth a warning."""
    lines = []
    for key, origin in scenario.origins.items():
        section, _, name = key.partition(".")
        if origin not in (FROM_FILE, FROM_SET) or key not in DECLARED or section not in _SELECTED:
            continue
        selector, registry = _SELECTED[section]
        chosen = scenario[section][selector]
        if name in registry[chosen].options.model_fields:
            continue
        readers = sorted(n for n, e in registry.items() if name in e.options.model_fields)
        lines.append(
            f"{key} ({origin}) is read only by {section}.{selector} = {' or '.join(readers)}, "
            f"not by {chosen!r}: it changes nothing in this run"
        )
    return lines


def _read_scenario(path: str | Path) -> dict[str, Any]:
    """The parsed TOML of the scenario file ``path`` (a ``ConfigError`` when it cannot be)."""
    return read_toml(path, "scenario")


def resolve(raw: dict[str, Any]) -> Scenario:
    """Validate a parsed scenario and fill in every default."""
    sections = validate_file(ScenarioFile, raw).model_dump()
    hierarchical = build_hierarchical(sections["model"])
    if hierarchical is not None:
        sections["model"] = {"name": hierarchical.name, **hierarchical.params()}
        _check_hierarchical(sections, hierarchical)
        return Scenario(sections)
    model = build_model(sections["model"])
    sections["model"] = {"name": model.name, **model.params()}
    entry = ALGORITHMS[sections["sampler"]["algorithm"]]
    if isinstance(entry, ChainAlgorithm) and entry.hierarchical:
        raise ConfigError(
            f"sampler.algorithm = {entry.name!r} samples a hierarchical model (model.name = "
            f"{', '.join(repr(n) for n in HIERARCHICAL)}), not {model.name!r}: change "
            "sampler.algorithm or model.name"
        )
    _check_consistency(sections, model)
    ALGORITHMS[sections["sampler"]["algorithm"]].check(sections, model)
    return Scenario(sections)


def _check_hierarchical(s: dict[str, dict[str, Any]], model: HierarchicalModel) -> None:
    """A hierarchical model's scenario: ``penalty_hier`` on synthetic owners (data.true_theta
    the shared mean μ, inside its box) without secure aggregation (penalty_hier's check)."""
    algorithm = s["sampler"]["algorithm"]
    entry = ALGORITHMS[algorithm]
    if not isinstance(entry, ChainAlgorithm) or not entry.hierarchical:
        samplers = [n for n, a in ALGORITHMS.items() if getattr(a, "hierarchical", False)]
        raise ConfigError(
            f"model.name = {model.name!r} is hierarchical (a block of random effects per owner): "
            f"sampler.algorithm must be one of {samplers}, not {algorithm!r}"
        )
    data = s["data"]
    if data["source"] != "synthetic" or data["paths"]:
        raise ConfigError(f"model.name = {model.name!r} runs on data.source = 'synthetic' only")
    n = data["n_per_owner"]
    if isinstance(n, list) and len(n) != data["owners"]:
        raise ConfigError(f"data.n_per_owner lists {len(n)} values for {data['owners']} owners")
    sigma = s["privacy"]["sigma"]
    if isinstance(sigma, list) and len(sigma) != data["owners"]:
        raise ConfigError(f"privacy.sigma lists {len(sigma)} values for {data['owners']} owners")
    if s["sampler"]["init_scale"] > 1:
        raise ConfigError("sampler.init_scale must be at most 1 (chains start inside the box)")
    if s["sampler"]["superchains"]:
        raise ConfigError(
            f"sampler.superchains: the chains of model.name = {model.name!r} (hierarchical) "
            "start on their own; set sampler.superchains = 0"
        )
    true_theta = data["true_theta"]
    number = isinstance(true_theta, (int, float))
    z = [[*model.true_shared(true_theta), *[0.0] * model.block_dim]] if number else None
    if z is None or not model.in_theta_space(np.array(z), 1).all():
        raise ConfigError(
            f"data.true_theta must be one number, the shared mean μ inside the box of "
            f"model.name = {model.name!r} (its model.mu_bound), got {true_theta!r}"
        )
    entry.check(s, model)  # type: ignore[arg-type]  # a hierarchical entry's check takes it


def _check_consistency(s: dict[str, dict[str, Any]], model: Model) -> None:
    """Checks across keys that hold for every algorithm (each algorithm checks its own)."""
    data, privacy, sampler = s["data"], s["privacy"], s["sampler"]
    if data["paths"] and data["source"] != "files":
        data["source"] = "files"
    if data["source"] == "files" and not data["paths"]:
        raise ConfigError("data.source = 'files' needs data.paths (one CSV or NPZ per owner)")
    owners = len(data["paths"]) if data["source"] == "files" else data["owners"]
    data["owners"] = owners
    n = data["n_per_owner"]
    if data["source"] == "synthetic" and isinstance(n, list) and len(n) != owners:
        raise ConfigError(f"data.n_per_owner lists {len(n)} values for {owners} owners")
    if isinstance(privacy["sigma"], list) and len(privacy["sigma"]) != owners:
        raise ConfigError(f"privacy.sigma lists {len(privacy['sigma'])} values for {owners} owners")
    true_theta, dim, bound = data["true_theta"], model.dim, model.theta_bound
    if isinstance(true_theta, list) and len(true_theta) != dim:
        raise ConfigError(
            f"data.true_theta has {len(true_theta)} values; the model has dimension {dim}"
        )
    values = true_theta if isinstance(true_theta, list) else [true_theta]
    if any(abs(v) > bound for v in values):
        raise ConfigError(f"data.true_theta must lie inside Θ = [-{bound:g}, {bound:g}]^{dim}")
    if sampler["init_scale"] > 1:
        raise ConfigError("sampler.init_scale must be at most 1 (chains start inside Θ)")
    _check_superchains(sampler)
    _check_aggregation(privacy, owners, ALGORITHMS[sampler["algorithm"]])
    if privacy["aggregation"] == "secure":
        _check_secure_units(ALGORITHMS[sampler["algorithm"]], sampler)


def _check_superchains(sampler: dict[str, Any]) -> None:
    """sampler.superchains: 0, or at least 2 groups that divide sampler.chains."""
    groups, chains = sampler["superchains"], sampler["chains"]
    if groups and (groups < 2 or chains % groups):
        raise ConfigError(
            f"sampler.superchains = {groups} must be 0 or at least 2 and divide sampler.chains "
            f"= {chains}: change sampler.superchains"
        )


def _check_aggregation(privacy: dict[str, Any], owners: int, algorithm: Algorithm) -> None:
    """Secure aggregation needs s, t < K, and an algorithm whose owners answer queries."""
    if privacy["aggregation"] != "secure":
        if privacy["total_noise_sd"] is not None or privacy["colluders"]:
            raise ConfigError(
                "privacy.total_noise_sd and privacy.colluders apply with privacy.aggregation = "
                "'secure' only; set it, or remove them"
            )
        return
    if privacy["total_noise_sd"] is None:
        raise ConfigError(
            "privacy.aggregation = 'secure' needs privacy.total_noise_sd (s, the noise sd of the "
            "owners' sum)"
        )
    if privacy["colluders"] >= owners:
        raise ConfigError(
            f"privacy.colluders = {privacy['colluders']} must be below the number of owners "
            f"({owners})"
        )
    if not isinstance(algorithm, ChainAlgorithm) or not algorithm.deployable:
        raise ConfigError(
            f"privacy.aggregation = 'secure' applies to penalty, penalty_expfam, sgld, sghmc, "
            f"sgnht and dp_hmc, not {algorithm.name!r}"
        )


def _check_secure_units(algorithm: Algorithm, sampler: Mapping[str, Any]) -> None:
    """One s serves every kind of a secure session (docs/design.md §2.6, "The noise level of
    a clipped kind"): a noise multiplier of the clip for the kinds clipped per record, a noise
    sd for the others. A run asking kinds of both has no one s that means either: refused."""
    assert isinstance(algorithm, ChainAlgorithm)  # _check_aggregation: a deployable kernel
    kinds = [query_kind(kind) for kind in algorithm.asks(sampler)]
    if len({kind.clip_scaled for kind in kinds}) > 1:
        clipped = [k.name for k in kinds if k.clip_scaled]
        other = [k.name for k in kinds if not k.clip_scaled]
        raise ConfigError(
            f"privacy.total_noise_sd is one noise level for every kind of a secure session — a "
            f"multiplier of the clip for {', '.join(clipped)}, a noise sd for "
            f"{', '.join(other)} — and {algorithm.name!r} asks both: set privacy.aggregation = "
            "'none' (each kind then has its own level in [privacy.noise])"
        )
