"""After a partition, or a member frozen past the heartbeat timeout: which side runs again as new
members, and when to ask the members declared dead whether they are back (pure; no I/O).

Two members may disagree on who is alive: one of them (the *refuser*) declared the other (the
*refused*) dead, and refuses all it sends (docs/design.md §5, "Declared dead, then running
again"). Whoever learns of the disagreement first — the refused member from a refusal, or
either member from a ``Probe`` — decides with :func:`refused_yields`, on the two members' live
sets. Both compute the same answer from the same sets, so exactly one side yields: it runs again
as new members and joins the other.

- The refuser's side is its live set: the members it still hears (fresh evidence, since it
  has just declared the refused dead).
- The refused member's side is its live set without the refuser's: the members only it still
  counts, itself among them. A member frozen past the timeout still counts everyone, so its
  side is itself alone; a member cut off by a partition counts its own group.
- The larger side stays; on a tie, the side holding the smallest node id stays.

So a frozen member that runs again yields to the cluster that declared it dead, the smaller
group of a partition yields to the larger once the network heals, and a majority member never
runs again because a lone member that was cut off refuses it (which "always obey a refusal"
would have done, were the lone member's verdicts quicker than the majority's).

:class:`DeadProbes` schedules the probes that let a partition heal: without them, two groups
that declared each other dead never speak again. Each member declared dead is probed a
``first`` interval after its verdict, then at doubling intervals up to ``longest``, until its
address shows that its process is gone (a refused dial, or another node id there).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeAlias

PROBE_LONGEST = 60.0  # the longest wait between two probes of a member declared dead
PROBED_MOST = 1024  # members probed at once; the longest dead are forgotten first

ProbeOutcome: TypeAlias = Literal["gone", "silent", "answered"]


def refused_yields(refuser_alive: Iterable[str], refused_alive: Iterable[str]) -> bool:
    """Whether the refused member's side must run again as new members (see the module
    docstring): its side (its live set without the refuser's) is smaller than the refuser's
    live set, or as large and without the smallest node id of the two."""
    theirs = set(refuser_alive)
    ours = set(refused_alive) - theirs
    if not ours:  # the refused member counts itself alive; only a malformed view lacks it
        return True
    if len(theirs) != len(ours):
        return len(theirs) > len(ours)
    return min(theirs) < min(ours)


def plausible(refuser: str, refuser_alive: Iterable[str], refused: str) -> bool:
    """Whether ``refuser_alive`` can be the live set of a member ``refuser`` that declared
    ``refused`` dead: it counts itself, and not the member it declared dead. Anything else
    (a confused or hostile sender) decides nothing."""
    alive = set(refuser_alive)
    return refuser in alive and refused not in alive


def parse_alive(text: str) -> list[str]:
    """A live set as a refusal carries it (error data are plain values: ids joined by ',')."""
    return [node for node in text.split(",") if node]


@dataclass
class _Probe:
    at: float  # when the next probe is due
    interval: float  # the wait before the probe after it
    since: float  # when the member was declared dead
    out: bool = False  # a probe is under way


class DeadProbes:
    """When to probe each member declared dead: events in, due members out."""

    def __init__(self, first: float, longest: float = PROBE_LONGEST,
                 most: int = PROBED_MOST) -> None:
        self.first = first
        self.longest = max(first, longest)
        self.most = most
        self._probes: dict[str, _Probe] = {}

    def __len__(self) -> int:
        return len(self._probes)

    def __contains__(self, node: object) -> bool:
        return node in self._probes

    def died(self, node: str, now: float) -> None:
        """``node`` was declared dead: probe it ``first`` seconds from now."""
        if node in self._probes:
            return
        if len(self._probes) >= self.most:
            oldest = min(self._probes, key=lambda n: self._probes[n].since)
            del self._probes[oldest]
        self._probes[node] = _Probe(now + self.first, self.first, now)

    def due(self, now: float) -> list[str]:
        """The members to probe now (each then under way until its ``outcome``)."""
        nodes = [n for n, p in self._probes.items() if not p.out and p.at <= now]
        for node in nodes:
            self._probes[node].out = True
        return nodes

    def outcome(self, node: str, outcome: ProbeOutcome, now: float) -> None:
        """A probe ended: ``gone`` (its process is: forget it), ``silent`` (unreachable, or
        no answer) or ``answered`` (it runs; the side rule decided): probe again later."""
        probe = self._probes.get(node)
        if probe is None:
            return
        if outcome == "gone":
            del self._probes[node]
            return
        probe.interval = min(self.longest, probe.interval * 2)
        probe.at, probe.out = now + probe.interval, False

    def forget(self, node: str) -> None:
        self._probes.pop(node, None)

    def wake(self) -> float | None:
        """When the next probe is due (None: nothing to probe, or all under way)."""
        return min((p.at for p in self._probes.values() if not p.out), default=None)
