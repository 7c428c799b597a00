"""Authenticated peer keys for secure aggregation (docs/design.md §2.6).

Session keys travel through the coordinator, which could otherwise swap them or invent owners.
An owner server configured with ``server.allowed_peers`` (OWNER.toml) therefore

* signs each of its owners' session keys with its TLS private key and attaches its TLS
  certificate (``PeerAuth.sign``), and
* accepts a secure session only when every other owner's key carries a certificate issued by
  ``server.peer_ca``, valid now, naming (SAN DNS name or subject CN) an entry of
  ``allowed_peers``, whose key signed (protocol, session, owner name, public key)
  (``PeerAuth.check``).

What this authenticates: that each relayed key belongs to a server holding a certificate the
owner allows, for this session and this owner name. What it does not: how many owners one
allowed server hosts (a server that serves several owners vouches for all of them, so a
dishonest allowed server can invent owners, which then count as colluders), and anything
about peers' behaviour (an honest-but-curious model: allowed peers follow the protocol).
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
from cryptography.x509.oid import NameOID

from ..errors import ConfigError, NotPermitted
from .aggregation import PROTOCOL, PeerKey, fields


def _message(session: str, key: PeerKey) -> bytes:
    return fields(PROTOCOL, b"peer-key", session.encode(), key.owner.encode(), key.public_key)


def certificate_names(cert: x509.Certificate) -> list[str]:
    """The SAN DNS names and the subject CN of ``cert``."""
    names: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names += san.value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        pass
    names += [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return names


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
    accepts: certificates issued by ``ca`` that name one of ``allowed``."""

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

    def sign(self, session: str, key: PeerKey) -> PeerKey:
        """``key`` with this server's signature over (protocol, session, owner, public key)."""
        signature = _sign(self.key, _message(session, key))
        return replace(key, signature=signature, certificate=self.certificate)

    def check(self, session: str, peers: Sequence[PeerKey], hosted: Sequence[str]) -> None:
        """``NotPermitted`` unless every peer key not of a ``hosted`` owner is signed under a
        certificate from the peer CA, valid now, that names an allowed peer."""
        for peer in peers:
            if peer.owner not in hosted:
                self._check_one(session, peer)

    def _check_one(self, session: str, peer: PeerKey) -> None:
        what = f"the session key of peer {peer.owner!r}"
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
        names = certificate_names(cert)
        folded = {n.casefold() for n in names}
        if not any(entry.casefold() in folded for entry in self.allowed):
            raise NotPermitted(
                f"{what} is vouched for by a certificate naming {names}, none of them in this "
                "owner's server.allowed_peers"
            )
        try:
            _verify(cert.public_key(), peer.signature, _message(session, peer))
        except (InvalidSignature, TypeError):
            raise NotPermitted(f"{what} is not signed by its certificate's key") from None
