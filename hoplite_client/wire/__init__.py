"""The wire protocol: frame codec, message records and handshake proofs (no I/O here)."""

from hoplite_client.wire import messages
from hoplite_client.wire.frames import BadFrame, Frame, FrameReader, encode, encode_header

__all__ = ["BadFrame", "Frame", "FrameReader", "encode", "encode_header", "messages"]
