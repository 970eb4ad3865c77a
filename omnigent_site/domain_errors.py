"""The project's own errors: what services raise, wherever they are called from.

A service is called by DRF views, async views, the tunnel consumer and management
commands alike, so it raises these rather than DRF's HTTP exceptions. Each error names
its error-format ``code`` and the HTTP status that goes with it; the one HTTP mapping is
``omnigent_site.errors.exception_handler``. Django-free, like the codes it carries.
"""

from __future__ import annotations

from typing import ClassVar


class DomainError(Exception):
    """A refusal with a message meant for the caller (never a secret, never a trace)."""

    code: ClassVar[str] = "invalid_input"
    http_status: ClassVar[int] = 400

    def __init__(
        self, message: str, *, field: str | None = None, fields: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        # Several fields, each with its own message (``{"rules.0.action": "..."}``).
        self.fields = fields

    @property
    def public_message(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidInput(DomainError):
    """The request's content is wrong (``field`` names where, when it is known)."""


class NotFound(DomainError):
    code = "not_found"
    http_status = 404


class Forbidden(DomainError):
    code = "forbidden"
    http_status = 403


class Conflict(DomainError):
    code = "conflict"
    http_status = 409


class BudgetExceeded(DomainError):
    """A message the session's spent budget refuses (usage.md, Budgets)."""

    code = "budget_exceeded"
    http_status = 409


class DailyBudgetExceeded(BudgetExceeded):
    """A message refused because the user's daily budget is spent; ``retry_after``:
    seconds until the next UTC day, sent as ``Retry-After``."""

    http_status = 429

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PayloadTooLarge(DomainError):
    code = "payload_too_large"
    http_status = 413


class UnsupportedMediaType(DomainError):
    """The content is of a type this endpoint does not take (an uploaded file's bytes)."""

    code = "unsupported_media_type"
    http_status = 415


class RunnerUnavailable(DomainError):
    """No live runner took the command: none bound, offline, or it did not answer."""

    code = "runner_unavailable"
    http_status = 503


class AgentUnavailable(DomainError):
    """The session's agent bundle is missing on this server (a deployment fault)."""

    code = "internal_error"
    http_status = 500
