"""Peer liveness as a pure core: when to ping a member, and when to declare it dead.

Theory of operation. Every link runs a heartbeat: ``interval`` seconds after the last attempt
ended, a Ping is sent with its own timeout. A sign of life is an answered Ping or any other
reply on the link (``Seen``); it moves ``last_seen`` forward, never back, so a late or
duplicated answer cannot make a peer look more silent than it is. A peer is declared dead

- when an attempt fails (timeout, lost connection, any error) while it has been silent for at
  least ``timeout``;
- at once when it refuses a reconnection: nothing listens on its port, its process is gone.
  A connection that closes on its own (``Closed``) is redialled at once rather than an
  interval later, so a killed peer (its kernel resets the connection, then refuses the
  redial) is declared dead within milliseconds;
- at the latest at the *deadline* ``last_seen + timeout + interval``, whatever is in flight.

The deadline bounds the verdict whatever the attempts do. Were the silence checked only when an
attempt fails, a failure could come early: a reply seen while a Ping was in flight (the peer
answered an older request, then was SIGSTOPped) makes the Ping's timeout end before
``timeout`` of silence, and the verdict would wait a whole further interval plus timeout (up to
``2 x timeout + interval``, more when a reconnection's three handshake steps each take their own
timeout). So every Ping's timeout is cut so that it ends by the deadline, and after a failed
attempt the driver is woken at the deadline at the latest. On the ordinary schedule (a Ping
``interval`` after the last answer) the cut is exactly ``timeout``, so a healthy or plainly
silent peer's Pings keep their whole timeout: a SIGSTOPped peer is dead ``timeout + interval``
after its last answer.

Suspicion, optional (``suspect_after``). A Ping unanswered for ``suspect_after`` seconds, or a
failed attempt, makes the peer *suspected* (``Suspect``) long before the verdict: the daemon
stops relying on it (its pulls move elsewhere, a reduce repairs around it, the directory takes
a lost object put again, docs/design.md §5), but it stays a member. Its next sign of life
clears the suspicion (``Trust``); a false suspicion costs redone work, never a wrong result.
With suspicion on, a ``SendPing`` is followed by a ``WaitUntil`` at the suspicion time: the
driver runs the Ping concurrently and feeds a ``Tick`` then if the Ping is still unanswered.

Watching, for clusters larger than the watch set (docs/design.md §5, "Watchers"). A peer this
node does not watch (``watched`` False, or ``Watch(watched=False)``) gets no periodic Ping:
the core answers ``Idle`` until there is a reason to ask it. Reasons are a closed connection,
an ``Alarm`` from a member that watches it, or our own suspicion; the core then pings every
interval until the peer answers, and its silence counts from when we began asking, not from
the last time we happened to hear from it. An alarm is a claim, never a verdict: the peer is
suspected only when our own Ping goes unanswered for ``suspect_after`` (or fails), and an
alarm that it is dead kills it only together with that evidence of our own, so a watcher cut
off from a healthy peer cannot condemn it everywhere. A watched peer's suspicion or death
comes with ``Warn``: tell the members that do not watch it.

Nothing here waits or reads a clock: time arrives in the events, and ``handle`` returns the
instructions to carry out. A driver is a short loop: feed ``Tick(now)``; on ``WaitUntil(t)``
sleep until ``t`` and feed ``Tick``; on ``SendPing(timeout)`` run one Ping (connecting first if
needed) bounded by ``timeout`` as a whole and feed ``Answered`` or ``Failed``; on ``ReportRtt``
tell the link model; on ``DeclareDead`` declare it and stop. Replies to other requests are fed
as ``Seen`` and a refused dial from any request as ``Failed(now, "refused")``.

Our own stalls. The deadline holds only while the driver runs. An event that comes more than an
interval after the time the core last asked to be woken (a ``WaitUntil``, or the expiry of the
Ping in flight) shows that our own process stalled (SIGSTOP, a long pause): the peer's silence
meanwhile is not evidence. Its last sign of life moves forward by the stall, a Ping whose
timeout ran out during it is asked again with a whole timeout, and a Ping still in flight is
given ``suspect_after`` of our running time again before it makes the peer suspected. A node
that ran again after a pause past the timeout would otherwise condemn peers that were only
waiting for it; so each verdict rests on silence we were awake to see (docs/design.md §5,
"Declared dead, then running again").

Asking others first, optional (``indirect``). A peer silent to us may be silent to us only:
the link between us broke while both of us reach everyone else. Declaring it dead then would
split our views (each of us holds the other dead, nobody else does), and once the link worked
again the side rule would send one of us back as a new member, its objects lost (fencing,
docs/design.md §5). So ``indirect`` seconds before the deadline the core says
``AskOthers``: a few other members ping the peer for us, each answer within that time. If one
reached it (``Vouched``), the peer runs: its silence counts from then, it stays suspected (our
own way to it is broken), and the core asks again before the next deadline. A verdict for
silence comes only at the deadline after an ask that nobody vouched for; refusals, alarms and
verdicts of the side rule are unchanged (docs/design.md §5, "A link broken between two
members").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypeAlias

from hoplite_client.wire.errors import InvalidArgumentError

# After a lost connection the next attempt waits this much (at most one interval) more than
# the interval: PeerLink._beat's ``min(interval, 0.2)``, a short pause before redialling.
LOST_PAUSE = 0.2

FailureKind: TypeAlias = Literal["timeout", "lost", "refused"]
FAILURE_KINDS: tuple[FailureKind, ...] = ("timeout", "lost", "refused")


# --- events ---
@dataclass(frozen=True, slots=True)
class Tick:
    """The driver woke up (at a ``WaitUntil`` time, or whenever it likes)."""

    now: float


@dataclass(frozen=True, slots=True)
class Answered:
    """Our Ping was answered, ``rtt`` seconds after it was sent."""

    now: float
    rtt: float


@dataclass(frozen=True, slots=True)
class Failed:
    """Our Ping failed: ``timeout`` (no answer in time, or any other error), ``lost`` (the
    connection broke) or ``refused`` (a dial, from any request, was refused)."""

    now: float
    kind: FailureKind

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            raise InvalidArgumentError(f"unknown failure kind {self.kind!r}")


@dataclass(frozen=True, slots=True)
class Seen:
    """Some other request on the link got a reply: a sign of life."""

    now: float


@dataclass(frozen=True, slots=True)
class Closed:
    """The link's connection closed without our asking (reset or shut down by the peer)."""

    now: float


@dataclass(frozen=True, slots=True)
class Watch:
    """The peer entered (``watched``) or left this node's watch set."""

    now: float
    watched: bool


@dataclass(frozen=True, slots=True)
class Alarm:
    """A member that watches the peer found it silent (``dead``: declared it dead)."""

    now: float
    dead: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    """Another rule declared the peer dead: it refuses us, and its side of a disagreement
    lost (``partitions.py``); it runs again as a new member."""

    now: float
    reason: str


@dataclass(frozen=True, slots=True)
class Vouched:
    """A member we asked reached the peer for us: it runs, only our own way to it fails."""

    now: float


Event: TypeAlias = Tick | Answered | Failed | Seen | Closed | Watch | Alarm | Verdict | Vouched


# --- instructions ---
@dataclass(frozen=True, slots=True)
class SendPing:
    """Send one Ping now (dialling first if needed); give up on all of it after ``timeout``."""

    timeout: float


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Feed the next ``Tick`` at time ``t`` (an outcome of a Ping may come first)."""

    t: float


@dataclass(frozen=True, slots=True)
class ReportRtt:
    """A round-trip time measured by a Ping, for the link model."""

    rtt: float


@dataclass(frozen=True, slots=True)
class Suspect:
    """The peer looks silent: stop relying on it, but keep it as a member."""

    reason: str


@dataclass(frozen=True, slots=True)
class Trust:
    """A suspected peer showed a sign of life again."""


@dataclass(frozen=True, slots=True)
class DeclareDead:
    """The peer is dead; fail everything waiting on it. Nothing follows this."""

    reason: str


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to do until an event arrives: the peer is not watched and nothing calls for a
    Ping."""


@dataclass(frozen=True, slots=True)
class Warn:
    """Tell the members that do not watch the peer that it is suspected (or ``dead``); each
    then asks it itself."""

    dead: bool


@dataclass(frozen=True, slots=True)
class AskOthers:
    """Ask a few other members to ping the peer for us, each to answer within ``timeout``;
    feed ``Vouched`` when one of them reached it."""

    timeout: float


Instruction: TypeAlias = (SendPing | WaitUntil | ReportRtt | Suspect | Trust | DeclareDead | Idle
                          | Warn | AskOthers)


class Liveness:
    """The heartbeat of one peer: events in, instructions out (see the module docstring)."""

    def __init__(self, interval: float, timeout: float, now: float,
                 suspect_after: float | None = None, watched: bool = True,
                 indirect: float | None = None) -> None:
        if not 0 < interval < timeout:
            raise InvalidArgumentError("liveness needs 0 < interval < timeout")
        if suspect_after is not None and not 0 < suspect_after < timeout:
            raise InvalidArgumentError("liveness needs 0 < suspect_after < timeout")
        if indirect is not None and not 0 < indirect < timeout:
            raise InvalidArgumentError("liveness needs 0 < indirect < timeout")
        self.interval = interval
        self.timeout = timeout
        self.suspect_after = suspect_after
        self.indirect = indirect
        self._suspected = False
        self._suspect_at: float | None = None  # when the Ping in flight makes it suspected
        self._now = now  # the latest time any event carried: our clock never runs backwards
        self._last_seen = now  # a new link counts as a sign of life: silence counts from here
        self._next_ping = now + interval
        self._watched = watched
        self._asking = False  # a closed connection or an alarm: Ping until the peer answers
        self._condemned = False  # a watcher declared it dead: our own failed Ping confirms it
        self._failing = False  # the latest attempt failed (cleared by an answer)
        self._expires: float | None = None  # when the Ping in flight times out, if any
        self._dead = False
        self._early = -interval  # when a closed connection last brought a Ping forward
        self._due: float | None = None  # when the driver should feed us next, if it should
        self._reached = -math.inf  # when another member last reached the peer for us
        self._asked: float | None = None  # when we last asked others (``indirect``)
        self._asked_for: float | None = None  # the silence that ask was for (its start)

    @property
    def last_seen(self) -> float:
        """The latest sign of life."""
        return self._last_seen

    @property
    def deadline(self) -> float:
        """The time by which the peer is declared dead unless it shows a sign of life (or,
        with ``indirect``, another member reaches it for us)."""
        return self._alive_at() + self.timeout + self.interval

    def _alive_at(self) -> float:
        """When the current silence began: our last sign of life, or another member's."""
        return max(self._last_seen, self._reached)

    def _asked_now(self) -> bool:
        """Whether others were asked about the current silence."""
        return self._asked_for is not None and self._asked_for == self._alive_at()

    def _ask_at(self) -> float | None:
        """When to ask others about the current silence (None: off, or asked already)."""
        if self.indirect is None or self._asked_now():
            return None
        return self.deadline - self.indirect

    def _verdict_at(self) -> float:
        """When silence makes the peer dead: the deadline, or with ``indirect`` the end of an
        ask made for this silence (never before the ask)."""
        if self.indirect is None:
            return self.deadline
        if self._asked is None or not self._asked_now():
            return math.inf
        return max(self.deadline, self._asked + self.indirect)

    def _limit(self) -> float:
        """The latest time the driver must feed us while the peer fails: the verdict, or the
        ask before it."""
        ask = self._ask_at()
        return self._verdict_at() if ask is None else min(ask, self._verdict_at())

    @property
    def dead(self) -> bool:
        return self._dead

    @property
    def suspected(self) -> bool:
        return self._suspected

    @property
    def in_flight(self) -> bool:
        """Whether a Ping has been sent and its outcome not yet fed."""
        return self._expires is not None

    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; returns what the driver must do next (nothing once dead)."""
        if self._dead:
            return []
        self._now = max(self._now, event.now)
        if self._due is not None and self._now - self._due > self.interval:
            self._resumed(self._now - self._due)
        out = self._handle(event)
        if any(isinstance(ins, SendPing | WaitUntil | Idle) for ins in out):
            waits = [ins.t for ins in out if isinstance(ins, WaitUntil)]
            if self._expires is not None:
                waits.append(self._expires)
            self._due = min(waits, default=None)
        return out

    def _resumed(self, stall: float) -> None:
        """We stalled for ``stall`` seconds: none of it counts as the peer's silence."""
        self._due = None
        self._last_seen = min(self._now, self._last_seen + stall)
        self._reached = min(self._now, self._reached + stall)
        if self._expires is not None and self._now >= self._expires:
            self._expires = self._suspect_at = None  # timed out while we slept: ask again
            self._next_ping = self._now
        elif (self._expires is not None and self._suspect_at is not None
              and self.suspect_after is not None):  # a Ping in flight: S of our time again
            self._suspect_at = min(self._expires, self._now + self.suspect_after)

    def _handle(self, event: Event) -> list[Instruction]:
        if isinstance(event, Seen):
            return self._saw(event.now)  # deadlines only move later: the current wait holds
        if isinstance(event, Answered):
            return self._answered(event)
        if isinstance(event, Failed):
            return self._failed(event.kind)
        if isinstance(event, Verdict):
            return self._die(event.reason)
        if isinstance(event, Vouched):
            self._reached = max(self._reached, event.now)  # no Trust: our way to it fails
            return []  # deadlines only move later: the current wait holds
        if isinstance(event, Watch):
            if event.watched:
                self._wake()  # as a new link does
            self._watched = event.watched
        elif isinstance(event, Alarm):
            if event.dead and self._suspected:  # our own Ping already went unanswered
                self._condemned = True  # the watcher told the others: no Warn from us
                return self._die("declared dead by a watcher, and silent to us too")
            self._condemned |= event.dead
            self._ask_early()
        elif isinstance(event, Closed):
            if self._expires is not None:
                return []  # the Ping in flight fails on its own, its outcome decides
            self._ask_early()
        return self._tick()

    def _active(self) -> bool:
        """Whether the peer is pinged every interval: watched, or a reason to ask holds."""
        return self._watched or self._asking or self._suspected or self._failing

    def _wake(self) -> None:
        """An idle peer is pinged again from now on: its silence counts from now, the first
        Ping an interval later."""
        if not self._active():
            self._last_seen = max(self._last_seen, self._now)
            self._next_ping = self._now + self.interval

    def _ask_early(self) -> None:
        """Ping now, at most once per interval (a peer that keeps closing, or a member that
        keeps sending alarms, cannot spin us); an idle peer's silence counts from now."""
        self._wake()
        self._asking = True
        if self._expires is None and self._now >= self._early + self.interval:
            self._early = self._now
            self._next_ping = min(self._next_ping, self._now)

    def _saw(self, when: float) -> list[Instruction]:
        """A sign of life: the peer is trusted again if it was suspected."""
        self._last_seen = max(self._last_seen, when)
        if not self._suspected:
            return []
        self._suspected = False
        return [Trust()]

    def _suspect(self, reason: str) -> list[Instruction]:
        self._suspect_at = None
        if self.suspect_after is None or self._suspected:
            return []
        self._suspected = True
        return [Warn(dead=False), Suspect(reason)] if self._watched else [Suspect(reason)]

    def _answered(self, event: Answered) -> list[Instruction]:
        trust = self._saw(event.now)
        if self._expires is None:
            return trust  # a duplicate, or the answer to a Ping already given up: no RTT
        self._expires = self._suspect_at = None
        self._failing = self._asking = self._condemned = False
        self._next_ping = self._now + self.interval
        if not self._active():
            return [*trust, ReportRtt(event.rtt), Idle()]
        return [*trust, ReportRtt(event.rtt), WaitUntil(self._next_ping)]

    def _failed(self, kind: FailureKind) -> list[Instruction]:
        if kind == "refused":
            return self._die("refuses connections")  # its process is gone
        if self._expires is None:
            return []  # not our Ping's outcome (or already timed out on a Tick)
        self._expires = None
        return self._attempt_failed(kind)

    def _attempt_failed(self, kind: FailureKind) -> list[Instruction]:
        if self._condemned:
            return self._die(f"declared dead by a watcher; our ping failed too ({kind})")
        silent = self._now - self._alive_at()
        if self.indirect is None and silent >= self.timeout:
            return self._die(f"silent for {silent:.1f}s (ping: {kind})")
        if self._now >= self._verdict_at():
            return self._die(f"silent for {silent:.1f}s, and no member we asked reached it "
                             f"(ping: {kind})")
        self._failing = True
        pause = min(self.interval, LOST_PAUSE) if kind == "lost" else 0.0
        self._next_ping = self._now + pause + self.interval
        return [*self._suspect(f"ping failed ({kind})"),
                WaitUntil(min(self._next_ping, self._limit()))]

    def _tick(self) -> list[Instruction]:
        ask = self._ask()
        return [*ask, *self._plan()] if ask else self._plan()

    def _ask(self) -> list[Instruction]:
        """Ask others about the current silence if it is time (``indirect``): the peer fails
        us, or a Ping of ours is out."""
        at = self._ask_at()
        if (at is None or self._now < at or self.indirect is None
                or not (self._failing or self._expires is not None)):
            return []
        self._asked, self._asked_for = self._now, self._alive_at()
        return [AskOthers(self.indirect)]

    def _clamp(self, t: float) -> float:
        """``t``, or the time to ask others if that comes first while a Ping is out."""
        ask = self._ask_at()
        return t if ask is None else min(t, ask)

    def _plan(self) -> list[Instruction]:
        if self._expires is not None:
            if self._suspect_at is not None and self._now >= self._suspect_at:
                unanswered = self.suspect_after
                if self._condemned:
                    return self._die(f"declared dead by a watcher; no answer to our ping "
                                     f"for {unanswered}s")
                return [*self._suspect(f"no answer to a ping for {unanswered}s"),
                        WaitUntil(self._clamp(self._expires))]
            if self._now < self._expires:
                return [WaitUntil(self._clamp(self._expires if self._suspect_at is None
                                              else min(self._expires, self._suspect_at)))]
            self._expires = self._suspect_at = None  # the driver did not bound its Ping:
            return self._attempt_failed("timeout")  # count it as timed out
        if self._failing and self._now >= self._verdict_at():
            silent = self._now - self._alive_at()
            asked = "" if self.indirect is None else ", and no member we asked reached it"
            return self._die(f"silent for {silent:.1f}s{asked} (no answer by the deadline)")
        if not self._active():
            return [Idle()]
        if self._now < self._next_ping:
            wake = min(self._next_ping, self._limit()) if self._failing else self._next_ping
            return [WaitUntil(wake)]
        budget = self.timeout
        if self._failing:  # > 0, or the verdict check above would have fired
            end = self.deadline if self._now < self.deadline else self._verdict_at()
            budget = min(budget, end - self._now)
        self._expires = self._now + budget
        ask = self._ask_at()
        if not (self.suspect_after is None or self._suspected or budget <= self.suspect_after):
            self._suspect_at = self._now + self.suspect_after
            ask = self._clamp(self._suspect_at)
        return [SendPing(budget)] if ask is None else [SendPing(budget), WaitUntil(ask)]

    def _die(self, reason: str) -> list[Instruction]:
        self._dead = True
        self._expires = self._suspect_at = None
        if self._watched and not self._condemned:
            return [Warn(dead=True), DeclareDead(reason)]
        return [DeclareDead(reason)]
