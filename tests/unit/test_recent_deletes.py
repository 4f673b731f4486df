"""Which of a member's recent deletes it sends again when owners move (docs/design.md §5,
"Deletes and moving owners"): the pure core, driven by a table of events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from hoplite_client.wire.ids import ObjectID
from hoplited.directory.recent_deletes import RecentDeletes, Resend

A, B, C = (ObjectID(bytes([n]) * 20) for n in (1, 2, 3))
WINDOW = 5.0

Step = Callable[[RecentDeletes], object]


def deleted(oid: ObjectID, version: bytes | None, at: float, moved: bool = False,
            retire: bool = False) -> Step:
    """``oid`` deleted at ``at``; ``moved``: owners changed while the delete was on its way;
    ``retire``: only that version was deleted, and another is put under the id."""
    return lambda r: r.deleted(oid, version, at, moved, retire)


def moved(at: float, *oids: ObjectID) -> Step:
    """Owners changed at ``at``; ``oids`` are the ids whose owner moved."""
    return lambda r: r.owners_moved(lambda oid: oid in oids, at)


@dataclass(frozen=True)
class Case:
    id: str
    steps: list[tuple[Step, object]]
    limit: int = 100


CASES = [
    Case("a delete whose owner moves is sent again, with its version", [
        (deleted(A, b"v1", 0.0), None), (moved(1.0, A), [Resend(A, b"v1")])]),
    Case("only the ids whose owner moved", [
        (deleted(A, b"v1", 0.0), None), (deleted(B, b"v2", 0.0), None),
        (moved(1.0, B, C), [Resend(B, b"v2")])]),
    Case("sent again at every move within the window", [
        (deleted(A, b"v1", 0.0), None),
        (moved(1.0, A), [Resend(A, b"v1")]), (moved(2.0, A), [Resend(A, b"v1")])]),
    Case("forgotten once the window has passed", [
        (deleted(A, b"v1", 0.0), None), (deleted(B, b"v2", 3.0), None),
        (moved(WINDOW + 1.0, A, B), [Resend(B, b"v2")]),
        (moved(3.0 + WINDOW, A, B), [])]),
    Case("a second delete of the same id starts its window again", [
        (deleted(A, b"v1", 0.0), None), (deleted(A, b"v2", 4.0), None),
        (moved(WINDOW + 1.0, A), [Resend(A, b"v2")])]),
    # nothing at the new owner could tell the deleted object from one put again since
    Case("a delete of no known version is not sent again", [
        (deleted(A, None, 0.0), None), (moved(1.0, A), [])]),
    Case("nor is an earlier delete of the id, once deleted again with no version", [
        (deleted(A, b"v1", 0.0), None), (deleted(A, None, 1.0), None), (moved(2.0, A), [])]),
    # the move's resends ran before the answer came: a stand-in answered, the owner is back
    Case("a delete answered after owners moved is sent again at once", [
        (deleted(A, b"v1", 0.0, moved=True), Resend(A, b"v1")),
        (moved(1.0, A), [Resend(A, b"v1")])]),
    Case("and not at once if they did not", [
        (deleted(A, b"v1", 0.0, moved=False), None), (moved(1.0, B), [])]),
    Case("nor at once with no known version", [
        (deleted(A, None, 0.0, moved=True), None), (moved(1.0, A), [])]),
    # a committed ring run again: a copy of the retired version announced late is withdrawn
    Case("a retire whose owner moves is sent again as a retire", [
        (deleted(A, b"v1", 0.0, retire=True), None),
        (moved(1.0, A), [Resend(A, b"v1", retire=True)])]),
    Case("and at once if owners moved while it was on its way", [
        (deleted(A, b"v1", 0.0, moved=True, retire=True), Resend(A, b"v1", retire=True))]),
    Case("a delete after a retire of the id is sent again as a delete", [
        (deleted(A, b"v1", 0.0, retire=True), None), (deleted(A, b"v2", 1.0), None),
        (moved(2.0, A), [Resend(A, b"v2")])]),
    Case("the oldest are forgotten beyond the limit", [
        (deleted(A, b"v1", 0.0), None), (deleted(B, b"v2", 0.1), None),
        (deleted(C, b"v3", 0.2), None),
        (moved(1.0, A, B, C), [Resend(B, b"v2"), Resend(C, b"v3")])], limit=2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recent_deletes(case: Case) -> None:
    recent = RecentDeletes(WINDOW, limit=case.limit)
    for n, (step, expected) in enumerate(case.steps):
        assert step(recent) == expected, f"step {n}"
    assert len(recent) <= case.limit
