"""Re-announcing holdings after a membership change: what a retry sends.

A real arena and store; the owner shard is a plain object standing in for the peer, answering
"not the owner" first, as a new owner does until it has heard of the death that made it the
owner. While that first answer is out, the reduce producing the object starts its result again
under a new version (docs/design.md §5, "Ownership"): the retry must announce that version.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hoplite_client.net.handshake import Identity
from hoplite_client.wire.errors import (
    HopliteError,
    NotOwnerError,
    ObjectNotFoundError,
    error_from_wire,
)
from hoplite_client.wire.frames import INLINE_MAX, encode
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Announce, Deleted, DeleteEntry, Holding, Publish
from hoplited.cluster.membership import OwnerSet
from hoplited.directory.client import DirectoryClient
from hoplited.memory.arena import PAGE, Arena
from hoplited.memory.store import ObjectStore
from hoplited.rpc import Rpc
from hoplited.tasks import Tasks

SIZE = INLINE_MAX + PAGE  # announced, not published with its bytes
OWNER = "owner"
WAIT = 30.0  # the retries end within a fraction of a second; this only bounds a bug


class Owner:
    """The new owner shard: refuses the first ``refusals`` announcements, running ``meanwhile``
    before answering the first, and records what it accepted."""

    def __init__(self, refusals: int, meanwhile: Any = None) -> None:
        self.refusals = refusals
        self.meanwhile = meanwhile
        self.accepted: list[Holding] = []
        self.moved: list[bool] = []
        self.retry_window = 30.0

    async def call_node(self, node: str, msg: Announce) -> None:
        assert node == OWNER
        if self.refusals:
            self.refusals -= 1
            if self.meanwhile is not None:
                self.meanwhile()
                self.meanwhile = None
            raise NotOwnerError("not the owner of 1 of the 1 announced objects")
        self.accepted += msg.holdings
        self.moved.append(msg.moved)


class Membership:
    """Owners that do not move while a request is on its way."""

    owner_set = OwnerSet([OWNER])

    def owner(self, oid: ObjectID) -> str:
        return OWNER


@pytest.fixture
def store() -> Any:
    arena = Arena(8 * SIZE)
    yield ObjectStore(arena)
    arena.close()


def produce(store: ObjectStore, oid: ObjectID) -> bytes:
    """A reduce's result being computed here: a third of it so far; returns its version."""
    obj = store.create(oid, SIZE, "uint8", [SIZE])
    obj.producing = True
    obj.advance(SIZE // 3)
    return obj.version


def restart(store: ObjectStore, oid: ObjectID) -> None:
    """The reduce starts its result again: the old copy goes, a new version begins."""
    store.remove(oid, HopliteError("started again"))
    produce(store, oid)


@pytest.mark.parametrize("case", ["restarted meanwhile", "dropped meanwhile", "unchanged"])
async def test_a_retry_announces_what_the_store_holds_at_that_moment(
        store: ObjectStore, case: str) -> None:
    oid = ObjectID.random()
    old = produce(store, oid)
    meanwhile = {"restarted meanwhile": lambda: restart(store, oid),
                 "dropped meanwhile": lambda: store.remove(oid),
                 "unchanged": None}[case]
    owner = Owner(refusals=1, meanwhile=meanwhile)
    tasks = Tasks()
    client = DirectoryClient(owner, store, Membership(), tasks)  # type: ignore[arg-type]
    client.reannounce(OwnerSet(["gone"]), lambda _: None, lambda _: 0)  # its old owner died
    for _ in range(int(WAIT / 0.01)):
        if not len(tasks):
            break
        await asyncio.sleep(0.01)
    assert not len(tasks), "the announcement never ended"
    obj = store.get(oid)
    if obj is None:
        assert owner.accepted == [], "a copy no longer held was announced"
        return
    [holding] = owner.accepted
    assert owner.moved == [True]  # not a new put: a delete that found no entry refuses it
    assert holding.version == obj.version
    assert (holding.version != old) == (case == "restarted meanwhile")
    assert holding.producing and holding.received == SIZE // 3


class TwoOwners:
    """Two new owner shards, ``a`` for ``x`` and ``b`` for the rest. While ``a`` has the
    request, ``meanwhile`` runs (before it answers); each records the holdings it was sent
    beside the versions the store held at that moment."""

    def __init__(self, store: ObjectStore, x: ObjectID, meanwhile: Any) -> None:
        self.store, self.x, self.meanwhile = store, x, meanwhile
        self.sent: list[tuple[str, list[bytes], list[bytes]]] = []
        self.retry_window = 30.0
        self.owner_set = OwnerSet(["a", "b"])

    def owner(self, oid: ObjectID) -> str:
        return "a" if oid == self.x else "b"

    async def call_node(self, node: str, msg: Announce) -> None:
        held = []
        for h in msg.holdings:
            obj = self.store.get(h.oid)
            held.append(b"" if obj is None else obj.version)
        self.sent.append((node, [h.version for h in msg.holdings], held))
        if node == "a":
            self.meanwhile()
            await asyncio.sleep(0.01)  # the round trip to a remote owner


async def test_each_owner_is_sent_what_the_store_holds_as_its_batch_goes(
        store: ObjectStore) -> None:
    """Two ids change owners at once, and the reduce producing one starts its result again
    while the other's new owner has its batch. The restarted result's owner must not be sent
    the old version read before: arriving after the new version's own announcement, it
    erased that entry, and the reduce's final publish was refused as "already exists" (CI,
    tests/cluster/test_repair.py, the merged-inputs host killed: the shard was node 0)."""
    x, y = ObjectID.random(), ObjectID.random()
    produce(store, x)
    produce(store, y)
    owners = TwoOwners(store, x, lambda: restart(store, y))
    tasks = Tasks()
    client = DirectoryClient(owners, store, owners, tasks)  # type: ignore[arg-type]
    client.reannounce(OwnerSet(["gone"]), lambda _: None, lambda _: 0)
    await drain(tasks)
    assert sorted(node for node, _, _ in owners.sent) == ["a", "b"]
    for node, sent, held in owners.sent:
        assert sent == held, f"{node} was sent a version the store no longer held"


class SmallOwner:
    """The new owner of a small copy: while the copy is re-published to it, the copy is
    deleted here (``store.remove``); it then encodes the request as a link sends it, and
    answers ``answer`` (None: accepted)."""

    def __init__(self, store: ObjectStore, answer: HopliteError | None) -> None:
        self.store = store
        self.answer = answer
        self.sent: list[bytes] = []
        self.retry_window = 30.0

    async def call_owner(self, oid: ObjectID, msg: Publish, payload: Any = None,
                         timeout: float | None = None, wanted: Any = None) -> None:
        self.store.remove(oid)  # a Drop, while the request is on its way
        await asyncio.sleep(0)
        self.sent.append(bytes(encode(msg, payload)[-1]))
        assert msg.moved
        if self.answer is not None:
            raise self.answer


@pytest.mark.parametrize("answer", [None, error_from_wire("deleted", "object was deleted", {})],
                         ids=["accepted", "refused as deleted"])
async def test_a_small_copy_deleted_while_it_is_republished_is_sent_whole_then_freed(
        store: ObjectStore, answer: HopliteError | None) -> None:
    """The request carries the copy's bytes from the store's memory: they stay valid until the
    owner answered (before, the delete freed them and encoding the retry crashed the task),
    and the memory is freed once it has."""
    oid = ObjectID.random()
    data = bytes(range(100))
    obj = store.create(oid, len(data), "uint8", [len(data)])
    obj.buffer[:] = data
    obj.advance(len(data))
    owner = SmallOwner(store, answer)
    tasks = Tasks()
    client = DirectoryClient(owner, store, Membership(), tasks)  # type: ignore[arg-type]
    client.reannounce(OwnerSet(["gone"]), lambda _: None, lambda _: 0)
    for _ in range(int(WAIT / 0.01)):
        if not len(tasks):
            break
        await asyncio.sleep(0.01)
    assert owner.sent == [data]
    assert store.get(oid) is None and store.arena.used == 0


class RefusingLink:
    """The link to a new owner that says "not the owner" to the first request, as it does
    until it hears of the death that made it the owner; while that answer is out the copy
    goes from here (``meanwhile``). Records every request sent."""

    def __init__(self, meanwhile: Any) -> None:
        self.meanwhile = meanwhile
        self.sent: list[Publish] = []

    async def request(self, msg: Publish, payload: Any, timeout: float | None) -> Any:
        self.sent.append(msg)
        if len(self.sent) == 1:
            self.meanwhile()
            raise NotOwnerError("not the owner")
        return SimpleNamespace(msg=None)


class Members(Membership):
    """The members as an Rpc sees them: one link, nobody suspected."""

    suspected: set[str] = set()

    def __init__(self, link: RefusingLink) -> None:
        self.link = link

    def get(self, node: str) -> RefusingLink:
        assert node == OWNER
        return self.link


async def test_a_small_copy_that_goes_while_its_republish_is_refused_is_not_sent_again(
        store: ObjectStore) -> None:
    """A small copy is published again to its new owner, which refuses until it hears of the
    death; meanwhile a delete made on this node removes the copy here. The retry must not go:
    it reached the owner after that delete, which listed a copy nobody held, and no delete
    ever removed that entry (``bench.chaos --stagger``, seed 65, trial 33)."""
    oid = ObjectID.random()
    obj = store.create(oid, 100, "uint8", [100])
    obj.advance(100)
    members = Members(RefusingLink(lambda: store.remove(oid)))
    tasks = Tasks()
    rpc = Rpc(Identity("me", b""), members, members, tasks,  # type: ignore[arg-type]
              retry_window=WAIT)
    client = DirectoryClient(rpc, store, members, tasks)  # type: ignore[arg-type]
    client.reannounce(OwnerSet(["gone"]), lambda _: None, lambda _: 0)  # its old owner died
    await drain(tasks)
    assert [m.oid for m in members.link.sent] == [oid], "the copy that went was sent again"
    assert store.get(oid) is None and store.arena.used == 0


class DeletingOwner:
    """The owner shard of deleted ids: answers the first delete with ``version`` (None: it
    had no entry, "not found"), and records every delete it is sent."""

    def __init__(self, version: bytes | None) -> None:
        self.version = version
        self.deletes: list[DeleteEntry] = []
        self.retry_window = 30.0

    async def call_owner(self, oid: ObjectID, msg: DeleteEntry, payload: Any = None,
                         timeout: float | None = None) -> SimpleNamespace:
        self.deletes.append(msg)
        if not msg.again and self.version is None:
            raise error_from_wire("not_found", f"object {oid.hex()} does not exist", {})
        return SimpleNamespace(msg=Deleted(version=self.version if not msg.again else None))


async def drain(tasks: Tasks) -> None:
    for _ in range(int(WAIT / 0.01)):
        if not len(tasks):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the tasks never ended")


@pytest.mark.parametrize("answer,local,expected", [
    (b"v-owner", False, b"v-owner"),  # the owner's entry: its version
    (None, True, "local"),  # the owner had no entry: our own copy's version
    (None, False, None),  # neither: not sent again (it could not tell a put made since)
], ids=["owner's version", "our copy's version", "no version"])
async def test_a_delete_is_sent_again_to_the_new_owner_when_its_owner_moves(
        store: ObjectStore, answer: bytes | None, local: bool,
        expected: bytes | str | None) -> None:
    """A holder's announcement on its way to an owner that then died (or to a stand-in that
    gave the id back) reaches a new owner that never heard of the delete; the deleter sends
    the delete again there, with the version it removed (docs/design.md §5, "Deletes and
    moving owners")."""
    oid = ObjectID.random()
    obj = produce(store, oid) if local else None
    owner = DeletingOwner(answer)
    tasks = Tasks()
    client = DirectoryClient(owner, store, Membership(), tasks)  # type: ignore[arg-type]
    if answer is None:
        with pytest.raises(ObjectNotFoundError):
            await client.delete(oid)
    else:
        await client.delete(oid)
    client.reannounce(OwnerSet([OWNER]), lambda _: None, lambda _: 0)  # nothing moved
    await drain(tasks)
    assert len(owner.deletes) == 1
    client.reannounce(OwnerSet(["gone"]), lambda _: None, lambda _: 0)  # its owner died
    await drain(tasks)
    [first, *again] = owner.deletes
    assert not first.again and first.version is None
    if expected is None:
        assert again == []
        return
    assert [(m.oid, m.again, m.version) for m in again] == [
        (oid, True, obj if expected == "local" else expected)]


async def test_a_retire_is_sent_again_as_a_retire_when_its_owner_moves(
        store: ObjectStore) -> None:
    """A committed ring that lost every holder retires its version and runs again; a copy of
    that version announced to the id's next owner must be withdrawn there too, not deleted
    (gets waiting on it take the next version: docs/design.md §4, "Ring allreduce")."""
    oid = ObjectID.random()
    owner = DeletingOwner(b"v-owner")
    tasks = Tasks()
    client = DirectoryClient(owner, store, Membership(), tasks)  # type: ignore[arg-type]
    await client.retire(oid, b"v-ring")
    client.reannounce(OwnerSet(["gone"]), lambda _: None, lambda _: 0)  # its owner died
    await drain(tasks)
    assert [(m.oid, m.again, m.retire, m.version) for m in owner.deletes] == [
        (oid, False, True, b"v-ring"), (oid, True, True, b"v-ring")]


class MovingMembership(Membership):
    """Owners that move (and move back) while ``DeletingOwner`` answers a delete."""

    def move(self) -> None:
        self.owner_set = OwnerSet([OWNER, "stand-in"])
        self.owner_set = OwnerSet([OWNER])


class AnsweringAfterAMove(DeletingOwner):
    def __init__(self, version: bytes | None, membership: MovingMembership) -> None:
        super().__init__(version)
        self.membership = membership

    async def call_owner(self, oid: ObjectID, msg: DeleteEntry, payload: Any = None,
                         timeout: float | None = None) -> SimpleNamespace:
        if not msg.again:  # the answer arrives after the move was handled here
            self.membership.move()
        return await super().call_owner(oid, msg, payload, timeout)


async def test_a_delete_answered_after_owners_moved_is_sent_again_at_once(
        store: ObjectStore) -> None:
    """A stand-in answered the delete, and the move back to the owner trusted again was
    handled before the answer: its resends did not know the delete yet, so the delete goes
    again at once, with the version removed (``bench/chaos.py --victims 2 --resume``, seed 37,
    trial 2: the owner kept its entry from before it froze)."""
    oid = ObjectID.random()
    membership = MovingMembership()
    owner = AnsweringAfterAMove(b"v-stand-in", membership)
    tasks = Tasks()
    client = DirectoryClient(owner, store, membership, tasks)  # type: ignore[arg-type]
    await client.delete(oid)
    await drain(tasks)
    assert [(m.oid, m.again, m.version) for m in owner.deletes] == [
        (oid, False, None), (oid, True, b"v-stand-in")]
