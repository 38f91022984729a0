"""TLS to the servers the game talks to: which connections are encrypted and verified, and why one failed.

A ``rediss://`` URL alone is not enough. Kombu (the broker) falls back to encryption *without* checking the server's
certificate when the URL says nothing more (it logs "defaulting to insecure SSL behaviour" and connects), and
Celery's Redis result store refuses to start. So every ``rediss://`` URL gets redis-py's standard query, which all
three read: ``ssl_cert_reqs=required`` unless the operator wrote another value, and the CA file and client
certificate from the settings (``ANIMEGAMER_REDIS_CA_FILE``, ``..._CERT_FILE``, ``..._KEY_FILE``). Nothing imports
a client library here.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


def with_redis_tls(url: str, ca_file: Path | None, cert_file: Path | None, key_file: Path | None) -> str:
    """A ``rediss://`` URL with the TLS query every client reads; a value already in the URL wins. Other URLs are
    returned as they are."""
    if not url.startswith("rediss://"):
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    wanted = {
        "ssl_cert_reqs": "required",
        "ssl_ca_certs": ca_file,
        "ssl_certfile": cert_file,
        "ssl_keyfile": key_file,
    }
    for key, value in wanted.items():
        if value is not None and key not in query:
            query[key] = str(value)
    return urlunsplit(parts._replace(query=urlencode(query)))


def with_database_ca(url: str, ca_file: Path) -> str:
    """A PostgreSQL URL that verifies the server against ``ca_file``: libpq's ``sslrootcert``, and
    ``sslmode=verify-full`` unless the URL names a mode (db/engine.py turns both into asyncpg's ``ssl``). Other URLs
    are returned as they are."""
    if not url.startswith("postgresql"):
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "sslmode" not in query and "ssl" not in query:
        query["sslmode"] = "verify-full"
    query.setdefault("sslrootcert", str(ca_file))
    return urlunsplit(parts._replace(query=urlencode(query)))


@dataclass(frozen=True)
class Transport:
    """How a connection travels: what ``animegamer check`` says of each server."""

    encrypted: bool
    verified: bool

    def said(self) -> str:
        if not self.encrypted:
            return "plain text"
        return "TLS, certificate verified" if self.verified else "TLS, certificate NOT verified"


def redis_transport(url: str) -> Transport:
    if not url.startswith("rediss://"):
        return Transport(encrypted=False, verified=False)
    reqs = dict(parse_qsl(urlsplit(url).query)).get("ssl_cert_reqs", "required")
    return Transport(encrypted=True, verified=reqs.lower() in ("required", "cert_required"))


def postgres_transport(url: str) -> Transport:
    """asyncpg's ``ssl``/``sslmode``: verify-full checks the certificate and the host name, verify-ca the certificate;
    require encrypts without checking; prefer (the default) may not even encrypt."""
    query = dict(parse_qsl(urlsplit(url).query))
    mode = (query.get("sslmode") or query.get("ssl") or "prefer").lower()
    return Transport(encrypted=mode in ("require", "verify-ca", "verify-full"), verified=mode.startswith("verify"))


def public_host(url: str) -> bool:
    """Whether ``url``'s host may be reached across networks nobody here owns: any address that is not loopback,
    private or link-local, and any dotted name (a one-word name is a compose or Kubernetes service)."""
    host = urlsplit(url).hostname or ""
    if not host or host == "localhost":
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." in host and not host.endswith((".local", ".internal", ".svc", ".cluster.local", ".localhost"))
    return address.is_global


@dataclass(frozen=True)
class TlsProblem:
    said: str  # what went wrong, for after "refused: "
    fix: str


UNTRUSTED_FIX = "give the CA that signed its certificate in ANIMEGAMER_REDIS_CA_FILE, or renew the certificate"
HANDSHAKE_FIX = (
    "give a client certificate the server accepts (ANIMEGAMER_REDIS_CERT_FILE and ANIMEGAMER_REDIS_KEY_FILE), "
    "and check that the port speaks TLS"
)


def certificate_problem(exc: BaseException) -> TlsProblem | None:
    """What a TLS failure was, where ``exc`` (or what it wraps) is one: a certificate that did not verify, or a
    handshake that failed (a client certificate refused, a port that speaks plain text); None for any other failure."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if isinstance(seen, ssl.SSLCertVerificationError) or "certificate verify failed" in text.lower():
            return TlsProblem(f"its certificate did not verify ({_reason(text)})", UNTRUSTED_FIX)
        if isinstance(seen, ssl.SSLError) or "[SSL" in text:
            return TlsProblem(f"the TLS handshake failed ({_reason(text)})", HANDSHAKE_FIX)
        seen = seen.__cause__ or seen.__context__
    return None


def _reason(text: str) -> str:
    """The part of OpenSSL's message a person reads: after the last colon of '[SSL: X] reason (_ssl.c:1006)'."""
    reason = text.split("] ")[-1].split(" (_ssl.c")[0].strip().removesuffix(".").removesuffix(")")
    reason = reason.split(" (_ssl.c")[0].removeprefix("certificate verify failed: ")
    return reason or text
