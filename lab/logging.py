"""Structured logging: one JSON object per line, carrying the current request id."""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import datetime, timezone

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

_STANDARD_ATTRIBUTES = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Attach the id of the request being served (or None) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def _is_client_error(record: logging.LogRecord) -> bool:
    """Whether ``record`` is Django's note of a 4xx answer (its ``status_code`` extra)."""
    status_code = getattr(record, "status_code", None)
    return isinstance(status_code, int) and 400 <= status_code < 500


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line: time, level, logger, message, request id, extras.

    The traceback is kept for everything but a refused request (4xx): Django logs the exception
    behind a 403 (PermissionDenied) or a 400 (a SuspiciousOperation such as a foreign Host header)
    with it, and there it is the client's doing, not a fault to debug, so the line stays one line.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info and not _is_client_error(record):
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
