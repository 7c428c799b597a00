"""Secure aggregation, the owners' side (docs/design.md §2.6).

In a secure session owner k releases its lattice answer — λ_k rounded to γℤ plus exact
discrete-Gaussian noise of variance s²/(K − t) — plus pairwise masks, all mod 2⁶⁴ in lattice
units. The masks cancel in the sum over the K owners, so the coordinator learns Σ_k λ̂_k only.

* **Keys.** An owner's X25519 key for a session is derived (HKDF-SHA256) from its agreement
  secret and the session id (``session_private_key``), so a restarted owner has the same key
  and can continue the session. Public keys travel through the coordinator (``PeerKey``).
* **Terms.** Every owner counts K from the distinct peer keys it received and takes s and t
  from its own policy (``agree``), never from the coordinator's numbers. It counts on the other
  owners' noise only when its server authenticated every peer key to a distinct owner identity
  (``SecureOpen.authenticated``, ``peer_auth.PeerAuth``) or its peers are a simulation's own;
  otherwise it refuses, or — by ``privacy.unauthenticated_peers = "charge_own_noise"`` — is
  charged at its own noise alone (``Agreed.charged``). It binds the session,
  the query kind, s, t, K and every (name, key) into a transcript hash (``transcript``). Owners
  shown different peers or terms derive different pair secrets, so their masks do not cancel
  and nothing decodes.
* **Masking graph.** Owners mask only with their neighbours in the session's graph: the complete
  graph for small K, else the SecAgg+ Harary graph over a ring order hashed from the session's
  keys and terms and every owner's share of the seed, committed to with its key and revealed
  once every commitment is fixed (``graph_seed``, ``reveal``), which every owner derives itself
  (``masking_graph``, ``mask_graph``).
* **Pair secrets.** For neighbours a < b (in name order): HKDF-SHA256 of X25519(sk_a, pk_b),
  salted with the transcript, with both names as info (``pair_secrets``).
* **Masks.** Owner a adds +m_ab and owner b adds −m_ab (mod 2⁶⁴). The words of m_ab for
  (chain, iteration, component) are ChaCha20 keystream under the pair secret (``ChaChaMasks``),
  or — SIMULATION ONLY, where one user runs every owner (in one process, packed host
  processes or Ray actors) from the run's seed anyway — a SplitMix64 mixer keyed by the pair
  secret (``MixMasks``; not a cryptographic function, about 10× faster).
* **Check word.** Every masked answer carries one more component: 0 plus its masks. The check
  words of the K owners sum to 0 mod 2⁶⁴ exactly when all of them answered under one
  transcript, so a missing owner or a disagreement is detected (it escapes with probability
  2⁻⁶⁴) and never decoded.

A host serving several owners replies with the sum mod 2⁶⁴ of its owners' masked answers
(``Reply``): masks between two owners of one host cancel there. Each owner's own masked answer
is what its ledger stores and replays.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from ..common import Policy, SecureTerms
from ..errors import InvalidRequest, NotPermitted
from .mask_graph import MaskGraph, graph_degree, graph_failure
from .noise.lattice import LATTICE_BITS
from .noise.seeded import keyed_words

PROTOCOL = b"fedpenalty.secure-aggregation.v1"
PUBLIC_KEY_BYTES = 32
#: Bytes of a graph-seed share and of its commitment.
SHARE_BYTES = 32
#: Words of one pair's masks computed at once (pairs × keys per chunk): bounds the memory.
MASK_CHUNK = 1 << 22

_U64 = np.uint64


@dataclass(frozen=True)
class PeerKey:
    """One owner's public X25519 key (32 raw bytes) for a session, relayed by the coordinator;
    from an owner server with peer authentication also its TLS ``certificate`` (PEM) and its
    ``signature`` of the key and commitment (``peer_auth.PeerAuth``). ``commitment``: SHA-256
    binding its graph ``share`` (32 bytes each; ``graph_commitment``), the share itself
    revealed only once every commitment is fixed (docs/design.md §2.6, "Commit, then reveal")."""

    owner: str
    public_key: bytes
    signature: bytes = b""
    certificate: bytes = b""
    commitment: bytes = b""
    share: bytes = b""


@dataclass(frozen=True)
class SecureOpen:
    """A coordinator's request to open a session with secure aggregation: every participant's
    key (``peers``, the asking owner included) and the s and t the coordinator asks for, which
    each owner checks against its own policy."""

    peers: tuple[PeerKey, ...]
    total_noise_sd: float
    colluders: int
    #: set only by the owner's own server once ``PeerAuth.check`` passed — every other key is
    #: signed under a certificate from its peer CA naming that key's owner, an identity it
    #: allows — never decoded from the wire (a coordinator cannot claim it)
    authenticated: bool = False


#: The one line a deployed owner refuses an unauthenticated secure session with.
UNAUTHENTICATED = (
    "this owner cannot authenticate its secure-aggregation peers (the coordinator relays their "
    "keys and could invent them): set server.peer_ca and server.allowed_peers in OWNER.toml "
    "(its server.tls_cert naming each owner it serves as URI urn:fedpenalty:owner:<name>), or "
    'privacy.unauthenticated_peers = "charge_own_noise" to answer charged at its own noise alone'
)


@dataclass(frozen=True)
class Agreed:
    """An owner's terms for a secure session: ``terms`` (K it counted, its t and s), which its
    noise and the transcript use, and ``charged``, what its μ and budget use — ``terms``, or
    with peers it could not authenticate ``terms.own_noise_only()`` (same noise, charged as if
    every other owner colluded)."""

    terms: SecureTerms
    charged: SecureTerms


# per-request record: plain, not frozen (built on every query, never changed; docs/design.md §4)
@dataclass
class Reply:
    """One host's answers to one query, as every transport carries them.

    Plain sessions: ``values`` ``(K, ...)`` float64, each hosted owner's answers. Secure
    sessions: ``values`` ``(1, ...)`` uint64, the sum mod 2⁶⁴ of the hosted owners' masked
    answers in units of ``lattice_step``, and ``check`` ``(1, keys)`` uint64, the sum of their
    check words. ``noise_sd`` ``(K,)``: the sd of the noise each hosted owner added.
    """

    values: np.ndarray
    noise_sd: np.ndarray
    lattice_step: float | None = None
    check: np.ndarray | None = None


# --------------------------------------------------------------------------- keys and terms


def session_private_key(secret: bytes, session: str) -> X25519PrivateKey:
    """An owner's X25519 key for ``session``: HKDF-SHA256 of its 32-byte agreement secret."""
    hkdf = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=PROTOCOL, info=b"x25519\x00" + session.encode()
    )
    return X25519PrivateKey.from_private_bytes(hkdf.derive(secret))


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32 raw bytes of ``key``'s public key."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def agree(
    owner: str, policy: Policy, own_key: bytes, request: SecureOpen, simulated: bool = False
) -> Agreed:
    """The terms ``owner`` accepts for a secure session, from its own policy and the peer keys
    it received; ``InvalidRequest`` (naming what to change) unless its policy allows secure
    sessions, the coordinator asks for the owner's own s and t, the keys are well formed and
    distinct, the owner's own key is among them, and there are at least ``min_peers`` others
    and more than t owners, and the session's masking graph fails with a probability below its δ
    (``mask_graph.graph_failure``, when the other owners' noise counts).

    The other owners' noise counts (charged at s) only when the peers are authenticated
    (``request.authenticated``) or ``simulated`` (SIMULATION ONLY: the simulation's own
    owners). Otherwise ``NotPermitted`` (``UNAUTHENTICATED``), unless the policy says
    ``unauthenticated_peers = "charge_own_noise"``: then it is charged at its own noise sd
    s/√(K − t), which no invented peer can lower (docs/design.md §3, invariant 13)."""
    s, t = policy.total_noise_sd, policy.colluders
    if s is None:
        raise InvalidRequest(
            "this owner's policy sets no privacy.total_noise_sd: it answers no session with "
            "secure aggregation",
            owner,
        )
    trusted = request.authenticated or simulated
    if not trusted and policy.unauthenticated_peers != "charge_own_noise":
        raise NotPermitted(UNAUTHENTICATED, owner)
    if (request.total_noise_sd, request.colluders) != (s, t):
        raise InvalidRequest(
            f"the session asks for total_noise_sd {request.total_noise_sd:g} and colluders "
            f"{request.colluders}; this owner's policy has privacy.total_noise_sd = {s:g} and "
            f"privacy.colluders = {t}",
            owner,
        )
    view = peers_view(request.peers)
    if view.problem:
        raise InvalidRequest(view.problem, owner)
    if view.keys.get(owner) != own_key:
        raise InvalidRequest("the peer keys lack this owner's own key for the session", owner)
    others = len(request.peers) - 1
    if others < policy.min_peers:
        raise InvalidRequest(
            f"the session has {others} other owners; this owner's privacy.min_peers is "
            f"{policy.min_peers}",
            owner,
        )
    if others + 1 <= t:
        raise InvalidRequest(
            f"with privacy.colluders = {t} a secure session needs more than {t} owners, got "
            f"{others + 1}",
            owner,
        )
    terms = SecureTerms(others + 1, t, s)
    failure = graph_failure(terms.owners, t) if trusted else 0.0
    if failure >= policy.delta:
        raise InvalidRequest(
            f"the masking graph of {terms.owners} owners with {t} colluders stays connected "
            f"only up to a probability {failure:.3g}, not below this owner's privacy.delta = "
            f"{policy.delta:g} (docs/design.md §2.6)",
            owner,
        )
    return Agreed(terms, terms if trusted else terms.own_noise_only())


@dataclass(frozen=True)
class _PeersView:
    """What every owner of a host checks of one key list, computed once: each name's key and
    the list's ``problem`` ("" when well formed)."""

    keys: dict[str, bytes]
    problem: str


#: One key list's view per list object (identity; the tuple of frozen keys never changes), so
#: the K owners of one host check a list of K keys once, not K times (O(K) rather than O(K²)).
_VIEWS: dict[int, tuple[Sequence[PeerKey], _PeersView]] = {}


def peers_view(peers: Sequence[PeerKey]) -> _PeersView:
    """``_PeersView`` of ``peers``: names and keys distinct (a repeated key would inflate K),
    keys 32 bytes."""
    kept = _VIEWS.get(id(peers))
    if kept is not None and kept[0] is peers:
        return kept[1]
    names = [p.owner for p in peers]
    keys = [p.public_key for p in peers]
    problem = ""
    if len(set(names)) != len(names) or not all(names):
        problem = "the peer keys name some owner twice (or none)"
    elif len(set(keys)) != len(keys):
        problem = "two peers present one public key; every owner has its own"
    elif any(not isinstance(k, bytes) or len(k) != PUBLIC_KEY_BYTES for k in keys):
        problem = f"a peer's public key is not {PUBLIC_KEY_BYTES} bytes"
    view = _PeersView(dict(zip(names, keys)), problem)
    if isinstance(peers, tuple):  # immutable: safe to remember by identity
        if len(_VIEWS) >= 8:
            _VIEWS.clear()
        _VIEWS[id(peers)] = (peers, view)
    return view


def fields(*parts: bytes) -> bytes:
    """An unambiguous encoding of ``parts``: each length-prefixed (4 bytes, little-endian)."""
    return b"".join(struct.pack("<I", len(p)) + p for p in parts)


def transcript(session: str, algorithm: str, terms: SecureTerms, peers: Sequence[PeerKey]) -> bytes:
    """SHA-256 of everything the owners must agree on: the protocol, session, query kind, s, t,
    K and every (name, key) in name order (32 bytes). Memoised per key list (``_TRANSCRIPTS``)."""
    memo = (session, algorithm, terms, id(peers))
    kept = _TRANSCRIPTS.get(memo)
    if kept is not None and kept[0] is peers:
        return kept[1]
    digest = _transcript(session, algorithm, terms, peers)
    if isinstance(peers, tuple):  # immutable: safe to remember by identity
        if len(_TRANSCRIPTS) >= 64:
            _TRANSCRIPTS.clear()
        _TRANSCRIPTS[memo] = (peers, digest)
    return digest


#: ``transcript`` by (session, kind, terms, key list identity): the owners of a host hash K keys
#: once per kind, not once each.
_TRANSCRIPTS: dict[tuple[str, str, SecureTerms, int], tuple[Sequence[PeerKey], bytes]] = {}


def _transcript(
    session: str, algorithm: str, terms: SecureTerms, peers: Sequence[PeerKey]
) -> bytes:
    ordered = sorted(peers, key=lambda p: p.owner)
    parts = [
        PROTOCOL,
        session.encode(),
        algorithm.encode(),
        struct.pack("<dqq", terms.total_noise_sd, terms.colluders, terms.owners),
    ]
    for p in ordered:
        parts += [p.owner.encode(), p.public_key]
    return hashlib.sha256(fields(*parts)).digest()


#: The label that stands for the query kind in the masking graph's seed: one graph a session.
GRAPH_LABEL = "\x00masking graph"


def masking_graph(session: str, terms: SecureTerms, peers: Sequence[PeerKey]) -> MaskGraph:
    """The session's masking graph (``mask_graph.MaskGraph``, owners in name order). A sparse
    graph's ring order is seeded by ``graph_seed`` — the transcript under ``GRAPH_LABEL`` and
    every owner's revealed share — so every owner derives it, and its own neighbours, from what
    it was shown, and all kinds of a session share it; the complete graph needs no seed
    (docs/design.md §2.6, "The masking graph")."""
    names = sorted(p.owner for p in peers)
    sparse = graph_degree(len(names), terms.colluders)[0] < len(names) - 1
    seed = graph_seed(session, terms, peers) if sparse else b""
    return MaskGraph.of(seed, names, terms.colluders)


# --------------------------------------------------------------------------- the graph's seed


def graph_share(key: X25519PrivateKey, session: str) -> bytes:
    """An owner's 32-byte share of ``session``'s graph seed: HMAC-SHA256 keyed by its session
    private key, so a restarted owner reveals the same share and nobody else can predict it."""
    secret = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return hmac.digest(secret, fields(PROTOCOL, b"graph share", session.encode()), "sha256")


def graph_commitment(session: str, owner: str, public_key: bytes, share: bytes) -> bytes:
    """SHA-256 commitment of ``owner`` to its ``share`` (and its ``public_key``) in ``session``."""
    parts = (PROTOCOL, b"graph commitment", session.encode(), owner.encode(), public_key, share)
    return hashlib.sha256(fields(*parts)).digest()


def revealed_key(owner: str, key: X25519PrivateKey, session: str) -> PeerKey:
    """``owner``'s public key for ``session`` from its private ``key``, with its commitment and
    its share (``graph_share``) revealed."""
    public, share = public_bytes(key), graph_share(key, session)
    commitment = graph_commitment(session, owner, public, share)
    return PeerKey(owner, public, commitment=commitment, share=share)


def commitments_digest(session: str, peers: Sequence[PeerKey]) -> bytes:
    """SHA-256 of ``session`` and every (name, key, commitment) in name order: what an owner
    binds before it reveals its share (``reveal.reveal_shares``)."""
    parts = [PROTOCOL, b"commitments", session.encode()]
    for p in sorted(peers, key=lambda p: p.owner):
        parts += [p.owner.encode(), p.public_key, p.commitment]
    return hashlib.sha256(fields(*parts)).digest()


def check_shares(session: str, peers: Sequence[PeerKey], owner: str | None = None) -> None:
    """``InvalidRequest`` (naming the peer; ``owner``: who refuses) unless every peer revealed
    a share that matches its commitment."""
    for p in peers:
        if len(p.commitment) != SHARE_BYTES or len(p.share) != SHARE_BYTES:
            raise InvalidRequest(
                f"peer {p.owner!r} has no {SHARE_BYTES}-byte graph commitment and revealed "
                "share: a sparse masking graph needs every owner's (docs/design.md §2.6)",
                owner,
            )
        if graph_commitment(session, p.owner, p.public_key, p.share) != p.commitment:
            raise InvalidRequest(
                f"the graph share revealed for peer {p.owner!r} does not match its commitment",
                owner,
            )


def graph_seed(session: str, terms: SecureTerms, peers: Sequence[PeerKey]) -> bytes:
    """SHA-256 of the transcript under ``GRAPH_LABEL`` (session, s, t, K, every (name, key)),
    the commitments and every revealed share in name order; ``InvalidRequest`` for a missing
    or mismatched share (``check_shares``). Uniform while one owner's share is unknown to the
    others when they commit."""
    check_shares(session, peers)
    shares = [p.share for p in sorted(peers, key=lambda p: p.owner)]
    digest = transcript(session, GRAPH_LABEL, terms, peers)
    return hashlib.sha256(fields(digest, commitments_digest(session, peers), *shares)).digest()


def lattice_step(terms: SecureTerms) -> float:
    """The session's lattice step γ, shared by every owner: a power of two 2²⁰ to 2²¹ times
    below each owner's noise sd s/√(K − t) (docs/design.md §2.7)."""
    exponent = math.frexp(terms.owner_noise_sd)[1] - 1  # ⌊log₂ sd⌋
    return 2.0 ** (exponent - LATTICE_BITS)


# --------------------------------------------------------------------------- pair secrets


def pair_secrets(
    hosted: dict[int, X25519PrivateKey],
    peers: Sequence[PeerKey],
    digest: bytes,
    exchanged: dict[tuple[int, int], bytes] | None = None,
    graph: MaskGraph | None = None,
) -> tuple[np.ndarray, np.ndarray, list[bytes]]:
    """The pairs (low, high) ``(P,)`` of positions in ``peers`` (name order) that are edges of
    the masking ``graph`` (None: the complete graph) with at least one end hosted (``hosted``:
    position → its private key), and each pair's 32-byte secret HKDF-SHA256(X25519, salt =
    ``digest``, info = both names). One exchange per pair, also when both ends are hosted;
    ``exchanged`` (pair → X25519 output) keeps them for the other kinds of a session of several
    kinds, whose transcripts (``digest``) differ. ``InvalidRequest`` for a peer key X25519
    refuses."""
    exchanged = {} if exchanged is None else exchanged
    graph = graph if graph is not None else MaskGraph(len(peers), len(peers) - 1, 0.0, None)
    low, high = graph.pairs(np.array(sorted(hosted), dtype=np.int64))
    publics: dict[int, X25519PublicKey] = {}
    secrets: list[bytes] = []
    for a, b in zip(low.tolist(), high.tolist()):
        shared = exchanged.get((a, b))
        if shared is None:
            shared = exchanged[(a, b)] = _exchange(hosted, peers, a, b, publics)
        info = fields(peers[a].owner.encode(), peers[b].owner.encode())
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=digest, info=info)
        secrets.append(hkdf.derive(shared))
    return low, high, secrets


def _exchange(
    hosted: dict[int, X25519PrivateKey],
    peers: Sequence[PeerKey],
    a: int,
    b: int,
    publics: dict[int, X25519PublicKey],
) -> bytes:
    """X25519 of pair (a, b)'s hosted end's private key and the other end's public key
    (``publics``: the peers' keys decoded so far); ``InvalidRequest`` for an unusable key."""
    mine, other = (a, b) if a in hosted else (b, a)
    try:
        if other not in publics:
            publics[other] = X25519PublicKey.from_public_bytes(peers[other].public_key)
        return hosted[mine].exchange(publics[other])
    except ValueError as exc:
        raise InvalidRequest(
            f"the public key of peer {peers[other].owner!r} is unusable ({exc})",
            peers[mine].owner,
        ) from None


# --------------------------------------------------------------------------- mask words


class ChaChaMasks:
    """Mask words of pairs from ChaCha20 keystream under each pair's subkey, HMAC-SHA256 of the
    pair secret over (protocol, "mask", session, query kind).

    Layout: the 12-byte nonce is iteration (8 bytes) ‖ chain // 2¹⁶ (4 bytes); the 32-bit block
    counter is (chain mod 2¹⁶)·B + block, B = ⌈count/8⌉ blocks of 8 words a key. So one cipher
    call per (pair, iteration, run of nearby chains) yields every chain's words, and every
    (pair, session, kind, chain, iteration, word) has its own keystream position (no reuse).
    """

    #: chains that share a nonce; a run of chains further apart than ``GAP`` gets its own call
    SPAN, GAP = 1 << 16, 8

    def __init__(self, secrets: Sequence[bytes], session: str, kind: str):
        label = fields(PROTOCOL, b"mask", session.encode(), kind.encode())
        self._subkeys = [hmac.digest(secret, label, "sha256") for secret in secrets]

    def words(
        self, pairs: np.ndarray, chains: np.ndarray, iterations: np.ndarray, count: int
    ) -> np.ndarray:
        """``(P, M, count)`` uint64 words of each of ``pairs`` ``(P,)`` at each key
        (chains[j], iterations[j]) ``(M,)``."""
        blocks = -(-count // 8)
        if blocks * self.SPAN > 2**32:
            raise ValueError(f"masks of {count} words a key exceed ChaCha20's block counter")
        out = np.empty((pairs.size, chains.size, count), dtype=_U64)
        subkeys = [self._subkeys[p] for p in pairs.tolist()]
        for keys, nonce, first, span in self._runs(chains, iterations):
            start = struct.pack("<I", first * blocks) + nonce
            zeros = bytes(64 * blocks * span)
            streams = b"".join(
                Cipher(algorithms.ChaCha20(k, start), None).encryptor().update(zeros)
                for k in subkeys
            )
            words = np.frombuffer(streams, dtype="<u8").reshape(pairs.size, span, 8 * blocks)
            out[:, keys] = words[:, chains[keys] % self.SPAN - first, :count]
        return out

    def _runs(self, chains: np.ndarray, iterations: np.ndarray):
        """(key indices, nonce, first chain mod 2¹⁶, chains spanned) of each run of keys that
        share an iteration and a nonce and lie at most ``GAP`` chains apart."""
        order = np.lexsort((chains, iterations))
        it, ch = iterations[order], chains[order]
        high = ch // self.SPAN
        cut = np.r_[True, (it[1:] != it[:-1]) | (high[1:] != high[:-1]) | (np.diff(ch) > self.GAP)]
        bounds = np.r_[np.flatnonzero(cut), order.size]
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            nonce = struct.pack("<QI", int(it[lo]), int(high[lo]))
            first = int(ch[lo] % self.SPAN)
            yield order[lo:hi], nonce, first, int(ch[hi - 1] % self.SPAN) - first + 1


class MixMasks:
    """SIMULATION ONLY: mask words from a SplitMix64 mixer keyed by each pair secret's first 16
    bytes — vectorised over pairs and keys, much faster than a ChaCha20 call per pair, and not
    a cryptographic function. Only for simulated owners, whose seeds one user holds anyway."""

    def __init__(self, secrets: Sequence[bytes]):
        raw = b"".join(s[:16] for s in secrets)
        self._keys = np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(_U64)

    def words(
        self, pairs: np.ndarray, chains: np.ndarray, iterations: np.ndarray, count: int
    ) -> np.ndarray:
        """``(P, M, count)`` uint64 words of each of ``pairs`` ``(P,)`` at each key
        (chains[j], iterations[j]) ``(M,)`` (``keyed_words``)."""
        return keyed_words(self._keys[pairs], chains, iterations, count)


@dataclass(frozen=True)
class _Sums:
    """How to add pair words into owners' rows: sort the pairs by ``order`` (None: they are in
    order already), reduce runs that start at ``starts``, each run belonging to row ``rows``."""

    order: np.ndarray | None
    starts: np.ndarray
    rows: np.ndarray

    @classmethod
    def of(cls, rows: np.ndarray) -> _Sums:
        """The plan for pair ends in ``rows`` ``(P,)`` (−1: not among the rows asked for)."""
        order = np.argsort(rows, kind="stable")
        order = order[rows[order] >= 0]
        ordered = rows[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if order.size else order
        in_place = order.size == rows.size and bool(np.all(order == np.arange(rows.size)))
        return cls(None if in_place else order, starts, ordered[starts])

    def apply(self, out: np.ndarray, words: np.ndarray, add: bool) -> None:
        """``out[row] ±= Σ words`` of each row's pairs, mod 2⁶⁴."""
        if self.rows.size == 0:
            return
        ordered = words if self.order is None else words[self.order]
        sums = np.add.reduceat(ordered, self.starts, axis=0)
        if add:
            out[self.rows] += sums
        else:
            out[self.rows] -= sums


# --------------------------------------------------------------------------- one session


class SecureSession:
    """One secure session at one host: its terms, lattice step, the hosted owners' pairs and
    their mask words.

    ``hosted``: (name, private key) of each hosted owner, in host order; ``peers``: every
    participant's key; ``simulation``: SplitMix64 masks instead of ChaCha20 (``MixMasks``).
    ``algorithm``: the query kind, bound into the transcript that salts every pair secret, so
    the kinds of a session of several kinds mask with unrelated words; ``exchanged``: their
    shared X25519 outputs (``pair_secrets``).
    """

    def __init__(
        self,
        session: str,
        algorithm: str,
        terms: SecureTerms,
        peers: Sequence[PeerKey],
        hosted: Sequence[tuple[str, X25519PrivateKey]],
        simulation: bool = False,
        exchanged: dict[tuple[int, int], bytes] | None = None,
    ):
        self.terms = terms
        self.gamma = lattice_step(terms)
        self.digest = transcript(session, algorithm, terms, peers)
        ordered = sorted(peers, key=lambda p: p.owner)
        position = {p.owner: i for i, p in enumerate(ordered)}
        keys = {position[name]: key for name, key in hosted}
        self.graph = masking_graph(session, terms, peers)
        low, high, secrets = pair_secrets(keys, ordered, self.digest, exchanged, self.graph)
        row = np.full(len(ordered), -1, dtype=np.int64)
        row[[position[name] for name, _ in hosted]] = np.arange(len(hosted))
        self._low, self._high = row[low], row[high]  # host index of each end (−1: elsewhere)
        self._hosted = len(hosted)
        self._masks = MixMasks(secrets) if simulation else ChaChaMasks(secrets, session, algorithm)
        self._every = self._plan(np.arange(self._hosted))
        self._secrets, self._session, self._algorithm = secrets, session, algorithm
        self._simulation = simulation
        self._at_substep: dict[int, ChaChaMasks | MixMasks] = {0: self._masks}

    def _masks_at(self, substep: int) -> ChaChaMasks | MixMasks:
        """The mask words of answers at ``substep``: sub-step 0's as before; any other's under
        a label of its own (the session and the sub-step), so that no mask word ever covers
        two answers of one (chain, iteration) — two answers masked alike would give away the
        difference of a host's answers (docs/design.md §2.6)."""
        masks = self._at_substep.get(substep)
        if masks is None:
            label = f"{self._session}\x00substep {substep}"
            if self._simulation:
                keyed = [hmac.digest(s, label.encode(), "sha256") for s in self._secrets]
                masks = MixMasks(keyed)
            else:
                masks = ChaChaMasks(self._secrets, label, self._algorithm)
            self._at_substep[substep] = masks
        return masks

    def _plan(self, owners: np.ndarray) -> tuple[np.ndarray, _Sums, _Sums]:
        """The pairs touching hosted ``owners`` ``(K',)`` and how their words add into the rows
        of ``owners`` (+ as the pair's first end, − as its second)."""
        row = np.full(self._hosted, -1, dtype=np.int64)
        row[owners] = np.arange(owners.size)
        low = np.where(self._low >= 0, row[self._low], -1)
        high = np.where(self._high >= 0, row[self._high], -1)
        pairs = np.flatnonzero((low >= 0) | (high >= 0))
        return pairs, _Sums.of(low[pairs]), _Sums.of(high[pairs])

    def mask(
        self,
        multiples: np.ndarray,
        owners: np.ndarray,
        chains: np.ndarray,
        iterations: np.ndarray,
        substep: int = 0,
    ) -> np.ndarray:
        """Masked answers ``(K', M, w + 1)`` uint64 of hosted ``owners`` ``(K',)`` from their
        noisy lattice multiples ``(K', M, w)`` int64 at keys (chains[j], iterations[j]) of
        ``substep``: each value plus its masks mod 2⁶⁴, and last the check word (0 plus the
        masks)."""
        n_owners, n_keys, width = multiples.shape
        out = np.zeros((n_owners, n_keys, width + 1), dtype=_U64)
        out[:, :, :width] = multiples.astype(np.int64).view(_U64)
        every = n_owners == self._hosted and np.array_equal(owners, np.arange(n_owners))
        pairs, low, high = self._every if every else self._plan(owners)
        if pairs.size == 0:  # a lone owner: nothing to mask with
            return out
        masks = self._masks_at(substep)
        step = max(1, MASK_CHUNK // (pairs.size * (width + 1)))
        for first in range(0, n_keys, step):
            keys = slice(first, min(first + step, n_keys))
            words = masks.words(pairs, chains[keys], iterations[keys], width + 1)
            block = out[:, keys]  # a view: the sums are written into ``out``
            low.apply(block, words, add=True)
            high.apply(block, words, add=False)
        return out

    def reply(self, masked: np.ndarray, shape: tuple[int, ...], scale: float = 1.0) -> Reply:
        """The host's reply from every hosted owner's masked answers ``(K, M, w + 1)``: their
        sum mod 2⁶⁴ with the answers reshaped to ``(1, *shape)``; ``scale``: the answer unit
        (gradients: the clip), which scales the noise sd and the lattice step."""
        total = masked.sum(axis=0, dtype=_U64)
        return Reply(
            total[:, :-1].reshape(1, *shape),
            np.full(self._hosted, self.terms.owner_noise_sd * scale),
            self.gamma * scaled_step(scale),
            total[None, :, -1],
        )


def scaled_step(scale: float) -> float:
    """The factor 2^⌊log₂ scale⌋ by which an answer unit ``scale`` (gradients: the clip)
    multiplies a lattice step (docs/design.md §2.7)."""
    return 2.0 ** (math.frexp(scale)[1] - 1)
