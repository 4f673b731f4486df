"""A receiver's fetch of one object as a pure core: where to ask, whom to pull from, when to stop.

Theory of operation. A fetch asks the object's owner shard for a source (``AskOwner``), which
also enrols this node as a receiver resuming at its watermark. The answer is this node itself
(the object was put here meanwhile: use the local copy), no node (a small object whose bytes
came in the answer: store them), or a source. The first source fixes the object's size, type and
version (``Allocate``); resuming must never splice two different puts of one id (docs/design.md
§5), so a source offering another version (every copy was lost and the id put again) makes the
fetch drop its partial copy (``Discard``) and start over from byte 0. A pull that ends early for
a retriable reason (the source died, closed, stalled, lost its copy, spoke garbage) keeps the
bytes received, avoids that source and asks again from the watermark; a fatal error ends the
fetch. Every ended pull is reported to the shard (``Report``) so it frees the source's slot. A
dead source, or one that spoke garbage, is excluded for good. One that stalled (sent nothing
for the stall window), closed the stream or no longer has that copy may only be slow upstream
or hold a newer copy: a partial holder re-attaching, a reduce's result waiting for a repaired
slot or started again with a backup input (docs/design.md §5). It is avoided for
``STALL_RETRY`` seconds; if the owner has nobody else by then, it is asked for again. So is a
source this node only suspects (``silent`` on the pull's error), without counting against the
attempts: it may answer again once a partition heals, and excluded for good, the only holder
of a stripe would leave its gets stalled until their timeouts (see the case "a source only
suspected is avoided for a while, then taken again" of tests/unit/test_fetch_plan.py). A source
offering another version clears every exclusion: they were about copies of the old one. After
``max_attempts`` pulls that brought no byte, and no sooner than ``patience`` seconds after the
first of them, the fetch gives up: ``patience`` is the time the membership may take to declare
a silent source dead (then the owner stops offering it), so a source that only the heartbeat
can condemn — say, behind a proxy that accepts connections for it — does not make the fetch
fail just before a copy put again elsewhere becomes visible. ``Fail`` means: discard the
partial copy.

No ask waits at the owner longer than ``OWNER_POLL``: one that ran out is asked again while the
deadline allows (a timeout that comes back sooner than half a poll is the shard's stored
failure, final), so a fetch that stops leaves no waiter at the shard for long.

One fetch serves every concurrent get of an id, so its deadline is the latest of its callers'
(``CallerJoined``; None means no deadline and wins). A locate that timed out after a caller
extended that deadline is asked again with the time that remains (a timeout under the deadline
it was asked with is final: it may be the shard's record of a failed reduce); once the deadline
has passed, no caller waits and the fetch fails instead of asking again. Each caller still gives
up on its own timeout in the driver (``hoplited.transfer.fetcher``).

Phases: new -> asking <-> pulling -> over; or asking -> halves -> over, when the owner splits
the object into two halves (``FetchHalves``): each half is then a fetch of its own, with a plan
of its own, and this one only waits for both (``HalvesEnded``). An event that does not fit the
phase (an answer while a pull runs, the end of a pull that is not the current one, anything
once over) is stale: it changes nothing and yields no instruction. Nothing here waits or does I/O:
``handle(event)`` returns instructions, carried out in order; ``history`` keeps the last few.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    LocalProtocolError,
    ObjectNotFoundError,
    PeerUnavailableError,
    ProtocolError,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, Half, LocateHint
from hoplited.collectives.ops import derived_id

# Sources tried before a get gives up on a transfer: enough to ride out several deaths in a
# row, few enough that a poisoned object fails in bounded time.
MAX_ATTEMPTS = 8
# Pull errors after which another source may do better; the rest end the fetch: lost / refused
# / stalled sources, garbage on the wire, socket errors.
RETRIABLE: tuple[type[BaseException], ...] = (
    ConnectionLostError, PeerUnavailableError, HopliteTimeoutError, ProtocolError,
    ObjectNotFoundError, OSError)
# Of those, the errors of a source that may serve again soon (stalled, closed the stream, lost
# that copy: it may hold a newer one): avoided for STALL_RETRY only, not excluded.
FORGIVEN: tuple[type[BaseException], ...] = (
    HopliteTimeoutError, ConnectionLostError, ObjectNotFoundError)
# (event, instructions) pairs kept for debugging: a fetch sees about three per source.
HISTORY_MAX = 64
# How long a stalled source is avoided when the owner has nobody else: time enough for the
# owner to offer another source, short next to a stall window (about a second on the test-bed
# links), since a source that stalled because its own upstream did resumes with it.
STALL_RETRY = 0.5
# The longest one ask waits at the owner: a fetch that stops (nobody waits for it any more)
# leaves no waiter at the shard for longer. An ask that waited this long for nothing is
# simply asked again while the deadline allows.
OWNER_POLL = 10.0


# --- events ---
@dataclass(frozen=True, slots=True)
class Located:
    """The owner's answer: ``source`` to pull from, None for inline bytes; ``here`` is True
    when this node's store holds the object now (it was put here while we waited)."""

    now: float
    source: str | None
    size: int
    dtype: str
    shape: tuple[int, ...]
    version: bytes
    here: bool = False
    halves: tuple[tuple[int, int], ...] | None = None  # take it as these two halves...
    index: int = -1  # ... as this receiver of their trees...
    receivers: int = 0  # ... built for this many


@dataclass(frozen=True, slots=True)
class LocateFailed:
    """Asking the owner failed (timed out, or the shard says the object will never exist)."""

    now: float
    error: HopliteError


@dataclass(frozen=True, slots=True)
class PullEnded:
    """The pull from ``source`` ended with ``watermark`` bytes held; ``error`` None: complete."""

    now: float
    source: str
    watermark: int
    error: Exception | None


@dataclass(frozen=True, slots=True)
class CopyFailed:
    """The local partial copy was failed (deleted, or a newer put replaced it)."""

    error: HopliteError


@dataclass(frozen=True, slots=True)
class HalvesEnded:
    """Both halves' fetches ended: the copy is complete, or (``error``) one of them failed
    after its own retries."""

    error: HopliteError | None


@dataclass(frozen=True, slots=True)
class CallerJoined:
    """Another get of the same id joined; its ``deadline`` (None: none) may extend ours."""

    deadline: float | None


Event = Located | LocateFailed | PullEnded | CopyFailed | CallerJoined | HalvesEnded


# --- instructions ---
@dataclass(frozen=True, slots=True)
class AskOwner:
    """Ask the owner shard for a source, excluding ``exclude``, resuming at ``offset``, waiting
    at most ``timeout`` seconds (None: no limit), saying ``hint`` (the plan's)."""

    exclude: tuple[str, ...]
    offset: int
    timeout: float | None
    hint: LocateHint = PLAIN


@dataclass(frozen=True, slots=True)
class UseLocalCopy:
    """The object is in this node's store: wait for it to be complete and return it."""


@dataclass(frozen=True, slots=True)
class StoreInline:
    """Store the inline bytes of the last answer and return the object."""


@dataclass(frozen=True, slots=True)
class Allocate:
    """Create (and pin) the local copy the pulls write into."""

    size: int
    dtype: str
    shape: tuple[int, ...]
    version: bytes


@dataclass(frozen=True, slots=True)
class Discard:
    """Drop the partial copy: the object was put again with another version."""


@dataclass(frozen=True, slots=True)
class Pull:
    """Stream the object from ``source`` into the local copy from ``offset`` on."""

    source: str
    offset: int


@dataclass(frozen=True, slots=True)
class FetchHalves:
    """Create the local copy as two halves (``bounds``) and fetch each on its own, as
    receiver ``index`` of the two trees built for ``receivers`` (docs/design.md §3);
    ``HalvesEnded`` follows."""

    size: int
    dtype: str
    shape: tuple[int, ...]
    version: bytes
    bounds: tuple[tuple[int, int], ...]
    index: int
    receivers: int

    def hint(self, half: int) -> Half:
        """The hint a locate of half ``half`` says: what this split said."""
        lo, hi = self.bounds[half]
        return Half(half=half, index=self.index, receivers=self.receivers, window=[lo, hi])


@dataclass(frozen=True, slots=True)
class Report:
    """Tell the owner shard the pull from ``source`` ended (``complete`` or not)."""

    source: str
    complete: bool


@dataclass(frozen=True, slots=True)
class Done:
    """The fetch succeeded: return the object."""


@dataclass(frozen=True, slots=True)
class Fail:
    """The fetch failed with ``error``: discard the partial copy with it."""

    error: HopliteError


Instruction = (AskOwner | UseLocalCopy | StoreInline | Allocate | Discard | Pull | Report | Done
               | Fail | FetchHalves)
Phase = Literal["new", "asking", "pulling", "halves", "over"]


def view_id(oid: ObjectID, half: int) -> ObjectID:
    """The local id of half ``half`` of ``oid`` taken as two halves: the view its pulls fill
    and its receivers' pulls read (never published)."""
    return derived_id(oid, half, b"broadcast-half")


def is_retriable(error: BaseException) -> bool:
    """Whether another source may succeed after a pull ended with ``error``."""
    return isinstance(error, RETRIABLE)


def later(a: float | None, b: float | None) -> float | None:
    """The later of two deadlines; None (no deadline) is later than any."""
    return None if a is None or b is None else max(a, b)


class FetchPlan:
    """The decisions of one fetch of ``oid`` on node ``me``, bounded by ``deadline`` (an
    absolute time on the clock the events' ``now`` come from; None: none); its asks say
    ``hint`` (a half's fetch: ``FetchHalves.hint``)."""

    def __init__(self, oid: ObjectID, me: str, deadline: float | None,
                 max_attempts: int = MAX_ATTEMPTS, patience: float = 0.0,
                 hint: LocateHint = PLAIN) -> None:
        if max_attempts < 1:
            raise LocalProtocolError(f"max_attempts must be at least 1, not {max_attempts}")
        if not patience >= 0:  # also refuses NaN
            raise LocalProtocolError(f"patience must be at least 0, not {patience}")
        self.oid, self.me, self.deadline, self.max_attempts = oid, me, deadline, max_attempts
        self.patience = patience
        self.hint = hint
        self.phase: Phase = "new"
        self.exclude: list[str] = []  # sources excluded for good (dead, garbage), in order
        self.stalled: list[str] = []  # silent, closed or copy gone: avoided for a while
        self.attempts = 0  # pulls started
        self.fruitless = 0  # pulls that ended without a byte
        self.first_fruitless: float | None = None  # when the first of them ended
        self.watermark = 0  # bytes held, from offset 0
        self.size: int | None = None  # set once allocated, with the version
        self.version: bytes | None = None
        self.source: str | None = None  # the pull in progress
        self.outcome: Done | Fail | None = None
        self._asked_for = deadline  # the deadline the pending ask was bounded by
        self._cut_short = False  # the pending ask waits less than the time that remains
        self._polling = False  # ... because of OWNER_POLL
        self._asked_at = 0.0  # when the pending ask was sent
        self.history: deque[tuple[Event | str, tuple[Instruction, ...]]] = deque(
            maxlen=HISTORY_MAX)

    def start(self, now: float) -> list[Instruction]:
        """The first instruction: ask the owner (whatever time remains, even none)."""
        if self.phase != "new":
            raise LocalProtocolError(f"fetch of {self.oid.hex()} started twice")
        out: list[Instruction] = [self._ask(now)]
        self.history.append(("start", tuple(out)))
        return out

    def handle(self, event: Event) -> list[Instruction]:
        """Apply ``event``; return the instructions to carry out, in order."""
        if isinstance(event, CallerJoined):
            self.deadline = later(self.deadline, event.deadline)
            out: list[Instruction] = []
        else:
            out = self._handle(event)
        if out and isinstance(out[-1], Done | Fail):
            self.phase, self.outcome, self.source = "over", out[-1], None
        self.history.append((event, tuple(out)))
        return out

    def _handle(self, ev: Located | LocateFailed | PullEnded | CopyFailed | HalvesEnded
                ) -> list[Instruction]:
        if isinstance(ev, HalvesEnded):
            if self.phase != "halves":
                return []
            return [Done()] if ev.error is None else [Fail(ev.error)]
        if isinstance(ev, CopyFailed):
            if self.phase in ("new", "over"):
                return []
            report = [Report(self.source, complete=False)] if self.source is not None else []
            return [*report, Fail(ev.error)]
        if isinstance(ev, Located):
            return self._located(ev) if self.phase == "asking" else []
        if isinstance(ev, LocateFailed):
            if self.phase != "asking":
                return []
            if (isinstance(ev.error, HopliteTimeoutError) and self._cut_short
                    and not self._expired(ev.now)):
                self.stalled.clear()  # nobody else came: the silent sources may send again
                return [self._ask(ev.now)]
            if (isinstance(ev.error, HopliteTimeoutError) and self._polling
                    and ev.now - self._asked_at >= OWNER_POLL / 2
                    and not self._expired(ev.now)):
                return [self._ask(ev.now)]  # the poll ran out (a stored failure comes at once)
            if (isinstance(ev.error, HopliteTimeoutError) and self._extended()
                    and not self._expired(ev.now)):
                return [self._ask(ev.now)]  # timed out under the deadline a caller has moved
            return [Fail(ev.error)]
        return self._pull_ended(ev) if self.phase == "pulling" and ev.source == self.source else []

    def _located(self, ev: Located) -> list[Instruction]:
        if ev.source == self.me or (self.version is None and ev.here):
            return [UseLocalCopy(), Done()]
        out: list[Instruction] = []
        if self.version is not None and (ev.source is None or ev.version != self.version):
            out.append(Discard())  # put again since we started: never splice the two
            self.size = self.version = None
            self.watermark = 0
            self.exclude.clear()  # about copies of the old version
            self.stalled.clear()
        if ev.halves is not None:  # a copy begun is discarded above (its source is None)
            self.size, self.version = ev.size, ev.version
            self.phase = "halves"
            return [*out, FetchHalves(ev.size, ev.dtype, ev.shape, ev.version, ev.halves,
                                      ev.index, ev.receivers)]
        if ev.source is None:
            return [*out, StoreInline(), Done()]
        if self.version is None:
            self.size, self.version = ev.size, ev.version
            out.append(Allocate(ev.size, ev.dtype, ev.shape, ev.version))
        self.attempts += 1
        self.phase, self.source = "pulling", ev.source
        return [*out, Pull(ev.source, self.watermark)]

    def _pull_ended(self, ev: PullEnded) -> list[Instruction]:
        silent = isinstance(ev.error, PeerUnavailableError) and ev.error.data.get("silent") is True
        if ev.watermark <= self.watermark and not silent:
            self.fruitless += 1
            if self.first_fruitless is None:
                self.first_fruitless = ev.now
        self.watermark = max(self.watermark, ev.watermark)
        if ev.error is None or (self.size is not None and self.watermark >= self.size):
            return [Report(ev.source, complete=True), Done()]  # every byte is here
        out: list[Instruction] = [Report(ev.source, complete=False)]
        if not is_retriable(ev.error):
            fatal = ev.error if isinstance(ev.error, HopliteError) else HopliteError(
                f"pull of {self.oid.hex()} from {ev.source} failed: {ev.error!r}")
            if fatal is not ev.error:
                fatal.__cause__ = ev.error
            return [*out, Fail(fatal)]
        if silent or isinstance(ev.error, FORGIVEN):
            if ev.source not in self.stalled:
                self.stalled.append(ev.source)
        elif ev.source not in self.exclude:
            self.exclude.append(ev.source)
        if (self.fruitless >= self.max_attempts and self.first_fruitless is not None
                and ev.now - self.first_fruitless >= self.patience):
            return [*out, Fail(PeerUnavailableError(
                f"gave up on {self.oid.hex()} after {self.fruitless} sources sent nothing "
                f"(last: {ev.error})", oid=self.oid.hex()))]
        if self._expired(ev.now):
            return [*out, Fail(HopliteTimeoutError(
                f"object {self.oid.hex()} not received by its deadline ({self.watermark}/"
                f"{self.size} bytes; last source: {ev.error})", oid=self.oid.hex()))]
        self.phase, self.source = "asking", None
        return [*out, self._ask(ev.now)]

    def _ask(self, now: float) -> AskOwner:
        self.phase, self._asked_for = "asking", self.deadline
        remaining = None if self.deadline is None else max(0.0, self.deadline - now)
        avoid = [*self.exclude, *(s for s in self.stalled if s not in self.exclude)]
        self._cut_short = bool(self.stalled) and (remaining is None or remaining > STALL_RETRY)
        self._polling = not self._cut_short and (remaining is None or remaining > OWNER_POLL)
        self._asked_at = now
        timeout = (STALL_RETRY if self._cut_short else OWNER_POLL if self._polling
                   else remaining)
        return AskOwner(tuple(avoid), self.watermark, timeout, self.hint)

    def _extended(self) -> bool:
        """Whether a caller moved the deadline since the pending ask was sent."""
        return self._asked_for is not None and (
            self.deadline is None or self.deadline > self._asked_for)

    def _expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline
