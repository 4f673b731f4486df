"""What a ``Locate`` says about its requester, as one tagged value (docs/protocol.md §6.1).

A requester is a plain get (``Plain``), a ring member that pulls from its predecessor
(``InRing``, docs/design.md §4), a get among ``receivers`` known receivers (``Among``,
docs/design.md §3), or the receiver of one half of an object taken as two halves (``Half``).
On the wire a hint is its tag followed by its fields; its values are checked by
:func:`check_hint` where a shard receives it.
"""

from __future__ import annotations

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.receivers import check_receivers
from hoplite_client.wire.schema import variant


@variant(0)
class Plain:
    """A get that knows nothing more: the shard picks the usual source."""


@variant(1)
class InRing:
    """A ring member: its source is its predecessor in node-id order among the holders and
    the other ring requesters, if that one asks soon (a striped allreduce's gathers)."""


@variant(2)
class Among:
    """A get of one of ``receivers`` nodes getting the object together (1 or more): the
    shard keeps the largest count heard and shapes the gets as a tree, or as two trees of
    halves, where that beats a chain."""

    receivers: int


@variant(3)
class Half:
    """A source of half ``half`` (0 or 1) of an object the shard split in two, the sender's
    parent in that half's tree; ``index``, ``receivers`` and ``window`` (lo, hi) repeat what
    the split said (-1, 0 and None: not said), from which a shard whose entry was rebuilt
    learns the trees again."""

    half: int
    index: int
    receivers: int
    window: list[int] | None


LocateHint = Plain | InRing | Among | Half
PLAIN = Plain()
IN_RING = InRing()


def among(receivers: int) -> Plain | Among:
    """The hint of a get that says ``receivers`` (0: unknown, a plain get)."""
    return Among(receivers=receivers) if receivers else PLAIN


def check_hint(hint: LocateHint) -> LocateHint:
    """``hint`` if its values make sense (receivers in range, a half 0 or 1, a window of two
    offsets); else InvalidArgumentError. A half's window is checked against the object by
    the shard."""
    if isinstance(hint, Among):
        if check_receivers(hint.receivers) < 1:
            raise InvalidArgumentError("a get among receivers says how many (1 or more), "
                                       "not 0")
    elif isinstance(hint, Half):
        if hint.half not in (0, 1):
            raise InvalidArgumentError(f"half must be 0 or 1, not {hint.half}")
        check_receivers(hint.receivers)
        if hint.window is not None and len(hint.window) != 2:
            raise InvalidArgumentError(f"a window is two offsets (lo, hi), not "
                                       f"{len(hint.window)}")
    return hint
