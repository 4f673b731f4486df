"""The packages import one way: the daemon may use the client's wire and net layers, never the
reverse, so an application that installs the SDK loads nothing of the daemon."""

from __future__ import annotations

import ast
from pathlib import Path

import hoplite_client


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_client_sdk_never_imports_the_daemon() -> None:
    sdk = Path(hoplite_client.__file__).parent
    upward = {str(p.relative_to(sdk.parent)): sorted(m for m in imported_modules(p)
                                                     if m.split(".")[0] == "hoplited")
              for p in sdk.rglob("*.py")}
    assert {path: mods for path, mods in upward.items() if mods} == {}
