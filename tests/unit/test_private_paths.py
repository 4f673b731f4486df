"""Where the default token lives, which directories and token files are refused, and what counts
as loopback (hoplite_client/net/endpoints.py): the pure parts, without a daemon."""

from __future__ import annotations

import os
import socket
import stat
from typing import Any

import pytest

from hoplite_client.net import endpoints
from hoplite_client.net.endpoints import (
    TOKEN_ENV,
    check_private_dir,
    check_token_file,
    default_dir,
    default_socket,
    default_token_file,
    is_loopback,
    read_token,
)
from hoplite_client.wire.errors import InvalidArgumentError

ME = os.getuid()
OTHER = ME + 4242  # a uid that is neither ours nor root's


def stat_of(mode: int, uid: int = ME) -> os.stat_result:
    """A stat result of the given type and mode bits, owned by ``uid``."""
    return os.stat_result((mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


def test_the_token_lives_in_the_xdg_runtime_dir_when_set(monkeypatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    assert default_dir() == "/run/user/1234/hoplite"
    assert default_token_file() == "/run/user/1234/hoplite/token"


@pytest.mark.parametrize("runtime", [None, "", "relative/dir"],
                         ids=["unset", "empty", "relative"])
def test_else_beside_the_default_socket(monkeypatch, runtime: str | None) -> None:
    """No usable XDG_RUNTIME_DIR (the spec ignores a relative one): /tmp/hoplite-UID."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv("HOPLITE_SOCKET", raising=False)
    if runtime is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    assert default_token_file() == f"/tmp/hoplite-{ME}/token"
    assert os.path.dirname(default_token_file()) == os.path.dirname(default_socket())


def test_the_environment_names_the_token_file(monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    monkeypatch.setenv(TOKEN_ENV, "/srv/cluster/token")
    assert default_token_file() == "/srv/cluster/token"


@pytest.mark.parametrize("mode,uid", [(0o700, ME), (0o755, ME), (0o700, 0)],
                         ids=["ours-private", "ours-readable", "roots"])
def test_a_directory_only_we_or_root_may_change_is_accepted(mode: int, uid: int) -> None:
    check_private_dir("/d", stat_of(stat.S_IFDIR | mode, uid), "pass --socket elsewhere")


@pytest.mark.parametrize("mode,uid,says", [
    (0o700, OTHER, f"belongs to uid {OTHER}"),
    (0o777, ME, "may be written by its group or others (mode 777)"),
    (0o770, ME, "may be written by its group or others"),
    (0o1777, ME, "may be written by its group or others"),  # sticky: others still create
    (0o600, ME, "is not a directory"),
], ids=["another-users", "world-writable", "group-writable", "sticky", "a-file"])
def test_a_directory_another_user_could_change_is_refused(mode: int, uid: int,
                                                          says: str) -> None:
    """The message names the directory, says why and what to do."""
    kind = stat.S_IFREG if says == "is not a directory" else stat.S_IFDIR
    with pytest.raises(InvalidArgumentError) as raised:
        check_private_dir("/tmp/hoplite-x", stat_of(kind | mode, uid), "pass --socket elsewhere")
    message = str(raised.value)
    assert message.startswith("/tmp/hoplite-x ") and says in message, message
    assert "remove it" in message and message.endswith("pass --socket elsewhere"), message


def test_a_token_file_of_ours_alone_is_accepted() -> None:
    check_token_file("/t", stat_of(stat.S_IFREG | 0o600))
    check_token_file("/t", stat_of(stat.S_IFREG | 0o400))


@pytest.mark.parametrize("mode,uid,says", [
    (stat.S_IFREG | 0o644, ME, "may be read or written by its group or others (mode 644)"),
    (stat.S_IFREG | 0o602, ME, "may be read or written by its group or others"),
    (stat.S_IFREG | 0o600, OTHER, f"is not a file of ours (uid {OTHER}"),
    (stat.S_IFDIR | 0o700, ME, "is not a file of ours"),
], ids=["readable", "writable", "another-users", "a-directory"])
def test_a_token_file_others_may_know_is_refused(mode: int, uid: int, says: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        check_token_file("/x/token", stat_of(mode, uid))
    message = str(raised.value)
    assert message.startswith("token file /x/token ") and says in message, message
    assert TOKEN_ENV in message, message


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.1", "2130706433"])
def test_loopback_is_decided_on_the_resolved_address(host: str) -> None:
    """Spelled any way (a name of /etc/hosts, short or decimal forms), it is loopback."""
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_other_addresses_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_a_name_spelled_like_loopback_counts_where_it_resolves(monkeypatch) -> None:
    """A DNS name that starts with "127." but resolves to a public address is not loopback,
    and a name with one public address among loopback ones is not either."""
    answers = {"127.evil.example": ["203.0.113.5"], "mixed.example": ["127.0.0.1", "::1",
                                                                       "198.51.100.1"]}

    def resolve(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in answers[host]]

    monkeypatch.setattr(endpoints.socket, "getaddrinfo", resolve)
    assert not is_loopback("127.evil.example")
    assert not is_loopback("mixed.example")


def test_a_name_that_does_not_resolve_is_refused(monkeypatch) -> None:
    def fail(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(endpoints.socket, "getaddrinfo", fail)
    with pytest.raises(InvalidArgumentError, match="cannot resolve '127.evil.example'"):
        is_loopback("127.evil.example")


@pytest.mark.parametrize("mode", [0o604, 0o602])
def test_a_given_token_file_every_user_may_know_is_refused(tmp_path, mode: int) -> None:
    """--token-file: a file every local user may read or write holds no secret."""
    path = tmp_path / "token"
    path.write_bytes(b"secret\n")
    path.chmod(mode)
    with pytest.raises(InvalidArgumentError, match="chmod o-rw"):
        read_token(str(path))
    path.chmod(0o640)  # a group the operator chose may read it
    assert read_token(str(path)) == b"secret"
