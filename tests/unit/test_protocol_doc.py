"""docs/protocol.md against the code: the kind table, nested records, constants and error codes
must say exactly what ``hoplite_client.wire`` declares, and the wire layer must stay sans-IO."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from hoplite_client.wire.errors import ERRORS_BY_CODE
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import MESSAGES, WireMessage
from hoplite_client.wire.schema import field_hints, is_record

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
WIRE = ROOT / "hoplite_client" / "wire"
NONE = "—"  # what the doc writes in an empty cell

KIND_HEADER = "| kind | name | shape | reply | roles | payload | fields (wire order) | meaning |"
RECORD_HEADER = "| record | fields (wire order) | meaning |"
CONSTANT_HEADER = "| constant | value | meaning |"
ERROR_HEADER = "| code | class | meaning, and its data |"
# Modules a sans-IO codec must not pull in (h11's rule: bytes in, events out).
IO_MODULES = ("asyncio", "socket")


# --- reading the document ----------------------------------------------------------------

def table(header: str) -> list[list[str]]:
    """The rows of the table under ``header`` in docs/protocol.md, cells stripped."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    try:
        start = lines.index(header)
    except ValueError:
        pytest.fail(f"docs/protocol.md has no table with the header {header!r}")
    width = header.count("|") - 1
    rows = []
    for line in lines[start + 2:]:  # skip the header and its --- line
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == width, f"row with {len(cells)} cells, expected {width}: {line}"
        rows.append(cells)
    return rows


def unquote(cell: str) -> str:
    return cell.replace("`", "").strip()


def first_code(cell: str) -> str:
    """The first `backticked` span of a cell."""
    parts = cell.split("`")
    assert len(parts) >= 3, f"no `code` span in {cell!r}"
    return parts[1]


def fields_cell(cell: str) -> list[tuple[str, str]]:
    """'`a: int, b: list[str]`' -> [('a', 'int'), ('b', 'list[str]')]; a record of no
    fields writes the empty cell's dash."""
    text = unquote(cell)
    if not text or text == NONE:
        return []
    pairs = []
    for item in text.split(", "):
        name, sep, hint = item.partition(": ")
        assert sep, f"field {item!r} is not 'name: type'"
        pairs.append((name, hint))
    return pairs


# --- what the code declares, written the way the document writes it ----------------------

def render(hint: Any) -> str:
    """A field type as docs/protocol.md §2.2 writes it."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inners = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inners) > 1:  # a tagged value: one of these variants
            return "/".join(render(a) for a in inners)
        return render(inners[0]) + "?"
    if origin is list:
        (inner,) = typing.get_args(hint)
        return f"list[{render(inner)}]"
    if origin is dict:
        return "map"
    if hint is ObjectID:
        return "ObjectID"
    return str(hint.__name__)


def declared_fields(cls: type) -> list[tuple[str, str]]:
    return [(name, render(hint)) for name, hint in field_hints(cls)]


def declared_row(cls: type[WireMessage]) -> dict[str, Any]:
    return {"name": cls.__name__, "shape": cls.SHAPE,
            "reply": cls.REPLY.__name__ if cls.REPLY is not None else None,
            "roles": set(cls.ROLES), "payload": cls.PAYLOAD, "fields": declared_fields(cls)}


def documented_rows() -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for kind, name, shape, reply, roles, payload, fields, meaning in table(KIND_HEADER):
        assert int(kind) not in rows, f"kind {kind} documented twice"
        assert meaning, f"kind {kind} has no meaning"
        rows[int(kind)] = {
            "name": unquote(name), "shape": shape,
            "reply": None if reply == NONE else unquote(reply),
            "roles": set() if roles == NONE else {r.strip() for r in roles.split(",")},
            "payload": payload, "fields": fields_cell(fields)}
    return rows


# --- the kind table ----------------------------------------------------------------------

def test_every_kind_documented_once_in_order() -> None:
    documented = list(documented_rows())
    assert documented == sorted(documented), "rows must be sorted by kind"
    assert documented == sorted(MESSAGES), (
        f"missing from the doc: {sorted(set(MESSAGES) - set(documented))}; "
        f"not in MESSAGES: {sorted(set(documented) - set(MESSAGES))}")


@pytest.mark.parametrize("kind", sorted(MESSAGES), ids=lambda k: f"{k}-{MESSAGES[k].__name__}")
def test_kind_row_matches_declaration(kind: int) -> None:
    row = documented_rows().get(kind)
    assert row is not None, f"kind {kind} ({MESSAGES[kind].__name__}) has no row"
    assert row == declared_row(MESSAGES[kind])


def test_nested_records_match() -> None:
    used = {inner for cls in MESSAGES.values() for _, hint in field_hints(cls)
            for inner in [hint, *typing.get_args(hint)] if is_record(inner)}
    documented = {unquote(name): fields_cell(fields)
                  for name, fields, _ in table(RECORD_HEADER)}
    assert documented == {cls.__name__: declared_fields(cls) for cls in used}


def test_a_wrong_row_is_caught() -> None:
    """The comparison can fail: a row with one field renamed differs from its declaration."""
    row = documented_rows()[25]
    row["fields"] = [("rid", "int"), ("object_id", "ObjectID"), ("timeout", "float?")]
    assert row != declared_row(MESSAGES[25])


# --- constants and error codes -----------------------------------------------------------

def resolve(dotted: str) -> Any:
    """``package.module.NAME.attr`` -> its value (the longest importable prefix is the module)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise AssertionError(f"cannot resolve {dotted}")


@pytest.mark.parametrize("name,value", [(unquote(c), first_code(v))
                                        for c, v, _ in table(CONSTANT_HEADER)],
                         ids=lambda x: str(x).rsplit(".", 1)[-1])
def test_constant_value(name: str, value: str) -> None:
    assert resolve(name) == ast.literal_eval(value)


def test_error_codes_match() -> None:
    documented = {unquote(code): first_code(cls) for code, cls, _ in table(ERROR_HEADER)}
    assert documented == {code: cls.__name__ for code, cls in ERRORS_BY_CODE.items()}


# --- the wire layer does no I/O ----------------------------------------------------------

def wire_modules() -> list[str]:
    return sorted(f"hoplite_client.wire.{p.stem}" for p in WIRE.glob("*.py")
                  if p.stem != "__init__") + ["hoplite_client.wire"]


def test_wire_imports_no_io_modules() -> None:
    """Importing every wire module, in a fresh interpreter, loads neither asyncio nor socket."""
    script = (
        "import importlib, json, sys\n"
        f"io = {IO_MODULES!r}\n"
        "before = [m for m in io if m in sys.modules]\n"
        f"for name in {wire_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "after = [m for m in io if m in sys.modules]\n"
        "print(json.dumps({'before': before, 'after': after}))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    loaded = json.loads(out.stdout)
    assert loaded["before"] == [], "the bare interpreter already loads them: test is moot"
    assert loaded["after"] == []


@pytest.mark.parametrize("path", sorted(WIRE.glob("*.py")), ids=lambda p: p.name)
def test_wire_sources_never_import_io_modules(path: Path) -> None:
    """Not even inside a function (which the import check above would not see)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & set(IO_MODULES)
