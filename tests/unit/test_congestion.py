"""The congestion control the daemons' TCP connections use (hoplite_client/net/congestion.py):
a listener's choice reaches the connections it accepts, a dialled socket takes its own, ""
leaves the system's, and a name the kernel lacks raises OSError."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from helpers import allowed_congestion

from hoplite_client.net import congestion

pytestmark = pytest.mark.unit


needs = pytest.mark.skipif(not {"cubic", "reno"} <= set(allowed_congestion()),
                           reason="needs Linux with cubic and reno allowed")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket, socket.socket]]:
    """A listener told to use reno, a socket dialled to it and the one it accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    congestion.use(listener, "reno")
    dialled = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    yield listener, dialled, accepted
    for s in (listener, dialled, accepted):
        s.close()


@needs
def test_a_listener_s_choice_reaches_what_it_accepts(
        pair: tuple[socket.socket, socket.socket, socket.socket]) -> None:
    _, dialled, accepted = pair
    assert congestion.current(accepted) == "reno"
    congestion.use(dialled, "cubic")
    assert congestion.current(dialled) == "cubic"


@needs
def test_an_empty_name_leaves_the_socket_as_it_is(
        pair: tuple[socket.socket, socket.socket, socket.socket]) -> None:
    _, _, accepted = pair
    congestion.use(accepted, "")
    assert congestion.current(accepted) == "reno"


@needs
def test_a_name_the_kernel_lacks_raises(
        pair: tuple[socket.socket, socket.socket, socket.socket]) -> None:
    with pytest.raises(OSError):
        congestion.use(pair[1], "no_such_cc")


def test_a_unix_socket_is_left_alone() -> None:
    a, b = socket.socketpair()
    with a, b:
        congestion.use(a, "cubic")  # no TCP option to set: nothing happens


@pytest.mark.parametrize("name, ok", [
    ("", True), ("cubic", True), ("bbr", True), ("dctcp_2", True), ("x" * 15, True),
    ("x" * 16, False), ("cu bic", False), ("cubic\0", False), ("../bbr", False),
    ("bbré", False)])
def test_names_are_checked_before_the_kernel_sees_them(name: str, ok: bool) -> None:
    if ok:
        congestion.check_name(name)
    else:
        with pytest.raises(ValueError):
            congestion.check_name(name)
