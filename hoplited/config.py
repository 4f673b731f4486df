"""Daemon settings, with the reasoning behind each default."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from hoplite_client.client import default_socket
from hoplite_client.errors import InvalidArgumentError

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
          "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4,
          "tb": 1000**4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'64MiB', '1.5GB', '4096' → bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InvalidArgumentError(f"not a size: {text!r} (try 64MiB, 1GB, 4096)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidArgumentError(f"not a HOST:PORT address: {text!r}")
    return host.strip("[]"), int(port)


def default_capacity() -> int:
    """Half the machine's memory: the arena is sparse, so this costs nothing until used."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


@dataclass
class DaemonConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: the kernel picks; the ready line on stdout says which
    socket_path: str = field(default_factory=default_socket)
    join: list[tuple[str, int]] = field(default_factory=list)
    token: bytes = b""
    insecure: bool = False
    capacity: int = field(default_factory=default_capacity)
    # The artifact served one transfer per object per node; chains then cost one hop each,
    # which cut-through forwarding makes cheap. Raise it to trade depth for uplink sharing.
    fanout: int = 1
    heartbeat_interval: float = 1.0
    # Five missed beats: long enough for a loaded 2-core test machine, short enough to react.
    heartbeat_timeout: float = 5.0
    # A pull that receives nothing for this long is abandoned and resumed from another source.
    stall_timeout: float = 30.0
    advertise_host: Optional[str] = None

    def check(self) -> None:
        """Refuse settings that would be unsafe or meaningless."""
        loopback = self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")
        if not self.token and not loopback and not self.insecure:
            raise InvalidArgumentError(
                f"refusing to listen on {self.host} without a cluster token: pass --token-file "
                f"(or --insecure to accept unauthenticated peers)")
        if self.fanout < 1:
            raise InvalidArgumentError("fanout must be at least 1")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise InvalidArgumentError("heartbeat timeout must exceed the heartbeat interval")
