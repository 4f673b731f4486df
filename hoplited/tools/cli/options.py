"""Options shared by several ``hoplite`` commands: the TLS files of a cluster that uses TLS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from hoplite_client.net.tls import TlsFiles, tls_files
from hoplite_client.wire.errors import InvalidArgumentError

F = TypeVar("F", bound=Callable[..., Any])


def tls_options(fn: F) -> F:
    """``--tls-cert/--tls-key/--tls-ca`` (or $HOPLITE_TLS_CERT, _KEY, _CA): the files a tool
    dials a TLS cluster with, or a local cluster's daemons use (docs/security.md)."""
    for flag, what in reversed([("--tls-cert", "a certificate signed by the cluster CA (PEM)"),
                                ("--tls-key", "its private key (PEM, unencrypted)"),
                                ("--tls-ca", "the cluster's CA certificate (PEM)")]):
        envvar = "HOPLITE_" + flag.removeprefix("--").replace("-", "_").upper()
        fn = click.option(flag, default=None, metavar="FILE", envvar=envvar,
                          help=f"TLS: {what} [${envvar}].")(fn)
    return fn


def tls_from(cert: str | None, key: str | None, ca: str | None) -> TlsFiles | None:
    """The three files as :class:`TlsFiles` (None: plain TCP); one or two is a usage error."""
    try:
        return tls_files(cert, key, ca)
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
