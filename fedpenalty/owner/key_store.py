"""The ledger's key store: what it keeps of secure aggregation (docs/design.md §2.6; §4, "The
ledger's parts") — each owner's secure sessions (``secure_sessions``: the K, t and s it counted
and assumed and the transcript hash of the peers' keys; a resumed session must show the same)
its agreement secret (``agreement``: drawn from OS entropy once; its X25519 session keys
derive from it, so a restarted owner continues its sessions) and the commitments each owner
revealed its graph share for (``graph_reveals``). The ledger file must therefore be kept as
private as the owner's data."""

from __future__ import annotations

import secrets
from collections import defaultdict

from ..common import SecureTerms
from ..errors import InvalidRequest
from .ledger_records import PART_SEPARATOR, Opening
from .ledger_store import LedgerStore


def _terms_row(terms: SecureTerms) -> tuple[int, int, float]:
    return (terms.owners, terms.colluders, terms.total_noise_sd)


def _secure_words(kept: tuple[SecureTerms, bytes] | None) -> str:
    if kept is None:
        return "no secure aggregation"
    terms, digest = kept
    return (
        f"secure aggregation over {terms.owners} owners (colluders {terms.colluders}, "
        f"total_noise_sd {terms.total_noise_sd:g}, peer keys {digest.hex()[:12]}…)"
    )


class KeyStore:
    """Secure-session records and key material of the owners of one ledger ``store``."""

    def __init__(self, store: LedgerStore):
        self.store = store

    def check_reopen(self, owners: list[Opening], session: str, recorded: dict[str, tuple]) -> None:
        """Refuse re-opening a recorded session (a ledger session: a session of several kinds
        asks once per part) with other secure-aggregation peers or terms than it was opened
        with (or a plain one as secure, or the reverse): the masks of its answered keys would
        no longer cancel with the new ones (call inside the transaction)."""
        rows = {
            owner_id: (SecureTerms(*terms), transcript)
            for owner_id, *terms, transcript in self.store.db.execute(
                "SELECT owner_id, owners, colluders, total_noise_sd, transcript "
                "FROM secure_sessions WHERE session_id=?",
                (self.store.id(session),),
            )
        }
        for o in owners:
            if o.owner not in recorded:
                continue
            kept = rows.get(self.store.id(o.owner))
            asked = None if o.secure is None else (o.secure.terms, o.secure.transcript)
            if kept != asked:
                raise InvalidRequest(
                    f"session {session.partition(PART_SEPARATOR)[0]!r} was opened with "
                    f"{_secure_words(kept)}, not {_secure_words(asked)}; a resumed session "
                    "keeps its peers and terms",
                    o.owner,
                )

    def agreement_secret(self, owner: str) -> bytes:
        """The owner's 32-byte agreement secret (secure aggregation), drawn from OS entropy and
        recorded the first time it is asked for, read back ever after."""
        with self.store.writing():
            owner_id = self.store.id(owner)
            self.store.db.execute(
                "INSERT OR IGNORE INTO agreement(owner_id, secret) VALUES (?, ?)",
                (owner_id, secrets.token_bytes(32)),
            )
            row = self.store.db.execute(
                "SELECT secret FROM agreement WHERE owner_id=?", (owner_id,)
            ).fetchone()
        return bytes(row[0])

    def bind_commitments(self, owners: list[str], session: str, digest: bytes) -> list[str]:
        """Bind each of ``owners``' graph-share reveal in ``session`` to the commitments
        ``digest`` (first time) and return those already bound to another digest — then nothing
        is written (docs/design.md §2.6, "Commit, then reveal")."""
        with self.store.writing():
            session_id = self.store.id(session)
            ids = [self.store.id(o) for o in owners]
            bound = dict(
                self.store.db.execute(
                    "SELECT owner_id, commitments FROM graph_reveals WHERE session_id=?",
                    (session_id,),
                )
            )
            clash = [o for o, i in zip(owners, ids) if bytes(bound.get(i, digest)) != digest]
            if not clash:
                self.store.db.executemany(
                    "INSERT OR IGNORE INTO graph_reveals(owner_id, session_id, commitments) "
                    "VALUES (?,?,?)",
                    [(i, session_id, digest) for i in ids],
                )
        return clash

    def bound_commitments(self, owners: list[str], session: str) -> dict[str, bytes]:
        """Owner → the commitments digest its reveal in ``session`` is bound to (bound only)."""
        with self.store.reading():
            self.store.load_names()  # ids of names never recorded are -1: nothing written
            session_id = self.store.known_id(session)
            bound = dict(
                self.store.db.execute(
                    "SELECT owner_id, commitments FROM graph_reveals WHERE session_id=?",
                    (session_id,),
                )
            )
            ids = {o: self.store.known_id(o) for o in owners}
        return {o: bytes(bound[i]) for o, i in ids.items() if i in bound}

    def record(self, ids: list[int], owners: list[Opening], session: str) -> None:
        """Record the secure session of each opening owner that has one (owner ids ``ids``;
        call inside the transaction that opens it)."""
        self.store.db.executemany(
            "INSERT OR IGNORE INTO secure_sessions(owner_id, session_id, owners, colluders, "
            "total_noise_sd, transcript) VALUES (?,?,?,?,?,?)",
            [
                (i, self.store.id(session), *_terms_row(o.secure.terms), o.secure.transcript)
                for i, o in zip(ids, owners)
                if o.secure is not None
            ],
        )

    def secure_sessions(self, wanted: set[int]) -> dict[int, list[tuple[int, str, SecureTerms]]]:
        """Session id → (owner id, session name, terms) of the secure sessions of the owner ids
        ``wanted`` (none in a ledger from before §2.6; call under the lock)."""
        by_session: dict[int, list[tuple[int, str, SecureTerms]]] = defaultdict(list)
        if not self.store.has_table("secure_sessions"):
            return by_session
        for owner_id, session_id, name, *terms in self.store.db.execute(
            "SELECT s.owner_id, s.session_id, n.name, s.owners, s.colluders, s.total_noise_sd "
            "FROM secure_sessions s JOIN names n ON n.id = s.session_id"
        ):
            if owner_id in wanted:
                by_session[session_id].append((owner_id, name, SecureTerms(*terms)))
        return by_session
