"""ReducePlan's repairs against a model of the tree nodes: every byte holds every input once.

The plan is driven by a small, synchronous model of what the daemons do with its instructions
(hoplited/collectives/worker.py, coordinator.py), on the simulator's driver (a handler per
instruction, hoplited/sim/plan_driver.py) with byte arrays in place of links: tasks
combine element by element from their start, each child and folded input over its byte
range; pulls copy a source's valid prefix a few bytes at a time and resume from their watermark; a fold adds an input from the first
element not combined yet; a reshape cuts a child at the later of its bound and what was
combined. Each element of every object is the multiset of inputs summed into it, so a lost,
doubled or misplaced input shows, and so does an element whose first bytes were pulled from
one value and the rest from another (a pull resumed inside an element: a consumer pulling a
child again resumes at the element boundary, as worker.on_child does). Random trees, random interleavings, one node killed at a
random step, its input put again on a random live node (and a second node too): the result must be complete and
exact every time (docs/design.md §5); with two nodes killed, folds give way to restarts.
Hypothesis draws the seeds (derandomized: tests/conftest.py), the seeds that once failed first.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hoplite_client.wire.errors import ObjectNotFoundError, PeerUnavailableError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives import plan as p
from hoplited.sim.plan_driver import PlanDriver

pytestmark = pytest.mark.unit

ITEM = 4  # float32
ELEMENTS = 12
SIZE = ELEMENTS * ITEM  # bytes the model moves per object
ME = "me"
R = ObjectID(b"\xee" * 20)
BIG = 1 << 20  # the size the plan is told (a tree, not inline); the model moves SIZE bytes
SPLICED = ObjectID(b"\x5b" * 20)  # marks an element whose bytes came from two values


@dataclass
class Obj:
    """An object on a node: valid bytes from 0, and each element's inputs once complete."""

    valid: int
    data: list[Counter[ObjectID]]
    version: bytes
    partial: Counter[ObjectID] | None = None  # the value the element at ``valid`` began as

    def element(self, e: int) -> Counter[ObjectID]:
        return self.data[e]


@dataclass
class Buf:
    obj: Obj
    first: int
    until: int
    source: tuple[str, ObjectID, bytes] | None = None  # node, object, version; None: stopped
    stop: int = SIZE


@dataclass
class Task:
    node: str
    slot: int
    gen: int
    own: ObjectID
    out: Obj
    out_id: ObjectID
    start: int
    expected: int
    combined: int
    children: dict[int, Buf] = field(default_factory=dict)
    cut: set[int] = field(default_factory=set)
    extras: list[tuple[int, Obj]] = field(default_factory=list)


def at_once(delay: float, fn: Callable[[], object]) -> None:
    """The model keeps no time: a timer's event is queued at once."""
    fn()


class World(PlanDriver[p.ReducePlan, p.Event]):
    """The cluster as the plan's driver would see it, one instruction or step at a time."""

    def __init__(self, rng: random.Random, k: int, depth: int, local: bool,
                 everyone: bool = False, hosts: int = 0) -> None:
        self.rng = rng
        self.versions = 0
        self.inputs = [ObjectID(bytes([i + 1]) * 20) for i in range(k)]
        # ``hosts``: inputs spread over that many nodes at random, several on some
        names = [ME] * local + [f"n{j}" for j in range(hosts)]
        self.nodes = [ME if (local and i == 0) else rng.choice(names) if hosts else f"n{i}"
                      for i in range(k)]
        self.objects: dict[tuple[str, ObjectID], Obj] = {}
        for oid, node in zip(self.inputs, self.nodes, strict=True):
            self.put(node, oid)
        self.dead: set[str] = set()
        self.helper = ""  # the node every lost input is put again on ("": anywhere)
        self.helper_slots = 0  # the most slots the plan had on it at once
        self.tasks: dict[tuple[str, int], Task] = {}
        self.result: Obj | None = None
        self.root_pull: Buf | None = None
        self.waits: dict[ObjectID, tuple[str, ...]] = {}
        super().__init__(p.ReducePlan(R, list(self.inputs), k, "sum", ME,
                                      depth=lambda n, size: depth,
                                      spec=p.ReduceSpec(everyone=everyone)), at_once)
        self.on(p.OpenResult, self._open)
        self.on(p.StartTask, self._start)
        self.on(p.Connect, self._connect)
        self.on(p.PullRoot, self._pull_root)
        self.on(p.Fold, self._fold)
        self.on(p.Reshape, self._reshape)
        self.on(p.WaitInput, self._wait)
        self.on(p.After, self.fire)
        self.on(p.CancelWaits, self._cancel)
        self.on(p.RestartResult, self._restart)
        self.on(p.Publish, lambda ins: self.queue(p.Published()))
        self.on(p.Fail, self._fail)
        # no memory is modelled; the plan is told BIG bytes, so it never combines inline
        self.ignore(p.Release, p.CombineInline)

    def put(self, node: str, oid: ObjectID) -> None:
        self.versions += 1
        self.objects[(node, oid)] = Obj(SIZE, [Counter({oid: 1}) for _ in range(ELEMENTS)],
                                        b"v%d" % self.versions)

    def ready(self, oid: ObjectID) -> p.InputReady | None:
        holders = tuple(n for (n, o) in self.objects if o == oid)
        if not holders:
            return None
        version = self.objects[(holders[-1], oid)].version
        return p.InputReady(oid, holders, tuple(n for n in holders if n not in self.dead),
                            BIG, "<f4", (BIG // 4,), version)

    # --- instructions ---
    def _open(self, ins: p.OpenResult) -> None:
        self.result = self._new_result()

    def _pull_root(self, ins: p.PullRoot) -> None:
        assert self.result is not None
        if self.root_pull is None or self.root_pull.obj is not self.result:
            self.root_pull = Buf(self.result, 0, SIZE)
        self.root_pull.source = (ins.node, ins.output, ins.version)

    def _wait(self, ins: p.WaitInput) -> None:
        self.waits[ins.oid] = ins.exclude

    def _cancel(self, ins: p.CancelWaits) -> None:
        for oid in ins.oids:
            self.waits.pop(oid, None)

    def _restart(self, ins: p.RestartResult) -> None:
        self.result = self._new_result()
        self.root_pull = None

    def _fail(self, ins: p.Fail) -> None:
        raise AssertionError(f"the reduce failed: {ins.error}")

    def _new_result(self) -> Obj:
        self.versions += 1
        return Obj(0, [Counter() for _ in range(ELEMENTS)], b"r%d" % self.versions)

    def _start(self, ins: p.StartTask) -> None:
        if ins.node in self.dead:
            self.queue(p.SlotFailed(ins.slot, ins.gen, PeerUnavailableError("gone")))
            return
        start = ins.start - ins.start % ITEM
        old = self.tasks.pop((ins.node, ins.slot), None)  # replaced: its output is dropped
        if old is not None and old.out_id != R:
            self.objects.pop((ins.node, old.out_id), None)
        if ins.output == R:
            assert self.result is not None
            out = self.result
            assert out.valid == ins.start, "the result holds other bytes than the task's start"
        else:
            self.versions += 1
            out = Obj(start, [Counter() for _ in range(ELEMENTS)], b"t%d" % self.versions)
            self.objects[(ins.node, ins.output)] = out
        assert (ins.node, ins.input) in self.objects, "a task's input is not on its node"
        extras = [(start, self.objects[(ins.node, oid)]) for oid in ins.extras]
        self.tasks[(ins.node, ins.slot)] = Task(ins.node, ins.slot, ins.gen, ins.input, out,
                                               ins.output, start, ins.children, start,
                                               extras=extras)
        self.queue(p.TaskStarted(ins.slot, ins.gen, out.version))

    def _task(self, node: str, slot: int, version: bytes | None = None) -> Task | None:
        task = None if node in self.dead else self.tasks.get((node, slot))
        if task is None or (version is not None and task.out.version != version):
            return None
        return task

    def _connect(self, ins: p.Connect) -> None:
        assert ins.parent_version, "an edge names the placement it is meant for"
        task = self._task(ins.parent_node, ins.parent_slot, ins.parent_version)
        if task is None:
            self.queue(p.SlotFailed(ins.parent_slot, None, PeerUnavailableError("x")))
            return
        buf = task.children.get(ins.child_slot)
        if buf is None:
            assert ins.child_slot not in task.cut
            assert len(task.children) + len(task.cut) < task.expected, "a child too many"
            first = max(task.start, ins.start)
            buf = Buf(Obj(first, [Counter() for _ in range(ELEMENTS)], b""), first,
                      ins.until or SIZE)
            task.children[ins.child_slot] = buf
        else:  # pulled again: the bytes of a partial element go (worker.on_child)
            buf.obj.valid = max(buf.first, buf.obj.valid - buf.obj.valid % ITEM)
            buf.obj.partial = None
        buf.source = (ins.child_node, ins.child_output, ins.child_version)
        buf.stop = ins.until or SIZE

    def _fold(self, ins: p.Fold) -> None:
        task = self._task(ins.node, ins.into, ins.version)
        extra = self.objects.get((ins.node, ins.input))
        if task is None or extra is None or extra.version != ins.input_version:
            self.queue(p.FoldFailed(ins.slot, ObjectNotFoundError("no such task"),
                                            ins.version))
            return
        assert ins.at % ITEM == 0
        at = max(ins.at, task.combined)
        task.extras.append((at, extra))
        self.queue(p.Folded(ins.slot, ins.into, at, ins.version))

    def _reshape(self, ins: p.Reshape) -> None:
        task = self._task(ins.parent_node, ins.parent, ins.version)
        if task is None:
            self.queue(p.SlotFailed(ins.parent, None, PeerUnavailableError("gone"),
                                            version=ins.version))
            return
        cut = max(ins.until, task.combined)
        assert not ins.more or cut == ins.until, "new children past what was combined"
        buf = task.children.get(ins.child)
        if buf is not None:
            buf.until = min(buf.until, max(buf.first, cut))
            if buf.source is not None and buf.obj.valid < buf.until:
                buf.stop = buf.until  # the pull goes on up to the cut (worker.on_reshape)
            else:
                buf.source = None
        else:
            assert cut <= task.start, "no bytes of a child below the cut"
            task.cut.add(ins.child)
        task.expected += ins.more
        self.queue(p.Reshaped(ins.child, cut))

    # --- steps: the daemons' progress, in a random order ---
    def step(self) -> bool:
        """Advance one random pull or combine; False if nothing can move."""
        moves: list[tuple[str, Task | None, int]] = [
            ("pull", t, k) for t in self.tasks.values() if t.node not in self.dead
            for k, b in t.children.items() if b.source is not None]
        if self.root_pull is not None and self.root_pull.source is not None:
            moves.append(("root", None, 0))
        moves += [("combine", t, 0) for t in self.tasks.values()
                  if t.node not in self.dead and t.combined < SIZE]
        self.rng.shuffle(moves)
        return any(self._move(kind, task, key) for kind, task, key in moves)

    def _move(self, kind: str, task: Task | None, key: int) -> bool:
        if kind == "combine":
            assert task is not None
            return self._combine(task)
        buf = self.root_pull if task is None else task.children[key]
        assert buf is not None and buf.source is not None
        node, oid, version = buf.source
        source = None if node in self.dead else self.objects.get((node, oid))
        if source is None or source.version != version:
            buf.source = None
            if kind == "root":
                self.queue(p.ChildLost(None, self._root_slot(), version, buf.obj.valid,
                                               node in self.dead, PeerUnavailableError("x")))
            else:
                assert task is not None
                self.queue(p.ChildLost(task.slot, key, version, buf.obj.valid,
                                               node in self.dead, PeerUnavailableError("x"),
                                               task.out.version))
            return True
        if source.valid <= buf.obj.valid:
            return False
        end = min(source.valid, buf.obj.valid + self.rng.randint(1, 2 * ITEM))
        for e in range(buf.obj.valid // ITEM, end // ITEM):
            got = Counter(source.data[e])
            if e * ITEM < buf.obj.valid and buf.obj.partial != got:  # its first bytes came
                got = Counter({SPLICED: 1})  # from another value: an element of garbage
            buf.obj.data[e] = got
        # a pull that stops inside an element holds its first bytes: of which value
        buf.obj.partial = Counter(source.data[end // ITEM]) if end % ITEM else None
        buf.obj.valid = end
        if kind == "root" and end == SIZE:
            self.queue(p.ResultComplete())
        if end >= buf.stop:
            buf.source = None
        return True

    def _root_slot(self) -> int:
        assert self.plan.shape is not None
        return self.plan.shape.root

    def _combine(self, task: Task) -> bool:
        if len(task.children) + len(task.cut) < task.expected:
            return False
        pos = task.combined
        e = pos // ITEM
        live = [b for k, b in sorted(task.children.items()) if b.first <= pos < b.until]
        if any(b.obj.valid < pos + ITEM for b in live):
            return False
        own = self.objects.get((task.node, task.own))
        assert own is not None, "a task's input vanished under it"
        total = Counter(own.data[e])
        for b in live:
            total.update(b.obj.data[e])
        for at, extra in task.extras:
            if at <= pos:
                total.update(extra.data[e])
        task.out.data[e] = total
        task.combined = pos + ITEM
        task.out.valid = max(task.out.valid, pos + ITEM)
        if task.out is self.result and task.out.valid == SIZE:
            self.queue(p.ResultComplete())
        return True

    # --- failures ---
    def kill(self, node: str) -> None:
        self.dead.add(node)
        for key in [k for k in self.objects if k[0] == node]:
            del self.objects[key]
        self.queue(p.NodeDied(node))

    def check_waits(self) -> None:
        for oid, exclude in list(self.waits.items()):
            ev = self.ready(oid)
            if ev is not None and any(n not in exclude for n in ev.alive):
                del self.waits[oid]
                self.queue(ev)


def run(seed: int, deaths: int, everyone: bool = False,
        hosts: int = 0, helper: bool = False) -> tuple[World, str]:
    """One reduce with ``deaths`` nodes killed at random steps, each one's input put again on
    a random live node (or a new one) a random number of steps later. ``everyone``: an
    allreduce whose first input to be ready is here (the root's last leaf, docs/design.md §4).
    ``hosts``: 4 to 12 inputs on that many nodes, several on some, becoming ready in bursts
    between the daemons' steps (merges, docs/design.md §4, "Several inputs on one node").
    ``helper``: every lost input is put again on one node that survives (``world.helper``),
    as ``bench/chaos.py`` does with one victim's inputs."""
    rng = random.Random(seed)
    k = rng.randint(4, 12) if hosts else rng.randint(3, 7)
    depth = rng.choice([0, 0, 1, 2])
    local = rng.random() < 0.5
    world = World(rng, k, depth, local=local or everyone, everyone=everyone, hosts=hosts)
    order = list(range(k))
    rng.shuffle(order)
    if everyone:
        order.remove(0)
        order.insert(0, 0)
    pending = order if hosts else []
    for i in [] if hosts else order:  # inputs become ready in a random order
        ev = world.ready(world.inputs[i])
        assert ev is not None
        world.feed(ev)
    others = sorted({n for n in world.nodes if n != ME})
    victims = rng.sample(others, max(0, min(deaths, len(others) - helper)))
    spared = sorted({n for n in world.nodes if n not in victims})
    world.helper = rng.choice(spared) if helper else ""
    kills = sorted(rng.randint(1, 6 * ELEMENTS) for _ in victims)
    again: dict[int, list[ObjectID]] = {}
    story = f"k={k} depth={depth} nodes={world.nodes} kills={list(zip(victims, kills))}"
    steps = 0
    while not world.plan.published:
        steps += 1
        assert steps < 20000, f"no progress: {story}"
        burst = rng.randint(0, 3) if pending and rng.random() < 0.3 else 0
        released, pending[:burst] = pending[:burst], []
        for i in released:  # queued together: a burst's TaskStarted come after it
            ev = world.ready(world.inputs[i])
            if ev is None:  # its node died first: ready once put again
                pending.append(i)
            else:
                world.queue(ev)
        for victim, at in zip(victims, kills, strict=True):
            if steps == at and victim not in world.dead:
                lost = [o for (n, o) in world.objects if n == victim and o in world.inputs]
                world.kill(victim)
                again.setdefault(steps + rng.randint(0, 3 * ELEMENTS), []).extend(lost)
        for oid in again.pop(steps, []):
            live = [n for n in world.nodes if n not in world.dead] + ["n9"]
            world.put(world.helper or rng.choice(live), oid)
        world.check_waits()
        world.drain()
        if not world.step() and not world.pending and not again and not pending:
            world.check_waits()
            assert world.pending or world.plan.published, (
                f"stuck: {story}; {list(world.plan.history)[-5:]}")
        world.drain()
        on_helper = sum(placed.node == world.helper for placed in world.plan.slots.values())
        world.helper_slots = max(world.helper_slots, on_helper)
    return world, story


# Each property draws seeds (a seed fixes the tree, the interleaving, the victims and when
# they die) and a number of deaths; the examples are seeds that once ended wrong (a spliced
# element, a redone child read from before its start, a leaf taken over below where its sums
# still reach the taker: a wrong sum) or stuck (a cut leaf whose pull stopped short of the
# cut; a slot dropped by a restart of the whole result; a child on a dead node whose consumer
# waited to be placed again), all fixed, and run first every time.
SEEDS = st.integers(0, 2**32 - 1)
FIXED = [(311, 2), (339, 2), (509, 2), (823, 2), (963, 2), (2019, 2), (2261, 2), (362, 2),
         (1601, 2), (1879, 2), (3404, 2), (6017, 2), (7319, 2), (4317, 1), (411, 3), (1963, 3),
         (2902, 3), (3573, 3), (14974, 3)]
# The same model for an allreduce whose first input is here: on a chain the last input hangs
# on the root (tree_shape's last_leaf); its examples are seeds that once ended wrong or stuck.
FIXED_ALLREDUCE = [(244, 2), (892, 2), (1043, 2), (1106, 2), (1279, 1), (2194, 3)]


def examples(pairs: list[tuple[int, int]]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``@example(seed=s, deaths=d)`` for each of ``pairs``."""
    def add(test: Callable[..., None]) -> Callable[..., None]:
        for seed, deaths in reversed(pairs):
            test = example(seed=seed, deaths=deaths)(test)
        return test
    return add


@settings(max_examples=400)
@given(seed=SEEDS, deaths=st.integers(1, 3))
@examples(FIXED)
def test_every_byte_of_the_result_holds_every_input_once(seed: int, deaths: int) -> None:
    check_every_byte(seed, deaths)


def check_every_byte(seed: int, deaths: int, everyone: bool = False, hosts: int = 0,
                     helper: bool = False) -> None:
    """Run the model; the result must be complete and hold every input once in every
    element."""
    world, story = run(seed, deaths, everyone, hosts, helper)
    want = Counter(world.inputs)
    assert world.result is not None and world.result.valid == SIZE, story
    for e, got in enumerate(world.result.data):
        assert got == want, f"element {e}: {dict(got)} != {dict(want)}; {story}"


@settings(max_examples=200)
@given(seed=SEEDS, deaths=st.integers(1, 3))
@examples(FIXED_ALLREDUCE)
def test_an_allreduce_root_with_the_last_leaf_is_repaired_too(seed: int, deaths: int) -> None:
    check_every_byte(seed, deaths, everyone=True)


@settings(max_examples=300)
@given(seed=SEEDS, deaths=st.integers(0, 2))
def test_inputs_several_to_a_node_are_merged_and_repaired(seed: int, deaths: int) -> None:
    """Inputs several to a node, ready in bursts between the daemons' steps: a slot adds
    the others on its node while it has combined nothing, and every byte still holds every
    input once, whatever dies."""
    check_every_byte(seed, deaths, hosts=3)


def test_the_model_merges_inputs() -> None:
    """The runs above do merge: most of their reduces add some input in another's slot."""
    merged = [bool(run(seed, 0, hosts=3)[0].plan.merged) for seed in range(50)]
    assert sum(merged) >= 25


@settings(max_examples=300)
@given(seed=SEEDS, deaths=st.integers(1, 3))
def test_inputs_put_again_on_one_node_are_merged_and_repaired(seed: int, deaths: int) -> None:
    """Every lost input put again on one survivor, as after a node with several inputs dies:
    they merge into a slot there where they can, and every byte holds every input once."""
    check_every_byte(seed, deaths, hosts=3, helper=True)


def test_inputs_put_again_on_one_node_share_its_slots() -> None:
    """The survivor taking the lost inputs holds at most two slots of the reduce at any time
    in most runs, whatever it took (160 of 200; with each input put again in a slot of its
    own, 52), so its store holds no buffer per input (docs/design.md §4, "Several inputs on
    one node")."""
    runs = [run(seed, deaths, hosts=3, helper=True)[0] for deaths in (2, 3)
            for seed in range(100)]
    assert sum(world.helper_slots <= 2 for world in runs) >= 0.7 * len(runs)
