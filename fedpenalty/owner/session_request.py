"""A request to open (or resume) a session, as one value: the session id, each kind's terms
(``kinds.KindTerms``: plan, sampling rate, largest step), who opens it and, with secure
aggregation, the peers' keys (docs/design.md §4). Built once by whoever receives the request
(the server from the wire, an oracle from its arguments) and passed unchanged through host and
nodes to the ledger. A session may ask several kinds (each with its own terms); the ledger
records and charges each kind as its own part (docs/design.md §4, "Sessions of several
kinds").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidRequest
from ..kinds import KindTerms, query_kind
from ..models.compat import ModelIdentity
from .aggregation import SecureOpen


@dataclass(frozen=True)
class SessionRequest:
    """``session`` (1..128 characters), ``terms`` (one ``KindTerms`` per kind the session
    asks), ``client`` (the allowed name that opens it; None without client identities),
    ``secure`` (secure aggregation's peer keys and terms; None: plain answers) and ``model``
    (the coordinator's model, which every owner checks is its own:
    ``models.compat.check_session_model``; None: an older client that names none)."""

    session: str
    terms: tuple[KindTerms, ...]
    client: str | None = None
    secure: SecureOpen | None = None
    model: ModelIdentity | None = None

    @classmethod
    def of(
        cls,
        session: str,
        kind: str,
        planned_answers: int,
        sampling_rate: float | None = None,
        client: str | None = None,
        max_step: float | None = None,
        secure: SecureOpen | None = None,
    ) -> SessionRequest:
        """A request for one kind (by its v2 or ledger name), from the protocol's fields."""
        return cls(
            session, (KindTerms(kind, planned_answers, sampling_rate, max_step),), client, secure
        )

    @classmethod
    def several(
        cls,
        session: str,
        terms: Sequence[KindTerms],
        client: str | None = None,
        secure: SecureOpen | None = None,
        model: ModelIdentity | None = None,
    ) -> SessionRequest:
        """A request for the kinds ``terms`` (one ``KindTerms`` each)."""
        return cls(session, tuple(terms), client, secure, model)

    def kinds(self, owner: str | None = None) -> tuple[KindTerms, ...]:
        """Every kind's terms, each kind once (``InvalidRequest`` for none and for a kind
        asked twice). A session of several kinds keys and charges each kind's answers apart,
        and with secure aggregation masks each kind under its own transcript (docs/design.md
        §4, "Sessions of several kinds")."""
        if not self.terms:
            raise InvalidRequest("a session asks at least one query kind", owner)
        names = [query_kind(t.kind, owner).name for t in self.terms]
        if len(set(names)) != len(names):
            raise InvalidRequest(f"a session asks each query kind once, not {names}", owner)
        return self.terms

    def single(self, owner: str | None = None) -> KindTerms:
        """The request's one kind's terms (a secure session's, or a protocol message's that
        carries one kind); ``InvalidRequest`` for none or several."""
        if len(self.terms) != 1:
            raise InvalidRequest(
                f"a session asks exactly one query kind here, not {len(self.terms)}", owner
            )
        return self.terms[0]
