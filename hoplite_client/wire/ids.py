"""Object identifiers: 20 bytes, random (unguessable) by default, or chosen by the application."""

from __future__ import annotations

import os

from hoplite_client.wire.errors import InvalidArgumentError

OBJECT_ID_SIZE = 20  # bytes, as in Ray/Hoplite: 160 random bits make collisions negligible


class ObjectID:
    """An immutable 20-byte object name; hashable, ordered, printable as hex."""

    __slots__ = ("_b",)

    def __init__(self, binary: bytes) -> None:
        if not isinstance(binary, (bytes, bytearray, memoryview)) or len(binary) != OBJECT_ID_SIZE:
            raise InvalidArgumentError(f"an ObjectID is {OBJECT_ID_SIZE} bytes")
        self._b = bytes(binary)

    @classmethod
    def random(cls) -> ObjectID:
        """A fresh id from the OS's CSPRNG."""
        return cls(os.urandom(OBJECT_ID_SIZE))

    @classmethod
    def from_hex(cls, text: str) -> ObjectID:
        """Parse the 40-hex-digit form produced by :meth:`hex`."""
        try:
            return cls(bytes.fromhex(text))
        except ValueError as exc:
            raise InvalidArgumentError(f"not a hex ObjectID: {text!r}") from exc

    def binary(self) -> bytes:
        return self._b

    def hex(self) -> str:
        return self._b.hex()

    def __bytes__(self) -> bytes:
        return self._b

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectID) and other._b == self._b

    def __lt__(self, other: ObjectID) -> bool:
        return self._b < other._b

    def __hash__(self) -> int:
        return hash(self._b)

    def __repr__(self) -> str:
        return f"ObjectID({self.hex()})"

    def short(self) -> str:
        """The first 8 hex digits, for log lines."""
        return self._b[:4].hex()
