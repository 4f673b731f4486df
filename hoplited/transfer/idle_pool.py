"""Which idle data connection a pull reuses, and which idle ones are closed: a pure core.

A pull needs an authenticated data connection to its source: a TCP connect and two handshake
exchanges before its ``Pull``, three round trips on the critical path of every small transfer
(docs/design.md §3, "Data connections"). A connection whose stream ended cleanly is kept here,
idle, for the next pull from the same member. The pool holds at most ``per_source`` idle
connections per member (more are closed at once), closes each after ``idle_timeout`` seconds
unused except the newest ``keep`` of each member (standing connections: dialled when the member
joins, so that even the first pull from it finds one), and gives out the most recently used
first (the one least likely to have been closed by the other side). A pull that finds no idle
connection dials on its critical path, 4–100 ms on busy emulated links; so once a take leaves
fewer than ``spare`` idle connections to a member (counting those being dialled), the pool asks
for one more to be dialled in the background (:meth:`IdlePool.refill`; docs/design.md §3,
"Data connections"). Nothing here does I/O or reads a clock: every call takes ``now`` and
returns the connections its caller must close.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from hoplite_client.wire.errors import InvalidArgumentError

C = TypeVar("C")


@dataclass(frozen=True)
class Idle(Generic[C]):
    """A connection kept for reuse, and when it is closed unless taken before."""

    conn: C
    expires: float


class IdlePool(Generic[C]):
    """Idle connections by member, newest last; bounded in number and in age."""

    def __init__(self, per_source: int, idle_timeout: float, keep: int = 0,
                 spare: int = 0) -> None:
        if (not 0 <= keep <= per_source or not 0 <= spare <= per_source
                or not idle_timeout > 0):  # also refuses NaN
            raise InvalidArgumentError("an idle pool needs 0 <= keep, spare <= per_source and "
                                       "a positive idle timeout")
        self.per_source = per_source
        self.idle_timeout = idle_timeout
        self.keep = keep
        self.spare = spare
        self._idle: dict[str, deque[Idle[C]]] = {}
        self._dialling: Counter[str] = Counter()  # background dials under way, by member

    def __len__(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def idle(self, node: str) -> int:
        """How many idle connections to ``node`` are kept."""
        return len(self._idle.get(node, ()))

    def put(self, node: str, conn: C, now: float) -> list[C]:
        """Keep ``conn`` (its stream ended cleanly); returns those to close: the oldest of
        ``node``'s beyond the bound, and any expired."""
        out = self.expire(now)
        queue = self._idle.setdefault(node, deque())
        queue.append(Idle(conn, now + self.idle_timeout))
        while len(queue) > self.per_source:
            out.append(queue.popleft().conn)
        if not queue:
            del self._idle[node]
        return out

    def take(self, node: str, now: float, usable: Callable[[C], bool] = lambda c: True
             ) -> tuple[C | None, list[C]]:
        """The most recently used idle connection to ``node`` that is ``usable`` (None: dial
        a new one), and those to close: expired ones, and unusable ones passed over."""
        out = self.expire(now)
        queue = self._idle.get(node)
        found: C | None = None
        while queue and found is None:
            conn = queue.pop().conn
            if usable(conn):
                found = conn
            else:
                out.append(conn)
        if queue is not None and not queue:
            del self._idle[node]
        return found, out

    def refill(self, node: str) -> bool:
        """Whether to dial ``node`` once more now, in the background: its idle connections and
        those being dialled number fewer than ``spare``. True counts that dial as under way
        until :meth:`dialled`."""
        if self.idle(node) + self._dialling[node] >= self.spare:
            return False
        self._dialling[node] += 1
        return True

    def dialled(self, node: str) -> None:
        """A dial :meth:`refill` asked for ended (its connection is :meth:`put`, or it
        failed)."""
        self._dialling[node] -= 1
        if self._dialling[node] <= 0:
            del self._dialling[node]

    def forget(self, node: str, conn: C) -> bool:
        """``conn`` closed while idle (the other side hung up): no longer kept. True if it
        was."""
        queue = self._idle.get(node)
        if queue is None:
            return False
        for item in queue:
            if item.conn is conn:
                queue.remove(item)
                if not queue:
                    del self._idle[node]
                return True
        return False

    def expire(self, now: float) -> list[C]:
        """Remove and return every connection idle past its timeout (but each member's newest
        ``keep``)."""
        out: list[C] = []
        for node in list(self._idle):
            queue = self._idle[node]
            while len(queue) > self.keep and queue[0].expires <= now:
                out.append(queue.popleft().conn)
            if not queue:
                del self._idle[node]
        return out

    def drop(self, node: str) -> list[C]:
        """``node`` died or fell silent: every idle connection to it, to close."""
        return [item.conn for item in self._idle.pop(node, ())]

    def drop_all(self) -> list[C]:
        """At shutdown: every idle connection, to close."""
        out = [item.conn for queue in self._idle.values() for item in queue]
        self._idle.clear()
        return out

    def next_expiry(self) -> float | None:
        """When the oldest connection that may expire does (None: none may)."""
        return min((q[0].expires for q in self._idle.values() if len(q) > self.keep),
                   default=None)
