"""A daemon is closed to peers that prove no secret, and keeps its token and socket where only
its user reaches: real daemons, and a throwaway local user (as root) playing the other user.

Every daemon here gets its default token under a temporary directory (``XDG_RUNTIME_DIR`` or
``HOPLITE_TOKEN_FILE``), never the real user's; each test removes its directory and stops
what it started by PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import CLI, address, eventually, run, run_hoplited

import hoplite_client
from hoplite_client.net.endpoints import TOKEN_ENV
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.wire.errors import AuthenticationError, ForeignDaemonError

DAEMON = [sys.executable, "-m", "hoplited"]
READY_TIMEOUT = 60.0  # a daemon's start on a loaded 2-core machine
CHILD_TIMEOUT = 60.0  # a forked child's report, and its exit once told to go
STOP_GRACE = 20.0

User = tuple[int, int]  # uid, gid


@dataclass
class Started:
    """A daemon we started: its process, ready line and log file."""

    process: asyncio.subprocess.Process
    ready: dict[str, Any]
    log: Path

    @property
    def listen(self) -> str:
        return str(self.ready["listen"])


StartDaemon = Callable[..., Awaitable[Started]]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory of ours under /tmp, removed with all it holds at teardown."""
    path = Path(tempfile.mkdtemp(prefix="hoplite-closed-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def daemons(workdir: Path) -> AsyncIterator[StartDaemon]:
    """``await start(*args, env=...)``: a hoplited that printed its ready line (its stderr in
    the workdir); every one is stopped by PID at teardown."""
    started: list[asyncio.subprocess.Process] = []

    async def start(*args: str, env: dict[str, str]) -> Started:
        log = workdir / f"hoplited-{len(started)}.log"
        with open(log, "wb") as err:
            process = await asyncio.create_subprocess_exec(
                *DAEMON, *args, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=err, env={**os.environ, **env})
        started.append(process)
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT)
        assert line, f"hoplited exited before it was ready: {log.read_text()}"
        return Started(process, json.loads(line), log)

    try:
        yield start
    finally:
        for process in started:
            if process.returncode is None:
                os.kill(process.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), STOP_GRACE)
                except TimeoutError:
                    os.kill(process.pid, signal.SIGKILL)
                    await process.wait()


@pytest.fixture(scope="module")
def other_user() -> Iterator[User]:
    """A throwaway local user (no home, no shell), deleted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root (to create one and setuid)")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if useradd is None or userdel is None:
        pytest.skip("acting as another local user needs useradd and userdel")
    name = f"hpltest{secrets.token_hex(4)}"
    made = subprocess.run([useradd, "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    if made.returncode != 0:
        pytest.skip(f"useradd could not create a user: {made.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run([userdel, name], capture_output=True, timeout=CHILD_TIMEOUT)


@contextlib.contextmanager
def as_user(user: User, work: Callable[[], str]) -> Iterator[str]:
    """Run ``work`` in a forked child that became ``user`` (plain stdlib work: the venv may be
    out of that user's reach); yields what it returned, or its exception as "Name: text".
    The child, and what ``work`` opened, lives until the block ends; then it is reaped."""
    uid, gid = user
    report_r, report_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, it ends in os._exit
        code = 1
        try:
            os.close(report_r)
            os.close(stop_w)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                result = work()
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"
            os.write(report_w, result.encode())
            os.close(report_w)
            os.read(stop_r, 1)  # returns once the parent closes its end
            code = 0
        finally:
            os._exit(code)
    os.close(report_w)
    os.close(stop_r)
    try:
        with os.fdopen(report_r, "rb") as report:
            ready, _, _ = select.select([report], [], [], CHILD_TIMEOUT)
            assert ready, f"the child acting as uid {uid} reported nothing"
            yield report.read().decode()
    finally:
        os.close(stop_w)
        deadline = time.monotonic() + CHILD_TIMEOUT
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)


def shared_with(workdir: Path, user: User) -> Path:
    """A directory of ``user`` inside ``workdir``, which it may now traverse (not list)."""
    workdir.chmod(0o711)
    shared = workdir / "shared"
    shared.mkdir()
    os.chown(shared, *user)
    return shared


def mode_and_owner(path: Path) -> tuple[int, int]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_uid


# --- the default token ------------------------------------------------------------------------

async def test_a_default_daemon_refuses_the_empty_token(workdir, daemons) -> None:
    """Without --token-file: a random token in $XDG_RUNTIME_DIR/hoplite/token (0600 in a 0700
    directory of ours), named in the ready line and the log; a tool proving the empty token
    is refused; a daemon given a copy of the file joins; ``hoplite bench --join`` without
    --token-file finds the default file."""
    env = {"XDG_RUNTIME_DIR": str(workdir / "xdg"), TOKEN_ENV: ""}
    (workdir / "xdg").mkdir(mode=0o700)
    first = await daemons("--listen", "127.0.0.1:0", "--socket", str(workdir / "a" / "d.sock"),
                          "--capacity", "64MiB", env=env)
    token_file = workdir / "xdg" / "hoplite" / "token"
    assert first.ready["token_file"] == str(token_file), first.ready
    assert f"copy {token_file}" in first.ready["to_join"], first.ready
    assert "--token-file" in first.ready["to_join"], first.ready
    assert str(token_file) in first.log.read_text()
    assert mode_and_owner(token_file.parent) == (0o700, os.getuid())
    assert mode_and_owner(token_file) == (0o600, os.getuid())
    token = token_file.read_bytes().strip()
    assert len(token) == 64

    host, port = address(first.listen)
    with pytest.raises(AuthenticationError):
        await dial(host, port, "tool", Identity("x", b""))
    protocol, _ = await dial(host, port, "tool", Identity("x", token))
    protocol.close()

    copy = workdir / "copy-of-token"
    shutil.copy(token_file, copy)
    await daemons("--listen", "127.0.0.1:0", "--socket", str(workdir / "b" / "d.sock"),
                  "--capacity", "64MiB", "--token-file", str(copy), "--join", first.listen,
                  env=env)
    async with await hoplite_client.connect(str(workdir / "a" / "d.sock")) as client:
        async def both_alive() -> bool:
            members = (await client.status())["local"]["members"]
            return len(members) == 2 and all(m["alive"] for m in members)
        await eventually(both_alive, timeout=60, what="the second daemon's join")

    code, out, err = await run(*CLI, "bench", "roundtrip", "--join", first.listen, "--nodes",
                               "2", "--repeat", "1", "--warmup", "0", env=env)
    assert code == 0 and "every result checked" in out, err


async def test_a_tool_without_any_token_says_what_to_do(workdir) -> None:
    """No --token-file and no default token file: a clear error naming both, not a dial
    with the empty token."""
    missing = workdir / "none" / "token"
    code, _, err = await run(*CLI, "bench", "roundtrip", "--join", "127.0.0.1:9", "--nodes",
                             "2", env={TOKEN_ENV: str(missing)})
    assert code != 0 and str(missing) in err and "--token-file" in err, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("mode,says", [(0o644, "chmod 600"), (0o606, "chmod 600")],
                         ids=["readable", "writable"])
async def test_a_default_token_file_others_may_know_is_refused(workdir, monkeypatch,
                                                               mode: int, says: str) -> None:
    token_file = workdir / "token"
    token_file.write_text("a-token-others-read\n")
    token_file.chmod(mode)
    monkeypatch.setenv(TOKEN_ENV, str(token_file))
    code, err = await run_hoplited("--socket", str(workdir / "d.sock"), "--capacity", "64MiB",
                                   timeout=READY_TIMEOUT)
    assert code == 2, err
    assert str(token_file) in err and says in err and TOKEN_ENV in err, err
    assert "Traceback" not in err, err


async def test_a_token_directory_others_may_write_is_refused(workdir, monkeypatch) -> None:
    """Another user could swap the token for one it knows: refused, the directory named."""
    open_dir = workdir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setenv(TOKEN_ENV, str(open_dir / "token"))
    code, err = await run_hoplited("--socket", str(workdir / "d.sock"), "--capacity", "64MiB",
                                   timeout=READY_TIMEOUT)
    assert code == 2, err
    assert str(open_dir) in err and "group or others" in err and TOKEN_ENV in err, err
    assert not (open_dir / "token").exists()


# --- --insecure, and addresses decided where they resolve --------------------------------------

@pytest.mark.parametrize("host,reach", [("localhost", "every user of this host"),
                                        ("0.0.0.0", "anyone who reaches 0.0.0.0")])
async def test_insecure_takes_the_empty_token_and_says_who_can_join(workdir, daemons,
                                                                    host: str,
                                                                    reach: str) -> None:
    """--insecure is the one way to accept the empty token; its warning says who can then
    join, decided on the address the name resolves to; no token file is made."""
    token_file = workdir / "tok" / "token"
    daemon = await daemons("--listen", f"{host}:0", "--socket", str(workdir / "d.sock"),
                           "--capacity", "64MiB", "--insecure",
                           env={TOKEN_ENV: str(token_file)})
    assert "token_file" not in daemon.ready and "--insecure" in daemon.ready["to_join"]
    assert reach in daemon.log.read_text(), daemon.log.read_text()
    assert not token_file.parent.exists()
    protocol, _ = await dial("127.0.0.1", address(daemon.listen)[1], "tool", Identity("x", b""))
    protocol.close()


async def test_insecure_with_a_token_file_is_refused(workdir) -> None:
    token_file = workdir / "token"
    token_file.write_text("a-token")
    token_file.chmod(0o600)
    code, err = await run_hoplited("--socket", str(workdir / "d.sock"), "--capacity", "64MiB",
                                   "--insecure", "--token-file", str(token_file),
                                   timeout=READY_TIMEOUT)
    assert code == 2 and "--insecure" in err and "--token-file" in err, err


async def test_a_listen_name_is_decided_where_it_resolves(workdir, monkeypatch) -> None:
    """A name spelled like loopback that resolves nowhere is refused, not taken for one."""
    monkeypatch.setenv(TOKEN_ENV, str(workdir / "token"))
    code, err = await run_hoplited("--listen", "127.evil.example:0", "--socket",
                                   str(workdir / "d.sock"), "--capacity", "64MiB",
                                   timeout=READY_TIMEOUT)
    assert code == 2 and "cannot resolve '127.evil.example'" in err, err


# --- the socket's directory -------------------------------------------------------------------

async def test_a_socket_directory_others_may_write_is_refused(workdir, monkeypatch) -> None:
    open_dir = workdir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setenv(TOKEN_ENV, str(workdir / "tok" / "token"))
    code, err = await run_hoplited("--socket", str(open_dir / "d.sock"), "--capacity", "64MiB",
                                   timeout=READY_TIMEOUT)
    assert code == 2, err
    assert str(open_dir) in err and "group or others" in err and "--socket" in err, err
    assert "Traceback" not in err and not (open_dir / "d.sock").exists(), err


async def test_a_socket_directory_another_user_made_is_refused(workdir, monkeypatch,
                                                               other_user: User) -> None:
    """The other user makes the directory where our daemon will bind, mode 0777: refused, and
    so is one it owns, mode 0700."""
    shared = shared_with(workdir, other_user)
    planted = shared / "sock-dir"

    def plant() -> str:
        os.mkdir(planted)
        os.chmod(planted, 0o777)
        return "planted"

    with as_user(other_user, plant) as report:
        assert report == "planted"
    assert mode_and_owner(planted) == (0o777, other_user[0])
    shared.chmod(0o700)
    monkeypatch.setenv(TOKEN_ENV, str(workdir / "tok" / "token"))
    for directory in (planted, shared):
        code, err = await run_hoplited("--socket", str(directory / "d.sock"), "--capacity",
                                       "64MiB", timeout=READY_TIMEOUT)
        assert code == 2, err
        assert f"{directory} belongs to uid {other_user[0]}" in err and "--socket" in err, err
        assert not (directory / "d.sock").exists()


# --- another local user -----------------------------------------------------------------------

async def test_another_user_cannot_read_the_default_token(workdir, daemons,
                                                          other_user: User) -> None:
    workdir.chmod(0o711)  # the directory of the token itself is all that keeps it
    token_file = workdir / "tok" / "token"
    await daemons("--socket", str(workdir / "d.sock"), "--capacity", "64MiB",
                  env={TOKEN_ENV: str(token_file)})

    def steal() -> str:
        with open(token_file) as f:
            return f.read()

    with as_user(other_user, steal) as report:
        assert report.startswith("PermissionError"), report


async def test_a_client_refuses_a_daemon_of_another_user(workdir, other_user: User) -> None:
    """Another user's process serves the Unix socket our client dials: a typed error naming
    the socket and that user's uid, before a byte of ours is sent."""
    path = shared_with(workdir, other_user) / "hoplited.sock"
    held: list[socket.socket] = []  # the child's server, open until the child goes

    def serve() -> str:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.append(server)
        server.bind(str(path))
        server.listen(1)
        return "listening"

    with as_user(other_user, serve) as report:
        assert report == "listening"
        with pytest.raises(ForeignDaemonError) as raised:
            await hoplite_client.connect(str(path), timeout=10)
    message = str(raised.value)
    assert str(path) in message and f"uid {other_user[0]}" in message, message
    assert raised.value.data == {"path": str(path), "uid": other_user[0]}
    assert raised.value.code == "foreign_daemon"
