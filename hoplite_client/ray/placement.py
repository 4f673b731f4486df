"""Which Ray nodes need a daemon started or forgotten, as a pure function.

The supervisor (:mod:`.supervisor`) asks Ray for its nodes every few seconds and feeds them
here with what it knows of the daemons it started; the answer is what to do: start a daemon on
a node that has none (joining a live one; the first daemon joins nobody), forget a daemon whose
node died (Ray killed the actor with it, and ``--exit-with-parent`` took the daemon along).
A node whose daemon failed to start is not tried again on every pass: it waits
:data:`RETRY_AFTER` seconds. Nothing here waits or does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Seconds before a node whose daemon failed to start is tried again.
RETRY_AFTER = 30.0


@dataclass(frozen=True, slots=True)
class Daemon:
    """What the supervisor knows of one node's daemon: where peers reach it (``listen``, empty
    while starting) or, if it failed, when."""

    listen: str = ""
    failed_at: float | None = None


@dataclass(frozen=True, slots=True)
class Start:
    """Start a daemon on Ray node ``node``, joining ``join`` (empty: it is the first)."""

    node: str
    join: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Forget:
    """The daemon of Ray node ``node`` went with its node."""

    node: str


Instruction = Start | Forget


def reconcile(alive: Sequence[str], daemons: Mapping[str, Daemon],
              now: float) -> list[Instruction]:
    """What to do for the Ray nodes ``alive`` (in Ray's order) given ``daemons`` (by node).

    Daemons of nodes no longer alive are forgotten first. Then every alive node without a
    daemon (or whose start failed over :data:`RETRY_AFTER` ago) gets one that joins every
    daemon already listening, so that any live one lets it in; while none listens, only the
    first such node gets one (the seed: two daemons joining nobody would make two clusters),
    and none while a seed is still starting."""
    out: list[Instruction] = [Forget(node) for node in daemons if node not in alive]
    here = {node: d for node, d in daemons.items() if node in alive}
    live = tuple(d.listen for d in here.values() if d.listen)
    need = [node for node in alive if node not in here or _retry(here[node], now)]
    if live:
        return out + [Start(node, live) for node in need]
    starting = any(not d.listen and d.failed_at is None for d in here.values())
    if need and not starting:
        out.append(Start(need[0], ()))
    return out


def _retry(daemon: Daemon, now: float) -> bool:
    """Whether a daemon's failed start is old enough to try again."""
    return daemon.failed_at is not None and now - daemon.failed_at >= RETRY_AFTER
