"""A ring allreduce's schedule and its choice of members, as pure functions.

Theory of operation (docs/design.md §4, "Ring allreduce"). When every input of an allreduce
is ready at once, the nodes holding them form a ring in node-id order (a node holding
several inputs adds them all) and run a pipelined reduce-scatter then allgather over one
stream per link: the object is cut into one chunk per member, each chunk into segments, and
each member sends its successor one ordered sequence of segments, ``2(n-1)`` chunks long.
Segment ``i`` of what a member receives is, in the reduce-scatter half, a partial sum it adds
its own inputs to (in place, in the result's memory) and forwards; in the allgather half, a
finished part of the result it forwards unless it is the last step. So each link carries
``2(n-1)/n`` of the object, once, in one flow: on the emulated links the per-stripe trees
carry the same bytes in ``2(n-1)`` flows per link and lose 15-20% to their interplay
(docs/benchmarks.md, "Ring allreduce").

Whether a ring runs at all, and how long an allreduce waits for its inputs to have one, is
:mod:`~.choose`'s to say (``ring_pays``, ``ring_saving``: the ring's cost, ``ring_cost``,
against the trees'). Nothing here waits or does I/O (``hoplited.collectives.ring_member``
carries it out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hoplite_client.wire.frames import MAX_IDS_PER_FRAME
from hoplited.collectives.layout import ALIGN, stripe_bounds

# Bytes per segment: large enough that a frame header is noise, small enough that a hop adds
# little latency (a ring in this module's shape runs at 1.76x of S/RATE with 256 KiB and
# 1 MiB segments at N = 8, docs/benchmarks.md "Ring allreduce").
SEGMENT = 1 << 20
# The most members a ring takes: as many nodes as a reduce takes inputs. Whether a ring pays
# at all is choose.ring_pays's to say: its 2(n-1) hops against the trees' depth
# (docs/simulation.md).
RING_MAX = MAX_IDS_PER_FRAME
# Holders the members' matching may look at in all to move inputs: far more than any real
# allreduce needs (each input on its own node needs none), few enough for about 0.1 s at worst.
MATCH_BUDGET = 20_000


@dataclass(frozen=True, slots=True)
class Segment:
    """One received segment: bytes ``lo..hi`` of the result. ``add``: combine this member's
    input into it (reduce-scatter); ``forward``: send it on to the successor afterwards."""

    lo: int
    hi: int
    add: bool
    forward: bool


@dataclass(frozen=True, slots=True)
class RingSchedule:
    """What one member of a ring sends first (from its input) and receives, in order."""

    first: tuple[tuple[int, int], ...]  # byte ranges of the input sent before any receive
    receive: tuple[Segment, ...]  # what the predecessor sends, in order


def chunk_segments(lo: int, hi: int, itemsize: int, segment: int) -> list[tuple[int, int]]:
    """``lo..hi`` cut into pieces of at most ``segment`` bytes on element boundaries."""
    step = max(itemsize, segment // math.lcm(itemsize, ALIGN) * math.lcm(itemsize, ALIGN))
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]


def ring_schedule(size: int, itemsize: int, n: int, position: int,
                  segment: int = SEGMENT) -> RingSchedule:
    """The schedule of the member at ``position`` of a ring of ``n`` (n >= 2).

    Reduce-scatter step ``s`` receives chunk ``position - s - 1``, allgather step ``s`` chunk
    ``position - s`` (mod n); the member at ``position`` ends with chunk ``position + 1``
    reduced, which is what its successor receives first in the allgather."""
    if n < 2 or not 0 <= position < n:
        raise ValueError(f"position {position} in a ring of {n}")
    chunks = stripe_bounds(size, itemsize, n)

    def segs(chunk: int) -> list[tuple[int, int]]:
        lo, hi = chunks[chunk % n]
        return chunk_segments(lo, hi, itemsize, segment)

    receive: list[Segment] = []
    for s in range(n - 1):
        receive += [Segment(lo, hi, True, True) for lo, hi in segs(position - s - 1)]
    for s in range(n - 1):
        last = s == n - 2
        receive += [Segment(lo, hi, False, not last) for lo, hi in segs(position - s)]
    return RingSchedule(tuple(segs(position)), tuple(receive))


def ring_cost(n: int, size: int, bandwidth: float, latency: float) -> float:
    """Seconds a ring of ``n`` takes: 2(n-1)/n of the object through each link, and a link's
    latency for each of the 2(n-1) chunks a member waits for its predecessor's."""
    return 2 * (n - 1) / n * size / max(bandwidth, 1.0) + 2 * (n - 1) * latency


def ring_members(ready: Mapping[int, Sequence[str]], n: int,
                 budget: int = MATCH_BUDGET) -> list[tuple[str, tuple[int, ...]]] | None:
    """The ring's members for ``n`` inputs (by index; ``ready[i]``: the live nodes holding
    input i, in the shard's order): as many distinct nodes as the inputs can be spread over
    (a maximum matching), each input added by one of them. An input whose every holder
    already adds another goes to the holder adding fewest (a node with several inputs adds
    them all). None if an input is missing or has no live holder, or if fewer than two or
    more than :data:`RING_MAX` nodes would take part. Returns (node, input indices) in ring
    order: node ids ascending, so every ring over the same nodes is the same ring.

    The matching looks at most ``budget`` holders in all for inputs to move; past that an
    input with no free holder is simply added by a busy one (fewer members, still a ring)."""
    if len(ready) != n or any(not ready.get(i) for i in range(n)):
        return None
    order = sorted(range(n), key=lambda i: len(ready[i]))
    owner = _matching(ready, order, budget)
    if not 2 <= len(owner) <= RING_MAX:
        return None
    adds: dict[str, list[int]] = {node: [i] for node, i in owner.items()}
    matched = set(owner.values())
    # each holder of an unmatched input adds one already (else: a path)
    for i in (i for i in order if i not in matched):
        node = min(ready[i], key=lambda h: (len(adds[h]), h))
        adds[node].append(i)
    return [(node, tuple(sorted(adds[node]))) for node in sorted(adds)]


def _matching(ready: Mapping[int, Sequence[str]], order: Sequence[int],
              budget: int) -> dict[str, int]:
    """Kuhn's augmenting paths, inputs taken in ``order``: node -> the input it adds. A free
    holder first, so earlier choices stay as they are; else a path that moves inputs along
    to a free holder. Iterative (a path may pass every node), done once every node adds an
    input, and stopped after ``budget`` holders looked at, so a hostile holder graph costs
    bounded time."""
    owner: dict[str, int] = {}
    nodes = len({node for i in order for node in ready[i]})
    looked = 0
    for start in order:
        if len(owner) == nodes:  # every node adds an input: no path can add a member
            break
        seen: set[str] = set()
        # frames of [input, next holder to try, the node this input would give up]
        stack: list[tuple[int, list[int], str]] = [(start, [0], "")]
        entered = True
        while stack:
            inp, at, _ = stack[-1]
            holders = ready[inp]
            if entered:
                free = next((node for node in holders if node not in owner), None)
                if free is not None:  # a path: each input on it takes the next one's node
                    owner[free] = inp
                    for k in range(len(stack) - 1, 0, -1):
                        owner[stack[k][2]] = stack[k - 1][0]
                    break
            entered = False
            while at[0] < len(holders) and looked < budget:
                node = holders[at[0]]
                at[0] += 1
                if node not in seen:
                    looked += 1
                    seen.add(node)
                    stack.append((owner[node], [0], node))
                    entered = True
                    break
            else:
                stack.pop()
    return owner
