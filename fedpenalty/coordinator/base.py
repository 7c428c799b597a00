"""The shapes every algorithm shares: what a kernel returns, the fields a step reports, and the
two kinds of registry entry (docs/design.md §4, §6).

* A **chain algorithm** (``ChainAlgorithm``) builds a ``SamplingAlgorithm`` — a pure
  ``init``/``step`` pair over an immutable state, in the style of BlackJAX's kernels — from the
  model, where its data come from (``ChainData``) and the ``[sampler]`` keys it declares.
  Each step reports the fields the kernel declares (``InfoField``). The driver runs every
  chain algorithm through one loop.
* A **release algorithm** (``ReleaseAlgorithm``) is a one-shot baseline: the simulation computes
  its draws and its privacy in one call.

Each entry carries its own settings model (a ``Section`` of the ``[sampler]`` keys only it and
its kin read); ``config.py`` assembles the scenario's flat ``[sampler]`` section from the generic
keys and every entry's settings model. ``coordinator/algorithms.py`` maps every
``sampler.algorithm`` name to one of these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from ..errors import ConfigError
from ..kinds import KindTerms, query_kind
from ..models import BoundHierarchy, Model
from ..schema import Section

if TYPE_CHECKING:
    from .oracle import Oracle

#: The resolved scenario sections ([model], [data], [privacy], [sampler], [run]) by name.
Sections = Mapping[str, Mapping[str, Any]]


class ChainState(Protocol):
    """What the driver reads of any kernel's state: ``position``, the chains' current θ
    ``(C, d)`` (the draw it keeps)."""

    @property
    def position(self) -> np.ndarray: ...


@dataclass(frozen=True)
class InfoField:
    """One statistic a kernel reports for every step and chain (as BlackJAX's per-kernel
    ``Info``): ``name`` (posterior.nc's sample_stats variable), ``dtype``, ``description`` (with
    units), ``shape`` per chain (() for one number), ``fill`` (its value before a step wrote
    it) and ``kept`` (stored per kept draw; False: only the driver's run counters read it)."""

    name: str
    dtype: type
    description: str
    shape: tuple[int, ...] = ()
    fill: Any = 0
    kept: bool = True


#: The fields the driver also counts over the whole run (warmup included) when a kernel
#: declares them; ``queried`` every kernel declares.
QUERIED = InfoField("queried", np.bool_, "owners were asked (MH: the proposal lay inside Θ)")
ACCEPTED = InfoField("accepted", np.bool_, "the proposal was accepted (kernels with an MH test)")
NOISE_VARIANCE = InfoField(
    "noise_variance",
    np.float64,
    "noise variance s² of the owners' answers (log ratio: nats²; gradient: per coordinate); NaN "
    "where no owner was asked",
    fill=np.nan,
)
EXCESS = InfoField(
    "excess_noise_ratio",
    np.float64,
    "owner noise variance / design noise variance − 1 of an SG-MCMC step (0 when it fits)",
    kept=False,
)

#: What one step reports: each declared field's name → its values ``(C, *shape)``.
Info = Mapping[str, np.ndarray]
#: (state after the run, warmup, (C, draws)) -> per-draw statistics the kernel derives after
#: the run rather than records (name → ``(C, draws)``).
Derived = Callable[[Any, int, tuple[int, int]], dict[str, np.ndarray]]


class SamplingAlgorithm(NamedTuple):
    """A built kernel: ``init(rng, theta0 (C, d)) -> state`` (a ``ChainState``) and
    ``step(rng, state) -> (state, Info)``; ``info``: the fields its steps report (``QUERIED``
    among them; ``ACCEPTED`` when it has an accept step); ``warmup``: the step of warmup
    iterations when it differs (it adapts the kernel's settings; None: ``step``); ``derived``:
    per-draw statistics it computes from its final state (the kept draws' step size)."""

    init: Callable[[np.random.Generator, np.ndarray], ChainState]
    step: Callable[[np.random.Generator, Any], tuple[Any, Info]]
    info: tuple[InfoField, ...]
    warmup: Callable[[np.random.Generator, Any], tuple[Any, Info]] | None = None
    derived: Derived | None = None


@dataclass(frozen=True)
class ChainData:
    """Where a kernel's data come from: the owners behind ``oracle`` (with ``n_total``, their
    public total record count), or a trusted curator's pooled ``records`` ``(n, p)``."""

    oracle: Oracle | None = None
    records: np.ndarray | None = None
    n_total: int | None = None

    def require_oracle(self, algorithm: str) -> Oracle:
        if self.oracle is None:
            raise ValueError(f"{algorithm} asks the owners: it needs an oracle")
        return self.oracle

    def require_records(self, algorithm: str) -> np.ndarray:
        if self.records is None:
            raise ValueError(f"{algorithm} needs the pooled records (trusted curator)")
        return self.records


class NoSettings(Section):
    """The settings model of an entry with no ``[sampler]`` keys of its own."""


#: The generic ``[sampler]`` keys a chain kernel's ``build`` takes by default (besides its
#: settings model's): the step, whose meaning each kernel states.
KERNEL_KEYS = ("step",)


def no_check(sections: Sections, model: Model) -> None:
    """The check of an algorithm whose settings need nothing beyond their own ranges."""


def planned_steps(sampler: Mapping[str, Any]) -> int:
    """Warmup plus kept iterations per chain."""
    return int(sampler["warmup"]) + int(sampler["iterations"])


@dataclass(frozen=True)
class Start:
    """A data-dependent start (hybrid): initial points ``theta`` ``(chains, d)``, the owners'
    noise ``sigma`` to use instead of ``privacy.sigma``, and ``privacy(summary)`` which folds
    what the start spent into the run's privacy.json content."""

    theta: np.ndarray
    sigma: float
    privacy: Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class ChainAlgorithm:
    """A registry entry that runs as Markov chains through the driver.

    ``build(model, data, **settings)`` returns the ``SamplingAlgorithm``; ``options`` is its
    settings model (the ``[sampler]`` keys of its own, with their defaults, validation and
    descriptions) and ``generic`` the generic ``[sampler]`` keys it also takes; ``settings``
    names them all. ``query`` is the owners' session kind it asks for (None: it
    asks no owner — a trusted curator's baseline, simulation only). ``state`` is its state
    class (checkpoints). ``plan(sampler)`` is the most answers one owner gives per chain.
    ``check(sections, model)`` raises ``ConfigError`` for a scenario it cannot run.
    ``start(rng, model, records, sections)``, when set, computes a data-dependent ``Start`` from
    the pooled records (a trusted curator, so the algorithm runs in simulation only).
    ``max_step(sampler)``, when set, is the largest ‖θ′ − θ‖ the session will ask about: it is
    declared when the session opens, and owners check the plan and every request against it.
    ``kinds(sampler)``, when set, names every kind a run asks for with its answers per chain
    (``asks``; docs/design.md §4, "Algorithms of several kinds"); unset: ``query`` alone.
    ``once`` names the kinds (v2 or ledger names) a run asks once in all, not per chain (a
    one-shot release, chain 0's): their ``asks`` count is the run's, not multiplied by the
    chains in the plan (``planned``) or in a budget-calibrated level.
    ``clips(sampler)``, when set, gives the per-record clip each clipping kind (``clipped_*``)
    of the run is asked at: the run then samples the clipped-likelihood posterior
    (``target``); ``clip_units(sampler)``, when set, names the unit of a clip that is not
    absolute (e.g. per unit of ‖θ′ − θ‖). ``temperature(sampler)``, when set, is the
    likelihood's exponent τ of a tempered target p(θ)Πp(x|θ)^τ: the run's reference is then
    the tempered posterior
    (``simulation.pooled_reference``). ``hierarchical``: it samples a hierarchical model
    (``BoundHierarchy``; every other algorithm a flat ``Model``), in simulation only.
    """

    name: str
    summary: str
    build: Callable[..., SamplingAlgorithm]
    options: type[Section]
    state: type
    query: str | None
    plan: Callable[[Mapping[str, Any]], int] = planned_steps
    check: Callable[[Sections, Model], None] = no_check
    start: Callable[[np.random.Generator, Model, np.ndarray, Sections], Start] | None = None
    max_step: Callable[[Mapping[str, Any]], float] | None = None
    generic: tuple[str, ...] = KERNEL_KEYS
    kinds: Callable[[Mapping[str, Any]], dict[str, int]] | None = None
    clips: Callable[[Mapping[str, Any]], dict[str, float]] | None = None
    clip_units: Callable[[Mapping[str, Any]], dict[str, str]] | None = None
    hierarchical: bool = False
    temperature: Callable[[Mapping[str, Any]], float] | None = None
    once: tuple[str, ...] = ()

    @property
    def settings(self) -> tuple[str, ...]:
        """The ``[sampler]`` keys ``build`` takes: ``generic``, then ``options``'s fields."""
        return (*self.generic, *self.options.model_fields)

    @property
    def adapts(self) -> bool:
        """Its step adapts during warmup (it takes ``sampler.adapt_step``)."""
        return "adapt_step" in self.settings

    @property
    def deployable(self) -> bool:
        """It can run against deployed owners: it asks them, needs no pooled records and
        samples a flat model."""
        return self.query is not None and self.start is None and not self.hierarchical

    def kernel(
        self, model: Model | BoundHierarchy, data: ChainData, sampler: Mapping[str, Any]
    ) -> SamplingAlgorithm:
        """The kernel with the settings it declares taken from a ``[sampler]`` section (a key
        of its settings model that the section lacks: the model's default); ``model`` is a
        ``BoundHierarchy`` for ``penalty_hier`` only."""
        own = self.options.model_fields
        settings = {
            key: sampler[key] if key in sampler or key not in own else own[key].default
            for key in self.settings
        }
        return self.build(model, data, **settings)

    def session_options(self, sampler: Mapping[str, Any]) -> dict[str, float]:
        """What the session declares when it opens: ``sampling_rate`` (when the algorithm takes
        one) and ``max_step`` (when it asks about steps)."""
        options = {}
        if "sampling_rate" in self.settings:
            options["sampling_rate"] = float(sampler["sampling_rate"])
        if self.max_step is not None:
            options["max_step"] = float(self.max_step(sampler))
        return options

    def planned_answers(self, sampler: Mapping[str, Any]) -> int:
        """Answers each owner is asked for at most in a run (all chains, every kind)."""
        return sum(self.planned(sampler).values())

    def asked_once(self, kind: str) -> bool:
        """``kind`` (v2 or ledger name) is asked once per run, not per chain (``once``)."""
        return query_kind(kind).name in {query_kind(k).name for k in self.once}

    def planned(self, sampler: Mapping[str, Any]) -> dict[str, int]:
        """Every kind ``asks`` names → the most answers each owner gives of it in a run: its
        answers per chain × ``sampler.chains``, or its count as it is for a kind asked once per
        run (``asked_once``; docs/design.md §4, "Algorithms of several kinds")."""
        chains = int(sampler["chains"])
        return {
            name: count if self.asked_once(name) else chains * count
            for name, count in self.asks(sampler).items()
        }

    def asks(self, sampler: Mapping[str, Any]) -> dict[str, int]:
        """Every query kind (v2 or ledger name) a run with ``sampler`` asks the owners for →
        the most answers per chain of it; the first is the primary kind (``primary``).
        Default: ``{query: plan(sampler)}``."""
        if self.kinds is not None:
            return self.kinds(sampler)
        if self.query is None:
            return {}
        return {self.query: self.plan(sampler)}

    def primary(self, sampler: Mapping[str, Any]) -> str | None:
        """The kind whose words head a run's reports: the first that ``asks`` names."""
        return next(iter(self.asks(sampler)), self.query)

    def target(self, sampler: Mapping[str, Any]) -> str | None:
        """What a run samples when some kind clips each record's term (docs/design.md §2.8):
        "clipped-likelihood posterior (per-record clip c ...)"; None: the posterior itself."""
        clips = {} if self.clips is None else self.clips(sampler)
        if not clips:
            return None
        units = {} if self.clip_units is None else self.clip_units(sampler)
        each = ", ".join(
            f"{c:g}{units.get(kind, '')} on {query_kind(kind).name}" for kind, c in clips.items()
        )
        return f"clipped-likelihood posterior (per-record clip {each})"

    def kind_terms(self, sampler: Mapping[str, Any]) -> list[KindTerms]:
        """The session's terms, one ``KindTerms`` per kind ``asks`` names: its planned answers
        (``planned``: all chains, or once per run), the sampling rate for the kind that takes one
        and ``max_step`` for the kinds whose sensitivity grows with the step
        (``session_options``)."""
        options = self.session_options(sampler)
        terms = []
        for name, planned in self.planned(sampler).items():
            kind = query_kind(name)
            rate = options.get("sampling_rate") if kind.takes_rate else None
            step = options.get("max_step") if kind.step_scaled else None
            terms.append(KindTerms(name, planned, rate, step))
        return terms


@dataclass(frozen=True)
class Release:
    """The draws of a release algorithm, ``theta`` ``(chains, iterations, d)``, and its
    privacy.json fields: ``epsilon`` and ``delta`` per owner, ``accounting`` (how), ``release``
    (where it was computed), ``per_owner`` (extra per-owner keys) and ``extra`` (top level)."""

    theta: np.ndarray
    epsilon: float
    delta: float
    accounting: str
    release: str
    trusted_curator: bool
    per_owner: dict[str, Any]
    extra: dict[str, Any]


@dataclass(frozen=True)
class ReleaseAlgorithm:
    """A one-shot baseline: ``release(rng, model, records, sections)`` computes its draws and
    privacy from every owner's records (a list of ``(n_k, p)`` arrays) in the simulation;
    ``options``: its settings model (the ``[sampler]`` keys of its own)."""

    name: str
    summary: str
    release: Callable[[np.random.Generator, Model, list[np.ndarray], Sections], Release]
    check: Callable[[Sections, Model], None] = no_check
    options: type[Section] = NoSettings
    query: None = None
    deployable = False


def require(condition: bool, message: str) -> None:
    """``ConfigError(message)`` unless ``condition``: the scenario checks of algorithms."""
    if not condition:
        raise ConfigError(message)
