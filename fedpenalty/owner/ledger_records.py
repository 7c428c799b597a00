"""The values the ledger's parts exchange with its callers (docs/design.md §4, "The ledger's
parts"): a session as recorded, a plan view, the openings and charges a caller asks for, and the
reports read back. Gaussian spend (``GaussianSpend``), gradient rows (``SubsampledGaussian``)
and pure-ε releases (``SelfComposed(EpsilonDelta(ε), count)``) are privacy events
(``fedpenalty.privacy.events``); the last two are an owner's ``Row``s."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..common import SecureTerms
from ..models.base import Neighbour
from ..privacy import GaussianSpend
from ..privacy.accountant import OwnerAccountant
from ..privacy.events import EpsilonDelta, SelfComposed
from ..privacy.owner_epsilon import Row
from ..privacy.subsampled import SubsampledGaussian
from .ledger_rows import AffineMus

#: joins a session and a kind's ledger name into the ledger session of that kind's part of a
#: session of several kinds (session ids may not contain it; docs/design.md §4, "Sessions of
#: several kinds")
PART_SEPARATOR = "\x1f"


def part_name(session: str, algorithm: str) -> str:
    """The ledger session of kind ``algorithm`` (ledger name) in a session of several kinds."""
    return f"{session}{PART_SEPARATOR}{algorithm}"


@dataclass(frozen=True)
class SessionPart:
    """One kind of a session as the ledger records it: its ledger session ``name`` (the session
    itself for a session of one kind, else ``part_name``), the kind's ledger name
    ``algorithm``, its plan (answers per owner), Poisson ``sampling_rate`` and ``max_step``."""

    name: str
    algorithm: str
    planned_answers: int
    sampling_rate: float | None = None
    max_step: float | None = None


@dataclass(frozen=True)
class Session:
    """A session as the ledger records it for one owner."""

    session: str
    algorithm: str
    planned_answers: int
    closed: bool
    spend: GaussianSpend
    sampled: list[Row]
    sampling_rate: float | None
    opened_at: float | None = None  # Unix time


@dataclass(frozen=True)
class PlanView:
    """What one owner has spent and holds, read inside the transaction that admits a plan.

    ``existing``: the session being re-opened (None when new); ``total``: its Gaussian spend;
    ``sampled``: the gradient answers it gave (all sessions); ``reserved``: what its *other* open
    sgmcmc sessions may still give, at the noise multiplier the owner named; ``gaussian_open``:
    some non-sgmcmc session of the owner is open (counting the one being opened).
    """

    existing: Session | None
    total: GaussianSpend
    sampled: list[Row]
    reserved: list[SubsampledGaussian]
    gaussian_open: bool
    #: the masking graphs' failure bound of its secure sessions, this one included: the
    #: accountant is asked at δ less it (``mask_graph.accounting_delta``)
    graph_failure: float = 0.0

    def committed(self, neighbour: Neighbour, lattice: bool = False) -> OwnerAccountant:
        """Everything spent and reserved, as privacy events composed by the owner's accountant:
        a plan is admitted when ``committed(...).admits(planned event, budget, δ)``."""
        return OwnerAccountant(neighbour, lattice=lattice).compose(
            self.total, *self.sampled, *self.reserved
        )


def events_of(rows: list[tuple]) -> list[Row]:
    """One event per (q, σ) of sampled rows (session id, q, σ, count), and per ε of pure-ε
    rows (session id, None, ε, count)."""
    counts: dict[tuple[float | None, float], int] = defaultdict(int)
    for _, q, sigma, count in rows:
        counts[(q, sigma)] += count
    return [
        SubsampledGaussian(q, sigma, c) if q is not None else pure_event(sigma, c)
        for (q, sigma), c in counts.items()
    ]


def pure_event(epsilon: float, count: int) -> SelfComposed:
    """``count`` pure-ε releases of ``epsilon`` each (nats), as the ledger reads them back."""
    return SelfComposed(EpsilonDelta(epsilon, 0.0), count)


#: decides a plan from a ``PlanView``: raises to refuse, returns the owner's new Gaussian μ² cap
#: (or None to keep it). It runs inside the ledger's transaction and must not call the ledger.
Admit = Callable[[PlanView], float | None]
#: the same for a session of several kinds: one ``PlanView`` per part, in the parts' order
AdmitParts = Callable[[list[PlanView]], float | None]


@dataclass(frozen=True)
class SecureRecord:
    """What the ledger keeps of an owner's secure session: the ``terms`` it counted and assumed
    and the ``transcript`` hash of the session's peers and terms (docs/design.md §2.6)."""

    terms: SecureTerms
    transcript: bytes


@dataclass(frozen=True)
class SecureSpend:
    """One secure session of an owner with its spend there (Gaussian and gradient answers)."""

    session: str
    terms: SecureTerms
    spend: GaussianSpend
    sampled: list[Row]


@dataclass(frozen=True)
class Report:
    """One owner's spend as ``Ledger.reports`` reads it: in all sessions (``total``,
    ``sampled``); whether the asked session is recorded for it, and then its spend there
    (``session``: Gaussian spend and gradient answers); ``secure``: each of its secure
    sessions with its spend."""

    total: GaussianSpend
    sampled: list[Row]
    in_session: bool
    session: tuple[GaussianSpend, list[Row]] | None
    secure: list[SecureSpend] = field(default_factory=list)


@dataclass(frozen=True)
class Opening:
    """One owner opening a session: its name, the noise multiplier its other open sgmcmc
    sessions are reserved at when the ledger did not record theirs (sessions of earlier
    ledgers), whether it answers with lattice noise, its plan check, the record of a secure
    session (None: plain), and ``session_multiplier``: the multiplier this session's gradient
    answers are charged at (sgmcmc sessions; recorded, so that later admissions reserve what the
    session may still give at that multiplier, also after a restart)."""

    owner: str
    noise_multiplier: float = 1.0
    lattice: bool = False
    admit: Admit | None = None
    secure: SecureRecord | None = None
    session_multiplier: float | None = None
    #: a session of several kinds: the joint plan check (``admit`` is then not called),
    #: each part's multiplier and each part's secure record (in the parts' order; ``secure``
    #: is then not read)
    admit_parts: AdmitParts | None = None
    part_multipliers: tuple[float | None, ...] = ()
    part_secure: tuple[SecureRecord | None, ...] = ()

    def part(self, j: int) -> Opening:
        """This opening as the ``j``-th part of its session sees it: with that part's secure
        record (a session of one kind: itself)."""
        return replace(self, secure=self.part_secure[j]) if self.part_secure else self


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class Charge:
    """New answers of K owners (one ledger) to one request of M keys.

    Keys (``chains[j]``, ``iterations[j]``) with query ``digests[j]`` (SHA-256); ``payloads``
    ``(K, M, w)`` float64 (uint64 masked words in secure sessions; stored as they are); ``mus``:
    every answer's μ (None for gradient answers); ``new`` ``(K, M)`` marks the answers to store
    and charge. ``substep``: the sub-step of every key (part of the key; 0 by default).
    ``max_mu_squared``, ``budget_epsilon``, ``delta``: ``(K,)`` each owner's limit; the ledger
    enforces the lower of ``max_mu_squared`` and the cap it recorded for the owner's plans.
    ``owner_ids``: the owners' ledger ids (``Ledger.ids``), when the caller has them.

    Gradient answers (``sampled`` set) are Poisson-subsampled Gaussian releases at
    (q, ``sampled.noise_multiplier[k]``) instead of GDP answers: ``mus`` is None and each
    owner's count in the session may not pass the plan the ledger admitted against its budget
    (``sessions.planned_answers``, read in the charging transaction — never a plan held in
    memory). ``payloads`` may be None for ``Ledger.charging``, which takes them once every
    check has passed.
    """

    session: str
    owners: list[str]
    chains: np.ndarray
    iterations: np.ndarray
    digests: list[bytes]
    payloads: np.ndarray | None
    mus: AffineMus | None
    new: np.ndarray
    max_mu_squared: np.ndarray
    budget_epsilon: np.ndarray
    delta: np.ndarray
    sampled: SampledCharge | None = None
    lattice: bool = False
    owner_ids: np.ndarray | None = None
    substep: int = 0
    #: pure-ε answers (the Laplace statistics, docs/design.md §2.10): each owner's ε of one
    #: answer ``(K,)`` (nats); ``mus`` is None and, as for gradient answers, each owner's count
    #: in the session may not pass the plan the ledger admitted against its budget
    pure: np.ndarray | None = None


@dataclass(frozen=True)
class SampledCharge:
    """Subsampled-Gaussian charge parameters: rate ``q``, per-owner noise multipliers and
    neighbour relations."""

    q: float
    noise_multiplier: np.ndarray
    neighbour: list[Neighbour]
