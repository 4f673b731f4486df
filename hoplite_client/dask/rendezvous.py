"""Which cluster a host's new daemon joins: a pure decision over the registrations kept in
the Dask scheduler's metadata.

Hosts start their daemons concurrently, and two daemons that both start a new cluster never
merge. So each host first registers (an entry appended to an ordered map in the scheduler,
which handles one message at a time) and only then decides: the first host whose entry is
still current starts the cluster (:class:`Seed`), every later one joins the current entries
before its own that have an address (:class:`Join`), or waits until one has (:class:`Wait`).
A host registers anew each time it starts a daemon, so an entry left by a daemon that died
(its host's workers all gone, or restarted) is superseded, or ignored once its host has no
live worker. docs/quickstart.md, "Dask".
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

# An entry's address while its daemon starts, and once it has been stopped.
STARTING = ""
STOPPED = None


@dataclass(frozen=True)
class Seed:
    """Start a new cluster: no live host registered before us."""


@dataclass(frozen=True)
class Join:
    """Start joining any of ``peers`` (HOST:PORT, the earliest registered first)."""

    peers: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    """Hosts registered before us are still starting: ask again in a moment."""


Decision = Seed | Join | Wait


def entry_key(host: str, nonce: str) -> str:
    """The key of one registration of ``host`` (``nonce``: unique per daemon start)."""
    return f"{host}/{nonce}"


def host_of(key: str) -> str:
    """The host an entry key registers."""
    return key.rsplit("/", 1)[0]


def decide(entries: Sequence[tuple[str, str | None]], mine: str,
           live_hosts: Collection[str]) -> Decision:
    """What the daemon registered as ``mine`` does, given every registration in order
    (``(key, address)``, address :data:`STARTING` or :data:`STOPPED` as the case may be) and
    the hosts that have a live worker now."""
    keys = [key for key, _ in entries]
    if mine not in keys:
        raise ValueError(f"{mine!r} is not registered")
    latest = {host_of(key): key for key in keys}  # a later registration supersedes
    me = host_of(mine)
    before = [(key, address) for key, address in entries[:keys.index(mine)]
              if host_of(key) != me and latest[host_of(key)] == key
              and host_of(key) in live_hosts and address is not STOPPED]
    if not before:
        return Seed()
    peers = tuple(address for _, address in before if address)
    return Join(peers) if peers else Wait()
