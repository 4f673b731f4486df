"""Unit tests of the sans-I/O wire codec: frames, message records and object ids."""

from __future__ import annotations

import dataclasses
import struct
import tracemalloc
import types
import typing
from typing import Any, Union

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hoplite_client.wire import messages as m
from hoplite_client.wire.errors import (
    InvalidArgumentError,
    LocalProtocolError,
    ObjectNotFoundError,
    ProtocolError,
    RemoteProtocolError,
    error_from_wire,
)
from hoplite_client.wire.frames import (
    MAGIC,
    MAX_HEADER,
    MAX_SMALL_PAYLOAD,
    MAX_STREAM_PAYLOAD,
    PRELUDE,
    PRELUDE_SIZE,
    PROTOCOL_VERSION,
    READ_AHEAD,
    BadFrame,
    Frame,
    FrameReader,
    encode,
    encode_header,
)
from hoplite_client.wire.ids import OBJECT_ID_SIZE, ObjectID
from hoplite_client.wire.schema import field_hints, is_record, to_wire

UNUSED_KIND = next(k for k in range(255, 0, -1) if k not in m.MESSAGES)


# --- helpers -----------------------------------------------------------------------------

def sample(hint: Any, variant: int = 1) -> Any:
    """A valid value for ``hint``; ``variant`` 0 picks None for optionals and empty lists."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if variant == 0 and type(None) in typing.get_args(hint):
            return None
        return sample(inner[variant % len(inner)], variant)  # a tagged field: cycle its variants
    if origin is list:
        (inner,) = typing.get_args(hint)
        return [sample(inner, variant) for _ in range(2 * variant)]
    if origin is dict:
        return {} if variant == 0 else {"answer": 42, "nested": {"k": [1, "two", b"3"]}}
    if hint is ObjectID:
        return ObjectID(bytes([variant + 1]) * OBJECT_ID_SIZE)
    if is_record(hint):
        return build(hint, variant)
    table = {int: 7 + variant, float: 1.5 * variant, str: f"s{variant}-é", bytes: b"\x00\xff|" * variant,
             bool: bool(variant)}
    return table[hint]


def build(cls: type, variant: int = 1) -> Any:
    """An instance of record ``cls`` with every field filled from its annotation."""
    return cls(**{name: sample(hint, variant) for name, hint in field_hints(cls)})


def norm(events: list) -> list:
    """Comparable form of reader events (payload views become bytes)."""
    out = []
    for ev in events:
        if isinstance(ev, Frame):
            out.append(("frame", ev.msg, None if ev.payload is None else bytes(ev.payload)))
        else:
            out.append(("bad", type(ev.error), str(ev.error), ev.rid))
    return out


def wire(msg: Any, payload: bytes | None = None) -> bytes:
    """The bytes ``encode`` would put on the wire."""
    return b"".join(bytes(b) for b in encode(msg, payload))


def raw_frame(kind: int, header: bytes, payload: bytes = b"", *, magic: bytes = MAGIC,
              version: int = PROTOCOL_VERSION, header_len: int | None = None,
              payload_len: int | None = None) -> bytes:
    """A hand-made frame, with every prelude field overridable."""
    hl = len(header) if header_len is None else header_len
    pl = len(payload) if payload_len is None else payload_len
    return PRELUDE.pack(magic, version, kind, hl, pl) + header + payload


def feed_chunks(reader: FrameReader, data: bytes, sizes: list[int]) -> list:
    """Feed ``data`` in chunks whose sizes cycle through ``sizes``."""
    events, pos, i = [], 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)]
        events.extend(reader.feed(data[pos:pos + n]))
        pos, i = pos + n, i + 1
    return events


KINDS = sorted(m.MESSAGES.items())
OK = m.Ok(rid=99)


# --- round trips ------------------------------------------------------------------------

@pytest.mark.parametrize("variant", [0, 1, 2])
@pytest.mark.parametrize("kind,cls", KINDS, ids=[c.__name__ for _, c in KINDS])
def test_round_trip_without_payload(kind, cls, variant):
    """Every registered kind decodes back to an equal message, with no payload."""
    msg = build(cls, variant)
    assert kind == type(msg).KIND
    (ev,) = FrameReader().feed(wire(msg))
    assert ev == Frame(msg, None)


@pytest.mark.parametrize("kind,cls", [(k, c) for k, c in KINDS if c.PAYLOAD != "none"],
                         ids=[c.__name__ for _, c in KINDS if c.PAYLOAD != "none"])
def test_round_trip_with_payload(kind, cls):
    """Kinds that carry a payload deliver it intact (stream kinds without a sink go inline)."""
    msg = build(cls)
    payload = bytes(range(256)) * 5
    (ev,) = FrameReader().feed(wire(msg, payload))
    assert isinstance(ev, Frame) and ev.msg == msg and bytes(ev.payload) == payload


def test_registry_is_consistent():
    """Each registered record knows its own kind and a valid payload mode."""
    assert KINDS
    for kind, cls in KINDS:
        assert kind == cls.KIND and cls.PAYLOAD in ("none", "small", "stream")
        assert 0 < kind < 256


def test_float_field_accepts_int_and_optional_none():
    """An int in a float field decodes as float; None is accepted for Optional fields."""
    oid = ObjectID.random()
    header = msgpack.packb([1, oid.binary(), 3, 0], use_bin_type=True)
    (ev,) = FrameReader().feed(raw_frame(m.Get.KIND, header))
    assert ev.msg == m.Get(rid=1, oid=oid, timeout=3.0) and type(ev.msg.timeout) is float
    (ev,) = FrameReader().feed(wire(m.Get(rid=1, oid=oid, timeout=None)))
    assert ev.msg.timeout is None


def test_encode_accepts_numpy_payload():
    """encode() turns any buffer (here a float64 array) into its raw bytes."""
    np = pytest.importorskip("numpy")
    arr = np.arange(10, dtype=np.float64)
    msg = build(m.Put)
    (ev,) = FrameReader().feed(wire(msg, arr))
    assert bytes(ev.payload) == arr.tobytes()


# --- chunking ---------------------------------------------------------------------------

def mixed_stream() -> bytes:
    """Several frames of various kinds, with and without payloads, plus one bad frame."""
    parts = [wire(build(cls, 1)) for _, cls in KINDS]
    parts.insert(3, wire(build(m.Put), b"x" * 1000))
    parts.insert(5, raw_frame(UNUSED_KIND, msgpack.packb([5]), b"junk"))
    parts.append(wire(build(m.Located, 0), b"small object"))
    parts.append(wire(build(m.DataStream), bytes(70_000)))
    return b"".join(parts)


def test_byte_at_a_time_equals_one_go():
    """Feeding one byte at a time yields exactly the events of a single feed."""
    data = mixed_stream()
    whole = norm(FrameReader().feed(data))
    assert len(whole) == len(KINDS) + 4
    reader = FrameReader()
    bytewise = [ev for i in range(len(data)) for ev in reader.feed(data[i:i + 1])]
    assert norm(bytewise) == whole


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=20))
def test_random_chunks_equal_one_go(sizes):
    """Feeding in random chunk sizes yields exactly the events of a single feed."""
    data = mixed_stream()
    assert norm(feed_chunks(FrameReader(), data, sizes)) == norm(FrameReader().feed(data))


def test_get_buffer_never_spans_frames():
    """get_buffer asks for the prelude first, then exactly the header, then the payload."""
    msg = build(m.Put)
    header = encode_header(msg, 10)
    reader = FrameReader()
    assert len(reader.get_buffer()) == PRELUDE_SIZE
    assert reader.feed(header[:PRELUDE_SIZE]) == []
    assert len(reader.get_buffer()) == len(header) - PRELUDE_SIZE
    assert reader.feed(header[PRELUDE_SIZE:]) == []
    assert len(reader.get_buffer()) == 10


# --- reading ahead ------------------------------------------------------------------------

def test_reading_ahead_yields_the_events_of_exact_parts():
    """A reader that reads ahead decodes every frame (bad ones, payloads larger than its
    scratch) exactly as one reading part by part."""
    data = mixed_stream()
    assert norm(FrameReader(read_ahead=READ_AHEAD).feed(data)) == norm(FrameReader().feed(data))


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=20))
def test_reading_ahead_in_random_chunks_equals_one_go(sizes):
    data = mixed_stream()
    assert norm(feed_chunks(FrameReader(read_ahead=READ_AHEAD), data, sizes)) == norm(
        FrameReader().feed(data))


def test_one_read_takes_every_small_frame_one_frame_per_call():
    """At a frame boundary the kernel gets the scratch: one read takes several frames, handed
    out one per call so that a handler may change the sink in between."""
    msgs = [m.Ok(rid=1), build(m.Put), m.Ok(rid=3)]
    data = wire(msgs[0]) + wire(msgs[1], b"x" * 1000) + wire(msgs[2])
    reader = FrameReader(read_ahead=READ_AHEAD)
    buf = reader.get_buffer()
    assert len(buf) == READ_AHEAD > len(data)
    buf[:len(data)] = data
    events = [reader.buffer_updated(len(data))]
    while reader.pending:
        events.append(reader.resume())
    assert [norm(e) for e in events] == [norm([Frame(msgs[0])]),
                                         [("frame", msgs[1], b"x" * 1000)],
                                         norm([Frame(msgs[2])])]
    assert len(reader.get_buffer()) == READ_AHEAD


def test_a_sink_installed_on_seeing_a_frame_takes_the_next_frames_stream():
    """Bytes read ahead past a frame whose handler installs a sink: the stream after it lands
    in the sink's buffer, not in memory of the reader's."""
    dest = bytearray(100)
    msg = m.DataStream(rid=2, offset=0, size=100)
    data = wire(OK) + wire(msg, bytes(range(100)))
    reader = FrameReader(read_ahead=READ_AHEAD)
    reader.get_buffer()[:len(data)] = data
    assert reader.buffer_updated(len(data)) == [Frame(OK, None)]
    reader.expect_stream(lambda got, n: memoryview(dest))
    assert reader.resume() == [Frame(msg, None)]
    assert dest == bytes(range(100)) and not reader.pending


def test_nothing_is_read_while_bytes_read_ahead_wait():
    data = wire(OK) + wire(OK)
    reader = FrameReader(read_ahead=READ_AHEAD)
    reader.get_buffer()[:len(data)] = data
    assert reader.buffer_updated(len(data)) == [Frame(OK, None)]
    with pytest.raises(LocalProtocolError):
        reader.get_buffer()
    assert reader.resume() == [Frame(OK, None)]


def test_a_reader_with_a_sink_reads_exact_parts():
    """Where streams go to their destination (a data connection), nothing is read ahead."""
    reader = FrameReader(stream_sink=lambda msg, n: memoryview(bytearray(n)),
                         read_ahead=READ_AHEAD)
    assert len(reader.get_buffer()) == PRELUDE_SIZE


def test_a_broken_prelude_read_ahead_breaks_the_reader():
    data = wire(OK) + raw_frame(m.Ok.KIND, msgpack.packb([1]), magic=b"XX")
    reader = FrameReader(read_ahead=READ_AHEAD)
    reader.get_buffer()[:len(data)] = data
    assert reader.buffer_updated(len(data)) == [Frame(OK, None)]
    with pytest.raises(RemoteProtocolError):
        reader.resume()
    assert not reader.pending
    with pytest.raises(RemoteProtocolError):
        reader.get_buffer()


# --- request ids stamped as they are encoded -------------------------------------------------

def test_encoding_stamps_the_request_id_without_changing_the_record():
    msg = build(m.Get)
    (ev,) = FrameReader().feed(b"".join(bytes(b) for b in encode(msg, None, rid=77)))
    assert ev.msg == dataclasses.replace(msg, rid=77) and msg.rid != 77


def test_a_one_way_has_no_request_id_to_stamp():
    with pytest.raises(LocalProtocolError):
        encode(build(m.Progress), None, rid=3)


def test_a_request_whose_first_field_is_not_its_rid_is_refused():
    with pytest.raises(RuntimeError, match="starts with its rid"):
        @m.message(UNUSED_KIND, shape="request", roles=(m.CLIENT,))
        class Backwards(m.Request[m.Ok]):
            oid: ObjectID
            rid: int = 0
    assert UNUSED_KIND not in m.MESSAGES


# --- streamed payloads ------------------------------------------------------------------

def test_stream_payload_lands_in_sink_buffer():
    """A DataStream payload is written into the sink's buffer; the Frame carries no payload."""
    dest = bytearray(b"." * 100)
    calls = []

    def sink(msg, n):
        calls.append((msg, n))
        return memoryview(dest)[msg.offset:msg.offset + n]

    msg = m.DataStream(rid=4, offset=10, size=100)
    payload = bytes(range(60))
    reader = FrameReader(stream_sink=sink)
    assert reader.feed(wire(msg, payload) + wire(OK)) == [Frame(msg, None), Frame(OK, None)]
    assert calls == [(msg, 60)]
    assert dest == b"." * 10 + payload + b"." * 30


def test_stream_progress_reported():
    """streaming and payload_received track a streamed payload as it arrives."""
    dest = bytearray(1000)
    reader = FrameReader(stream_sink=lambda msg, n: memoryview(dest))
    data = wire(m.DataStream(rid=1, offset=0, size=1000), bytes([7]) * 1000)
    head = len(data) - 1000
    assert reader.feed(data[:head]) == []
    assert reader.streaming and reader.payload_received == 0
    for done in range(100, 1001, 100):
        buf = reader.get_buffer()
        assert len(buf) == 1000 - (done - 100)
        buf[:100] = data[head + done - 100:head + done]
        events = reader.buffer_updated(100)
        if done < 1000:
            assert events == [] and reader.streaming and reader.payload_received == done
            assert dest[:done] == bytes([7]) * done
    assert events == [Frame(m.DataStream(rid=1, offset=0, size=1000), None)]
    assert not reader.streaming and reader.payload_received == 0
    assert dest == bytes([7]) * 1000


def test_stream_sink_not_used_for_other_kinds():
    """Small-payload kinds keep their inline payload even when a sink is installed."""
    reader = FrameReader(stream_sink=lambda msg, n: pytest.fail("sink called"))
    msg = build(m.Put)
    (ev,) = reader.feed(wire(msg, b"abc"))
    assert bytes(ev.payload) == b"abc"


def test_stream_empty_payload_with_sink():
    """A zero-length stream completes at once with no payload."""
    reader = FrameReader(stream_sink=lambda msg, n: memoryview(bytearray(n)))
    msg = m.DataStream(rid=1, offset=5, size=5)
    assert reader.feed(wire(msg)) == [Frame(msg, None)]


def test_stream_sink_wrong_size_breaks_reader():
    """A sink buffer of the wrong size is a protocol error and breaks the reader."""
    reader = FrameReader(stream_sink=lambda msg, n: memoryview(bytearray(n + 1)))
    with pytest.raises(RemoteProtocolError):
        reader.feed(wire(m.DataStream(rid=1, offset=0, size=8), bytes(8)))
    with pytest.raises(RemoteProtocolError):
        reader.get_buffer()


# --- fatal errors: checked before allocation, reader stays broken ------------------------

OK_HEADER = msgpack.packb([1])
FATAL = {
    "header_too_large": raw_frame(m.Ok.KIND, b"", header_len=MAX_HEADER + 1),
    "header_zero": raw_frame(m.Ok.KIND, b"", header_len=0),
    "header_huge": raw_frame(m.Ok.KIND, b"", header_len=2**32 - 1),
    "bad_magic": raw_frame(m.Ok.KIND, OK_HEADER, magic=b"XX"),
    "bad_version": raw_frame(m.Ok.KIND, OK_HEADER, version=PROTOCOL_VERSION + 1),
    "version_zero": raw_frame(m.Ok.KIND, OK_HEADER, version=0),
    "payload_over_stream_limit": raw_frame(m.DataStream.KIND, b"", header_len=3,
                                           payload_len=MAX_STREAM_PAYLOAD + 1),
    "small_payload_too_large": encode_header(build(m.Put), MAX_SMALL_PAYLOAD + 1),
    "stream_without_sink_too_large": encode_header(build(m.DataStream), MAX_SMALL_PAYLOAD + 1),
    "huge_payload_on_none_kind": raw_frame(m.Ok.KIND, OK_HEADER, payload_len=MAX_SMALL_PAYLOAD + 1),
    "unknown_kind_huge_payload": raw_frame(UNUSED_KIND, OK_HEADER, payload_len=2**40),
}


@pytest.mark.parametrize("name", sorted(FATAL))
def test_fatal_prelude_breaks_reader(name):
    """Out-of-range lengths and a foreign prelude raise before any payload byte, then stick."""
    reader = FrameReader()
    before = norm(reader.feed(wire(OK)))
    assert before == [("frame", OK, None)]
    with pytest.raises(RemoteProtocolError):
        reader.feed(FATAL[name])  # no payload bytes follow: the error comes from lengths alone
    assert isinstance(reader.broken, RemoteProtocolError)
    with pytest.raises(RemoteProtocolError):
        reader.get_buffer()
    with pytest.raises(RemoteProtocolError):
        reader.feed(wire(OK))


def test_custom_small_limit():
    """max_small_payload lowers the inline limit: one byte over it is fatal."""
    msg = build(m.Put)
    assert len(FrameReader(max_small_payload=16).feed(wire(msg, bytes(16)))) == 1
    with pytest.raises(RemoteProtocolError):
        FrameReader(max_small_payload=16).feed(wire(msg, bytes(17)))


def test_huge_announced_payload_allocates_nothing():
    """A prelude announcing 2**48 bytes is refused without allocating anything near that size."""
    data = encode_header(build(m.Put), MAX_STREAM_PAYLOAD)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError):
            FrameReader().feed(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_SMALL_PAYLOAD


# --- recoverable bad frames -------------------------------------------------------------

BAD = {
    "unknown_kind": (raw_frame(UNUSED_KIND, msgpack.packb([12, "x"]), b"abc"), 12),
    "not_msgpack": (raw_frame(m.Ok.KIND, b"\xc1\xc1\xc1"), None),
    "truncated_msgpack": (raw_frame(m.Ok.KIND, b"\x92\x01"), None),
    "trailing_bytes": (raw_frame(m.Ok.KIND, msgpack.packb([3]) + b"\x00"), None),
    "ext_type": (raw_frame(m.Ok.KIND, msgpack.packb([msgpack.ExtType(5, b"x")])), None),
    "header_not_list": (raw_frame(m.Ok.KIND, msgpack.packb({"rid": 1})), None),
    "too_many_fields": (raw_frame(m.Ok.KIND, msgpack.packb([13, 14])), 13),
    "too_few_fields": (raw_frame(m.Seal.KIND, msgpack.packb([15])), 15),
    "wrong_type": (raw_frame(m.Ok.KIND, msgpack.packb(["x"])), None),
    "bool_as_int": (raw_frame(m.Ok.KIND, msgpack.packb([True])), None),
    "short_object_id": (raw_frame(m.Seal.KIND, msgpack.packb([16, b"x" * 19])), 16),
    "str_object_id": (raw_frame(m.Seal.KIND, msgpack.packb([17, "x" * 20])), 17),
    "bad_nested_record": (raw_frame(m.Join.KIND, msgpack.packb([18, ["n", "h", "p", "s", "i"]])), 18),
    "bad_list_item": (raw_frame(m.Release.KIND, msgpack.packb([[b"x" * 20, 3]])), None),
    "payload_on_none_kind": (raw_frame(m.Ok.KIND, msgpack.packb([19]), b"p" * 100_000), 19),
    "bad_header_with_payload": (raw_frame(m.Put.KIND, msgpack.packb([20]), b"q" * 10), 20),
    **{f"locate_hint_{name}": (raw_frame(m.Locate.KIND, msgpack.packb(
        [21, b"o" * 20, None, [], 0, hint], use_bin_type=True)), 21) for name, hint in [
            ("missing", None), ("unknown_tag", [9]), ("bool_tag", [True]), ("empty", []),
            ("not_a_list", 2), ("too_few_fields", [2]), ("too_many_fields", [0, 1]),
            ("wrong_type", [3, 0, 0, 4, "lo-hi"])]},
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_frame_is_skipped(name):
    """A well-delimited bad frame yields BadFrame (with its rid) and the next frame decodes."""
    data, rid = BAD[name]
    after = build(m.Put)
    for sizes in ([len(data) + 1000], [1], [7, 3, 1000]):
        reader = FrameReader()
        events = feed_chunks(reader, data + wire(after, b"next") + wire(OK), sizes)
        assert len(events) == 3, sizes
        bad, good, ok = events
        assert isinstance(bad, BadFrame) and isinstance(bad.error, RemoteProtocolError)
        assert bad.rid == rid
        assert good.msg == after and bytes(good.payload) == b"next"
        assert ok == Frame(OK, None)
        assert reader.broken is None


def _decode_one(kind: int, fields: list) -> Any:
    """The single event produced by a frame of ``kind`` whose header is ``fields``."""
    (ev,) = FrameReader().feed(raw_frame(kind, msgpack.packb(fields, use_bin_type=True)))
    return ev


@pytest.mark.parametrize("kind,cls", [(k, c) for k, c in KINDS if field_hints(c)[0][0] != "rid"],
                         ids=[c.__name__ for _, c in KINDS if field_hints(c)[0][0] != "rid"])
def test_bad_frame_rid_only_for_kinds_with_rid(kind, cls):
    """A bad frame of a kind without a rid field reports rid None (not e.g. its version)."""
    ev = _decode_one(kind, to_wire(build(cls)) + [None])  # valid fields plus one too many
    assert isinstance(ev, BadFrame) and ev.rid is None


def test_timestamp_extension_rejected():
    """msgpack's built-in timestamp extension (-1) is refused like every other extension type."""
    ev = _decode_one(m.StatusReply.KIND, [1, {"t": msgpack.Timestamp(5, 0)}])
    assert isinstance(ev, BadFrame), ev


@pytest.mark.parametrize("kind,fields", [
    (m.Error.KIND, [1, "not_found", "m", {b"k": 1}]),
    (m.StatusReply.KIND, [1, {1: "x"}]),
], ids=["error_bytes_key", "status_int_key"])
def test_dict_field_rejects_non_str_keys(kind, fields):
    """A dict[str, Any] field with a non-str key is rejected as a BadFrame."""
    assert isinstance(_decode_one(kind, fields), BadFrame)


@pytest.mark.parametrize("data", [{}, {"node": "n1", "retriable": True}, {"message": "x"},
                                  {"self": 1}])
def test_decoded_error_frame_rebuilds_typed_error(data):
    """Any Error frame the codec accepts can be re-raised as a typed HopliteError."""
    ev = _decode_one(m.Error.KIND, [1, "not_found", "gone", data])
    if isinstance(ev, Frame):
        err = error_from_wire(ev.msg.code, ev.msg.message, ev.msg.data)
        assert isinstance(err, ObjectNotFoundError) and err.message == "gone"


# --- encoder ---------------------------------------------------------------------------

def test_encode_header_refuses_payload_on_none_kind():
    """encode_header and encode refuse a payload on a kind that carries none."""
    with pytest.raises(LocalProtocolError):
        encode_header(OK, 1)
    with pytest.raises(LocalProtocolError):
        encode(OK, b"x")


@pytest.mark.parametrize("obj", [object(), {"rid": 1}, [1], build(m.MemberInfo), m.Ok])
def test_encode_header_refuses_non_messages(obj):
    """encode_header refuses objects that are not registered wire messages."""
    with pytest.raises(LocalProtocolError):
        encode_header(obj)


def test_encode_header_refuses_oversized_header():
    """A header larger than MAX_HEADER is refused at the sender."""
    msg = m.Error(rid=1, code="x", message="y" * (MAX_HEADER + 1), data={})
    with pytest.raises(LocalProtocolError):
        encode_header(msg)


def test_encode_layout():
    """encode() returns the prelude+header bytes, then the payload view; prelude fields match."""
    msg = build(m.Put)
    head, view = encode(msg, b"hello")
    assert isinstance(view, memoryview) and bytes(view) == b"hello"
    magic, version, kind, hl, pl = PRELUDE.unpack(head[:PRELUDE_SIZE])
    assert (magic, version, kind, hl, pl) == (MAGIC, PROTOCOL_VERSION, m.Put.KIND,
                                              len(head) - PRELUDE_SIZE, 5)
    assert encode(OK) == [encode_header(OK)]


# --- fuzzing ---------------------------------------------------------------------------

def _capped_sink(msg, n):
    if n > 1 << 16:
        raise RemoteProtocolError("stream too large for this test")
    return memoryview(bytearray(n))


@st.composite
def valid_frames(draw):
    """Encoded frames of random registered kinds, some with payloads."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        _, cls = draw(st.sampled_from(KINDS))
        msg = build(cls, draw(st.integers(0, 2)))
        payload = None if cls.PAYLOAD == "none" else draw(st.one_of(st.none(), st.binary(max_size=64)))
        out.append(wire(msg, payload))
    return b"".join(out)


@st.composite
def mutated(draw):
    """A valid frame stream with bit flips, truncation, insertions and length-field edits."""
    data = bytearray(draw(valid_frames()))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "length", "byte"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[i] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "length" and len(data) >= PRELUDE_SIZE:
            if draw(st.booleans()):
                value = draw(st.integers(0, 2**32 - 1) | st.integers(0, 64))
                struct.pack_into("!I", data, 4, value)
            else:
                value = draw(st.integers(0, 2**64 - 1) | st.integers(0, 64))
                struct.pack_into("!Q", data, 8, value)
    return bytes(data)


@st.composite
def noise(draw):
    """Random bytes, half the time behind a valid magic and version so they reach the header."""
    body = draw(st.binary(max_size=200))
    return (MAGIC + bytes([PROTOCOL_VERSION]) + body) if draw(st.booleans()) else body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(mutated(), noise()), sizes=st.lists(st.integers(1, 64), min_size=1, max_size=8),
       use_sink=st.booleans())
def test_fuzz_only_frames_or_protocol_error(data, sizes, use_sink):
    """Garbage and mutated frames yield only Frame/BadFrame events or a RemoteProtocolError."""
    reader = FrameReader(stream_sink=_capped_sink if use_sink else None)
    try:
        events = feed_chunks(reader, data, sizes)
    except RemoteProtocolError:
        assert reader.broken is not None
        with pytest.raises(RemoteProtocolError):
            reader.get_buffer()
        return
    for ev in events:
        assert isinstance(ev, (Frame, BadFrame))
        if isinstance(ev, BadFrame):
            assert isinstance(ev.error, ProtocolError)
            assert ev.rid is None or type(ev.rid) is int
        else:
            assert type(ev.msg).KIND in m.MESSAGES


# --- ObjectID --------------------------------------------------------------------------

def test_object_id_round_trips():
    """random(), from_hex() and hex() round trip; ids compare and hash by value."""
    for _ in range(20):
        oid = ObjectID.random()
        assert len(oid.binary()) == OBJECT_ID_SIZE and len(oid.hex()) == 2 * OBJECT_ID_SIZE
        again = ObjectID.from_hex(oid.hex())
        assert again == oid and hash(again) == hash(oid) and bytes(again) == oid.binary()
        assert ObjectID.from_hex(oid.hex().upper()) == oid
        assert oid.short() == oid.hex()[:8]
    assert ObjectID.random() != ObjectID.random()


@pytest.mark.parametrize("binary", [b"", b"x" * 19, b"x" * 21, "x" * 20, 20, None])
def test_object_id_wrong_length_or_type(binary):
    """ObjectID() refuses anything but 20 bytes."""
    with pytest.raises(InvalidArgumentError):
        ObjectID(binary)


@pytest.mark.parametrize("text", ["", "ab", "ab" * 19, "ab" * 21, "zz" * 20, "g" + "0" * 39, "0" * 39])
def test_object_id_bad_hex(text):
    """from_hex() refuses wrong lengths and non-hex text with InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError):
        ObjectID.from_hex(text)
