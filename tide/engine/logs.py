"""``tide engine``'s logs: one JSON object per line on stderr.

A record that carries a ``tide`` dict (the service's decision and round records) has its
fields merged into the line; any other record's message goes in ``message``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and a record's ``tide`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
        }
        fields = getattr(record, "tide", None)
        if isinstance(fields, dict):
            line.update(fields)
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time of each record."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


@contextmanager
def json_logging(level: int = logging.INFO) -> Iterator[None]:
    """While inside, the root logger writes JSON lines to stderr at ``level``.

    The engine is the application here, so it owns the root logger: the plain handler the
    ``tide`` command installed is swapped out, and put back on the way out.
    """
    root = logging.getLogger()
    plain = [h for h in root.handlers if type(h) is logging.StreamHandler]
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter())
    previous = root.level
    for h in plain:
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for h in plain:
            root.addHandler(h)
        root.setLevel(previous)
