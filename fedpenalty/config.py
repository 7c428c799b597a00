"""Scenario files: parsing, defaults, validation and the resolved form written to a run.

A scenario is a TOML file with sections ``[model]``, ``[data]``, ``[privacy]``, ``[sampler]``
and ``[run]``. Every key has a default (``SCHEMA``); an unknown section or key is an error
that names it; a bad value is an error that says what is allowed. ``--set section.key=value``
overrides are parsed as TOML values (falling back to a bare string).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import tomli_w

from .coordinator.driver import KERNELS
from .errors import ConfigError
from .models import MODELS, ExpFamModel, build_model
from .models.base import NEIGHBOURS

#: The papers' one-shot and hybrid baselines, run by the simulation beside the kernels.
BASELINES = ("ops", "noisy_stats", "hybrid")
#: Every value of ``sampler.algorithm``.
ALGORITHMS = (*KERNELS, *BASELINES)
#: Models whose posterior given sufficient statistics is closed form (``noisy_stats``).
CONJUGATE_MODELS = ("gaussian_mean", "bernoulli", "poisson")

Check = Callable[[str, Any], Any]


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    return v


def _non_negative_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {v!r}")
    return v


def _positive(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{name} must be a positive finite number, got {v!r}")
    return float(v)


def _probability(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ConfigError(f"{name} must be a number strictly between 0 and 1, got {v!r}")
    return float(v)


def _rate(name: str, v: Any) -> float:
    """A Poisson sampling rate q ∈ (0, 1]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ConfigError(f"{name} must be a number in (0, 1], got {v!r}")
    return float(v)


def _one_of(*allowed: str) -> Check:
    def check(name: str, v: Any) -> str:
        if v not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {v!r}")
        return v

    return check


def _optional(check: Check) -> Check:
    return lambda name, v: None if v is None else check(name, v)


def _scalar_or_list(check: Check) -> Check:
    def both(name: str, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ConfigError(f"{name} must not be an empty list")
            return [check(f"{name}[{i}]", x) for i, x in enumerate(v)]
        return check(name, v)

    return both


def _numbers(name: str, v: Any) -> float | list[float]:
    values = v if isinstance(v, list) else [v]
    for x in values:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ConfigError(f"{name} must be a finite number or a list of finite numbers, got {v!r}")
    return [float(x) for x in v] if isinstance(v, list) else float(v)


def _paths(name: str, v: Any) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(p, str) and p for p in v):
        raise ConfigError(f"{name} must be a list of file paths (CSV or NPZ, one per owner), got {v!r}")
    return v


def _string(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{name} must be a non-empty string, got {v!r}")
    return v


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{name} must be true or false, got {v!r}")
    return v


# section -> key -> (default, check, documentation)
SCHEMA: dict[str, dict[str, tuple[Any, Check, str]]] = {
    "data": {
        "source": ("synthetic", _one_of("synthetic", "files"), "'synthetic' (simulated records) or 'files' (paths)"),
        "owners": (4, _positive_int, "number of owners for synthetic data (files: one owner per path)"),
        "n_per_owner": (1000, _scalar_or_list(_positive_int), "records per owner: one number or one per owner"),
        "true_theta": (0.5, _numbers, "parameter that generates synthetic data: a number or one per dimension"),
        "paths": ([], _paths, "one CSV or NPZ file per owner (source = 'files')"),
    },
    "privacy": {
        "delta": (1e-5, _probability, "δ at which ε is reported and budgets are enforced"),
        "sigma": (1.0, _scalar_or_list(_positive), "owner noise sd (sgld, sghmc, sgnht: noise multiplier, sd σ·clip): "
                                                   "one number or one per owner"),
        "budget_epsilon": (10.0, _positive, "each owner refuses answers past this ε at δ"),
        "max_step": (None, _optional(_positive), "largest ‖θ'−θ‖ owners answer for (default: sampler.step)"),
        "neighbour": ("replace_one", _one_of(*NEIGHBOURS), "neighbouring relation of the DP guarantee"),
        "epsilon": (1.0, _positive, "ops, noisy_stats, hybrid: each owner's target ε (at δ for noisy_stats with "
                                    "mechanism 'gaussian' and for hybrid; δ = 0 otherwise)"),
        "mechanism": ("laplace", _one_of("laplace", "gaussian"),
                      "noisy_stats: noise of the one release (Laplace of L1 sensitivity, or exactly calibrated Gaussian)"),
        "ops_form": ("wang", _one_of("wang", "foulds"),
                     "ops, hybrid: OPS temperature min{1, ε/(4B)} (wang; ε/(2B) for add_remove) or min{1, ε/(2C)} "
                     "(foulds; replace_one only)"),
    },
    "sampler": {
        "algorithm": ("penalty", _one_of(*ALGORITHMS), "which sampler or baseline to run"),
        "iterations": (1000, _positive_int, "kept iterations per chain"),
        "warmup": (500, _non_negative_int, "discarded iterations per chain (still charged)"),
        "chains": (4, _positive_int, "number of chains"),
        "step": (0.05, _positive, "penalty, penalty_expfam, exact_mh: radius of the uniform-in-ball proposal; "
                                  "sgld, sghmc, sgnht, hybrid: the step η (units of θ²), or a in η_t = a (b + t)^−γ"),
        "block": (1, _positive_int, "penalty_expfam: noisy statistic copies released per reply"),
        "step_schedule": ("constant", _one_of("constant", "polynomial"),
                          "sgld, sghmc, sgnht, hybrid: η_t = step, or η_t = step · (b + t)^−γ"),
        "step_decay_b": (1.0, _positive, "polynomial schedule: b"),
        "step_decay_gamma": (0.55, _positive, "polynomial schedule: γ"),
        "sampling_rate": (0.01, _rate, "sgld, sghmc, sgnht, hybrid: each owner's Poisson sampling rate q per answer"),
        "clip": (1.0, _positive, "sgld, sghmc, sgnht, hybrid: per-record gradient clip C (L2 norm); noise sd σ·C"),
        "ops_mh_steps": (2000, _positive_int, "ops, hybrid on models without a closed-form tempered posterior: "
                                              "exact-MH steps per released draw (after tuning)"),
        "friction": (1.0, _positive, "sghmc: friction C; sgnht: diffusion A (per unit of h = √η; "
                                     "needs h·friction ≤ 1 for sghmc, < ½ for sgnht)"),
        "init_scale": (0.25, _positive, "chains start uniform in init_scale × Θ (data independent)"),
    },
    "run": {
        "transport": ("grpc", _one_of("grpc", "inprocess"),
                      "simulate: 'grpc' (owners as local processes on loopback gRPC) or 'inprocess' (fastest)"),
        "owner_hosts": (0, _non_negative_int, "grpc simulate: owner host processes (0: one per CPU core but the coordinator's)"),
        "checkpoint_every": (500, _non_negative_int, "iterations between checkpoints of the chain (0: never)"),
        "retry_seconds": (20.0, _positive, "grpc: how long an unreachable owner is retried before the run stops"),
        "seed": (0, _non_negative_int, "seed of data simulation, owner noise and chains"),
        "out": (None, _optional(_string), "run directory (default: runs/<algorithm>-<time>)"),
        "progress": (True, _bool, "show a progress bar"),
    },
}
SECTIONS = ("model", *SCHEMA)


@dataclass(frozen=True)
class Scenario:
    """A fully resolved scenario: every section with every key."""

    sections: dict[str, dict[str, Any]]

    def __getitem__(self, section: str) -> dict[str, Any]:
        return self.sections[section]

    def to_toml(self) -> str:
        """The resolved scenario as TOML (keys whose value is unset are written as comments)."""
        clean = {s: {k: v for k, v in keys.items() if v is not None} for s, keys in self.sections.items()}
        unset = [f"# {s}.{k} is unset (default applies)" for s, keys in self.sections.items()
                 for k, v in keys.items() if v is None]
        return ("\n".join(unset) + "\n\n" if unset else "") + tomli_w.dumps(clean)


def default_scenario_text() -> str:
    """The scenario ``fedpenalty simulate`` runs when given none."""
    return resources.files("fedpenalty").joinpath("default_scenario.toml").read_text()


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


def load_scenario(path: str | Path | None = None, overrides: list[str] = ()) -> Scenario:
    """Read a scenario file (or the embedded default), apply overrides, validate, resolve."""
    if path is None:
        text, origin = default_scenario_text(), "the embedded default scenario"
    else:
        try:
            text, origin = Path(path).read_text(), str(path)
        except OSError as exc:
            raise ConfigError(f"cannot read scenario {path}: {exc.strerror}") from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin} is not valid TOML: {exc}") from exc
    for item in overrides:
        section, key, value = parse_override(item)
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(f"[{section}] must be a table")
        raw[section][key] = value
    return resolve(raw)


def resolve(raw: dict[str, Any]) -> Scenario:
    """Validate a parsed scenario and fill in every default."""
    for section, body in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown section [{section}]; allowed sections: {', '.join(SECTIONS)}")
        if not isinstance(body, dict):
            raise ConfigError(f"[{section}] must be a table of keys")
    model_raw = dict(raw.get("model", {}))
    model_raw.setdefault("name", "gaussian_mean")
    if model_raw["name"] not in MODELS:
        raise ConfigError(f"model.name must be one of {', '.join(MODELS)}, got {model_raw['name']!r}")
    model = build_model(model_raw)
    sections: dict[str, dict[str, Any]] = {"model": {"name": model.name, **model.params()}}
    for section, keys in SCHEMA.items():
        given = raw.get(section, {})
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise ConfigError(f"unknown key {section}.{unknown[0]}; allowed keys in [{section}]: {', '.join(keys)}")
        sections[section] = {k: check(f"{section}.{k}", given[k]) if k in given else default
                             for k, (default, check, _) in keys.items()}
    _check_consistency(sections, model.dim, model.theta_bound)
    return Scenario(sections)


def _check_consistency(s: dict[str, dict[str, Any]], dim: int, theta_bound: float) -> None:
    data, privacy, sampler = s["data"], s["privacy"], s["sampler"]
    if data["paths"] and data["source"] != "files":
        data["source"] = "files"
    if data["source"] == "files" and not data["paths"]:
        raise ConfigError("data.source = 'files' needs data.paths (one CSV or NPZ per owner)")
    owners = len(data["paths"]) if data["source"] == "files" else data["owners"]
    data["owners"] = owners
    for key in ("n_per_owner",) if data["source"] == "synthetic" else ():
        if isinstance(data[key], list) and len(data[key]) != owners:
            raise ConfigError(f"data.{key} lists {len(data[key])} values for {owners} owners")
    if isinstance(privacy["sigma"], list) and len(privacy["sigma"]) != owners:
        raise ConfigError(f"privacy.sigma lists {len(privacy['sigma'])} values for {owners} owners")
    true_theta = data["true_theta"]
    if isinstance(true_theta, list) and len(true_theta) != dim:
        raise ConfigError(f"data.true_theta has {len(true_theta)} values; the model has dimension {dim}")
    values = true_theta if isinstance(true_theta, list) else [true_theta]
    if any(abs(v) > theta_bound for v in values):
        raise ConfigError(f"data.true_theta must lie inside Θ = [-{theta_bound:g}, {theta_bound:g}]^{dim}")
    algorithm = sampler["algorithm"]
    mh_like = algorithm in ("penalty", "penalty_expfam", "exact_mh")
    if mh_like and privacy["max_step"] is not None and sampler["step"] > privacy["max_step"]:
        raise ConfigError(f"sampler.step = {sampler['step']:g} exceeds privacy.max_step = {privacy['max_step']:g}; "
                          "owners would refuse every query")
    if algorithm == "penalty_expfam" and not isinstance(build_model(s["model"]), ExpFamModel):
        raise ConfigError(f"sampler.algorithm = 'penalty_expfam' needs an exponential-family model; "
                          f"{s['model']['name']!r} is not one")
    if algorithm == "noisy_stats" and s["model"]["name"] not in CONJUGATE_MODELS:
        raise ConfigError(f"sampler.algorithm = 'noisy_stats' needs a model with a conjugate posterior "
                          f"({', '.join(CONJUGATE_MODELS)}); {s['model']['name']!r} has none")
    if algorithm in ("ops", "hybrid") and privacy["ops_form"] == "foulds" and privacy["neighbour"] != "replace_one":
        raise ConfigError("privacy.ops_form = 'foulds' (the 2C form) is for replace_one neighbours; "
                          "use ops_form = 'wang' with add_remove")
    if algorithm in ("sghmc", "sgnht"):
        first_step = sampler["step"] * (sampler["step_decay_b"] ** -sampler["step_decay_gamma"]
                                        if sampler["step_schedule"] == "polynomial" else 1.0)
        per_step = math.sqrt(first_step) * sampler["friction"]
        limit_ok, rule = (per_step <= 1.0, "at most 1") if algorithm == "sghmc" else (per_step < 0.5, "below 0.5")
        if not limit_ok:
            raise ConfigError(f"sampler.friction × √(first step) = {per_step:.4g} must be {rule} for {algorithm} "
                              "(h·friction is the friction per step); reduce sampler.step or sampler.friction")
    if sampler["init_scale"] > 1:
        raise ConfigError("sampler.init_scale must be at most 1 (chains start inside Θ)")

