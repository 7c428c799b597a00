"""Certificates for mutual TLS and owner identities (ECDSA P-256, with the ``cryptography``
package): a certificate authority and the leaf certificates it signs, written as PEM files.

A leaf's subject alternative names (SAN) name the party: the DNS names and IP addresses a
client dials (an owner's server) or that an owner lists in ``server.allowed_clients`` (the
coordinator), and, for secure aggregation, the owner identities its server vouches for (URIs
``urn:fedpenalty:owner:<name>``, ``owner.peer_auth``). ``fedpenalty init`` and the tests make
their certificates here; a real study's parties make their own keys (README, "Deploying
owners on separate machines").
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .owner.peer_auth import OWNER_URI

#: Seconds before now a certificate becomes valid (clocks of one machine's processes agree;
#: a few minutes absorb the skew between machines).
BACKDATE = datetime.timedelta(minutes=5)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer_cert: x509.Certificate | None = None,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
    *,
    ca: bool = False,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    owners: Sequence[str] = (),
    days: float = 365.0,
) -> x509.Certificate:
    """A certificate with common name ``subject`` for ``key``, valid for ``days``: a
    self-signed CA with ``ca``, else signed by the issuer, with SANs the DNS names ``dns``, the
    IP addresses ``ips`` and the owner identities ``owners``."""
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    signer = issuer_key or key
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
    )
    if ca:
        signs = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        builder = builder.add_extension(signs, critical=True)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.UniformResourceIdentifier(f"{OWNER_URI}{o}") for o in owners]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signer, hashes.SHA256())


def write(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    """``stem``.crt and ``stem``.key (unencrypted PKCS#8, readable by its owner only: 0600) in
    ``folder``."""
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
        f.write(pem)
    return cert_path, key_path


class CertificateAuthority:
    """A CA in ``folder`` (``ca.crt``, and its key ``ca.key``) that issues leaf certificates
    and their keys, each valid for ``days``."""

    def __init__(self, folder: Path, name: str = "fedpenalty CA", days: float = 365.0):
        self.folder, self.days = folder, days
        self.key = new_key()
        self.cert = issue(name, self.key, ca=True, days=days)
        self.path, _ = write(folder, "ca", self.cert, self.key)

    def leaf(
        self,
        stem: str,
        subject: str,
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
        owners: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """``stem``.crt/.key for common name ``subject``, SAN DNS names ``dns``, IP addresses
        ``ips`` and owner identities ``owners``."""
        key = new_key()
        cert = issue(
            subject, key, self.cert, self.key, dns=dns, ips=ips, owners=owners, days=self.days
        )
        return write(self.folder, stem, cert, key)
