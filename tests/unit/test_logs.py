"""The daemon's JSON log lines (hoplited/logs.py): one parseable object per record."""

from __future__ import annotations

import json
import logging

import pytest

from hoplited.logs import JsonFormatter, log_to_stderr


def record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    info = None if exc is None else (type(exc), exc, None)
    return logging.LogRecord("hoplited.test", logging.WARNING, __file__, 1, msg, args, info)


@pytest.mark.parametrize("msg, args, message", [
    ("plain", (), "plain"),
    ("node %s at %d", ("n1", 42), "node n1 at 42"),
    ("two\nlines \"quoted\"", (), "two\nlines \"quoted\""),
    ("unicode → ok", (), "unicode → ok"),
])
def test_each_record_is_one_json_line(msg: str, args: tuple[object, ...], message: str) -> None:
    line = JsonFormatter().format(record(msg, *args))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == message
    assert entry["level"] == "warning" and entry["logger"] == "hoplited.test"
    assert entry["time"].endswith("+00:00") and isinstance(entry["pid"], int)
    assert "exc" not in entry


def test_an_exception_is_named_not_dumped() -> None:
    entry = json.loads(JsonFormatter().format(record("failed", exc=ValueError("bad size"))))
    assert entry["exc"] == "ValueError: bad size"


def test_unknown_format_refused() -> None:
    with pytest.raises(ValueError, match="log format"):
        log_to_stderr("info", "xml")
