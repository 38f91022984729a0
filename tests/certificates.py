"""Certificates a test makes for its own TLS servers: a CA, a server certificate for 127.0.0.1 and localhost signed by
it, a client certificate, and the ways they go wrong (another CA, an expired certificate).

EC keys (P-256): made in a millisecond, where RSA takes a tenth of a second each.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA's certificate: what a client is given to verify the server
    cert: Path  # the server's certificate and key
    key: Path
    client_cert: Path  # a client's, signed by the same CA (for a server that asks for one)
    client_key: Path


def make_certificates(folder: Path, *, expired: bool = False, addresses: tuple[str, ...] = ()) -> Certificates:
    """A CA and certificates signed by it, written under ``folder``; ``expired``: the server's ended yesterday;
    ``addresses``: the server's addresses besides 127.0.0.1 (a network namespace's side of a veth pair)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca(folder.name)
    now = dt.datetime.now(dt.UTC)
    server_key, server = _signed(
        ca_key, ca, "server", ExtendedKeyUsageOID.SERVER_AUTH, now - 2 * DAY if expired else now, addresses
    )
    client_key, client = _signed(ca_key, ca, "client", ExtendedKeyUsageOID.CLIENT_AUTH, now, ())
    paths = Certificates(
        *(folder / name for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key"))
    )
    _write(paths.ca, ca)
    _write(paths.cert, server, paths.key, server_key)
    _write(paths.client_cert, client, paths.client_key, client_key)
    return paths


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"test CA {common}"))
        .issuer_name(_name(f"test CA {common}"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 30 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(*[False] * 5, True, True, False, False), critical=True)  # cert and CRL signing
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _signed(
    ca_key: ec.EllipticCurvePrivateKey,
    ca: x509.Certificate,
    common: str,
    usage: x509.ObjectIdentifier,
    start: dt.datetime,
    addresses: tuple[str, ...],
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate valid from a day before ``start`` to a day after it, for 127.0.0.1, localhost and
    ``addresses``."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        *(x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", *addresses)),
        x509.DNSName("localhost"),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - DAY)
        .not_valid_after(start + DAY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _write(
    cert_path: Path, cert: x509.Certificate, key_path: Path | None = None, key: ec.EllipticCurvePrivateKey | None = None
) -> None:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key_path is not None and key is not None:
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key_path.chmod(0o600)
