"""The runner's log lines: human (the default) or one JSON object per line
(``OMNIGENT_RUNNER_LOG_FORMAT=json``, or the server's ``OMNIGENT_LOG_FORMAT``), with the
same keys as the server's (operations.md, "Metrics and logs"): ``timestamp`` (ISO 8601),
``level``, ``logger``, ``message``, and when known ``runner_id``, ``session_id`` and
``request_id``.

``request_id`` is the id of the server request that started the turn (``turn.start``
carries it): the tunnel sets it, with the session's id, while it hands the turn to the
executor, and every task started for the turn copies that context, so all the turn's
lines carry them. Standard library only (the runner imports no Django and no logging
package of the server's).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

LOG_FORMATS = ("text", "json")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CONTEXT_KEYS = ("runner_id", "session_id", "request_id")

session_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "omnigent_runner_session_id", default=None
)
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "omnigent_runner_request_id", default=None
)


class ContextFilter(logging.Filter):
    """Puts the runner's id and the current turn's session and request ids on records."""

    def __init__(self, runner_id: str | None = None) -> None:
        super().__init__()
        self.runner_id = runner_id

    def filter(self, record: logging.LogRecord) -> bool:
        if self.runner_id and getattr(record, "runner_id", None) is None:
            record.runner_id = self.runner_id
        for key, var in (("session_id", session_id_var), ("request_id", request_id_var)):
            if getattr(record, key, None) is None:
                value = var.get()
                if value is not None:
                    setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, tz=UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in _CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(*, log_format: str = "text", runner_id: str | None = None) -> None:
    """The root handler's format and context filter (called again once the runner's id is
    known: the handler is replaced, never added twice)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT)
    )
    handler.addFilter(ContextFilter(runner_id))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)


def log_format_from(env: Any) -> str:
    """``text`` or ``json`` from the runner's variable, else the server's, else ``text``;
    anything else is returned as given for the caller to refuse."""
    for name in ("OMNIGENT_RUNNER_LOG_FORMAT", "OMNIGENT_LOG_FORMAT"):
        raw = str(env.get(name, "") or "").strip().lower()
        if raw:
            return raw
    return "text"
