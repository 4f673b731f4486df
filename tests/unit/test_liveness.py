"""Liveness, the heartbeat's pure core: tables of timed events and the exact instructions; its
bounds as properties over peers Hypothesis draws (derandomized: tests/conftest.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from helpers import top_level_imports
from hypothesis import given, settings
from hypothesis import strategies as st

import hoplited.cluster.liveness as liveness_module
from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.cluster.liveness import (
    LOST_PAUSE,
    Alarm,
    Answered,
    AskOthers,
    Closed,
    DeclareDead,
    Event,
    Failed,
    Idle,
    Instruction,
    Liveness,
    ReportRtt,
    Seen,
    SendPing,
    Suspect,
    Tick,
    Trust,
    Vouched,
    WaitUntil,
    Warn,
    Watch,
)

pytestmark = pytest.mark.unit

I = 1.0  # heartbeat interval of most cases (the daemon's default)  # noqa: E741
T = 5.0  # heartbeat timeout of most cases (the daemon's default)
P = LOST_PAUSE  # the extra pause after a lost connection (min(I, LOST_PAUSE) with I = 1)

S = 0.5  # suspicion after an unanswered ping of this long, in the suspicion cases
B = 1.0  # others are asked this long before the deadline, in the indirect cases
NOBODY = "no member we asked reached it"

Step = tuple[Event, list[Instruction]]


@dataclass
class Case:
    """A Liveness created at time 0, the events fed in order, and what each must return."""

    id: str
    steps: list[Step]
    last_seen: float
    dead: bool = False
    interval: float = I
    timeout: float = T
    suspect_after: float | None = None
    suspected: bool = False
    watched: bool = True
    indirect: float | None = None


CASES = [
    Case("a closed connection is redialled at once; the refusal is the verdict", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Closed(0.25), [SendPing(T)]),
        (Failed(0.26, "refused"), [Warn(dead=True), DeclareDead("refuses connections")]),
        (Closed(0.3), []),
    ], last_seen=0.0, dead=True),
    Case("a closed connection while a Ping is in flight: the Ping's outcome decides", [
        (Tick(1.0), [SendPing(T)]),
        (Closed(1.5), []),
        (Answered(1.75, 0.75), [ReportRtt(0.75), WaitUntil(2.75)]),
    ], last_seen=1.75),
    Case("a peer that keeps closing gets one early redial per interval", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Closed(0.25), [SendPing(T)]),
        (Answered(0.3, 0.05), [ReportRtt(0.05), WaitUntil(1.3)]),
        (Closed(0.5), [WaitUntil(1.3)]),  # within the interval of the last early redial
        (Closed(1.25), [SendPing(T)]),
    ], last_seen=0.3),
    Case("healthy peer: a Ping every interval after the last answer, full timeout each", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Tick(0.5), [WaitUntil(1.0)]),  # an early tick changes nothing
        (Tick(1.0), [SendPing(T)]),
        (Answered(1.25, 0.25), [ReportRtt(0.25), WaitUntil(2.25)]),
        (Tick(2.25), [SendPing(T)]),
        (Seen(2.5), []),  # another request's reply: life, no new instruction
        (Answered(2.75, 0.5), [ReportRtt(0.5), WaitUntil(3.75)]),
    ], last_seen=2.75),
    Case("one lost ping, a shorter retry within the deadline, then recovery", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Tick(1.0), [SendPing(T)]),
        (Failed(1.5, "lost"), [WaitUntil(1.5 + P + I)]),
        (Tick(1.5 + P + I), [SendPing(6.0 - (1.5 + P + I))]),  # ends by the deadline 0+T+I
        (Answered(3.0, 0.25), [ReportRtt(0.25), WaitUntil(4.0)]),
        (Tick(4.0), [SendPing(T)]),  # recovered: a full timeout again
    ], last_seen=3.0),
    Case("lost pause is at most one interval", [
        (Tick(0.0), [WaitUntil(0.125)]),
        (Tick(0.125), [SendPing(1.0)]),
        (Failed(0.25, "lost"), [WaitUntil(0.25 + 0.125 + 0.125)]),
    ], last_seen=0.0, interval=0.125, timeout=1.0),
    Case("a reply seen mid-Ping saves a timed-out Ping; the next one is answered", [
        (Tick(1.0), [SendPing(T)]),
        (Seen(1.5), []),
        (Failed(6.0, "timeout"), [WaitUntil(7.0)]),  # silent 4.5 < T
        (Tick(7.0), [SendPing(0.5)]),  # the deadline is 1.5+T+I = 7.5
        (Answered(7.25, 0.25), [ReportRtt(0.25), WaitUntil(8.25)]),
    ], last_seen=7.25),
    Case("SIGSTOP: Pings hang, dead timeout + interval after the last answer (as today)", [
        (Tick(1.0), [SendPing(T)]),
        (Answered(1.5, 0.5), [ReportRtt(0.5), WaitUntil(2.5)]),
        (Tick(2.5), [SendPing(T)]),
        (Failed(7.5, "timeout"), [Warn(dead=True), DeclareDead("silent for 6.0s (ping: timeout)")]),
    ], last_seen=1.5, dead=True),
    Case("SIGSTOP just after a reply mid-Ping: still dead by timeout + interval", [
        # Today's loop pinged again with a full timeout and condemned it at 13.5.
        (Tick(1.0), [SendPing(T)]),
        (Answered(1.5, 0.5), [ReportRtt(0.5), WaitUntil(2.5)]),
        (Tick(2.5), [SendPing(T)]),
        (Seen(3.0), []),
        (Failed(7.5, "timeout"), [WaitUntil(8.5)]),  # silent 4.5 < T
        (Tick(8.5), [SendPing(0.5)]),  # cut to end at the deadline 3+T+I = 9
        (Failed(9.0, "timeout"), [Warn(dead=True), DeclareDead("silent for 6.0s (ping: timeout)")]),
    ], last_seen=3.0, dead=True),
    Case("a failure after timeout of silence is fatal, however early in the Ping", [
        (Tick(1.0), [SendPing(T)]),
        (Failed(5.0, "lost"), [Warn(dead=True), DeclareDead("silent for 5.0s (ping: lost)")]),
    ], last_seen=0.0, dead=True),
    Case("not earlier: a failure just under timeout of silence is not fatal", [
        (Tick(1.0), [SendPing(T)]),
        (Failed(4.75, "timeout"), [WaitUntil(5.75)]),
    ], last_seen=0.0),
    Case("a lost connection whose retry would pass the deadline: dead at the deadline", [
        (Tick(1.0), [SendPing(T)]),
        (Failed(4.875, "lost"), [WaitUntil(6.0)]),  # the retry would be at 4.875 + P + I
        (Tick(5.5), [WaitUntil(6.0)]),
        (Tick(6.0), [Warn(dead=True), DeclareDead("silent for 6.0s (no answer by the deadline)")]),
    ], last_seen=0.0, dead=True),
    Case("refused reconnection (from any request): dead at once", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Failed(0.5, "refused"), [Warn(dead=True), DeclareDead("refuses connections")]),
    ], last_seen=0.0, dead=True),
    Case("refused while our Ping is in flight: dead at once", [
        (Tick(1.0), [SendPing(T)]),
        (Failed(1.5, "refused"), [Warn(dead=True), DeclareDead("refuses connections")]),
    ], last_seen=0.0, dead=True),
    Case("out of order: an answer stamped before a reply already seen", [
        (Tick(1.0), [SendPing(T)]),
        (Seen(2.0), []),
        (Answered(1.5, 0.5), [ReportRtt(0.5), WaitUntil(3.0)]),  # scheduled from time 2.0
    ], last_seen=2.0),
    Case("duplicate answer: life only, no second RTT, no new schedule", [
        (Tick(1.0), [SendPing(T)]),
        (Answered(1.5, 0.5), [ReportRtt(0.5), WaitUntil(2.5)]),
        (Answered(1.5, 0.5), []),
        (Answered(1.25, 0.25), []),  # older still: last_seen does not move back
    ], last_seen=1.5),
    Case("stale failures without a Ping in flight are not evidence", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Failed(0.5, "timeout"), []),
        (Failed(0.75, "lost"), []),
        (Tick(1.0), [SendPing(T)]),  # still the ordinary schedule, full timeout
    ], last_seen=0.0),
    Case("a driver that ticks during the Ping: the core enforces the Ping's timeout", [
        (Tick(1.0), [SendPing(T)]),
        (Tick(3.0), [WaitUntil(6.0)]),
        (Tick(6.0), [Warn(dead=True), DeclareDead("silent for 6.0s (ping: timeout)")]),
    ], last_seen=0.0, dead=True),
    Case("a Ping given up on a tick: its late outcome is life (answer) or ignored (failure)", [
        (Tick(1.0), [SendPing(T)]),
        (Seen(2.0), []),
        (Tick(6.0), [WaitUntil(7.0)]),  # timed out, silent 4 < T
        (Failed(6.0, "timeout"), []),
        (Answered(6.5, 5.5), []),  # no RTT from a Ping already given up
        (Tick(7.0), [SendPing(T)]),  # the deadline moved to 6.5+T+I: budget not cut
    ], last_seen=6.5),
    Case("our own stall past the deadline: the overdue Ping still gets a full timeout", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Tick(10.0), [SendPing(T)]),
        (Answered(10.25, 0.25), [ReportRtt(0.25), WaitUntil(11.25)]),
    ], last_seen=10.25),
    Case("our own stall with a Ping in flight: its late timeout is no verdict; asked again", [
        (Tick(1.0), [SendPing(T)]),
        (Failed(12.0, "timeout"), []),  # due at 6.0: we slept 6 s, the peer gets them back
        (Tick(12.0), [SendPing(T)]),  # a whole timeout again
        (Answered(12.1, 0.1), [ReportRtt(0.1), WaitUntil(13.1)]),
    ], last_seen=12.1),
    Case("our own stall after a failed Ping: the peer keeps only the rest of its deadline", [
        (Tick(1.0), [SendPing(T)]),
        (Failed(4.75, "timeout"), [WaitUntil(5.75)]),  # silent 4.75 s while we were awake
        (Tick(20.0), [SendPing(0.25)]),  # 14.25 s late: the deadline moves as far
        (Failed(20.25, "timeout"), [Warn(dead=True),
                                    DeclareDead("silent for 6.0s (ping: timeout)")]),
    ], last_seen=14.25, dead=True),
    Case("a stall within an interval of the wake-up is no stall: the verdict stands", [
        (Tick(1.0), [SendPing(T)]),
        (Failed(6.75, "timeout"), [Warn(dead=True),
                                   DeclareDead("silent for 6.8s (ping: timeout)")]),
    ], last_seen=0.0, dead=True),
    Case("events after death are ignored", [
        (Failed(0.5, "refused"), [Warn(dead=True), DeclareDead("refuses connections")]),
        (Tick(1.0), []),
        (Seen(1.5), []),
        (Answered(2.0, 0.1), []),
        (Failed(2.5, "refused"), []),  # declared once only
        (Failed(3.0, "timeout"), []),
    ], last_seen=0.0, dead=True),
    # --- suspicion: a ping unanswered for S, long before the verdict ---
    Case("suspicion on: a ping answered in time is followed by a wake-up it makes moot", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.0 + S)]),
        (Answered(1.1, 0.1), [ReportRtt(0.1), WaitUntil(2.1)]),
        (Tick(2.1), [SendPing(T), WaitUntil(2.1 + S)]),
    ], last_seen=1.1, suspect_after=S),
    Case("a ping unanswered for S: suspected, then trusted again by its late answer", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.2), [WaitUntil(1.5)]),  # early: nothing yet
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"), WaitUntil(1.0 + T)]),
        (Tick(2.0), [WaitUntil(1.0 + T)]),  # suspected once only
        (Answered(2.5, 1.5), [Trust(), ReportRtt(1.5), WaitUntil(3.5)]),
    ], last_seen=2.5, suspect_after=S),
    Case("another request's reply clears a suspicion too", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"), WaitUntil(1.0 + T)]),
        (Seen(1.7), [Trust()]),
        (Seen(1.8), []),
    ], last_seen=1.8, suspect_after=S),
    Case("a silent peer: suspected after S, dead at the verdict as without suspicion", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"), WaitUntil(1.0 + T)]),
        (Failed(1.0 + T, "timeout"), [Warn(dead=True), DeclareDead("silent for 6.0s (ping: timeout)")]),
    ], last_seen=0.0, dead=True, suspect_after=S, suspected=True),
    Case("our own stall mid-Ping: the Ping gets S of our running time before a suspicion", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(3.0), [WaitUntil(3.5)]),  # woken 1.5 s late
        (Answered(3.1, 2.1), [ReportRtt(2.1), WaitUntil(4.1)]),
    ], last_seen=3.1, suspect_after=S),
    Case("a lost connection makes the peer suspected at once; the answer clears it", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Failed(1.1, "lost"), [Warn(dead=False), Suspect("ping failed (lost)"), WaitUntil(1.1 + P + I)]),
        # already suspected: no second wake-up; the budget ends by the deadline
        (Tick(1.1 + P + I), [SendPing(T + I - (1.1 + P + I))]),
        (Answered(2.4, 0.1), [Trust(), ReportRtt(0.1), WaitUntil(3.4)]),
    ], last_seen=2.4, suspect_after=S),
    Case("a refusal is the verdict, suspected or not", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"), WaitUntil(1.0 + T)]),
        (Failed(1.6, "refused"), [Warn(dead=True), DeclareDead("refuses connections")]),
    ], last_seen=0.0, dead=True, suspect_after=S, suspected=True),
    # --- watching: a peer we do not watch is asked only when there is a reason ---
    Case("an unwatched peer gets no Ping; signs of life still count", [
        (Tick(0.0), [Idle()]),
        (Tick(10.0), [Idle()]),
        (Seen(11.0), []),
        (Tick(30.0), [Idle()]),  # silence alone is no reason: nobody condemns it
    ], last_seen=11.0, watched=False, suspect_after=S),
    Case("an alarm makes us ask; the answer ends the asking", [
        (Tick(0.0), [Idle()]),
        (Alarm(20.0, dead=False), [SendPing(T), WaitUntil(20.0 + S)]),
        (Answered(20.1, 0.1), [ReportRtt(0.1), Idle()]),
    ], last_seen=20.1, watched=False, suspect_after=S),
    Case("an alarm confirmed by our own unanswered Ping: suspected, no Warn from us", [
        (Tick(0.0), [Idle()]),
        (Alarm(20.0, dead=False), [SendPing(T), WaitUntil(20.0 + S)]),
        (Tick(20.0 + S), [Suspect(f"no answer to a ping for {S}s"), WaitUntil(20.0 + T)]),
        (Alarm(21.0, dead=True), [DeclareDead("declared dead by a watcher, and silent to us "
                                              "too")]),
    ], last_seen=20.0, dead=True, watched=False, suspect_after=S, suspected=True),
    Case("a dead alarm for a peer that answers us: no verdict, and alarms ask once an interval",
         [
        (Alarm(10.0, dead=True), [SendPing(T), WaitUntil(10.0 + S)]),
        (Answered(10.2, 0.2), [ReportRtt(0.2), Idle()]),
        (Alarm(10.5, dead=False), [WaitUntil(11.5)]),  # one early Ping per interval
        (Tick(11.5), [SendPing(T), WaitUntil(11.5 + S)]),
        (Answered(11.6, 0.1), [ReportRtt(0.1), Idle()]),
    ], last_seen=11.6, watched=False, suspect_after=S),
    Case("a dead alarm and no answer to our Ping for S: dead", [
        (Alarm(10.0, dead=True), [SendPing(T), WaitUntil(10.0 + S)]),
        (Tick(10.0 + S), [DeclareDead(f"declared dead by a watcher; no answer to our ping for "
                                      f"{S}s")]),
    ], last_seen=10.0, dead=True, watched=False, suspect_after=S),
    Case("a dead alarm and our Ping fails: dead", [
        (Alarm(10.0, dead=True), [SendPing(T), WaitUntil(10.0 + S)]),
        (Failed(10.1, "lost"), [DeclareDead("declared dead by a watcher; our ping failed too "
                                            "(lost)")]),
    ], last_seen=10.0, dead=True, watched=False, suspect_after=S),
    Case("a watcher that is told the peer is dead while it suspects it warns nobody again", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"),
                     WaitUntil(1.0 + T)]),
        (Alarm(2.0, dead=True), [DeclareDead("declared dead by a watcher, and silent to us "
                                             "too")]),
    ], last_seen=0.0, dead=True, suspect_after=S, suspected=True),
    Case("without suspicion, silence counts from when we began asking, not the last reply", [
        (Seen(3.0), []),
        (Alarm(100.0, dead=False), [SendPing(T)]),
        (Failed(100.5, "lost"), [WaitUntil(100.5 + P + I)]),  # silent 0.5s, not 97.5s
        (Tick(100.5 + P + I), [SendPing(100.0 + T + I - (100.5 + P + I))]),
        (Failed(106.0, "timeout"), [DeclareDead("silent for 6.0s (ping: timeout)")]),
    ], last_seen=100.0, dead=True, watched=False),
    Case("watched from some time on: Pings every interval; unwatched: idle after the answer", [
        (Tick(0.0), [Idle()]),
        (Watch(3.0, watched=True), [WaitUntil(4.0)]),
        (Tick(4.0), [SendPing(T)]),
        (Watch(4.1, watched=False), [WaitUntil(4.0 + T)]),  # the Ping in flight decides
        (Answered(4.2, 0.2), [ReportRtt(0.2), Idle()]),
    ], last_seen=4.2, watched=False),
    Case("a closed connection to an unwatched peer: asked until it answers", [
        (Tick(0.0), [Idle()]),
        (Closed(50.0), [SendPing(T)]),
        (Failed(50.1, "lost"), [WaitUntil(50.1 + P + I)]),
        (Tick(50.1 + P + I), [SendPing(50.0 + T + I - (50.1 + P + I))]),
        (Answered(51.4, 0.1), [ReportRtt(0.1), Idle()]),
    ], last_seen=51.4, watched=False),
    # --- indirect: others are asked before a verdict for silence ---
    Case("others are asked B before the deadline; nobody vouches: dead at the deadline", [
        (Tick(0.0), [WaitUntil(1.0)]),
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"),
                     WaitUntil(T + I - B)]),  # the Ping expires at the deadline, 6.0
        (Tick(T + I - B), [AskOthers(B), WaitUntil(T + I)]),
        (Failed(T + I, "timeout"), [Warn(dead=True),
                                    DeclareDead(f"silent for 6.0s, and {NOBODY} (ping: timeout)")]),
    ], last_seen=0.0, dead=True, suspect_after=S, suspected=True, indirect=B),
    Case("vouched for: no verdict, still suspected, others asked again before the next one", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"),
                     WaitUntil(5.0)]),
        (Tick(5.0), [AskOthers(B), WaitUntil(6.0)]),
        (Vouched(5.1), []),  # silence now counts from 5.1: the deadline is 11.1
        (Failed(6.0, "timeout"), [WaitUntil(7.0)]),
        (Tick(7.0), [SendPing(11.1 - 7.0), WaitUntil(11.1 - B)]),
        (Tick(11.1 - B), [AskOthers(B), WaitUntil(11.1)]),
        (Failed(11.1, "timeout"), [Warn(dead=True),
                                   DeclareDead(f"silent for 6.0s, and {NOBODY} (ping: timeout)")]),
    ], last_seen=0.0, dead=True, suspect_after=S, suspected=True, indirect=B),
    Case("vouched for, then it answers us again: trusted", [
        (Tick(1.0), [SendPing(T), WaitUntil(1.5)]),
        (Tick(1.5), [Warn(dead=False), Suspect(f"no answer to a ping for {S}s"),
                     WaitUntil(5.0)]),
        (Tick(5.0), [AskOthers(B), WaitUntil(6.0)]),
        (Vouched(5.1), []),
        (Failed(6.0, "timeout"), [WaitUntil(7.0)]),
        (Tick(7.0), [SendPing(11.1 - 7.0), WaitUntil(11.1 - B)]),
        (Answered(7.2, 0.2), [Trust(), ReportRtt(0.2), WaitUntil(8.2)]),
    ], last_seen=7.2, suspect_after=S, indirect=B),
    Case("woken late for the ask: the verdict waits until the ask has had its time", [
        (Tick(1.0), [SendPing(T), WaitUntil(5.0)]),
        (Tick(5.5), [AskOthers(B), WaitUntil(6.0)]),  # late by less than an interval
        (Failed(6.0, "timeout"), [WaitUntil(6.5)]),
        (Tick(6.5), [Warn(dead=True), DeclareDead(f"silent for 6.5s, and {NOBODY} (no answer "
                                                  f"by the deadline)")]),
    ], last_seen=0.0, dead=True, indirect=B),
    Case("with others to ask, a refusal is still the verdict at once", [
        (Tick(1.0), [SendPing(T), WaitUntil(5.0)]),
        (Failed(1.1, "refused"), [Warn(dead=True), DeclareDead("refuses connections")]),
    ], last_seen=0.0, dead=True, indirect=B),
    Case("a healthy peer: others are never asked", [
        (Tick(1.0), [SendPing(T), WaitUntil(5.0)]),
        (Answered(1.1, 0.1), [ReportRtt(0.1), WaitUntil(2.1)]),
        (Tick(2.1), [SendPing(T), WaitUntil(6.1)]),
        (Seen(3.0), []),
        (Answered(3.1, 1.0), [ReportRtt(1.0), WaitUntil(4.1)]),
    ], last_seen=3.1, indirect=B),
    Case("an unwatched peer that refuses a dial is dead at once, with no Warn", [
        (Tick(0.0), [Idle()]),
        (Failed(0.5, "refused"), [DeclareDead("refuses connections")]),
    ], last_seen=0.0, dead=True, watched=False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_liveness_table(case: Case) -> None:
    live = Liveness(case.interval, case.timeout, now=0.0, suspect_after=case.suspect_after,
                    watched=case.watched, indirect=case.indirect)
    got = [(event, live.handle(event)) for event, _ in case.steps]
    assert got == case.steps
    assert (live.last_seen, live.dead) == (case.last_seen, case.dead)
    assert live.suspected == case.suspected


# --- the deadline, checked over many silences (drawn by Hypothesis) with a simulated driver ---
@dataclass
class Peer:
    """A simulated peer: answers Pings after ``rtt`` until it stops at ``stop``; then its Pings
    hang (``fail_after`` None) or break after ``fail_after`` seconds."""

    stop: float
    rtt: float
    fail_after: float | None
    seen: list[float] = field(default_factory=list)  # replies to other requests (< stop)

    def outcome(self, now: float, timeout: float) -> Event:
        """What becomes of a Ping sent at ``now`` with ``timeout``: its answer or failure."""
        if now + self.rtt <= self.stop:
            return Answered(now + self.rtt, self.rtt)
        if self.fail_after is None or self.fail_after >= timeout:
            return Failed(now + timeout, "timeout")
        return Failed(now + self.fail_after, "lost")


def drive(live: Liveness, peer: Peer) -> tuple[float, list[float]]:
    """The short loop a driver is: returns the time of death and the times Pings were sent."""
    seen = sorted(peer.seen)
    sends: list[float] = []
    event: Event = Tick(0.0)
    for _ in range(10_000):  # a bounded loop: a plan that stops making progress fails
        while seen and seen[0] <= event.now:  # replies that arrived before this event
            assert live.handle(Seen(seen.pop(0))) == []
        todo = live.handle(event)
        if todo and isinstance(todo[-1], DeclareDead):
            assert todo[:-1] == [Warn(dead=True)] and live.dead
            return event.now, sends
        last = todo[-1]
        if isinstance(last, WaitUntil):
            assert last.t > event.now or isinstance(event, (Answered, Failed)), "no progress"
            event = Tick(last.t)
        else:
            assert isinstance(last, SendPing) and 0 < last.timeout <= live.timeout
            sends.append(event.now)
            event = peer.outcome(event.now, last.timeout)
    raise AssertionError("never declared dead")


@st.composite
def peers(draw: st.DrawFn) -> tuple[float, float, Peer]:
    """A heartbeat's interval and timeout, and a peer that stops answering within 20 s: its
    round trip, whether its Pings then hang or break (and when), and replies to other
    requests before it stops, often one just before the stop (the case today's loop
    overshoots)."""
    interval = draw(st.sampled_from([0.25, 0.5, 1.0]))
    timeout = interval * draw(st.sampled_from([2, 4, 5, 8]))
    stop = draw(st.floats(0.0, 20.0))
    fail_after = draw(st.none() | st.floats(0.0, timeout) | st.floats(0.0, 0.05))
    seen = draw(st.lists(st.floats(0.0, stop), max_size=5))
    if draw(st.booleans()):
        seen.append(max(0.0, stop - draw(st.floats(0.0, 0.01))))
    rtt = draw(st.sampled_from([0.0, 0.001, 0.01]))
    return interval, timeout, Peer(stop, rtt, fail_after, seen)


# Suspicion after an unanswered Ping of this long (at most half the timeout), in the cases
# with suspicion; with others asked, they are asked this long before the deadline.
SUSPECT_AFTER = st.sampled_from([0.1, 0.25, 0.5, 1.0])
INDIRECT = st.sampled_from(["suspect_after", "interval", "half the timeout"])


def indirect_for(kind: str, suspect_after: float, interval: float, timeout: float) -> float:
    return {"suspect_after": suspect_after, "interval": interval,
            "half the timeout": timeout / 2}[kind]


@settings(max_examples=300)
@given(peers())
def test_silent_peer_dead_within_timeout_plus_interval(
        drawn: tuple[float, float, Peer]) -> None:
    interval, timeout, peer = drawn
    live = Liveness(interval, timeout, now=0.0)
    died, sends = drive(live, peer)
    silent = died - live.last_seen
    assert timeout <= silent <= timeout + interval + 1e-9, (silent, peer)
    assert all(b - a >= interval - 1e-9 for a, b in zip(sends, sends[1:]))  # never faster


def drive_suspecting(live: Liveness, peer: Peer, vouch: float | None = None,
                     until: float = 1e9) -> tuple[float, float | None]:
    """A driver that runs each Ping concurrently with its wake-ups (suspicion on): returns the
    times of death and of the first suspicion. Others asked about the peer vouch for it
    ``vouch`` seconds later (None: nobody does); ``until`` ends the run alive (death inf)."""
    pending: Event | None = None  # the outcome of the Ping in flight, when it will arrive
    vouched: float | None = None  # when the others' answer arrives
    wake: float | None = 0.0
    suspected: float | None = None
    for _ in range(100_000):
        due = [t for t in (wake, None if pending is None else pending.now, vouched)
               if t is not None]
        assert due, "nothing to wait for"
        if min(due) > until:
            return math.inf, suspected
        if pending is not None and pending.now == min(due):
            event, pending = pending, None
        elif vouched is not None and vouched == min(due):
            event, vouched = Vouched(vouched), None
        else:
            assert wake is not None
            event, wake = Tick(wake), None
        for ins in live.handle(event):
            if isinstance(ins, DeclareDead):
                return event.now, suspected
            if isinstance(ins, Suspect) and suspected is None:
                suspected = event.now
            if isinstance(ins, WaitUntil):
                wake = ins.t
            if isinstance(ins, SendPing):
                pending = peer.outcome(event.now, ins.timeout)
            if isinstance(ins, AskOthers):
                assert live.indirect is not None and ins.timeout == live.indirect
                assert vouched is None, "asked again before the others answered"
                if vouch is not None:
                    vouched = event.now + vouch
    raise AssertionError("never declared dead")


@settings(max_examples=200)
@given(peers(), SUSPECT_AFTER)
def test_silent_peer_suspected_soon_and_dead_as_without_suspicion(
        drawn: tuple[float, float, Peer], suspect_after: float) -> None:
    """Suspected at most an interval plus ``suspect_after`` after it stops (never before, as
    it answers in time until then); the verdict keeps its bounds."""
    interval, timeout, peer = drawn
    peer.seen = []  # replies to other requests would clear a suspicion: not modelled here
    suspect_after = min(timeout / 2, suspect_after)
    live = Liveness(interval, timeout, now=0.0, suspect_after=suspect_after)
    died, suspected = drive_suspecting(live, peer)
    silent = died - live.last_seen
    assert timeout <= silent <= timeout + interval + 1e-9, (silent, peer)
    assert suspected is not None and peer.stop - peer.rtt <= suspected, (suspected, peer)
    assert suspected <= peer.stop + interval + suspect_after + 1e-9, (suspected, peer)


@settings(max_examples=200)
@given(peers(), SUSPECT_AFTER, INDIRECT)
def test_asking_others_keeps_the_verdict_s_bounds_when_nobody_vouches(
        drawn: tuple[float, float, Peer], suspect_after: float, asked: str) -> None:
    """With others asked before each verdict and none reaching the peer, the verdict keeps
    its bounds: asking costs no time."""
    interval, timeout, peer = drawn
    peer.seen = []
    suspect_after = min(timeout / 2, suspect_after)
    indirect = indirect_for(asked, suspect_after, interval, timeout)
    live = Liveness(interval, timeout, now=0.0, suspect_after=suspect_after, indirect=indirect)
    died, suspected = drive_suspecting(live, peer)
    silent = died - live.last_seen
    assert timeout <= silent <= timeout + interval + 1e-9, (silent, peer)
    assert suspected is not None


@settings(max_examples=100)
@given(peers(), SUSPECT_AFTER, INDIRECT, st.floats(0.0, 0.9))
def test_a_peer_others_reach_is_never_declared_dead_by_its_silence_to_us(
        drawn: tuple[float, float, Peer], suspect_after: float, asked: str,
        vouch_share: float) -> None:
    """Our way to the peer breaks for good, but the members we ask reach it (within 90% of
    the time they are given): it stays suspected and a member, however long that lasts."""
    interval, timeout, peer = drawn
    peer.seen = []
    suspect_after = min(timeout / 2, suspect_after)
    indirect = indirect_for(asked, suspect_after, interval, timeout)
    vouch = vouch_share * indirect
    live = Liveness(interval, timeout, now=0.0, suspect_after=suspect_after, indirect=indirect)
    died, suspected = drive_suspecting(live, peer, vouch=vouch, until=peer.stop + 50 * timeout)
    assert died == math.inf and not live.dead, peer
    assert suspected is not None and live.suspected


def test_healthy_peer_never_dies_and_pings_every_interval() -> None:
    live = Liveness(I, T, now=0.0)
    now, pings = 0.0, []
    todo = live.handle(Tick(now))
    while now < 100.0:
        if isinstance(todo[-1], WaitUntil):
            now = todo[-1].t
            todo = live.handle(Tick(now))
        else:
            assert todo == [SendPing(T)]
            pings.append(now)
            now += 0.01
            todo = live.handle(Answered(now, 0.01))
            assert todo == [ReportRtt(0.01), WaitUntil(now + I)]
    assert len(pings) == 99 and not live.dead
    assert all(b - a == pytest.approx(I + 0.01) for a, b in zip(pings, pings[1:]))


@pytest.mark.parametrize(("interval", "timeout"), [(1.0, 1.0), (2.0, 1.0), (0.0, 1.0)])
def test_rejects_an_interval_not_below_the_timeout(interval: float, timeout: float) -> None:
    with pytest.raises(InvalidArgumentError):
        Liveness(interval, timeout, now=0.0)


def test_rejects_an_unknown_failure_kind() -> None:
    with pytest.raises(InvalidArgumentError):
        Failed(0.0, "gone")  # type: ignore[arg-type]


def test_pure_module_imports_no_io() -> None:
    assert not top_level_imports(liveness_module) & {"asyncio", "socket", "time", "logging", "random"}
