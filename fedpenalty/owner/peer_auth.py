"""Authenticated peer keys for secure aggregation (docs/design.md §2.6).

Session keys travel through the coordinator, which could otherwise swap them or invent owners
(whose answers it supplies itself, so their "noise" protects nobody). An owner server
configured with ``server.peer_ca`` and ``server.allowed_peers`` (OWNER.toml) therefore

* is itself named by its TLS certificate for every owner it serves: a SAN URI
  ``urn:fedpenalty:owner:<owner name>`` per owner (``OWNER_URI``), checked at start-up
  (``PeerAuth.check_hosted``);
* signs each of its owners' session keys (with their commitments to their shares of the
  masking graph's seed) with its TLS private key and attaches its TLS certificate
  (``PeerAuth.sign``); and
* accepts a secure session only when every other owner's key carries a certificate issued by
  ``server.peer_ca``, valid now, that names *that key's owner* (its ``urn:fedpenalty:owner:``
  URI), an owner listed in ``allowed_peers``, and whose key signed (protocol, session, owner
  name, public key, commitment) (``PeerAuth.check``). Names are distinct in a session, so K counts
  distinct authenticated owner identities.

What this authenticates: that each relayed key belongs to an owner identity the owner allows,
vouched for by a certificate its peer CA issued for that owner, for this session. A server can
vouch only for the owners its certificate names, so it cannot invent more. What it does not:
anything about peers' behaviour (an honest-but-curious model: allowed peers follow the
protocol), and whether the CA issues certificates carefully.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from ..errors import ConfigError, NotPermitted
from .aggregation import PROTOCOL, PeerKey, fields

#: The SAN URI by which a certificate names an owner identity: this prefix and the owner's name.
OWNER_URI = "urn:fedpenalty:owner:"


def _message(session: str, key: PeerKey) -> bytes:
    """What a server signs: the session, the owner, its key and its graph commitment."""
    parts = (session.encode(), key.owner.encode(), key.public_key, key.commitment)
    return fields(PROTOCOL, b"peer-key", *parts)


def owner_identities(cert: x509.Certificate) -> list[str]:
    """The owner names ``cert`` vouches for: its SAN URIs ``urn:fedpenalty:owner:<name>``."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    return [u.removeprefix(OWNER_URI) for u in uris if u.startswith(OWNER_URI) and u != OWNER_URI]


def _sign(key, message: bytes) -> bytes:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(message, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(message, padding.PKCS1v15(), hashes.SHA256())
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(message)
    raise ConfigError("server.tls_key must be an EC, RSA or Ed25519 key to sign peer keys")


def _verify(public, signature: bytes, message: bytes) -> None:
    """Raise ``InvalidSignature`` (or ``TypeError`` for a key type no peer signs with)."""
    if isinstance(public, ec.EllipticCurvePublicKey):
        public.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    elif isinstance(public, rsa.RSAPublicKey):
        public.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
    elif isinstance(public, ed25519.Ed25519PublicKey):
        public.verify(signature, message)
    else:
        raise TypeError(f"unsupported certificate key {type(public).__name__}")


@dataclass(frozen=True)
class PeerAuth:
    """An owner server's signing key and certificate (its TLS identity), and which peers it
    accepts: keys of the owners ``allowed`` (owner names), each vouched for by a certificate
    issued by ``ca`` that names that owner (SAN URI ``urn:fedpenalty:owner:<name>``)."""

    key: object
    certificate: bytes
    ca: x509.Certificate
    allowed: tuple[str, ...]

    @classmethod
    def load(cls, cert: Path, key: Path, peer_ca: Path, allowed: Sequence[str]) -> PeerAuth:
        """From PEM files; ``ConfigError`` naming the key when one cannot be read."""
        try:
            certificate = cert.read_bytes()
            private = serialization.load_pem_private_key(key.read_bytes(), password=None)
            ca = x509.load_pem_x509_certificate(peer_ca.read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load server.tls_key or server.peer_ca: {exc}") from exc
        return cls(private, certificate, ca, tuple(allowed))

    def check_hosted(self, hosted: Sequence[str]) -> None:
        """``ConfigError`` (naming the keys to fix) unless this server's certificate names every
        owner it serves and is issued by the peer CA: a server vouches only for the owners its
        certificate names."""
        cert = x509.load_pem_x509_certificate(self.certificate)
        named = owner_identities(cert)
        missing = [name for name in hosted if name not in named]
        if missing:
            raise ConfigError(
                f"server.tls_cert names the owners {named or '(none)'} (SAN URI "
                f"{OWNER_URI}<name>), not {', '.join(map(repr, missing))} that this server "
                "serves: its session keys would not be accepted; issue server.tls_cert with a "
                f"SAN URI {OWNER_URI}<name> for every owner it serves (or fix server.name)"
            )
        try:
            cert.verify_directly_issued_by(self.ca)
        except (ValueError, TypeError, InvalidSignature):
            raise ConfigError(
                "server.tls_cert is not issued by server.peer_ca: the other owners, trusting "
                "the same peer CA, would refuse its session keys"
            ) from None

    def sign(self, session: str, key: PeerKey) -> PeerKey:
        """``key`` with this server's signature over (protocol, session, owner, public key,
        commitment)."""
        signature = _sign(self.key, _message(session, key))
        return replace(key, signature=signature, certificate=self.certificate)

    def check(self, session: str, peers: Sequence[PeerKey], hosted: Sequence[str]) -> None:
        """``NotPermitted`` unless every peer key not of a ``hosted`` owner is signed under a
        certificate from the peer CA, valid now, naming that key's owner, an allowed one."""
        for peer in peers:
            if peer.owner not in hosted:
                self._check_one(session, peer)

    def _check_one(self, session: str, peer: PeerKey) -> None:
        what = f"the session key of peer {peer.owner!r}"
        if peer.owner not in self.allowed:
            raise NotPermitted(
                f"{what}: {peer.owner!r} is not in this owner's server.allowed_peers"
            )
        try:
            cert = x509.load_pem_x509_certificate(peer.certificate)
            cert.verify_directly_issued_by(self.ca)
        except (ValueError, TypeError, InvalidSignature):
            raise NotPermitted(
                f"{what} carries no certificate issued by this owner's server.peer_ca"
            ) from None
        now = datetime.datetime.now(datetime.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise NotPermitted(f"{what} carries an expired or not yet valid certificate")
        named = owner_identities(cert)
        if peer.owner not in named:
            raise NotPermitted(
                f"{what} is vouched for by a certificate naming the owners {named or '(none)'} "
                f"(SAN URI {OWNER_URI}<name>), not {peer.owner!r}"
            )
        try:
            _verify(cert.public_key(), peer.signature, _message(session, peer))
        except (InvalidSignature, TypeError):
            raise NotPermitted(f"{what} is not signed by its certificate's key") from None
