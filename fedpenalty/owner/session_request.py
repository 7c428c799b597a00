"""A request to open (or resume) a session, as one value: the session id, each kind's terms
(``kinds.KindTerms``: plan, sampling rate, largest step), who opens it and, with secure
aggregation, the peers' keys (docs/design.md §4). Built once by whoever receives the request
(the server from the wire, an oracle from its arguments) and passed unchanged through host and
nodes to the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidRequest
from ..kinds import KindTerms
from .aggregation import SecureOpen


@dataclass(frozen=True)
class SessionRequest:
    """``session`` (1..128 characters), ``terms`` (one ``KindTerms`` per kind the session
    asks), ``client`` (the allowed name that opens it; None without client identities) and
    ``secure`` (secure aggregation's peer keys and terms; None: plain answers)."""

    session: str
    terms: tuple[KindTerms, ...]
    client: str | None = None
    secure: SecureOpen | None = None

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

    def single(self, owner: str | None = None) -> KindTerms:
        """The request's one kind's terms. A session answers one kind for now (its answers
        are keyed by chain and iteration only); ``InvalidRequest`` for none or several."""
        if len(self.terms) != 1:
            raise InvalidRequest(
                f"a session asks exactly one query kind, not {len(self.terms)}", owner
            )
        return self.terms[0]
