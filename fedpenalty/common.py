"""Types every layer shares: query kinds, an owner's policy, its public description and its
privacy reports. This module imports only leaves (errors, models, privacy) and the shared field
types (schema), so owners, transports, kernels, config and the CLI may all import it
(docs/design.md §4).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConfigError
from .kinds import KINDS, QueryKind
from .privacy import GaussianSpend
from .privacy.owner_epsilon import Row, owner_epsilon
from .schema import (
    Neighbour,
    NonNegativeInt,
    PeerTrust,
    PositiveFloat,
    PositiveInt,
    Probability,
    Rate,
    check_fields,
)

#: The ledger names of the query kinds (``kinds.KINDS``), kept for modules that still name a
#: kind by its string: noisy log-likelihood ratios (penalty MH), noisy sufficient-statistic
#: copies (exponential-family penalty MH), and clipped, Poisson-subsampled, noised gradients
#: (SGLD, SGHMC, SGNHT).
LOG_RATIO = KINDS["log_ratio"].ledger_name
SUFF_STATS = KINDS["suff_stats"].ledger_name
SGMCMC = KINDS["gradient"].ledger_name

#: The smallest gradient noise sd σ·clip an owner uses: the smallest normal float (below it the
#: noise is subnormal or rounds to 0 while the ledger would still count σ).
_SMALLEST_NOISE_SD = sys.float_info.min


@dataclass(frozen=True)
class Policy:
    """Owner policy (``[privacy]`` of OWNER.toml); every field is checked on construction
    (``ConfigError`` naming ``privacy.<field>``).

    sigma: the owner's noise level for every query kind ``noise`` does not name, whose meaning
        is its query kind's (``QueryKind.sigma_meaning``): the sd of the log-likelihood-ratio
        sum (``log_ratio``), of each component of the sufficient-statistic sum
        (``suff_stats``), or for gradient answers (``gradient``) the noise *multiplier*: noise
        sd σ·clip on each coordinate. OWNER.toml names each kind's level for what it is
        (``QueryKind.noise_key``: log_ratio_sd, stat_sd, gradient_noise_multiplier).
    noise: the noise level of each kind it names (keyed by the kind's ledger name: penalty,
        penalty_expfam, sgmcmc), so that one session of several kinds answers each at its own
        level (``noise_for``); empty: ``sigma`` for every kind.
    max_step: the largest ‖θ' − θ‖₂ the owner answers for (bounds each answer's sensitivity).
    budget_epsilon, delta: the owner refuses any answer that would take its cumulative
        ε(δ) past ``budget_epsilon``.
    neighbour: ``replace_one`` or ``add_remove``; sets the sensitivities.
    max_answers_per_request: refuse larger requests outright (chains × block); small enough
        that one request keeps the owner's worker busy for milliseconds, not seconds, so that
        other clients' requests wait little (docs/design.md §3, invariant 14).
    max_sampling_rate, max_clip: the largest Poisson sampling rate q and per-record gradient
        clip norm the owner accepts for gradient answers.
    min_step, min_clip: the smallest ‖θ' − θ‖₂ and gradient clip the owner answers for: below
        them an answer carries (almost) no information yet costs storage and computation, and
        a vanishing noise scale σ·clip must never reach the noise sampler.
    min_charged_step: a log-ratio answer for a shorter step is charged as if its step were this
        long (unset: max_step/10), so that every stored answer costs the budget at least
        μ = Δ(min_charged_step)/σ and the budget bounds how many answers the ledger ever stores;
        honest proposals are rarely that short, and then cost little more (invariant 14).
    max_record_evaluations: the most per-record terms (chains × records) one request may make
        the owner compute; larger requests are refused before any work.
    total_noise_sd, colluders, min_peers: secure aggregation (docs/design.md §2.6). s, the sd of
        the noise the honest owners' *sum* carries (same units as sigma; unset: the owner answers
        no secure session); t, how many of the other owners it assumes may collude with the
        coordinator; the fewest other owners a secure session must have. In a secure session of
        K owners (counted from the peer keys it receives) it adds noise of variance s²/(K − t)
        and charges μ = (Δ + γ√w)/s per answer.
    unauthenticated_peers: what a deployed owner does with a secure session whose peers its
        server cannot authenticate (no ``server.peer_ca``/``allowed_peers``): ``"refuse"`` (the
        default), or ``"charge_own_noise"`` — answer, but charge and enforce the budget at its
        own noise sd s/√(K − t) alone, which stays true whoever the peers are (it gives up the
        other owners' noise). Simulated owners' peers are the simulation's own: they ignore it.
    """

    sigma: PositiveFloat = 1.0
    max_step: PositiveFloat = 0.05
    budget_epsilon: PositiveFloat = 10.0
    delta: Probability = 1e-5
    neighbour: Neighbour = "replace_one"
    max_answers_per_request: PositiveInt = 512
    max_sampling_rate: Rate = 1.0
    max_clip: PositiveFloat = 10.0
    min_step: PositiveFloat = 1e-9
    min_clip: PositiveFloat = 1e-6
    max_record_evaluations: PositiveInt = 50_000_000
    min_charged_step: PositiveFloat | None = None
    total_noise_sd: PositiveFloat | None = None
    colluders: NonNegativeInt = 0
    min_peers: NonNegativeInt = 0
    unauthenticated_peers: PeerTrust = "refuse"
    noise: Mapping[str, PositiveFloat] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, "privacy")
        if self.min_step > self.max_step:
            raise ConfigError(
                f"privacy.min_step = {self.min_step:g} exceeds privacy.max_step = {self.max_step:g}"
            )
        if self.min_charged_step is not None and self.min_charged_step > self.max_step:
            raise ConfigError(
                f"privacy.min_charged_step = {self.min_charged_step:g} exceeds privacy.max_step = "
                f"{self.max_step:g}"
            )
        if self.min_clip > self.max_clip:
            raise ConfigError(
                f"privacy.min_clip = {self.min_clip:g} exceeds privacy.max_clip = {self.max_clip:g}"
            )
        object.__setattr__(self, "noise", NoiseLevels(self.noise))
        self._check_noise()

    def _check_noise(self) -> None:
        """Every level ``noise`` names is of a known kind (``ConfigError`` otherwise), and the
        gradient noise sd σ·min_clip is a normal float."""
        ledger_names = _ledger_names()
        unknown = sorted(set(self.noise) - set(ledger_names))
        if unknown:
            raise ConfigError(
                f"privacy.noise names unknown query kinds {unknown}; known: {sorted(ledger_names)}"
            )
        for name, kind in ledger_names.items():  # the kinds whose noise sd is σ·clip
            sigma = self.noise_for(name)
            if not kind.clip_scaled or sigma * self.min_clip >= _SMALLEST_NOISE_SD:
                continue
            key = "sigma" if name not in self.noise else kind.noise_key
            raise ConfigError(
                f"privacy.{key} × privacy.min_clip = {sigma * self.min_clip:g} is below "
                f"{_SMALLEST_NOISE_SD:g}: {kind.name} noise that small is no noise; raise min_clip"
            )

    def noise_for(self, kind: str) -> float:
        """The noise level of query kind ``kind`` (its ledger name; ``KeyError`` for an unknown
        kind): its entry in ``noise``, else ``sigma``. Units: the kind's ``sigma_meaning``."""
        if kind not in _ledger_names():
            raise KeyError(f"unknown query kind {kind!r}")
        return self.noise.get(kind, self.sigma)

    @property
    def charged_step(self) -> float:
        """The shortest step a log-ratio answer is charged for: ``min_charged_step``, or
        max_step/10 when unset."""
        return self.max_step / 10 if self.min_charged_step is None else self.min_charged_step

    def to_dict(self) -> dict[str, Any]:
        """The fields by name; ``noise`` only when it names a kind (a policy of sigma alone
        gives the dict it gave before levels per kind)."""
        fields = asdict(self)
        fields["noise"] = dict(self.noise)
        if not self.noise:
            del fields["noise"]
        return fields


class NoiseLevels(dict[str, float]):
    """``Policy.noise``: each named kind's level by ledger name, immutable and hashable (a
    policy is a frozen, hashable value)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def _immutable(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a policy's noise levels are immutable")

    def __reduce__(self) -> tuple[type, tuple[dict[str, float]]]:
        """Pickled as its items (a Ray actor's policy): unpickling a dict subclass would
        otherwise set them one by one, which ``_immutable`` refuses."""
        return (NoiseLevels, (dict(self),))

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _immutable  # type: ignore[assignment]
    __ior__ = _immutable  # type: ignore[assignment]


def _ledger_names() -> dict[str, QueryKind]:
    """The registered query kinds (``kinds.KINDS``, read when asked: a kind registered or
    removed later counts) by ledger name, rebuilt only when the registry changed (a host's
    ``HostNoise`` asks 9 × K times at open; docs/design.md §4 "Many owners")."""
    global _LEDGER_NAMES
    kinds = tuple(KINDS.values())
    if kinds != _LEDGER_NAMES[0]:
        _LEDGER_NAMES = (kinds, {kind.ledger_name: kind for kind in kinds})
    return _LEDGER_NAMES[1]


#: ``_ledger_names``' last answer and the registry's kinds it was built from
_LEDGER_NAMES: tuple[tuple[QueryKind, ...], dict[str, QueryKind]] = ((), {})


@dataclass(frozen=True)
class SecureTerms:
    """What an owner counted and assumed when it opened a secure session (docs/design.md §2.6):
    ``owners`` K (itself included, from the peer keys it received), ``colluders`` t and
    ``total_noise_sd`` s from its own policy."""

    owners: int
    colluders: int
    total_noise_sd: float

    @property
    def owner_noise_sd(self) -> float:
        """The sd of the noise this owner adds: s/√(K − t)."""
        return self.total_noise_sd / math.sqrt(self.owners - self.colluders)

    def own_noise_only(self) -> SecureTerms:
        """The same noise, charged as if every other owner colluded (t = K − 1): the owner's own
        noise sd s/√(K − t) becomes the s its μ divides by. How an owner that cannot
        authenticate its peers is charged (docs/design.md §2.6); its ledger records these
        terms, so its own-noise ε equals its ε."""
        return SecureTerms(self.owners, self.owners - 1, self.owner_noise_sd)

    @property
    def own_noise_charged(self) -> bool:
        """Charged at the owner's own noise alone (t = K − 1: no other owner's noise counted)."""
        return self.colluders >= self.owners - 1


#: What an owner's ε in a secure session rests on (``OwnNoise.peers``): its peers' keys were
#: authenticated to distinct owner identities (charged at s, assuming ≤ t colluders); the
#: simulation's own owners (charged at s, the simulation's peers are real); or nothing (charged
#: at its own noise alone, true whoever the peers are).
PEERS_AUTHENTICATED = "authenticated"
PEERS_SIMULATED = "simulated"
PEERS_OWN_NOISE = "own_noise"


@dataclass(frozen=True)
class OwnNoise:
    """What an owner's privacy would be if only its *own* noise protected it in its secure
    sessions (no honest peer's noise counted; noise sd s/√(K − t) instead of s): ``total``
    across every session, ``session`` for the asked one (None when not asked), whose terms are
    ``terms`` (None when it was not secure) and whose ε rests on ``peers`` (``PEERS_*``: ""
    when not secure)."""

    total: SpendReport
    session: SpendReport | None = None
    terms: SecureTerms | None = None
    peers: str = ""


@dataclass(frozen=True)
class OwnerDescription:
    """What an owner tells anyone who asks: public facts only."""

    name: str
    model: str
    model_params: dict[str, Any]
    dim: int
    n: int | None  # None: not disclosed (under add_remove the count itself is private)
    policy: Policy
    model_digest: str = ""  # sha256 hex of the model's code (models.model_digest); "": not sent


@dataclass(frozen=True)
class SpendReport:
    """A spend in the units people read: answers (all kinds), μ of the Gaussian answers, ε at the
    owner's δ of everything (``accountant`` "gdp": exact; "pld": dp-accounting, once gradient
    answers are included) and the penalty paper's bound (inf when it does not apply)."""

    answers: int
    mu: float
    epsilon: float
    epsilon_paper_bound: float
    accountant: str = "gdp"

    @staticmethod
    def of(
        spend: GaussianSpend,
        sampled: list[Row],
        delta: float,
        neighbour: Neighbour,
        lattice: bool = False,
    ) -> SpendReport:
        """The report of ``spend`` and ``sampled``; ``lattice``: the Gaussian answers were exact
        lattice answers (accounted by RDP, docs/design.md §2.7). Memoised: the many owners of
        one run usually spent alike."""
        return _spend_report(spend, tuple(sampled), delta, neighbour, lattice)


@functools.lru_cache(maxsize=4096)
def _spend_report(
    spend: GaussianSpend,
    sampled: tuple[Row, ...],
    delta: float,
    neighbour: Neighbour,
    lattice: bool,
) -> SpendReport:
    epsilon, accountant = owner_epsilon(spend, list(sampled), delta, neighbour, lattice)
    paper = spend.epsilon_paper_bound(delta) if accountant == "gdp" else math.inf
    return SpendReport(
        spend.answers + sum(e.count for e in sampled), spend.mu, epsilon, paper, accountant
    )


@dataclass(frozen=True)
class PrivacyReport:
    """An owner's privacy report: ``session`` for one session (None when not asked), ``total``
    across every session the ledger has seen."""

    owner: str
    n: int | None  # None: not disclosed (add_remove)
    delta: float
    budget_epsilon: float
    neighbour: Neighbour
    total: SpendReport
    session: SpendReport | None = None
    #: secure aggregation: ε as if its own noise alone protected it (None: never secure)
    own_noise: OwnNoise | None = None

    @property
    def budget_left(self) -> float:
        return max(self.budget_epsilon - self.total.epsilon, 0.0)
