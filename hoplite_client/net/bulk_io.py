"""One large frame's payload moved between a socket and memory by a worker thread.

A client's large put sends its object over the Unix socket, and its daemon lands it in the
object's extent. The event loop's transports copy what they cannot send at once (asyncio's
``writelines`` joins its buffers) and read one socket buffer per turn of the loop, between
everything else the loop does: a 256 MiB put then waits on a daemon busy streaming a
collective. Here a worker thread moves the payload on a duplicate of the socket's descriptor,
straight from the sender's array and straight into the receiver's extent, waiting for room
or data with ``poll``: the kernel copies each byte once each way, and both loops go on.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Sequence

from hoplite_client.wire.errors import ConnectionLostError

# How long one wait for room or data lasts before the stop flag is checked again; a closed
# connection ends it at once (POLLHUP, POLLERR).
POLL_MS = 200
_BROKEN = select.POLLERR | select.POLLHUP | select.POLLNVAL


def write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write every part to the non-blocking descriptor ``fd``, in order; raises
    ConnectionLostError when the other side is gone."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                for _, events in poller.poll(POLL_MS):
                    if events & _BROKEN:
                        raise ConnectionLostError("the other side closed the connection "
                                                  "during a bulk write") from None
            except OSError as exc:  # EPIPE, ECONNRESET
                raise ConnectionLostError(f"the other side closed the connection during a "
                                          f"bulk write: {exc}") from exc


def read_into(fd: int, view: memoryview, stop: threading.Event) -> None:
    """Fill ``view`` from the non-blocking descriptor ``fd``; raises ConnectionLostError when
    the other side closes first, or ``stop`` is set (our side closed the connection)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    got = 0
    while got < len(view):
        if stop.is_set():
            raise ConnectionLostError("the connection closed during a bulk read")
        try:
            n = os.readv(fd, [view[got:]])
        except BlockingIOError:
            poller.poll(POLL_MS)
            continue
        except OSError as exc:
            raise ConnectionLostError(f"the connection failed during a bulk read: {exc}") from exc
        if n == 0:
            raise ConnectionLostError("the other side closed the connection during a bulk "
                                      "read")
        got += n
