"""Which failures send a request to an object's (new) owner again, and which are its answer."""

from __future__ import annotations

import pytest

from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    NotOwnerError,
    ObjectNotFoundError,
    PeerUnavailableError,
    error_from_wire,
)
from hoplited.rpc import named_owner, owner_moved


@pytest.mark.parametrize("error,retry", [
    (NotOwnerError("not mine", owner="b"), True),
    (error_from_wire("not_owner", "not mine", {"owner": "b"}), True),
    (ConnectionLostError("link to a dropped"), True),            # reaching it failed here
    (PeerUnavailableError("a is dead", node="a"), True),
    (error_from_wire("connection_lost", "slot 2: source closed the stream", {}), False),
    (error_from_wire("unavailable", "node c died holding slot 1", {}), False),
    (error_from_wire("timeout", "reduce timed out", {}), False),
    (ObjectNotFoundError("gone"), False),
    (HopliteTimeoutError("no reply"), False),
], ids=["not-owner", "not-owner-reported", "link-lost", "link-dead", "answered-lost",
        "answered-unavailable", "answered-timeout", "not-found", "timeout"])
def test_owner_moved(error: HopliteError, retry: bool) -> None:
    assert owner_moved(error) is retry


@pytest.mark.parametrize("error,owner", [
    (NotOwnerError("not mine", owner="b"), "b"),
    (error_from_wire("not_owner", "not mine", {"owner": "b"}), "b"),
    (error_from_wire("not_owner", "not mine", {}), None),
    (error_from_wire("not_owner", "not mine", {"owner": 7}), None),  # a peer's odd answer
    (PeerUnavailableError("a is dead", node="a"), None),
], ids=["not-owner", "reported", "no-owner", "not-a-name", "other-error"])
def test_named_owner(error: HopliteError, owner: str | None) -> None:
    """The member a "not the owner" answer names: a request waits for our views to agree
    when we suspect it (docs/design.md §5, "A link broken between two members")."""
    assert named_owner(error) == owner
