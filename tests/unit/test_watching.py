"""Who pings whom: every member has exactly ``watchers`` watchers, and alarms reach the rest."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

import pytest
from helpers import top_level_imports

import hoplited.cluster.watching as watching_module
from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.cluster.liveness import (
    Alarm,
    Answered,
    DeclareDead,
    Event,
    Failed,
    Liveness,
    SendPing,
    Tick,
    WaitUntil,
    Warn,
)
from hoplited.cluster.watching import (
    VOUCHERS,
    roster_partner,
    to_alarm,
    vouchers,
    watched_by,
    watchers_of,
)
from hoplited.config import MAX_WATCHERS, DaemonConfig

pytestmark = pytest.mark.unit


def members(n: int) -> list[str]:
    return [f"node{i:04d}" for i in range(n)]


@pytest.mark.parametrize(("n", "k"), [(2, 1), (5, 4), (5, 16), (17, 16)])
def test_small_clusters_are_a_full_mesh(n: int, k: int) -> None:
    nodes = members(n)
    for me in nodes:
        assert watched_by(me, nodes, k) == set(nodes) - {me}
        assert watchers_of(me, nodes, k) == set(nodes) - {me}
        assert to_alarm(me, nodes[0], nodes, k) == []  # everyone watches everyone


@pytest.mark.parametrize(("n", "k"), [(3, 1), (6, 2), (18, 16), (100, 3), (1000, 16)])
def test_every_member_has_exactly_k_watchers_and_watches_k(n: int, k: int) -> None:
    nodes = members(n)
    watched = {me: watched_by(me, nodes, k) for me in nodes}
    for me in nodes:
        assert len(watched[me]) == k and me not in watched[me]
        holders = {w for w in nodes if me in watched[w]}
        assert holders == watchers_of(me, nodes, k)
        assert len(holders) == k


@pytest.mark.parametrize(("n", "k", "copies"),
                         [(6, 2, 3), (100, 3, 3), (100, 4, 3), (1000, 16, 3), (1000, 16, 1),
                          (300, 7, 6), (40, 16, 16)])
def test_an_alarm_reaches_every_member_that_does_not_watch_the_node_copies_times(
        n: int, k: int, copies: int) -> None:
    """Each member that does not watch a silent one hears of it from min(copies, k) of its
    watchers; the watchers and the silent member hear nothing; the watchers share the work
    evenly, to within ``copies`` messages."""
    nodes = members(n)
    silent = nodes[n // 2]
    around = watchers_of(silent, nodes, k)
    heard: Counter[str] = Counter()
    shares = []
    for watcher in around:
        told = to_alarm(watcher, silent, nodes, k, copies)
        assert told == sorted(told) and len(set(told)) == len(told)
        heard.update(told)
        shares.append(len(told))
    assert set(heard) == set(nodes) - around - {silent}
    assert set(heard.values()) == {min(copies, k)}
    assert max(shares) - min(shares) <= copies


def test_at_1000_members_an_alarm_costs_three_messages_a_member() -> None:
    nodes = members(1000)
    silent = nodes[0]
    sent = sum(len(to_alarm(w, silent, nodes, 16)) for w in watchers_of(silent, nodes, 16))
    assert sent == 3 * (1000 - 16 - 1)  # where every watcher telling everyone sent 16 times that


def test_a_watcher_that_is_none_in_its_own_view_tells_everyone_that_does_not_watch() -> None:
    """Views differ for a moment (a join not known everywhere): a node told to warn about a
    member it does not watch in its view tells every member that does not watch it."""
    nodes = members(50)
    silent = nodes[10]
    outsider = next(n for n in nodes if n != silent and n not in watchers_of(silent, nodes, 4))
    assert to_alarm(outsider, silent, nodes, 4) == sorted(
        set(nodes) - watchers_of(silent, nodes, 4) - {silent, outsider})


def test_a_view_that_includes_me_or_not_gives_the_same_answer() -> None:
    nodes = members(40)
    me = nodes[7]
    without_me = [n for n in nodes if n != me]
    assert watched_by(me, nodes, 4) == watched_by(me, without_me, 4)
    assert watchers_of(me, nodes, 4) == watchers_of(me, without_me, 4)


def test_a_death_moves_only_the_watching_next_to_it() -> None:
    """Members far from the dead one on the ring keep what they watch."""
    nodes = members(200)
    before = {me: watched_by(me, nodes, 3) for me in nodes}
    dead = nodes[50]
    rest = [n for n in nodes if n != dead]
    after = {me: watched_by(me, rest, 3) for me in rest}
    changed = [me for me in rest if after[me] != before[me]]
    assert set(changed) == watchers_of(dead, nodes, 3)  # its watchers take the next one on
    for me in changed:
        assert after[me] - before[me] != set() and before[me] - after[me] == {dead}


@pytest.mark.parametrize(("n", "turn", "expected"), [
    (1, 0, []),  # nobody else to ask
    (3, 0, 2),  # fewer trusted than VOUCHERS: all of them, every turn
    (3, 5, 2),
    (4, 0, 3),
    (40, 0, 3),
    (40, 7, 3),
])
def test_vouchers_are_trusted_members_other_than_the_peer(n: int, turn: int,
                                                          expected: int | list[str]) -> None:
    nodes = members(n)
    peer = nodes[0]
    asked = vouchers(peer, nodes[1:], turn=turn)
    assert asked == expected if isinstance(expected, list) else len(asked) == expected
    assert peer not in asked and len(set(asked)) == len(asked) and set(asked) <= set(nodes)
    assert vouchers(peer, nodes, turn=turn) == asked  # the peer among them changes nothing


@pytest.mark.parametrize("n", [5, 10, 41])
def test_successive_asks_try_every_trusted_member_evenly(n: int) -> None:
    """Helpers cut off from the peer too are not asked at every turn: the turns go round all
    the trusted members, each asked as often as any other to within one."""
    nodes = members(n)
    peer, trusted = nodes[3], nodes[:3] + nodes[4:]
    asked: Counter[str] = Counter()
    for turn in range(n - 1):
        asked.update(vouchers(peer, trusted, turn=turn))
    assert set(asked) == set(trusted)
    assert max(asked.values()) - min(asked.values()) <= 1
    assert sum(asked.values()) == VOUCHERS * (n - 1)


def test_vouchers_follow_the_peer_on_the_ring() -> None:
    """The first turn asks the members after the peer on the ring, as its watchers' ring
    puts them: the same few for every member that asks about it."""
    nodes = members(30)
    peer = nodes[12]
    assert set(vouchers(peer, nodes, turn=0)) == watched_by(peer, nodes, VOUCHERS)


@pytest.mark.parametrize(("n", "expected"), [(1, None), (2, 1), (5, 4), (40, 39)])
def test_roster_partners_go_round_every_trusted_member(n: int, expected: int | None) -> None:
    """Each trusted member is asked once every len(trusted) turns, never ourselves; with
    nobody else trusted there is nobody to ask."""
    nodes = members(n)
    me = nodes[0]
    asked = [roster_partner(me, nodes[1:], turn) for turn in range(2 * max(1, n - 1))]
    if expected is None:
        assert set(asked) == {None}
        return
    first = asked[:n - 1]
    assert len(set(first)) == expected and me not in first and None not in first
    assert asked[n - 1:] == first  # round and round, in the same order
    assert roster_partner(me, nodes, 0) == asked[0]  # ourselves among them changes nothing


@pytest.mark.parametrize("k", [0, -1])
def test_rejects_fewer_than_one_watcher(k: int) -> None:
    with pytest.raises(InvalidArgumentError):
        watched_by("a", ["a", "b"], k)
    with pytest.raises(InvalidArgumentError):
        watchers_of("a", ["a", "b"], k)
    with pytest.raises(InvalidArgumentError):
        vouchers("a", ["a", "b"], k)


def test_pure_module_imports_no_io() -> None:
    assert not top_level_imports(watching_module) & {"asyncio", "socket", "time", "logging"}


# --- the liveness cores of a whole cluster, with watchers and alarms, simulated ------------
INTERVAL, TIMEOUT, SUSPECT, RTT, HOP = 0.5, 4.0, 1.0, 0.001, 0.002


def simulate(n: int, k: int, victim: int, stop: float | None, cut_off: int | None,
             until: float, mute: frozenset[int] = frozenset()
             ) -> dict[tuple[int, int], tuple[Liveness, float | None]]:
    """Every member's core for every other one, driven by a discrete-event loop: Pings are
    answered after RTT unless the target has stopped (at ``stop``) or the pinger is
    ``cut_off`` from the victim; a Warn reaches the members ``to_alarm`` names after HOP,
    unless its sender is in ``mute`` (its alarms are lost).
    Returns each (member, peer) core with the time it declared the peer dead, if it did."""
    names = [f"m{i:03d}" for i in range(n)]
    cores: dict[tuple[int, int], Liveness] = {}
    for a in range(n):
        watched = watched_by(names[a], names, k)
        for b in range(n):
            if a != b:
                cores[a, b] = Liveness(INTERVAL, TIMEOUT, 0.0, SUSPECT, names[b] in watched)
    died: dict[tuple[int, int], float] = {}
    queue: list[tuple[float, int, int, int, Event]] = []
    seq = itertools.count()

    def push(event: Event, a: int, b: int) -> None:
        heapq.heappush(queue, (event.now, next(seq), a, b, event))

    def answers(a: int, b: int, at: float) -> bool:
        if b == victim and stop is not None and at >= stop:
            return False
        return not (b == victim and a == cut_off)

    for pair in cores:
        push(Tick(0.0), *pair)
    while queue:
        now, _, a, b, event = heapq.heappop(queue)
        if now > until or a == victim and stop is not None and now >= stop:
            continue
        core = cores[a, b]
        for ins in core.handle(event):
            if isinstance(ins, WaitUntil):
                push(Tick(ins.t), a, b)
            elif isinstance(ins, SendPing):
                ok = answers(a, b, now)
                push(Answered(now + RTT, RTT) if ok else Failed(now + ins.timeout, "timeout"),
                     a, b)
            elif isinstance(ins, Warn) and a not in mute:
                for other in to_alarm(names[a], names[b], names, k):
                    push(Alarm(now + HOP, ins.dead), names.index(other), b)
            elif isinstance(ins, DeclareDead):
                died[a, b] = now
    return {pair: (core, died.get(pair)) for pair, core in cores.items()}


@pytest.mark.parametrize(("n", "k", "victim", "stop"),
                         [(6, 2, 5, 3.0), (12, 3, 0, 2.2), (40, 4, 17, 5.1), (7, 16, 2, 1.0)])
def test_every_member_declares_a_frozen_member_dead_soon_after_its_watchers(
        n: int, k: int, victim: int, stop: float) -> None:
    result = simulate(n, k, victim, stop, cut_off=None, until=stop + 3 * TIMEOUT)
    for (a, b), (core, died) in result.items():
        if a == victim:
            continue
        if b != victim:
            assert died is None and not core.suspected, (a, b)
            continue
        # a watcher: within its own bound; any other: a Ping's suspicion time after that
        assert died is not None, (a, b)
        assert stop + TIMEOUT - RTT <= died <= stop + TIMEOUT + INTERVAL + SUSPECT + 2 * HOP


@pytest.mark.parametrize(("n", "k", "muted"), [(40, 16, 2), (30, 5, 2), (20, 16, 0)])
def test_every_member_hears_of_a_frozen_member_though_some_watchers_alarms_are_lost(
        n: int, k: int, muted: int) -> None:
    """Each member hears from three of the victim's watchers: with two of them unable to
    send, every survivor still declares it dead within the bound."""
    names = [f"m{i:03d}" for i in range(n)]
    victim, stop = 11, 2.0
    mute = frozenset(names.index(w) for w in sorted(watchers_of(names[victim], names, k))[:muted])
    result = simulate(n, k, victim, stop, cut_off=None, until=stop + 3 * TIMEOUT, mute=mute)
    for (a, b), (_, died) in result.items():
        if b == victim and a != victim:
            assert died is not None, (a, b)
            assert died <= stop + TIMEOUT + INTERVAL + SUSPECT + 2 * HOP


@pytest.mark.parametrize(("n", "k"), [(6, 2), (40, 4)])
def test_a_watcher_cut_off_from_a_healthy_member_condemns_it_alone(n: int, k: int) -> None:
    names = [f"m{i:03d}" for i in range(n)]
    victim = 3
    watcher = names.index(sorted(watchers_of(names[victim], names, k))[0])
    result = simulate(n, k, victim, stop=None, cut_off=watcher, until=3 * TIMEOUT)
    for (a, b), (core, died) in result.items():
        if (a, b) == (watcher, victim):
            assert died is not None  # its own verdict, for itself only
        else:
            assert died is None and not core.suspected, (a, b)


@pytest.mark.parametrize("watchers", [0, -3, MAX_WATCHERS + 1])
def test_the_daemon_refuses_a_watcher_count_out_of_range(watchers: int) -> None:
    with pytest.raises(InvalidArgumentError, match="--watchers"):
        DaemonConfig(watchers=watchers).check()
