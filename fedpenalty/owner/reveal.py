"""Commit, then reveal: the owners' side of the sparse masking graph's seed (docs/design.md
§2.6, "Commit, then reveal").

1. ``SessionKeys``: each owner sends its session key with a commitment to a 32-byte share of the
   graph seed (``committed_keys``; a server with peer authentication signs key and commitment).
2. ``RevealShares``: the coordinator relays every owner's key and commitment; each owner checks
   the list, binds it in its ledger (``KeyStore.bind_commitments``: never another list in that
   session, also after a restart) and only then reveals its share (``reveal_shares``).
3. ``OpenSession``: the keys, commitments and revealed shares; before anything is recorded each
   owner checks every share against its commitment and that the commitments are those it
   revealed for (``check_open``); the seed hashes them all (``aggregation.graph_seed``).

So every owner's share is fixed before any honest owner's share is seen, and colluders who send
their keys last cannot grind them for a graph that cuts the honest owners. Only a sparse graph
has a seed: the complete graph (K ≤ ``mask_graph.COMPLETE_UP_TO``) needs no reveal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..errors import InvalidRequest
from .aggregation import (
    SHARE_BYTES,
    PeerKey,
    SecureOpen,
    check_shares,
    commitments_digest,
    peers_view,
    revealed_key,
)
from .mask_graph import graph_degree
from .node import OwnerNode


def sparse(owners: int, colluders: int) -> bool:
    """Whether a session of ``owners`` K with ``colluders`` t masks along a sparse graph (whose
    seed is committed, then revealed)."""
    return graph_degree(owners, colluders)[0] < owners - 1


def committed_key(node: OwnerNode, session: str) -> PeerKey:
    """``node``'s public key for ``session`` with its commitment to its graph share, both revealed
    (``share``) — the share is stripped before the key leaves the owner (``committed_keys``)."""
    return revealed_key(node.name, node.session_private_key(session), session)


def committed_keys(nodes: Sequence[OwnerNode], session: str) -> list[PeerKey]:
    """Every hosted owner's public key for ``session`` and its commitment (no share)."""
    return [replace(committed_key(n, session), share=b"") for n in nodes]


def reveal_shares(
    nodes: Sequence[OwnerNode], session: str, peers: Sequence[PeerKey]
) -> list[PeerKey]:
    """Each hosted owner's key, commitment and share once it holds every owner's commitment
    ``peers``: ``InvalidRequest`` (nothing revealed) for a malformed list, a peer without a
    commitment, a list lacking an owner's own key and commitment, or one other than the list
    an owner already revealed for in ``session``."""
    view = peers_view(tuple(peers))
    label = nodes[0].name if len(nodes) == 1 else f"host of {len(nodes)} owners"
    if view.problem:
        raise InvalidRequest(view.problem, label)
    for p in peers:
        if len(p.commitment) != SHARE_BYTES:
            raise InvalidRequest(f"peer {p.owner!r} sent no graph commitment", label)
    mine = {p.owner: p for p in peers}
    keys = [committed_key(n, session) for n in nodes]
    for key in keys:
        shown = mine.get(key.owner)
        if shown is None or (shown.public_key, shown.commitment) != (
            key.public_key,
            key.commitment,
        ):
            raise InvalidRequest(
                "the peer list lacks this owner's own session key and commitment", key.owner
            )
    digest = commitments_digest(session, peers)
    for names in _by_ledger(nodes).values():
        clash = names[0].ledger.keys.bind_commitments([n.name for n in names], session, digest)
        if clash:
            raise InvalidRequest(
                f"session {session!r}: this owner revealed its graph share for other commitments; "
                "it reveals for one list of commitments a session (docs/design.md §2.6)",
                clash[0],
            )
    return keys


def check_open(nodes: Sequence[OwnerNode], session: str, secure: SecureOpen) -> None:
    """``InvalidRequest`` (nothing recorded) unless, for a sparse graph, every peer's revealed
    share matches its commitment (naming the peer) and every hosted owner revealed its share for
    exactly these commitments (a coordinator cannot withhold, swap or change them after the
    reveal)."""
    if not sparse(len(secure.peers), secure.colluders):
        return
    label = nodes[0].name if len(nodes) == 1 else f"host of {len(nodes)} owners"
    check_shares(session, secure.peers, label)
    digest = commitments_digest(session, secure.peers)
    for names in _by_ledger(nodes).values():
        bound = names[0].ledger.keys.bound_commitments([n.name for n in names], session)
        for n in names:
            if bound.get(n.name) != digest:
                raise InvalidRequest(
                    f"session {session!r} shows other graph commitments than this owner revealed "
                    "its share for (or it revealed none): open with the commitments relayed to "
                    "RevealShares (docs/design.md §2.6)",
                    n.name,
                )


def _by_ledger(nodes: Sequence[OwnerNode]) -> dict[int, list[OwnerNode]]:
    """``nodes`` grouped by ledger object (one transaction each)."""
    groups: dict[int, list[OwnerNode]] = {}
    for n in nodes:
        groups.setdefault(id(n.ledger), []).append(n)
    return groups
