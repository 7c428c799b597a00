"""Likelihood models: the registry of ``[model]`` names and ``build_model``; the capability
protocols code asks instead of naming model classes (``capabilities.py``); what a model author
needs is in ``fedpenalty.models.api`` (docs/design.md §6).

``MODELS`` is the table of built-in models; ``build_model`` also loads a user's model named
``"package.module:Class"`` or by a ``fedpenalty.models`` entry point (``registry.py``).
``build_model({"name": "bernoulli", "theta_bound": 5.0})`` validates the ``[model]`` table of a
scenario and returns the model; ``build_model({"name": m.name, **m.params()}) == m``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from ..errors import ConfigError
from .base import NEIGHBOURS, ExpFamModel, Model, Neighbour, Reference
from .bernoulli import Bernoulli
from .capabilities import BoundedLogLikelihood, ConjugateUpdate
from .compat import check_owner_models
from .gaussian_mean import GaussianMean
from .hierarchical import BoundHierarchy, HierarchicalModel
from .linear_regression import LinearRegression
from .logistic import Logistic
from .poisson import Poisson
from .poisson_regression import PoissonRegression
from .random_intercept import RandomIntercept
from .registry import entry_point_names, known_names, model_class, model_digest, search_folders

MODELS: dict[str, type[Model]] = {
    cls.name: cls
    for cls in (GaussianMean, Bernoulli, Poisson, Logistic, LinearRegression, PoissonRegression)
}

#: The built-in hierarchical models (docs/design.md §6, "Hierarchical models"): a block of
#: random effects per owner, sampled by ``penalty_hier`` only.
HIERARCHICAL: dict[str, type[HierarchicalModel]] = {RandomIntercept.name: RandomIntercept}


def build_hierarchical(section: Mapping[str, Any]) -> HierarchicalModel | None:
    """The hierarchical model a ``[model]`` table names (its keys validated as
    ``build_model``'s), or None when ``model.name`` names no hierarchical model."""
    name = section.get("name") if isinstance(section, Mapping) else None
    if not isinstance(name, str) or name not in HIERARCHICAL:
        return None
    return HIERARCHICAL[name](**{k: v for k, v in section.items() if k != "name"})


def build_model(section: Mapping[str, Any]) -> Model:
    """The model described by a ``[model]`` table: ``name`` required (a built-in name, a
    ``fedpenalty.models`` entry point or ``"package.module:Class"``: ``registry.model_class``),
    every other key optional (the model's ``defaults()``). ``ConfigError`` for an unknown name
    or key, or a bad value."""
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"[model] must be a table with a 'name' key, got {type(section).__name__}"
        )
    if "name" not in section:
        raise ConfigError(f"[model] needs a 'name' key; known models: {known_names(MODELS)}")
    name = section["name"]
    if name in HIERARCHICAL:
        raise ConfigError(
            f"[model] {name} is a hierarchical model: it runs with sampler.algorithm = "
            "'penalty_hier' in `fedpenalty simulate` only (docs/design.md §6)"
        )
    cls = model_class(name, MODELS)
    rest = {k: v for k, v in section.items() if k != "name"}
    for key in rest:
        if not isinstance(key, str):
            allowed = ", ".join(["name", *cls.defaults()])
            raise ConfigError(f"[model] {name}: unknown key {key!r}; allowed keys: {allowed}")
    return cls(**rest)


class ModelNames(Collection[str]):
    """The names ``[model] name`` accepts, for ``schema.entry_of``: the built-in ones, the
    installed entry points, and any ``"module:Class"`` (which ``build_model`` then imports and
    checks, with its own message)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (
            name in MODELS or name in HIERARCHICAL or ":" in name or name in entry_point_names()
        )

    def __iter__(self) -> Iterator[str]:
        return iter([*MODELS, *HIERARCHICAL, *entry_point_names(), "package.module:Class"])

    def __len__(self) -> int:
        return len(MODELS) + len(HIERARCHICAL) + len(entry_point_names()) + 1


MODEL_NAMES = ModelNames()


__all__ = [
    "HIERARCHICAL",
    "MODELS",
    "MODEL_NAMES",
    "NEIGHBOURS",
    "Bernoulli",
    "BoundHierarchy",
    "BoundedLogLikelihood",
    "ConjugateUpdate",
    "ExpFamModel",
    "GaussianMean",
    "HierarchicalModel",
    "LinearRegression",
    "Logistic",
    "Model",
    "Neighbour",
    "Poisson",
    "PoissonRegression",
    "RandomIntercept",
    "Reference",
    "build_hierarchical",
    "build_model",
    "check_owner_models",
    "model_digest",
    "search_folders",
]
