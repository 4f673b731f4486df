"""Daemon settings, with the reasoning behind each default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hoplite_client.net.endpoints import default_socket
from hoplite_client.wire.errors import InvalidArgumentError


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
    # The longest a pull may receive nothing before it is abandoned and resumed from another
    # source; a get's own window is derived from the link rate below this cap (link_model.py).
    stall_timeout: float = 30.0
    advertise_host: str | None = None
    # Prometheus metrics on this port of ``host`` (docs/operations.md); None: not served.
    metrics_port: int | None = None

    def check(self) -> None:
        """Refuse settings that would be unsafe or meaningless."""
        loopback = self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")
        if not self.token and not loopback and not self.insecure:
            raise InvalidArgumentError(
                f"refusing to listen on {self.host} without a cluster token: pass --token-file "
                f"(or --insecure to accept unauthenticated peers)")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InvalidArgumentError(f"metrics port must be within 0..65535, "
                                       f"not {self.metrics_port}")
        if self.fanout < 1:
            raise InvalidArgumentError("fanout must be at least 1")
        if not self.heartbeat_interval > 0:  # also refuses NaN
            raise InvalidArgumentError("heartbeat interval must be positive")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise InvalidArgumentError("heartbeat timeout must exceed the heartbeat interval")
