"""Likelihood models: the registry of ``[model]`` names and ``build_model``; the capability
protocols code asks instead of naming model classes (``capabilities.py``); what a model author
needs is in ``fedpenalty.models.api`` (docs/design.md §6).

``build_model({"name": "bernoulli", "theta_bound": 5.0})`` validates the ``[model]`` table of a
scenario and returns the model; ``build_model({"name": m.name, **m.params()}) == m``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .base import NEIGHBOURS, ExpFamModel, Model, Neighbour, Reference
from .bernoulli import Bernoulli
from .capabilities import BoundedLogLikelihood, ConjugateUpdate
from .compat import check_owner_models
from .gaussian_mean import GaussianMean
from .linear_regression import LinearRegression
from .logistic import Logistic
from .poisson import Poisson
from .poisson_regression import PoissonRegression

MODELS: dict[str, type[Model]] = {
    cls.name: cls
    for cls in (GaussianMean, Bernoulli, Poisson, Logistic, LinearRegression, PoissonRegression)
}


def build_model(section: Mapping[str, Any]) -> Model:
    """The model described by a ``[model]`` table: ``name`` required, every other key optional
    (the model's ``defaults()``). ``ConfigError`` for an unknown name or key, or a bad value."""
    known = ", ".join(sorted(MODELS))
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"[model] must be a table with a 'name' key, got {type(section).__name__}"
        )
    if "name" not in section:
        raise ConfigError(f"[model] needs a 'name' key; known models: {known}")
    name = section["name"]
    if not isinstance(name, str) or name not in MODELS:
        raise ConfigError(f"[model] unknown model name {name!r}; known models: {known}")
    cls = MODELS[name]
    rest = {k: v for k, v in section.items() if k != "name"}
    for key in rest:
        if not isinstance(key, str):
            allowed = ", ".join(["name", *cls.defaults()])
            raise ConfigError(f"[model] {name}: unknown key {key!r}; allowed keys: {allowed}")
    return cls(**rest)


__all__ = [
    "MODELS",
    "NEIGHBOURS",
    "Bernoulli",
    "BoundedLogLikelihood",
    "ConjugateUpdate",
    "ExpFamModel",
    "GaussianMean",
    "LinearRegression",
    "Logistic",
    "Model",
    "Neighbour",
    "Poisson",
    "PoissonRegression",
    "Reference",
    "build_model",
    "check_owner_models",
]
