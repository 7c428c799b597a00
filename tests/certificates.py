"""A test CA and the certificates it signs, as PEM files (``fedpenalty.certificates``): valid
for one day, and every leaf names 127.0.0.1 (SAN IP), where the tests' owners serve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from fedpenalty import certificates
from fedpenalty.certificates import write

__all__ = ["TestCA", "issue", "write"]
LOOPBACK = ("127.0.0.1",)


def issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer_cert: x509.Certificate | None = None,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
    ca: bool = False,
    dns: tuple[str, ...] = (),
    owners: tuple[str, ...] = (),
) -> x509.Certificate:
    """``certificates.issue`` for a day; a leaf also names IP 127.0.0.1."""
    ips = () if ca else LOOPBACK
    return certificates.issue(
        subject, key, issuer_cert, issuer_key, ca=ca, dns=dns, ips=ips, owners=owners, days=1
    )


class TestCA(certificates.CertificateAuthority):
    """A CA in ``folder`` (``ca.crt``) that issues leaf certificates naming 127.0.0.1."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: Path, name: str = "fedpenalty test CA"):
        super().__init__(folder, name, days=1)

    def leaf(
        self,
        stem: str,
        subject: str,
        dns: Sequence[str] = (),
        ips: Sequence[str] = LOOPBACK,
        owners: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """``stem``.crt/.key for common name ``subject``, SAN DNS names ``dns``, IP addresses
        ``ips`` (default 127.0.0.1) and owner identities ``owners``."""
        return super().leaf(stem, subject, dns=dns, ips=ips, owners=owners)
