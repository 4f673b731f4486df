"""The TCP congestion control of the daemons' connections to each other.

Linux lets each socket choose its own (``TCP_CONGESTION``); a listening socket's choice is
inherited by the connections it accepts. The daemons take cubic by default rather than the
system's: on the emulated links, whose queues are a few packets deep, BBR (v1) loses segments
whenever three or more streams meet on one link, and a stream whose last segments are lost
waits out a retransmission timeout, 100-200 ms, with nothing behind them to signal the loss
(docs/design.md §3, "Congestion control").
"""

from __future__ import annotations

import socket

# The option's number on Linux, where Python's socket module may not name it.
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
# Longest name the kernel keeps (TCP_CA_NAME_MAX, with its terminating zero).
NAME_MAX = 16
DEFAULT = "cubic"


def check_name(name: str) -> None:
    """Refuse a name no kernel could know: ASCII letters, digits and ``_`` only, at most 15
    characters ("" means the system's)."""
    if len(name) >= NAME_MAX or not all(c.isascii() and (c.isalnum() or c == "_")
                                        for c in name):
        raise ValueError(f"{name!r} is not a congestion control's name")


def use(sock: socket.socket, name: str) -> None:
    """Have TCP socket ``sock`` (and, if it listens, every connection it accepts) use the
    congestion control ``name``; "" leaves the system's. Raises OSError where the kernel
    does not have it or does not allow it."""
    if name and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, name.encode())


def current(sock: socket.socket) -> str:
    """The congestion control ``sock`` uses."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, NAME_MAX)
    return raw.split(b"\0", 1)[0].decode()
