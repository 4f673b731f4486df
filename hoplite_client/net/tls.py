"""TLS for TCP connections: mutual authentication against the cluster's private CA.

Optional (``--tls-cert/--tls-key/--tls-ca``): when given, every TCP connection a daemon
accepts or dials, and every tool's, runs over TLS, and the token handshake runs inside it.
Both sides present a certificate and require the other's to chain to the cluster CA, and
only to it (no system roots are loaded). Host names are not checked: peers are addressed
by IP and every holder of a CA-signed certificate is a member anyway, as is every holder
of the token (docs/security.md, "TLS on peer links").
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import NoReturn

from hoplite_client.wire.errors import InvalidArgumentError

# TLS 1.3 is negotiated whenever both ends have it (OpenSSL 1.1.1+); 1.2 is the floor because
# older versions have known breaks (RFC 8996 deprecates 1.0 and 1.1).
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
# Steps of the in-memory self-check (each side acts, then the buffers are swapped): a full
# TLS 1.3 or 1.2 handshake takes four; two more are slack.
SELF_CHECK_STEPS = 6

# OpenSSL's reasons for the usual mistakes, in an operator's words.
EXPLAINED = {
    "WRONG_VERSION_NUMBER": "the other side does not speak TLS (no --tls-cert/--tls-key/--tls-ca?)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the other side presented no certificate",
}


@dataclass(frozen=True)
class TlsFiles:
    """The three PEM files of one node: its certificate, its private key, the cluster CA."""

    cert: str
    key: str
    ca: str


@dataclass(frozen=True)
class TlsContexts:
    """The SSL contexts a node accepts (``server``) and dials (``client``) with."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def tls_files(cert: str | None, key: str | None, ca: str | None) -> TlsFiles | None:
    """The files if all three are given, None if none is; anything else is refused."""
    given = {"--tls-cert": cert, "--tls-key": key, "--tls-ca": ca}
    if all(v is None for v in given.values()):
        return None
    if cert is None or key is None or ca is None:
        missing = ", ".join(name for name, v in given.items() if v is None)
        raise InvalidArgumentError(f"TLS needs all of --tls-cert, --tls-key and --tls-ca; "
                                   f"missing {missing}")
    return TlsFiles(cert, key, ca)


def load(files: TlsFiles) -> TlsContexts:
    """Both contexts, after checking in memory that this node's certificate passes the checks
    its peers will make (signed by the CA, valid now, fit for client and server use)."""
    for flag, path in (("--tls-cert", files.cert), ("--tls-key", files.key),
                       ("--tls-ca", files.ca)):
        if not os.access(path, os.R_OK):
            reason = "no such file" if not os.path.exists(path) else "not readable"
            raise InvalidArgumentError(f"{flag} {path}: {reason}")
    contexts = TlsContexts(_context(files, server_side=True),
                           _context(files, server_side=False))
    _self_check(contexts, files)
    return contexts


def _context(files: TlsFiles, server_side: bool) -> ssl.SSLContext:
    protocol = ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = MINIMUM_VERSION
    ctx.verify_mode = ssl.CERT_REQUIRED  # the server side too: mutual authentication
    ctx.check_hostname = False  # CA-pinned instead (module docstring)
    try:
        ctx.load_verify_locations(cafile=files.ca)
    except ssl.SSLError as exc:
        _refuse("--tls-ca", files.ca, "no CA certificate in it", exc)
    try:  # alone first, so a bad certificate is not blamed on the key
        ssl.SSLContext(protocol).load_verify_locations(cafile=files.cert)
    except ssl.SSLError as exc:
        _refuse("--tls-cert", files.cert, "no certificate in it", exc)
    try:
        ctx.load_cert_chain(files.cert, files.key, password=lambda: _encrypted(files.key))
    except ssl.SSLError as exc:
        _refuse("--tls-key", files.key, f"not a private key of {files.cert}", exc)
    return ctx


def _encrypted(path: str) -> NoReturn:
    """Asked for the key's passphrase: refuse (OpenSSL would prompt on the terminal)."""
    raise InvalidArgumentError(f"--tls-key {path}: the key is encrypted; hoplite needs it "
                               f"unencrypted, readable by its user only")


def describe(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in a few words: the verification failure, else the error's reason
    (explained, for the usual mistakes)."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    reason = str(exc.reason or exc)
    explained = EXPLAINED.get(reason)
    return reason if explained is None else f"{reason}: {explained}"


def _refuse(flag: str, path: str, what: str, exc: ssl.SSLError) -> NoReturn:
    raise InvalidArgumentError(f"{flag} {path}: {what} ({describe(exc)})") from exc


def _self_check(contexts: TlsContexts, files: TlsFiles) -> None:
    """Handshake our client context with our server context through memory buffers."""
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    server = contexts.server.wrap_bio(pipes[0], pipes[1], server_side=True)
    client = contexts.client.wrap_bio(pipes[2], pipes[3], server_side=False)
    try:
        for _ in range(SELF_CHECK_STEPS):
            pending = False
            for side in (client, server):
                try:
                    side.do_handshake()
                except ssl.SSLWantReadError:
                    pending = True
            pipes[0].write(pipes[3].read())
            pipes[2].write(pipes[1].read())
            if not pending:
                return
    except ssl.SSLError as exc:
        _refuse("--tls-cert", files.cert, f"not accepted by --tls-ca {files.ca}", exc)
    raise InvalidArgumentError(f"--tls-cert {files.cert}: the TLS self-check did not finish")
