"""Typed records on the wire: a dataclass encodes as a msgpack array of its fields in order.

Decoding checks every field against the dataclass's annotations, so a well-formed msgpack
header with wrong types is rejected exactly like a malformed one. A *variant* is a record
with a tag, which its array starts with: a field typed as a union of variants holds any one
of them, and its tag says which.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast, dataclass_transform

from hoplite_client.wire.errors import RemoteProtocolError
from hoplite_client.wire.ids import OBJECT_ID_SIZE, ObjectID

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Every record, with its tag (None but for a variant).
_RECORDS: dict[type, int | None] = {}
# Each record's fields and their types, resolved on first use: resolving every record's
# annotations at import would cost each process about 70 ms of CPU at start.
_HINTS: dict[type, list[tuple[str, Any]]] = {}
_C = TypeVar("_C")
_Check = Callable[[Any], Any]
# Each record's tag (None but for a variant) and fields with their checkers, made on first
# decode of its kind: walking the annotations with typing.get_origin for every field of every
# message would make a decode twice as dear (docs/design.md §2.1).
_CHECKS: dict[type, tuple[int | None, list[tuple[str, _Check]]]] = {}
# Fields whose values are msgpack-ready as they are (scalars, optional or not) encode as is.
_PLAIN_HINTS = frozenset({int, str, bytes, bool, float, int | None, str | None, bytes | None,
                          bool | None, float | None})
# Per record, made on its first encode: all its field values at once (one C call), and the
# positions of the fields that need converting (ids, nested records, lists of them), and a
# variant's tag.
_Encoding = tuple[Callable[[Any], Any], list[int], int | None]
_ENCODED: dict[type, _Encoding] = {}


@dataclass_transform(frozen_default=True, kw_only_default=True)
def record(cls: type[_C]) -> type[_C]:
    """Make ``cls`` a frozen slotted dataclass with keyword-only fields (so a request id can
    default to 0 ahead of required fields) whose fields are checked when decoded."""
    dc = dataclasses.dataclass(frozen=True, slots=True, kw_only=True)(cls)
    _RECORDS[dc] = None
    return dc


@dataclass_transform(frozen_default=True, kw_only_default=True)
def variant(tag: int) -> Callable[[type[_C]], type[_C]]:
    """Make a class a :func:`record` whose wire form starts with ``tag``: one of the variants
    a field typed as their union may hold."""

    def wrap(cls: type[_C]) -> type[_C]:
        rec = record(cls)
        _RECORDS[rec] = tag
        return rec

    return wrap


def is_record(cls: object) -> bool:
    """Whether ``cls`` is a :func:`record` (a variant included)."""
    return cls in _RECORDS


def field_hints(cls: type) -> list[tuple[str, Any]]:
    """The fields of record ``cls`` in order, each with its type."""
    hints = _HINTS.get(cls)
    if hints is None:
        resolved = typing.get_type_hints(cls)
        fields = dataclasses.fields(cast("type[DataclassInstance]", cls))
        hints = _HINTS[cls] = [(f.name, resolved[f.name]) for f in fields]
    return hints


def _encoding(cls: type) -> _Encoding:
    """How to encode a record of type ``cls``, made once."""
    hints = field_hints(cls)
    names = [name for name, _ in hints]
    getter = operator.attrgetter(*names) if len(names) > 1 else (
        lambda value: tuple(getattr(value, name) for name in names))
    encoded = _ENCODED[cls] = (getter, [i for i, (_, hint) in enumerate(hints)
                                        if hint not in _PLAIN_HINTS], _RECORDS[cls])
    return encoded


def to_wire(value: object) -> Any:
    """The msgpack-ready form of a record, an ObjectID, or a container of them."""
    if isinstance(value, ObjectID):
        return value.binary()
    cls = type(value)
    encoded = _ENCODED.get(cls)
    if encoded is None and cls in _RECORDS:
        encoded = _encoding(cls)
    if encoded is not None:
        getter, convert, tag = encoded
        fields = list(getter(value))
        for i in convert:
            fields[i] = to_wire(fields[i])
        return fields if tag is None else [tag, *fields]
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    return value


def from_wire(cls: type[_C], raw: Any) -> _C:
    """Build a record of type ``cls`` from its decoded msgpack array, checking every field."""
    checks = _CHECKS.get(cls)
    if checks is None:
        checks = _CHECKS[cls] = (_RECORDS.get(cls), [(name, _checker(cls, name, hint))
                                                     for name, hint in field_hints(cls)])
    tag, fields = checks
    if tag is not None:
        if not isinstance(raw, list) or not raw or type(raw[0]) is not int or raw[0] != tag:
            raise RemoteProtocolError(f"{cls.__name__}: expected its tag {tag} first")
        raw = raw[1:]
    if not isinstance(raw, list) or len(raw) != len(fields):
        raise RemoteProtocolError(f"{cls.__name__}: expected {len(fields)} fields")
    return cls(**{name: check(v) for (name, check), v in zip(fields, raw)})


def _checker(cls: type, name: str, hint: Any) -> _Check:
    """The check of field ``name`` of ``cls`` against ``hint``: returns the field's value
    (an ObjectID, a nested record, a float from an int) or raises RemoteProtocolError."""
    where = f"{cls.__name__}.{name}"
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        inners = [a for a in args if a is not type(None)]
        check = (_checker(cls, name, inners[0]) if len(inners) == 1
                 else _tagged(where, inners))
        if type(None) not in args:
            return check
        return lambda value: None if value is None else check(value)
    if origin is list:
        (inner,) = typing.get_args(hint)
        item = _checker(cls, name, inner)

        def many(value: Any) -> list[Any]:
            if not isinstance(value, list):
                raise RemoteProtocolError(f"{where}: expected a list")
            return [item(v) for v in value]
        return many
    if origin is dict:
        def mapping(value: Any) -> Any:
            if not isinstance(value, dict) or not _plain(value):
                raise RemoteProtocolError(f"{where}: expected a map of plain values "
                                          f"with string keys")
            return value
        return mapping
    if hint is ObjectID:
        def object_id(value: Any) -> ObjectID:
            if not isinstance(value, bytes) or len(value) != OBJECT_ID_SIZE:
                raise RemoteProtocolError(f"{where}: expected a {OBJECT_ID_SIZE}-byte id")
            return ObjectID(value)
        return object_id
    if hint in _RECORDS:
        return lambda value: from_wire(hint, value)
    if hint is Any:
        def plain(value: Any) -> Any:
            if not _plain(value):
                raise RemoteProtocolError(f"{where}: not a plain value")
            return value
        return plain
    if hint is float:
        def real(value: Any) -> float:
            if isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            if not isinstance(value, float):
                raise RemoteProtocolError(f"{where}: expected float")
            return value
        return real
    if hint is int:
        def integer(value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise RemoteProtocolError(f"{where}: expected int")
            return value
        return integer

    def instance(value: Any) -> Any:
        if not isinstance(value, hint):
            raise RemoteProtocolError(f"{where}: expected {hint.__name__}")
        return value
    return instance


def _tagged(where: str, variants: list[Any]) -> _Check:
    """The check of a field holding one of ``variants`` (each a :func:`variant`): its tag
    picks the variant its fields are checked as."""
    by_tag: dict[int, Any] = {}
    for v in variants:
        tag = _RECORDS.get(v)
        if tag is None:
            raise TypeError(f"{where}: a union of several types must be of variants only")
        by_tag[tag] = v
    if len(by_tag) != len(variants):
        raise TypeError(f"{where}: two variants share a tag")

    def tagged(value: Any) -> Any:
        head = value[0] if isinstance(value, list) and value else None
        chosen = by_tag.get(head) if type(head) is int else None
        if chosen is None:
            raise RemoteProtocolError(f"{where}: expected a tagged value, tag one of "
                                      f"{sorted(by_tag)}")
        return from_wire(chosen, value)
    return tagged


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
