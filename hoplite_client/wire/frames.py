"""Frame codec, sans I/O: bytes in, typed messages out (no asyncio, no sockets here).

Theory of operation. A frame is a 16-byte prelude ``magic, version, kind, header length,
payload length``, then a msgpack header (a :mod:`messages` record), then the raw payload.
:class:`FrameReader` is driven the way ``asyncio.BufferedProtocol`` drives a protocol:
:meth:`FrameReader.get_buffer` returns exactly the bytes still missing from the current part
(prelude, header or payload), so the kernel writes each part where it belongs and a streamed
payload lands directly in the destination buffer with no copy. A reader made with
``read_ahead`` instead offers a scratch buffer of that size at each frame boundary while no
stream sink is installed, or one installed to keep reading ahead (control connections, and a
client's connection, whose large puts stream into their extents): one read then takes every
small frame that has arrived, where exact parts take three reads per frame and a fourth to
find none left, and the parts are copied out of it (docs/design.md §2.4, "Small requests").
Such a reader hands out one frame per :meth:`FrameReader.buffer_updated` or
:meth:`FrameReader.resume` call, so that a sink installed on seeing a frame takes the next
frame's payload. Every length is checked before anything is allocated. A frame with a bad
header or an unknown kind is skipped (the lengths still delimit it) and reported as
:class:`BadFrame`; a broken prelude or an oversized length raises :class:`RemoteProtocolError`
and the reader stays broken (it cannot re-sync).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeAlias, TypeVar, cast

# msgpack ships neither inline types nor a py.typed marker, and typeshed has no stubs for it;
# its two calls here are wrapped in typed functions.
import msgpack  # type: ignore[import-untyped]

from hoplite_client.wire.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from hoplite_client.wire.messages import MESSAGES, WireMessage
from hoplite_client.wire.schema import from_wire, to_wire

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer
    from numpy.typing import NDArray

MAGIC = b"HP"
PROTOCOL_VERSION = 26
SUPPORTED_VERSIONS = [26]
PRELUDE = struct.Struct("!2sBBIQ")  # magic, version, kind, header length, payload length
PRELUDE_SIZE = PRELUDE.size
# Headers hold ids, offsets and member lists: 256 KiB fits thousands of members.
MAX_HEADER = 256 * 1024
# The header cap before a connection is authenticated, so that a stranger's frame costs a few
# KiB at most, not MAX_HEADER. The largest handshake header is an Error naming an address
# (about 110 bytes) or a Welcome (about 70); a Hello takes 27 plus the node id a tool chose
# for itself, a ClientHello 8. Over 30 times the largest leaves room for long names and
# messages (tests/unit/test_strangers.py checks the largest of each kind fits).
HANDSHAKE_MAX_HEADER = 4 * 1024
# The most object ids one frame lists. An id is 22 bytes of msgpack, so 10,000 take 220,000 of
# MAX_HEADER's 262,144 bytes and leave over 40 KB for the other fields. A reduce takes at most
# this many inputs (its Reduce and InputList list them all); a client sends its Release
# notices in batches of at most this many.
MAX_IDS_PER_FRAME = 10_000
# A stripe task names at most this many inputs already ready, each with at most this many
# holders: about 11 KB at most, within what MAX_IDS_PER_FRAME inputs leave of MAX_HEADER.
MAX_READY = 128
MAX_READY_HOLDERS = 4
# Objects of at most this size travel inline in control frames and live in their directory
# entry (docs/design.md §2): no shared memory, no data-plane transfer.
INLINE_MAX = 64 * 1024
# Small payloads: inline objects plus room to spare.
MAX_SMALL_PAYLOAD = 1024 * 1024
# A streamed payload is a whole object; the reader's sink checks it against the directory.
MAX_STREAM_PAYLOAD = 1 << 48
_SKIP_CHUNK = 64 * 1024
# The scratch a control connection's reader offers at a frame boundary: a small get, put or
# locate with a 1 KB object fits in one read; a bigger payload's rest is read in place.
READ_AHEAD = 4 * 1024

# A payload to send: any C-contiguous object with the buffer protocol. numpy arrays are named
# apart because numpy's stubs declare ``__buffer__`` only for Python >= 3.12.
Payload: TypeAlias = "ReadableBuffer | NDArray[Any]"
# Where a streamed payload goes, given its message's header and length. The message is typed
# ``Any`` on purpose: the sink's owner knows which stream kind its connection carries (only
# DataStream is streamed), and a parameter typed ``WireMessage`` would refuse such a sink.
StreamSink = Callable[[Any, int], memoryview]

M_co = TypeVar("M_co", bound=WireMessage, covariant=True)


@dataclass(frozen=True, slots=True)
class Frame(Generic[M_co]):
    """A decoded message and its payload (None when it has none, or when it was streamed)."""

    msg: M_co
    payload: memoryview | None = None


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A well-delimited frame we could not accept; ``rid`` is its request id if readable."""

    error: ProtocolError
    rid: int | None


Event: TypeAlias = Frame[WireMessage] | BadFrame


def encode_header(msg: WireMessage, payload_len: int = 0, rid: int | None = None) -> bytes:
    """Prelude and msgpack header of ``msg``; ``payload_len`` raw bytes must follow it.
    ``rid``: the request id to send in place of the record's own (a request's or reply's
    first field), so that stamping one needs no copy of the record."""
    kind: int | None = getattr(type(msg), "KIND", None)
    if kind is None:
        raise LocalProtocolError(f"{type(msg).__name__} is not a wire message")
    if payload_len and type(msg).PAYLOAD == "none":
        raise LocalProtocolError(f"{type(msg).__name__} carries no payload")
    fields = to_wire(msg)
    if rid is not None:
        if type(msg).SHAPE not in ("request", "reply"):
            raise LocalProtocolError(f"{type(msg).__name__} has no request id")
        fields[0] = rid
    header: bytes = msgpack.packb(fields, use_bin_type=True)
    if len(header) > MAX_HEADER:
        raise LocalProtocolError(f"{type(msg).__name__} header of {len(header)} bytes is too large")
    return PRELUDE.pack(MAGIC, PROTOCOL_VERSION, kind, len(header), payload_len) + header


def encode(msg: WireMessage, payload: Payload | None = None,
           rid: int | None = None) -> list[bytes | memoryview]:
    """Buffers for ``transport.writelines``: header bytes, then the payload as a memoryview
    (``rid``: as for :func:`encode_header`)."""
    if payload is None:
        return [encode_header(msg, 0, rid)]
    view = memoryview(cast("ReadableBuffer", payload)).cast("B")  # arrays too: see Payload
    return [encode_header(msg, view.nbytes, rid), view]


def _unpack_header(data: memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True, ext_hook=_no_ext)


def _no_ext(code: int, data: bytes) -> NoReturn:
    raise ValueError("msgpack extension types are not part of the protocol")


class FrameReader:
    """Incremental frame decoder fed through :meth:`get_buffer` / :meth:`buffer_updated`."""

    def __init__(self, stream_sink: StreamSink | None = None,
                 max_small_payload: int = MAX_SMALL_PAYLOAD, read_ahead: int = 0,
                 max_header: int = MAX_HEADER) -> None:
        self._sink = stream_sink
        # the longest header accepted from the next frame on: HANDSHAKE_MAX_HEADER until the
        # connection is authenticated, then raised by its owner
        self.max_header = max_header
        self._max_small = max_small_payload
        self._prelude = bytearray(PRELUDE_SIZE)
        self._part = memoryview(self._prelude)
        self._got = 0
        self._state = "prelude"
        self._kind = 0
        self._payload_len = 0
        self._msg: WireMessage | None = None
        self._bad: BadFrame | None = None
        self.broken: ProtocolError | None = None
        self._read_ahead = read_ahead
        self._ahead_with_sink = False  # go on reading ahead with a sink installed
        self._scratch: memoryview | None = None  # made at its first use (none on a data
        # connection, whose sink is installed before anything arrives)
        self._pending = memoryview(b"")  # bytes read ahead and not parsed yet
        self._into_scratch = False  # the last buffer handed out was the scratch

    def expect_stream(self, sink: StreamSink | None, read_ahead: bool = False) -> None:
        """Where streamed payloads go from the next frame on (None: read them into memory).
        A sink ends reading ahead, and the scratch goes (a data connection after its
        handshake), unless bytes read ahead still wait in it; with ``read_ahead`` a reader
        made to read ahead goes on doing so at frame boundaries (a connection that carries
        small requests too), and a stream's first bytes read ahead are copied to the sink."""
        self._sink = sink
        self._ahead_with_sink = read_ahead
        if sink is not None and not read_ahead and not self._pending:
            self._scratch = None

    @property
    def streaming(self) -> bool:
        """True while a streamed payload is arriving into the sink's buffer."""
        return self._state == "stream"

    @property
    def payload_received(self) -> int:
        """Bytes of the current payload received so far."""
        return self._got if self._state in ("stream", "payload") else 0

    @property
    def pending(self) -> bool:
        """Whether bytes read ahead wait to be parsed: call :meth:`resume` before the next
        :meth:`get_buffer`."""
        return bool(self._pending)

    def get_buffer(self) -> memoryview:
        """Where the next bytes go: the scratch at a frame boundary of a reader that reads
        ahead, with no sink installed or one that keeps reading ahead; else exactly the part
        still missing."""
        if self.broken is not None:
            raise self.broken
        if self._pending:
            raise LocalProtocolError("bytes read ahead are still pending: resume() first")
        if (self._read_ahead and self._state == "prelude" and self._got == 0
                and (self._sink is None or self._ahead_with_sink)):
            if self._scratch is None:
                self._scratch = memoryview(bytearray(self._read_ahead))
            self._into_scratch = True
            return self._scratch
        self._into_scratch = False
        return self._missing()

    def _missing(self) -> memoryview:
        """Exactly the current part's bytes still missing (a skipped payload's next chunk)."""
        if self._state == "skip":
            return self._part[: min(_SKIP_CHUNK, self._payload_len - self._got)]
        return self._part[self._got:]

    def buffer_updated(self, nbytes: int) -> list[Event]:
        """Account for ``nbytes`` written into the last buffer; return the frames completed
        (from the scratch, up to the first whole frame: :attr:`pending` says if more wait)."""
        if self._into_scratch:
            self._into_scratch = False
            assert self._scratch is not None  # handed out by get_buffer
            self._pending = self._scratch[:nbytes]
            return self.resume()
        self._got += nbytes
        events: list[Event] = []
        try:
            while self._advance(events):
                pass
        except RemoteProtocolError as exc:
            self.broken = exc
            raise
        return events

    def resume(self) -> list[Event]:
        """Parse bytes read ahead, up to and including the next whole frame (a frame's
        handler may install the sink its next frame's payload goes to)."""
        events: list[Event] = []
        try:
            while self._pending:
                if self._state == "prelude" and self._got == 0:
                    frame = self._whole_frame()
                    if frame is not None:
                        events.append(frame)
                        break
                part = self._missing()
                n = min(len(part), len(self._pending))
                part[:n] = self._pending[:n]
                self._pending = self._pending[n:]
                self._got += n
                while self._advance(events):
                    pass
                if events and isinstance(events[-1], Frame):
                    break
        except RemoteProtocolError as exc:
            self.broken = exc
            self._pending = memoryview(b"")
            raise
        return events

    def drop_pending(self) -> None:
        """Forget the bytes read ahead (their connection is closing: nothing more is read).
        They start at a frame boundary: each call parses up to a whole frame's end."""
        self._pending = memoryview(b"")

    def _whole_frame(self) -> Frame[WireMessage] | None:
        """The next frame, if the bytes read ahead hold all of it and it is well formed and
        read into memory; else None, and the part-by-part path takes it (and reports what
        is wrong with it). One step instead of three parts: the common case of a control
        connection."""
        pending = self._pending
        if len(pending) < PRELUDE_SIZE:
            return None
        magic, version, kind, header_len, payload_len = PRELUDE.unpack_from(pending)
        end = PRELUDE_SIZE + header_len + payload_len
        cls = MESSAGES.get(kind)
        if (len(pending) < end or magic != MAGIC or version not in SUPPORTED_VERSIONS
                or not 0 < header_len <= self.max_header or cls is None
                or payload_len > self._max_small or payload_len and (
                    cls.PAYLOAD == "none" or cls.PAYLOAD == "stream" and self._sink is not None)):
            return None
        try:
            msg = from_wire(cls, _unpack_header(pending[PRELUDE_SIZE:PRELUDE_SIZE + header_len]))
        except Exception:  # the part-by-part path decodes it again and says why it failed
            return None
        self._pending = pending[end:]
        if not payload_len:
            return Frame(msg, None)
        return Frame(msg, memoryview(bytearray(pending[end - payload_len:end])))

    def feed(self, data: bytes) -> list[Event]:
        """Convenience for tests and non-buffered transports: copy ``data`` in, part by part."""
        events: list[Event] = []
        view = memoryview(data)
        while view:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            events.extend(self.buffer_updated(n))
            while self._pending:
                events.extend(self.resume())
        return events

    def _advance(self, events: list[Event]) -> bool:
        """Move to the next part if the current one is complete; True if it moved."""
        state = self._state
        if state == "prelude":
            if self._got < PRELUDE_SIZE:
                return False
            self._on_prelude()
        elif state == "header":
            if self._got < len(self._part):
                return False
            self._on_header()
        elif state in ("payload", "stream"):
            if self._got < self._payload_len:
                return False
            payload = self._part if state == "payload" and self._payload_len else None
            assert self._msg is not None  # set by _on_header before these states
            events.append(Frame(self._msg, payload))
            self._reset()
        elif state == "skip":
            if self._got < self._payload_len:
                return False
            assert self._bad is not None
            events.append(self._bad)
            self._reset()
        return True

    def _reset(self) -> None:
        self._state = "prelude"
        self._part = memoryview(self._prelude)
        self._got = 0
        self._msg = None
        self._bad = None

    def _on_prelude(self) -> None:
        magic, version, kind, header_len, payload_len = PRELUDE.unpack(self._prelude)
        if magic != MAGIC:
            raise RemoteProtocolError("bad frame magic: not a hoplite peer")
        if version not in SUPPORTED_VERSIONS:
            raise RemoteProtocolError(f"unsupported frame version {version}")
        if not 0 < header_len <= self.max_header:
            raise RemoteProtocolError(f"frame header length {header_len} out of range "
                                      f"(at most {self.max_header})")
        if payload_len > MAX_STREAM_PAYLOAD:
            raise RemoteProtocolError(f"frame payload length {payload_len} out of range")
        self._kind = kind
        self._payload_len = payload_len
        self._state = "header"
        self._part = memoryview(bytearray(header_len))
        self._got = 0

    def _on_header(self) -> None:
        header = self._part
        self._got = 0
        try:
            raw = _unpack_header(header)
        except Exception as exc:  # msgpack raises many types for garbage
            self._start_skip(RemoteProtocolError(f"undecodable frame header: {exc}"), None)
            return
        cls = MESSAGES.get(self._kind)
        has_rid = cls is None or "rid" in getattr(cls, "__dataclass_fields__", {})
        rid = raw[0] if has_rid and isinstance(raw, list) and raw and type(raw[0]) is int else None
        if cls is None:
            self._start_skip(RemoteProtocolError(f"unknown message kind {self._kind}"), rid)
            return
        try:
            msg = from_wire(cls, raw)
        except RemoteProtocolError as exc:
            self._start_skip(exc, rid)
            return
        self._msg = msg
        mode = cls.PAYLOAD
        n = self._payload_len
        if mode == "stream" and self._sink is not None:
            self._part = self._sink(msg, n)
            if len(self._part) != n:
                raise RemoteProtocolError("stream sink returned a buffer of the wrong size")
            self._state = "stream"
        elif n == 0:
            self._state = "payload"
        elif mode == "none":
            self._start_skip(RemoteProtocolError(f"{cls.__name__} carries no payload"), rid)
        elif n > self._max_small:
            raise RemoteProtocolError(f"payload of {n} bytes exceeds the {self._max_small} limit")
        else:
            self._state = "payload"
            self._part = memoryview(bytearray(n))

    def _start_skip(self, error: RemoteProtocolError, rid: int | None) -> None:
        if self._payload_len > self._max_small:
            raise error
        self._bad = BadFrame(error, rid)
        self._state = "skip"
        self._part = memoryview(bytearray(min(_SKIP_CHUNK, max(self._payload_len, 1))))
        self._got = 0
