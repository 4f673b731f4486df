"""The daemon's log lines: plain text for people, or one JSON object per line for collectors.

``hoplited --log-format json`` writes records a log pipeline (Loki, Elasticsearch, journald's
JSON export) can index without parsing prose: time (ISO 8601, UTC), level, logger, message,
the process id, and ``exc`` (the exception's type and message) when a record carries one.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside strings are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": os.getpid(),
        }
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            entry["exc"] = f"{type(exc).__name__}: {exc}"
        return json.dumps(entry, ensure_ascii=False)


def log_to_stderr(level: str, fmt: str = "text") -> None:
    """Send every logger's records at ``level`` and above to stderr, as ``fmt`` (text, json)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
