"""The TLS settings of a daemon: all three files or none, and a missing file named.

Certificates themselves (a wrong key, another CA) are checked in tests/net/test_tls.py, which
makes them with the openssl command.
"""

from __future__ import annotations

import pytest

from hoplite_client.net.tls import TlsFiles, load, tls_files
from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.config import DaemonConfig

C, K, A = "node.pem", "node.key", "ca.pem"


@pytest.mark.parametrize(("cert", "key", "ca", "missing"), [
    (None, None, None, None),
    (C, K, A, None),
    (C, None, None, "--tls-key, --tls-ca"),
    (None, K, None, "--tls-cert, --tls-ca"),
    (None, None, A, "--tls-cert, --tls-key"),
    (C, K, None, "--tls-ca"),
    (C, None, A, "--tls-key"),
    (None, K, A, "--tls-cert"),
])
def test_all_three_tls_files_or_none(cert, key, ca, missing) -> None:
    """check() refuses one or two of the files and names the missing ones; it reads none."""
    config = DaemonConfig(token=b"t", tls_cert=cert, tls_key=key, tls_ca=ca)
    if missing is None:
        config.check()
        assert config.tls_files == (None if cert is None else TlsFiles(C, K, A))
    else:
        with pytest.raises(InvalidArgumentError, match=f"missing {missing}$"):
            config.check()


def test_no_tls_files_means_plain_tcp() -> None:
    assert tls_files(None, None, None) is None
    assert DaemonConfig().tls_contexts() is None


@pytest.mark.parametrize("absent", ["cert", "key", "ca"])
def test_a_missing_file_is_named(tmp_path, absent: str) -> None:
    """The first unreadable file is named with its flag, before anything is parsed."""
    paths = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca")}
    for name, path in paths.items():
        if name != absent:
            path.write_text("")
    files = TlsFiles(str(paths["cert"]), str(paths["key"]), str(paths["ca"]))
    with pytest.raises(InvalidArgumentError, match=f"--tls-{absent} {paths[absent]}: no such"):
        load(files)
