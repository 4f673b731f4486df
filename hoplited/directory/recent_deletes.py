"""The deletes this member made lately, and which of them to send again when owners move.

A delete reaches the holders its owner shard knows of. A holder whose announcement was still on
its way (to an owner that then died, or to a stand-in that gave the id back to its trusted
owner) announces its copy to the next owner, which never heard of the delete, and the copy is
kept for good. So the deleter remembers each delete for a window, and when the owner of a
remembered id moves, it sends the delete again to the new owner, with the version the first
one removed (docs/design.md §5, "Deletes and moving owners"). A pure core: the caller passes
the time and who owns what.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from hoplite_client.wire.ids import ObjectID

# Deletes remembered at most, oldest forgotten first: after an owner change each is checked
# for a move, at up to 14 us each with 1,000 members (docs/benchmarks.md, "Owners at 1,000
# members"), so this bounds that pause to about 0.1 s.
RECENT_MAX = 4096


@dataclass(frozen=True, slots=True)
class Resend:
    """Send the delete of ``oid`` again to its new owner; ``version``: the one it removed;
    ``retire``: it was a retire (its copies are withdrawn, not deleted)."""

    oid: ObjectID
    version: bytes
    retire: bool = False


class RecentDeletes:
    """Deletes made in the last ``window`` seconds (at most ``limit``)."""

    def __init__(self, window: float, limit: int = RECENT_MAX) -> None:
        self.window = window
        self.limit = limit
        # id -> (what a resend would send, until when it would)
        self._deletes: OrderedDict[ObjectID, tuple[Resend, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._deletes)

    def deleted(self, oid: ObjectID, version: bytes | None, now: float,
                moved: bool = False, retire: bool = False) -> Resend | None:
        """This member deleted ``oid``, removing ``version``. A delete of no known version
        is not sent again: at the new owner it could not tell the deleted object from one
        put again since under the same id, and must never remove that. ``moved``: owners
        changed while the delete was on its way, so the resends of that move
        (``owners_moved``) ran before it was known here. It is sent again at once then: a
        stand-in answered it, and the owner trusted again keeps its entry (see the case "a
        delete answered after owners moved is sent again at once" of
        tests/unit/test_recent_deletes.py). ``retire``: a delete of
        that version only, whose maker puts another under the same id (docs/design.md §4,
        "Ring allreduce"); sent again the same way, so that a copy of the retired version
        announced to the next owner is withdrawn too."""
        self._deletes.pop(oid, None)
        if version is None:
            return None
        resend = Resend(oid, version, retire)
        self._deletes[oid] = (resend, now + self.window)
        if len(self._deletes) > self.limit:
            self._deletes.popitem(last=False)
        return resend if moved else None

    def owners_moved(self, moved: Callable[[ObjectID], bool], now: float) -> list[Resend]:
        """The deletes to send again now that owners changed (``moved``: whether an id's owner
        is another one now); forgets those older than the window."""
        while self._deletes:
            oid, (_, until) = next(iter(self._deletes.items()))
            if until > now:
                break
            del self._deletes[oid]
        return [resend for oid, (resend, _) in self._deletes.items() if moved(oid)]
