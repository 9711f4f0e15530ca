"""Structured log lines: one event per line, as logfmt (`key=value`) or JSON.

Code logs an event name plus fields with `event(log, "connection closed", peer=...)`;
the formatter chosen at start (`--log-format`) renders them, so a field never has
to be parsed back out of a sentence. Errors too: `event(log, "spilling failed",
logging.ERROR, exc_info=True, app=...)` adds the traceback as `exc`. Records from
elsewhere (other libraries' warnings) keep their message as `msg`.

Every module logs to `logging.getLogger(__name__)`, so `logger=` names the module
(`shuffled.server.daemon`, `shuffled.server.storage.spill`, ...).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_FIELDS = "shuffled_fields"


def event(
    logger: logging.Logger, name: str, level: int = logging.INFO, /, *, exc_info: bool = False, **fields: Any
) -> None:
    """Log one event with structured fields (cheap when the level is off); `exc_info` adds the
    exception being handled, as `log.exception` would."""
    if logger.isEnabledFor(level):
        logger.log(level, name, exc_info=exc_info, stacklevel=2, extra={_FIELDS: fields})


def _quote(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    if any(c in text for c in ' "=\n\t\\'):
        return json.dumps(text)
    return text


class KeyValueFormatter(logging.Formatter):
    """`ts=… level=… logger=… msg=<event> key=value …` (values with spaces quoted)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + "Z"
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} msg={_quote(record.getMessage())}"
        for key, value in getattr(record, _FIELDS, {}).items():
            line += f" {key}={_quote(value)}"
        if record.exc_info:
            line += " exc=" + _quote(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in getattr(record, _FIELDS, {}).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(level: str, fmt: str = "kv") -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter() if fmt == "json" else KeyValueFormatter()
    formatter.converter = time.gmtime  # timestamps in UTC, as the trailing Z in JSON says
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
