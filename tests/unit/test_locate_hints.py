"""``Locate.hint``, one tagged value: each variant crosses the wire as itself, and a hint whose
values make no sense is refused as an invalid argument where a shard receives it."""

from __future__ import annotations

import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.frames import FrameReader, encode
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import (
    IN_RING,
    PLAIN,
    Among,
    Half,
    LocateHint,
    among,
    check_hint,
)
from hoplite_client.wire.messages import Locate
from hoplite_client.wire.receivers import MAX_RECEIVERS
from hoplite_client.wire.schema import to_wire

pytestmark = pytest.mark.unit

HINTS: list[LocateHint] = [PLAIN, IN_RING, Among(receivers=5),
                           Half(half=1, index=2, receivers=4, window=[50, 100]),
                           Half(half=0, index=-1, receivers=0, window=None)]


@pytest.mark.parametrize("hint", HINTS, ids=repr)
def test_each_variant_round_trips_with_its_tag(hint: LocateHint) -> None:
    msg = Locate(rid=4, oid=ObjectID(b"o" * 20), timeout=1.5, exclude=["a"], offset=7, hint=hint)
    assert to_wire(msg)[-1][0] == {"Plain": 0, "InRing": 1, "Among": 2,
                                   "Half": 3}[type(hint).__name__]
    (ev,) = FrameReader().feed(b"".join(bytes(b) for b in encode(msg)))
    assert ev.msg == msg and check_hint(ev.msg.hint) == hint


def test_a_get_says_its_receivers_only_when_it_knows_them() -> None:
    assert among(0) is PLAIN
    assert among(3) == Among(receivers=3)


@pytest.mark.parametrize("hint, match", [
    (Among(receivers=0), "1 or more"), (Among(receivers=-1), "receivers"),
    (Among(receivers=MAX_RECEIVERS + 1), "receivers"),
    (Half(half=-1, index=0, receivers=4, window=[0, 5]), "half must be 0 or 1"),
    (Half(half=2, index=0, receivers=4, window=[0, 5]), "half must be 0 or 1"),
    (Half(half=0, index=0, receivers=MAX_RECEIVERS + 1, window=[0, 5]), "receivers"),
    (Half(half=0, index=0, receivers=4, window=[0, 5, 9]), "two offsets")], ids=repr)
def test_a_hint_out_of_range_is_an_invalid_argument(hint: LocateHint, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        check_hint(hint)
