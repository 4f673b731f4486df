"""Typed records on the wire: a dataclass encodes as a msgpack array of its fields in order.

Decoding checks every field against the dataclass's annotations, so a well-formed msgpack
header with wrong types is rejected exactly like a malformed one.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast, dataclass_transform

from hoplite_client.wire.errors import RemoteProtocolError
from hoplite_client.wire.ids import OBJECT_ID_SIZE, ObjectID

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_HINTS: dict[type, list[tuple[str, Any]]] = {}
_C = TypeVar("_C")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def record(cls: type[_C]) -> type[_C]:
    """Make ``cls`` a frozen slotted dataclass with keyword-only fields (so a request id can
    default to 0 ahead of required fields) whose fields are checked when decoded."""
    dc = dataclasses.dataclass(frozen=True, slots=True, kw_only=True)(cls)
    hints = typing.get_type_hints(dc)
    fields = dataclasses.fields(cast("type[DataclassInstance]", dc))  # a dataclass now
    _HINTS[dc] = [(f.name, hints[f.name]) for f in fields]
    return dc


def to_wire(value: object) -> Any:
    """The msgpack-ready form of a record, an ObjectID, or a container of them."""
    if isinstance(value, ObjectID):
        return value.binary()
    if type(value) in _HINTS:
        return [to_wire(getattr(value, name)) for name, _ in _HINTS[type(value)]]
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    return value


def from_wire(cls: type[_C], raw: Any) -> _C:
    """Build a record of type ``cls`` from its decoded msgpack array, checking every field."""
    fields = _HINTS[cls]
    if not isinstance(raw, list) or len(raw) != len(fields):
        raise RemoteProtocolError(f"{cls.__name__}: expected {len(fields)} fields")
    return cls(**{name: _check(cls, name, hint, v) for (name, hint), v in zip(fields, raw)})


def _check(cls: type, name: str, hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check(cls, name, inner, value)
    if origin is list:
        (inner,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise RemoteProtocolError(f"{cls.__name__}.{name}: expected a list")
        return [_check(cls, name, inner, v) for v in value]
    if origin is dict:
        if not isinstance(value, dict) or not _plain(value):
            raise RemoteProtocolError(f"{cls.__name__}.{name}: expected a map of plain values "
                                      f"with string keys")
        return value
    if hint is ObjectID:
        if not isinstance(value, bytes) or len(value) != OBJECT_ID_SIZE:
            raise RemoteProtocolError(f"{cls.__name__}.{name}: expected a {OBJECT_ID_SIZE}-byte id")
        return ObjectID(value)
    if hint in _HINTS:
        return from_wire(hint, value)
    if hint is Any:
        if not _plain(value):
            raise RemoteProtocolError(f"{cls.__name__}.{name}: not a plain value")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise RemoteProtocolError(f"{cls.__name__}.{name}: expected int")
    if not isinstance(value, hint):
        raise RemoteProtocolError(f"{cls.__name__}.{name}: expected {hint.__name__}")
    return value


_SCALARS = (type(None), bool, int, float, str, bytes)


def _plain(value: Any, depth: int = 0) -> bool:
    """True for msgpack's plain types (maps keyed by str); msgpack decodes its timestamp
    extension itself, bypassing ``ext_hook``, so this is where such values are refused."""
    if isinstance(value, _SCALARS):
        return True
    if depth > 32:
        return False
    if isinstance(value, list):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False
