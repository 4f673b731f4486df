"""A connection's phases: the moves the table allows and refuses, and what each move installs."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from hoplite_client.net.protocol import MOVES, FrameProtocol, Phase, check_move
from hoplite_client.wire.errors import LocalProtocolError
from hoplite_client.wire.frames import Frame, encode
from hoplite_client.wire.messages import Ping

H, CH, CL, SV, RX, OP, TX, ID = (Phase.HANDSHAKE, Phase.CHANNEL, Phase.CLIENT, Phase.SERVING,
                                  Phase.RECEIVING, Phase.OPENING, Phase.SENDING, Phase.IDLE)

# Written out, not derived from MOVES: the test states the phases' course on its own.
ALLOWED = {
    (H, CH), (H, SV), (H, RX), (H, OP), (H, ID),  # what a handshake leads to
    (CH, CL),  # a daemon's channel to a local client takes its puts' streams
    (SV, RX),  # an accepted data connection lends itself to a ring's stream
    (RX, H), (RX, SV), (RX, ID),  # a stream ends: queueing, serving again, or idle
    (OP, TX),  # our ring stream was accepted
    (TX, ID),  # and has gone out
    (ID, RX), (ID, OP),  # an idle connection taken for a pull or a ring's stream
}


def _frame(msg: Any) -> bytes:
    return b"".join(bytes(part) for part in encode(msg))


def _feed(protocol: FrameProtocol, data: bytes) -> None:
    """Hand ``data`` (one frame) to the protocol as the transport would."""
    while data:
        buffer = protocol.get_buffer(len(data))
        n = min(len(buffer), len(data))
        buffer[:n] = data[:n]
        protocol.buffer_updated(n)
        data = data[n:]


@pytest.mark.parametrize("current,new", list(itertools.product(Phase, Phase)),
                         ids=lambda p: p.value)
def test_each_move_is_allowed_or_refused_as_the_table_says(current: Phase, new: Phase) -> None:
    if (current, new) in ALLOWED:
        check_move("conn", current, new)
        return
    with pytest.raises(LocalProtocolError, match=f"phase {current.value} cannot move to "
                                                 f"{new.value}"):
        check_move("conn", current, new)


def test_the_table_names_every_phase() -> None:
    assert set(MOVES) == set(Phase)


async def test_a_dialled_data_connection_goes_from_pulls_to_rings_and_back() -> None:
    protocol = FrameProtocol(name="t")
    assert protocol.phase is Phase.HANDSHAKE
    for phase in (RX, ID, OP, TX, ID, RX, ID):
        protocol.enter(phase)
        assert protocol.phase is phase


async def test_a_refused_move_changes_nothing() -> None:
    protocol = FrameProtocol(name="t")
    got: list[Frame[Any]] = []
    protocol.enter(Phase.IDLE, handler=got.append)
    with pytest.raises(LocalProtocolError, match="t: a connection in phase idle cannot move "
                                                 "to channel"):
        protocol.enter(Phase.CHANNEL, handler=lambda frame: None)
    assert protocol.phase is Phase.IDLE and protocol.handler == got.append
    _feed(protocol, _frame(Ping(rid=1)))
    assert [f.msg for f in got] == [Ping(rid=1)]


async def test_frames_queued_in_the_handshake_go_to_the_next_phase_first() -> None:
    protocol = FrameProtocol(name="t")
    _feed(protocol, _frame(Ping(rid=1)))
    got: list[Any] = []
    protocol.enter(Phase.SERVING, handler=lambda frame: got.append(frame.msg))
    _feed(protocol, _frame(Ping(rid=2)))
    assert got == [Ping(rid=1), Ping(rid=2)]


async def test_leaving_a_phase_restores_the_one_before_with_its_hooks() -> None:
    protocol = FrameProtocol(name="t")
    served: list[Any] = []
    received: list[Any] = []
    protocol.enter(Phase.SERVING, handler=lambda frame: served.append(frame.msg))
    with protocol.enter(Phase.RECEIVING, handler=lambda frame: received.append(frame.msg)):
        assert protocol.phase is Phase.RECEIVING
        _feed(protocol, _frame(Ping(rid=1)))
    assert protocol.phase is Phase.SERVING
    _feed(protocol, _frame(Ping(rid=2)))
    assert received == [Ping(rid=1)] and served == [Ping(rid=2)]


async def test_a_phase_moved_on_from_cannot_be_left() -> None:
    protocol = FrameProtocol(name="t")
    scope = protocol.enter(Phase.RECEIVING)
    protocol.enter(Phase.IDLE)  # given back to the pool: the stream's scope is over
    assert not scope.current
    with pytest.raises(LocalProtocolError, match="cannot leave phase receiving: the "
                                                 "connection is in idle now"):
        scope.leave()
    assert protocol.phase is Phase.IDLE


async def test_a_channel_taking_the_connection_is_the_move_to_its_phase() -> None:
    protocol = FrameProtocol(name="t")
    protocol.enter(Phase.CHANNEL, handler=lambda frame: None)
    assert protocol.phase is Phase.CHANNEL
    with pytest.raises(LocalProtocolError):
        protocol.enter(Phase.CHANNEL, handler=lambda frame: None)  # a second channel
