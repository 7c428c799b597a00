"""The query kinds an owner answers, as objects in one registry (docs/design.md §6): a new kind
is one module and one line here. Look a kind up with ``query_kind``, by its protocol-v2 name
or its ledger name; an unknown name is an error, never a fallback to another kind.
"""

from __future__ import annotations

from ..errors import InvalidRequest
from .base import Event, KindTerms, QueryKind
from .clipped_gradient import ClippedGradient
from .clipped_log_ratio import ClippedLogRatio
from .grad_fisher import GradFisher
from .gradient import Gradient
from .laplace_stats import LaplaceStats
from .log_ratio import GaussianKind, LogRatio
from .sampled_log_ratio import SampledLogRatio
from .suff_stats import SuffStats

__all__ = [
    "KINDS",
    "Event",
    "GaussianKind",
    "KindTerms",
    "QueryKind",
    "kind_names",
    "query_kind",
]

#: Protocol-v2 name → kind, one line per kind.
KINDS: dict[str, QueryKind] = {
    "log_ratio": LogRatio(),
    "suff_stats": SuffStats(),
    "gradient": Gradient(),
    "clipped_log_ratio": ClippedLogRatio(),
    "clipped_gradient": ClippedGradient(),
    "grad_fisher": GradFisher(),
    "sampled_log_ratio": SampledLogRatio(),
    "laplace_stats": LaplaceStats(),
}


def kind_names() -> str:
    """Every kind's names, for messages: "log_ratio (penalty), suff_stats (...), ..."."""
    return ", ".join(f"{k.name} ({k.ledger_name})" for k in KINDS.values())


def query_kind(name: object, owner: str | None = None) -> QueryKind:
    """The kind called ``name`` (its v2 name or its ledger name; a kind itself is itself);
    ``InvalidRequest`` naming the known kinds (and ``owner``, when given) for anything else."""
    if isinstance(name, QueryKind):  # an in-process caller hands the kind it looked up
        return name
    kind = None
    if isinstance(name, str):  # by ledger name: the names stored on disk and spoken by v1 clients
        kind = KINDS.get(name) or next((k for k in KINDS.values() if k.ledger_name == name), None)
    if kind is None:
        raise InvalidRequest(
            f"unknown algorithm (query kind) {name!r}; this owner answers {kind_names()}", owner
        )
    return kind
