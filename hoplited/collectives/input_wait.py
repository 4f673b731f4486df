"""A reduce's wait for one input as a pure core: poll its shard again, sleep, or give up.

Theory of operation. The coordinator waits for each input at the input's shard in bounded long
polls (``WaitObject``), so a shard never keeps a waiter the coordinator gave up on. The shard
answers a poll in one of three ways: the input's holders; a timeout error once the poll's own
time ran out; or, at once, the error it recorded for the id (a tombstone: the id is the result
of a reduce that failed, perhaps itself with a timeout). Only the poll's expiry is polled
again, and only while the reduce's deadline is beyond that poll; any other error, a stored
timeout included, is the input's failure. A timeout that comes back before half its poll's time
has passed cannot be the expiry (the shard counts the poll from when it received it, after we
sent it), so it is a stored error. Holders that are all dead or excluded (the shard has not
heard of a death yet) are asked for again after ``REWAIT_POLL``.

So the wait never asks twice without, in between, either a poll held at the shard for at least
half of ``LONG_POLL`` or a sleep: whatever the shard answers, it cannot spin. Nothing here waits
or does I/O: the coordinator (``hoplited.collectives.coordinator``) carries out each step and
reports its outcome with the clock's ``now``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hoplite_client.wire.errors import HopliteError, HopliteTimeoutError
from hoplite_client.wire.ids import ObjectID

# A coordinator re-asks a shard for an input this often. A wait it abandons (a backup input
# not needed any more) is cancelled at the shard at once (``Cancel``, docs/protocol.md §5);
# had the connection closed first, it would still end there within this time.
LONG_POLL = 30.0
# A lost input's shard may still list the dead node as its holder for a moment (its own
# verdict comes later): the coordinator asks again this often until another node holds it.
REWAIT_POLL = 0.1
# A timeout back sooner than this share of its poll's time is the shard's stored error, not the
# poll's expiry; half leaves room for clock granularity (uvloop's clock ticks in milliseconds).
EXPIRY_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Poll:
    """Ask the shard (``WaitObject``), which may hold the request ``timeout`` seconds."""

    timeout: float


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``delay`` seconds, then ask :meth:`InputWait.poll` for the next poll."""

    delay: float


@dataclass(frozen=True, slots=True)
class Ready:
    """The input is complete on a usable holder (or came inline): the wait is over."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The input failed with ``error``: the plan hears ``InputFailed``."""

    error: HopliteError


Step = Poll | Sleep | Ready | GiveUp


class InputWait:
    """The decisions of one wait for input ``oid``, bounded by ``deadline`` (an absolute time
    on the clock the calls' ``now`` come from; None: none)."""

    def __init__(self, oid: ObjectID, deadline: float | None, long_poll: float = LONG_POLL,
                 rewait: float = REWAIT_POLL) -> None:
        self.oid, self.deadline, self.long_poll, self.rewait = oid, deadline, long_poll, rewait
        self._sent = 0.0  # when the pending poll was sent
        self._timeout = 0.0  # how long the shard may hold it
        self._last = False  # it runs to the deadline: its expiry is the reduce's timeout

    def poll(self, now: float) -> Poll:
        """The next poll: a long one, or the time that remains if that is shorter."""
        remaining = None if self.deadline is None else max(0.0, self.deadline - now)
        self._last = remaining is not None and remaining <= self.long_poll
        self._sent = now
        self._timeout = self.long_poll if remaining is None else min(remaining, self.long_poll)
        return Poll(self._timeout)

    def failed(self, now: float, error: HopliteError) -> Poll | GiveUp:
        """The poll raised ``error``: only its own expiry before the deadline is polled again."""
        expired = (isinstance(error, HopliteTimeoutError)
                   and now - self._sent >= self._timeout * EXPIRY_SHARE)
        if expired and not self._last:
            return self.poll(now)
        return GiveUp(error)

    def answered(self, now: float, usable: bool, holders: Sequence[str]) -> Ready | Sleep | GiveUp:
        """The shard named the input's ``holders``; ``usable``: one is alive and not excluded
        (or the input came inline). Otherwise ask again shortly, while time remains."""
        if usable:
            return Ready()
        if self.deadline is not None and self.deadline - now <= self.rewait:
            return GiveUp(HopliteTimeoutError(
                f"input {self.oid.hex()} has no live holder but {list(holders)}",
                oid=self.oid.hex()))
        return Sleep(self.rewait)
