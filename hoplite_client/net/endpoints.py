"""Where things are: the local daemon's socket path, HOST:PORT addresses, this host's id."""

from __future__ import annotations

import os

from hoplite_client.wire.errors import InvalidArgumentError


def default_socket() -> str:
    """The local daemon's Unix socket: ``$HOPLITE_SOCKET`` or a per-user path under /tmp."""
    return os.environ.get("HOPLITE_SOCKET") or f"/tmp/hoplite-{os.getuid()}/hoplited.sock"


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
