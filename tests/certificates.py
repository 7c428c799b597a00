"""A test CA and the certificates it signs (ECDSA P-256, valid for one day), as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer_cert: x509.Certificate | None = None,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
    ca: bool = False,
    dns: tuple[str, ...] = (),
    owners: tuple[str, ...] = (),
) -> x509.Certificate:
    """A certificate with common name ``subject`` for ``key``: a self-signed CA with ``ca``,
    else signed by the issuer, with SANs IP 127.0.0.1, the DNS names ``dns`` and the owner
    identities ``owners`` (URIs urn:fedpenalty:owner:<name>, secure-aggregation peers)."""
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_cert.subject if issuer_cert else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        sans += [x509.DNSName(d) for d in dns]
        sans += [x509.UniformResourceIdentifier(f"urn:fedpenalty:owner:{o}") for o in owners]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def write(folder: Path, stem: str, cert: x509.Certificate, key) -> tuple[Path, Path]:
    """``stem``.crt and ``stem``.key (unencrypted PKCS#8) in ``folder``."""
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class TestCA:
    """A CA in ``folder`` (``ca.crt``) that issues leaf certificates and their keys."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: Path, name: str = "fedpenalty test CA"):
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = issue(name, self.key, ca=True)
        self.path, _ = write(folder, "ca", self.cert, self.key)

    def leaf(
        self, stem: str, subject: str, dns: tuple[str, ...] = (), owners: tuple[str, ...] = ()
    ) -> tuple[Path, Path]:
        """``stem``.crt/.key for common name ``subject``, SAN DNS names ``dns`` and owner
        identities ``owners``."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue(subject, key, self.cert, self.key, dns=dns, owners=owners)
        return write(self.folder, stem, cert, key)
