"""Where things are: the local daemon's socket path and cluster token, HOST:PORT addresses,
this host's id; and the checks that keep the token and the socket where only we can reach."""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import stat

from hoplite_client.wire.errors import InvalidArgumentError

# The variable naming the default token file (unset: ``token`` in default_dir()).
TOKEN_ENV = "HOPLITE_TOKEN_FILE"
# Random bytes of a default token, written as hex so that the file copies and reads as text.
TOKEN_BYTES = 32
# What to do when the default token's directory or file is refused.
TOKEN_REMEDY = f"set {TOKEN_ENV} (or pass --token-file) to a file in a directory of yours"


def _tmp_dir() -> str:
    """This user's directory under /tmp: the default socket's, and the token's without XDG."""
    return f"/tmp/hoplite-{os.getuid()}"


def default_socket() -> str:
    """The local daemon's Unix socket: ``$HOPLITE_SOCKET`` or a per-user path under /tmp."""
    return os.environ.get("HOPLITE_SOCKET") or os.path.join(_tmp_dir(), "hoplited.sock")


def default_dir() -> str:
    """This user's private directory for the default token: ``$XDG_RUNTIME_DIR/hoplite``
    where that is set (to an absolute path, as the XDG spec requires), else /tmp/hoplite-UID."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    return os.path.join(runtime, "hoplite") if os.path.isabs(runtime) else _tmp_dir()


def default_token_file() -> str:
    """The token file of a daemon started without --token-file (created if missing), which
    tools fall back to: ``$HOPLITE_TOKEN_FILE`` or ``token`` in :func:`default_dir`."""
    return os.environ.get(TOKEN_ENV) or os.path.join(default_dir(), "token")


def trusted_owner(uid: int) -> bool:
    """Whether ``uid`` may own what holds our token or socket, or serve our socket: ours, or
    root's (who can reach everything of ours anyway)."""
    return uid in (os.getuid(), 0)


def check_private_dir(path: str, st: os.stat_result, remedy: str) -> None:
    """Refuse the directory ``path`` (``st``: its lstat) if another user could change what we
    put in it: owned by another user than us or root, or writable by group or others.
    ``remedy`` ends the message: the way out besides fixing the directory."""
    if not trusted_owner(st.st_uid):
        raise InvalidArgumentError(
            f"{path} belongs to uid {st.st_uid}, not to us (uid {os.getuid()}): that user "
            f"could replace what we put there; remove it, or {remedy}",
            path=path, uid=st.st_uid)
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidArgumentError(f"{path} is not a directory: remove it, or {remedy}",
                                   path=path)
    if st.st_mode & 0o022:
        raise InvalidArgumentError(
            f"{path} may be written by its group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): they could replace what we put there; remove it "
            f"(or run chmod go-w on it), or {remedy}", path=path)


def private_dir(path: str, remedy: str) -> None:
    """Create the directory ``path`` mode 0700 (its missing parents as usual), or refuse it
    if it exists and :func:`check_private_dir` does."""
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) and trusted_owner(st.st_uid):
        st = os.stat(path)  # a link only we could have made: what it points to counts
    check_private_dir(path, st, remedy)


def check_token_file(path: str, st: os.stat_result) -> None:
    """Refuse the default token file ``path`` (``st``: its fstat) if another user may know or
    set the token: not a regular file of ours, or readable or writable by group or others."""
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        raise InvalidArgumentError(
            f"token file {path} is not a file of ours (uid {st.st_uid}, we are "
            f"{os.getuid()}): another user may know its token; remove it (a daemon started "
            f"without --token-file makes a new one), or {TOKEN_REMEDY}", path=path)
    if st.st_mode & 0o066:
        raise InvalidArgumentError(
            f"token file {path} may be read or written by its group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): run chmod 600 on it (and change the token if "
            f"others read it), or {TOKEN_REMEDY}", path=path)


def _token_in(data: bytes, path: str) -> bytes:
    """The token in ``data``, read from ``path``: whitespace around it dropped, never empty."""
    token = data.strip()
    if not token:
        raise InvalidArgumentError(f"token file {path} is empty: write the cluster's token in "
                                   f"it", path=path)
    return token


def read_token(path: str) -> bytes:
    """The token in ``path``, a file given by its user (--token-file); one that every user of
    this host may read or write is refused (a group its operator chose may)."""
    with open(path, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & 0o006:
            raise InvalidArgumentError(
                f"token file {path} may be read or written by every user of this host (mode "
                f"{stat.S_IMODE(mode):o}): run chmod o-rw on it, and change the token if "
                f"others read it", path=path)
        return _token_in(f.read(), path)


def _read_private_token(path: str) -> bytes:
    """The token in the default token file ``path``, once :func:`check_token_file` passes on
    the file opened (a link is followed: what it opens is what is checked)."""
    with open(path, "rb") as f:
        check_token_file(path, os.fstat(f.fileno()))
        return _token_in(f.read(), path)


def default_token() -> tuple[str, bytes]:
    """The default token file and its token: a new random one if the file is missing (made
    mode 0600 in a :func:`private_dir`), else the file's, once checked as ours alone."""
    path = os.path.abspath(default_token_file())
    directory = os.path.dirname(path)
    private_dir(directory, TOKEN_REMEDY)
    token = secrets.token_hex(TOKEN_BYTES).encode()
    # Written whole under another name, then linked into place: a daemon starting at the same
    # moment either makes the file or reads it complete, never half written.
    draft = os.path.join(directory, f".token-{secrets.token_hex(8)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(fd, "wb") as f:
            f.write(token + b"\n")
        os.link(draft, path)
    except FileExistsError:
        return path, _read_private_token(path)
    finally:
        os.unlink(draft)
    return path, token


def tool_token(token_file: str | None) -> bytes:
    """The token a tool dials a cluster with: ``token_file``'s, else the default token file's
    (that of a daemon of this user started without --token-file)."""
    if token_file is not None:
        return read_token(token_file)
    path = default_token_file()
    try:
        return _read_private_token(path)
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"no --token-file given and the default token file {path} does not exist: pass "
            f"the cluster's --token-file", path=path) from None


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback one, so only this machine's
    processes reach it: decided on the addresses, never on how the name is spelled."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise InvalidArgumentError(f"cannot resolve {host!r} ({exc}): pass an address or a "
                                   f"name this host resolves", host=host) from None
    return all(ipaddress.ip_address(str(info[4][0])).is_loopback for info in infos)


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidArgumentError(f"not a HOST:PORT address: {text!r}")
    return host.strip("[]"), int(port)


def host_id() -> str:
    """Identifies this kernel (shared by every network namespace): same host_id, same machine."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return os.uname().nodename
