"""An owner whose TLS certificate does not name the address the coordinator dials.

gRPC reports it as a transport failure ("Hostname Verification Check failed"), which the
oracle would retry for ``run.retry_seconds`` and then call the owner unreachable; no retry can
help, so the oracle says at once what it is. The names come from the owner's certificate,
read in one TLS handshake of our own (``certificate_names``): it is not verified — gRPC's
handshake already did that, and failed only on the name — and is used for the message alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from cryptography import x509
from cryptography.x509.oid import NameOID

from ..owner.owner_config import TlsFiles

#: What gRPC's failure says when the certificate does not name the target (gRPC ≥ 1.60, and
#: the wording of older releases).
MISMATCH_MARKS = ("Hostname Verification Check failed", "is not in peer certificate")
#: Seconds the handshake that reads the owner's certificate may take.
READ_SECONDS = 5.0


def is_name_mismatch(details: str | None) -> bool:
    """gRPC's failure ``details`` say the owner's certificate does not name the target."""
    return any(mark in (details or "") for mark in MISMATCH_MARKS)


def names(cert: x509.Certificate) -> list[str]:
    """The names ``cert`` is for: its SAN DNS names and IP addresses, else its common name."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        found: list[str] = []
    else:
        found = san.get_values_for_type(x509.DNSName)
        found += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    if not found:
        found = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return found


async def certificate_names(address: str, tls: TlsFiles) -> list[str]:
    """The names of the certificate the owner at ``address`` (HOST:PORT) presents, read in a
    TLS handshake that presents ``tls``'s client certificate (owners ask for one)."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(tls.cert, tls.key)
    context.set_alpn_protocols(["h2"])
    async with asyncio.timeout(READ_SECONDS):
        _, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    return names(x509.load_der_x509_certificate(der))


async def mismatch_message(address: str, tls: TlsFiles) -> str:
    """One line: the owner at ``address`` has a certificate for other names, and what to do."""
    host, _, port = address.rpartition(":")
    fix = f"or give the owner a certificate that names {host} (a SAN DNS name or IP address)"
    try:
        found = await certificate_names(address, tls)
    except (OSError, ValueError) as exc:  # OSError: also ssl.SSLError and TimeoutError
        return (
            f"owner host {address}: its certificate does not name {host} (its names could not be "
            f"read: {exc or type(exc).__name__}); dial a name in the owner's certificate {fix}"
        )
    if not found:
        return f"owner host {address}: its certificate names no host; {fix.removeprefix('or ')}"
    return (
        f"owner host {address}: its certificate is for {', '.join(found)}, not {host}; dial the "
        f"name in the owner's certificate (--owners {found[0]}:{port}, a name that resolves to "
        f"the owner's machine) {fix}"
    )
