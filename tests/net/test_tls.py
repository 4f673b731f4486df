"""Mutual TLS on peer links: a TLS cluster moves objects and reduces; plaintext and foreign
certificates are refused with typed errors, in both directions, never by a hang.

Certificates are made per module with the ``openssl`` command (EC P-256, valid two days) in
a temporary directory that is removed afterwards: the cluster's CA and a node certificate,
and another CA with its own node certificate.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import uvloop
from helpers import CLI, IO_TIMEOUT, MiB, address, run

from hoplite_client.net.endpoints import TOKEN_ENV
from hoplite_client.net.handshake import HANDSHAKE_TIMEOUT, Identity, accept, dial, open_accepted
from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.net.tls import TlsContexts, TlsFiles, load
from hoplite_client.wire.errors import (
    AuthenticationError,
    ConnectionLostError,
    InvalidArgumentError,
)
from hoplite_client.wire.frames import Frame, encode_header
from hoplite_client.wire.messages import DataStream

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="needs the openssl command to make certificates")

DAEMON = [sys.executable, "-m", "hoplited"]
# A refusal must come within the handshake timeout; the rest is a loaded machine's slack.
REFUSED_WITHIN = HANDSHAKE_TIMEOUT + 20.0
NODE_EXTENSIONS = ("basicConstraints=critical,CA:FALSE\n"
                   "keyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n"
                   "subjectKeyIdentifier=hash\n"
                   "authorityKeyIdentifier=keyid,issuer\n")
EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Pki:
    """The cluster's files, another CA's, and the directory holding both."""

    cluster: TlsFiles
    other: TlsFiles
    root: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca_and_node(where: Path, name: str) -> TlsFiles:
    """A CA and one node certificate it signed, as docs/security.md makes them."""
    where.mkdir()
    _openssl("req", "-x509", *EC_KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", f"/CN={name} CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=where)
    _openssl("req", *EC_KEY, "-keyout", "node.key", "-out", "node.csr",
             "-subj", f"/CN={name} node", cwd=where)
    (where / "node.ext").write_text(NODE_EXTENSIONS)
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-set_serial", "0x" + os.urandom(8).hex(), "-days", "2", "-extfile", "node.ext",
             "-out", "node.pem", cwd=where)
    return TlsFiles(str(where / "node.pem"), str(where / "node.key"), str(where / "ca.pem"))


@pytest.fixture(scope="module")
def pki() -> Iterator[Pki]:
    with tempfile.TemporaryDirectory(prefix="hoplite-tls-") as root:
        yield Pki(make_ca_and_node(Path(root) / "cluster", "cluster"),
                  make_ca_and_node(Path(root) / "other", "other"), Path(root))


def tls_args(files: TlsFiles) -> list[str]:
    return ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca]


def token_of(cluster) -> bytes:
    return Path(cluster.token_file).read_bytes().strip()




async def join_as_daemon(seed: str, token_file: str, workdir: Path, *args: str) -> tuple[int, str]:
    """Start a daemon that joins ``seed``; it must exit on its own. Its exit code, stderr."""
    code, _, err = await run(*DAEMON, "--listen", "127.0.0.1:0", "--socket",
                             str(workdir / "joiner.sock"), "--capacity", "64MiB",
                             "--token-file", token_file, "--join", seed, *args)
    return code, err


def client_context(cert: TlsFiles | None, ca: str) -> TlsContexts:
    """A dialer's contexts trusting ``ca`` and presenting ``cert`` (None: no certificate),
    built by hand: :func:`load` refuses a certificate its own CA did not sign."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    return TlsContexts(server=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), client=ctx)


async def dial_tool(listen: str, token: bytes, tls: TlsContexts | None) -> None:
    """Dial a daemon as a tool and hang up; raises what :func:`dial` raised."""
    host, port = address(listen)
    protocol, _ = await asyncio.wait_for(
        dial(host, port, "tool", Identity("tls-test", token, tls)), REFUSED_WITHIN)
    protocol.close()


async def stream_over_tls(files: TlsFiles) -> None:
    """One stream of 20 MiB from an acceptor to a dialer over TLS, written in 8 MiB slices as
    the sender writes them and received into a destination buffer through the sink."""
    loop = asyncio.get_running_loop()
    me = Identity("tls-test", b"token", load(files))
    with socket.create_server(("127.0.0.1", 0)) as listening:
        listening.setblocking(False)

        async def serve() -> FrameProtocol:
            conn, _ = await loop.sock_accept(listening)
            protocol = await open_accepted(conn, me)
            await accept(protocol, me)
            return protocol

        serving = asyncio.ensure_future(serve())
        receiver, _ = await dial("127.0.0.1", listening.getsockname()[1], "data", me)
        sender = await asyncio.wait_for(serving, IO_TIMEOUT)
    data = memoryview(np.random.default_rng(3).bytes(20 * MiB))
    dest = bytearray(len(data))
    done: asyncio.Future[Frame[DataStream]] = loop.create_future()
    receiver.enter(Phase.RECEIVING, handler=done.set_result,
                   sink=lambda msg, length: memoryview(dest))
    sender.write_raw(memoryview(encode_header(DataStream(rid=1, offset=0, size=len(data)),
                                              len(data))))
    for start in range(0, len(data), 8 * MiB):
        sender.write_raw(data[start:start + 8 * MiB])
        await sender.drain()
    await asyncio.wait_for(sender.flush(), IO_TIMEOUT)
    frame = await asyncio.wait_for(done, IO_TIMEOUT)
    assert frame.msg.size == len(data) and dest == data
    sender.close()
    receiver.close()


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop],
                         ids=["asyncio", "uvloop"])
def test_streams_land_in_their_buffer_over_tls(pki, new_loop) -> None:
    """FrameProtocol over both loops' SSL transports: the sink's buffer gets every byte, the
    sender's drain and flush return (the daemon runs uvloop, tests and tools asyncio)."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(stream_over_tls(pki.cluster))


async def test_tls_cluster_moves_objects_and_reduces(make_cluster, connect, pki) -> None:
    """Three TLS daemons: a 24 MiB object (three send slices) got on two other nodes, bytes
    checked; a reduce of one input per node, its result got remotely."""
    cluster = await make_cluster(3, tls=pki.cluster)
    clients = [await connect(s) for s in cluster.sockets]
    data = np.frombuffer(np.random.default_rng(7).bytes(24 * MiB), dtype=np.uint8)
    oid = await clients[0].put(data)
    got = await asyncio.gather(*(c.get(oid, timeout=IO_TIMEOUT) for c in clients[1:]))
    for copy in got:
        assert np.array_equal(copy, data)
    del got
    inputs = [np.full(MiB // 8, i + 1, dtype=np.float64) for i in range(3)]
    ids = [await c.put(x) for c, x in zip(clients, inputs, strict=True)]
    rid = await clients[1].reduce(ids, op="sum")
    assert np.array_equal(await clients[2].get(rid, timeout=IO_TIMEOUT), sum(inputs))


async def test_plaintext_and_tls_refuse_each_other(make_cluster, connect, pki, tmp_path) -> None:
    """A plaintext dialer of a TLS daemon, and a TLS dialer of a plaintext one, get a typed
    error within the handshake timeout; a daemon of either kind cannot join a cluster of the
    other kind (exit code 2, no traceback); the TLS cluster serves on afterwards."""
    secure = await make_cluster(2, tls=pki.cluster)
    plain = await make_cluster(1, token=token_of(secure))
    token = token_of(secure)
    with pytest.raises(ConnectionLostError):
        await dial_tool(secure.seed, token, None)
    with pytest.raises(AuthenticationError):
        await dial_tool(plain.seed, token, load(pki.cluster))
    code, err = await join_as_daemon(secure.seed, secure.token_file, tmp_path)
    assert code == 2 and "Traceback" not in err, err
    code, err = await join_as_daemon(plain.seed, plain.token_file, tmp_path,
                                     *tls_args(pki.cluster))
    assert code == 2 and "Traceback" not in err, err
    a, b = await connect(secure.sockets[0]), await connect(secure.sockets[1])
    data = np.arange(MiB, dtype=np.int32)
    assert np.array_equal(await b.get(await a.put(data), timeout=IO_TIMEOUT), data)


async def test_certificates_of_another_ca_are_refused(make_cluster, pki, tmp_path) -> None:
    """Refused: a daemon whose CA and certificate are another cluster's (it cannot verify
    ours), a dialer presenting another CA's certificate (the acceptor cannot verify it), a
    dialer with no certificate at all; the right certificate is let in."""
    cluster = await make_cluster(1, tls=pki.cluster)
    token = token_of(cluster)
    code, err = await join_as_daemon(cluster.seed, cluster.token_file, tmp_path,
                                     *tls_args(pki.other))
    assert code == 2 and "Traceback" not in err, err
    for presented in (pki.other, None):
        # TLS 1.3: our side's handshake ends before the acceptor checks our certificate; the
        # acceptor then hangs up (ConnectionLostError). Under TLS 1.2 the handshake fails.
        with pytest.raises((ConnectionLostError, AuthenticationError)):
            await dial_tool(cluster.seed, token, client_context(presented, pki.cluster.ca))
    await dial_tool(cluster.seed, token, client_context(pki.cluster, pki.cluster.ca))


async def test_tools_dial_a_tls_cluster_with_the_flags(make_cluster, pki) -> None:
    """``hoplite bench --join`` dials the seed as a tool: it works with the TLS flags or the
    environment variables, and fails cleanly without them. ``hoplite status`` talks to the
    local daemon's Unix socket, so it needs none."""
    cluster = await make_cluster(2, tls=pki.cluster)
    bench = [*CLI, "bench", "roundtrip", "--join", cluster.seed, "--token-file",
             cluster.token_file, "--nodes", "2", "--repeat", "1", "--warmup", "0"]
    code, out, err = await run(*bench, *tls_args(pki.cluster))
    assert code == 0 and "every result checked" in out, err
    env = {"HOPLITE_TLS_CERT": pki.cluster.cert, "HOPLITE_TLS_KEY": pki.cluster.key,
           "HOPLITE_TLS_CA": pki.cluster.ca}
    code, out, err = await run(*bench, env=env)
    assert code == 0 and "every result checked" in out, err
    code, _, err = await run(*bench)
    assert code == 1 and "Traceback" not in err, err
    code, _, err = await run(*bench, "--tls-cert", pki.cluster.cert)
    assert code == 2 and "--tls-key" in err, err
    code, out, err = await run(*CLI, "status", "--socket", cluster.sockets[1])
    assert code == 0 and out.count("alive") == 2, err


def _encrypted_key(pki: Pki) -> str:
    path = pki.root / "encrypted.key"
    if not path.exists():
        _openssl("pkey", "-in", pki.cluster.key, "-aes256", "-passout", "pass:secret",
                 "-out", str(path), cwd=pki.root)
    return str(path)


@pytest.mark.parametrize(("case", "blamed"), [
    ("key of another certificate", "key"),
    ("encrypted key", "key"),
    ("a key as the certificate", "cert"),
    ("a key as the CA", "ca"),
    ("certificate of another CA", "cert"),
    ("missing CA file", "ca"),
])
def test_bad_tls_files_are_refused_naming_the_file(pki, case: str, blamed: str) -> None:
    """Each broken file is an InvalidArgumentError that names it, at load time."""
    c, o = pki.cluster, pki.other
    files = {
        "key of another certificate": TlsFiles(c.cert, o.key, c.ca),
        "encrypted key": TlsFiles(c.cert, _encrypted_key(pki), c.ca),
        "a key as the certificate": TlsFiles(c.key, c.key, c.ca),
        "a key as the CA": TlsFiles(c.cert, c.key, c.key),
        "certificate of another CA": TlsFiles(o.cert, o.key, c.ca),
        "missing CA file": TlsFiles(c.cert, c.key, str(pki.root / "nothing.pem")),
    }[case]
    path = getattr(files, blamed)
    with pytest.raises(InvalidArgumentError, match=f"--tls-{blamed} {path}"):
        load(files)


async def test_daemon_with_a_bad_key_exits_at_start(pki, tmp_path) -> None:
    """The daemon refuses to start (exit code 2, no traceback) rather than fail every peer."""
    code, _, err = await run(*DAEMON, "--listen", "127.0.0.1:0", "--socket",
                             str(tmp_path / "bad.sock"), "--capacity", "64MiB",
                             "--tls-cert", pki.cluster.cert, "--tls-key", pki.other.key,
                             "--tls-ca", pki.cluster.ca,
                             env={TOKEN_ENV: str(tmp_path / "token")})  # not the user's own
    assert code == 2 and pki.other.key in err and "Traceback" not in err, err
