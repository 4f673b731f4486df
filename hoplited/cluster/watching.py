"""Who pings whom: each member is watched by a fixed number of others, not by everyone.

With every member pinging every other one, an idle daemon's CPU grows with the cluster (about
0.1% of a core per peer here, a core at 1,000 members; docs/design.md §5, "Watchers"). Here
the live members stand on a ring ordered by a hash of their ids, and each one pings the
``watchers`` members that follow it: every member has exactly that many watchers (its
predecessors), and a member's share of the pinging stays the same however large the cluster.
The rest learn of a silent member from an ``Alarm`` its watchers send, and check it with a
Ping of their own (docs/design.md §5, "Watchers"). Clusters of at most ``watchers + 1``
members are a full mesh: everyone pings everyone, as before.

Every node computes the same ring from the same membership; views that differ for a moment
(a death not yet known everywhere) only shift a few watchers for that moment.
"""

from __future__ import annotations

from collections.abc import Iterable

from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.cluster.membership import node_key


def _neighbours(node: str, alive: Iterable[str], watchers: int, step: int) -> frozenset[str]:
    """The ``watchers`` members after ``node`` on the ring (``step`` 1) or before it (-1);
    every other member when there are no more than that."""
    if watchers < 1:
        raise InvalidArgumentError(f"watchers must be at least 1, not {watchers}")
    ring = sorted({*alive, node}, key=lambda n: (node_key(n), n))
    if len(ring) - 1 <= watchers:
        return frozenset(n for n in ring if n != node)
    at = ring.index(node)
    return frozenset(ring[(at + step * i) % len(ring)] for i in range(1, watchers + 1))


def watched_by(me: str, alive: Iterable[str], watchers: int) -> frozenset[str]:
    """The members ``me`` pings every interval: the ``watchers`` that follow it on the ring."""
    return _neighbours(me, alive, watchers, 1)


def watchers_of(node: str, alive: Iterable[str], watchers: int) -> frozenset[str]:
    """The members that ping ``node`` every interval: the ``watchers`` that precede it."""
    return _neighbours(node, alive, watchers, -1)


def to_alarm(me: str, node: str, alive: Iterable[str], watchers: int) -> list[str]:
    """Whom a watcher of ``node`` tells that it fell silent: the live members that do not
    watch it themselves, sorted (none in a full mesh)."""
    alive = list(alive)
    skip = watchers_of(node, alive, watchers) | {me, node}
    return sorted(n for n in set(alive) if n not in skip)
