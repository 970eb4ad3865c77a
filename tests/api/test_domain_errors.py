"""The one HTTP mapping of the project's own errors (omnigent_site.domain_errors)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIRequestFactory

from omnigent_site import domain_errors
from omnigent_site.errors import exception_handler

CASES = [
    (domain_errors.InvalidInput("must be 1, 2 or 3", field="level"), 400, "invalid_input"),
    (domain_errors.InvalidInput("bad"), 400, "invalid_input"),
    (domain_errors.NotFound("session 'x' not found"), 404, "not_found"),
    (domain_errors.Forbidden("needs edit access"), 403, "forbidden"),
    (domain_errors.Conflict("already exists"), 409, "conflict"),
    (domain_errors.BudgetExceeded("budget spent"), 409, "budget_exceeded"),
    (
        domain_errors.DailyBudgetExceeded("daily budget spent", retry_after=60),
        429,
        "budget_exceeded",
    ),
    (domain_errors.PayloadTooLarge("too big"), 413, "payload_too_large"),
    (domain_errors.UnsupportedMediaType("not a PNG"), 415, "unsupported_media_type"),
    (domain_errors.RunnerUnavailable("offline"), 503, "runner_unavailable"),
    (domain_errors.AgentUnavailable("bundle missing"), 500, "internal_error"),
]


@pytest.mark.parametrize(("error", "status", "code"), CASES)
def test_each_domain_error_renders_in_the_error_format(
    error: domain_errors.DomainError, status: int, code: str
) -> None:
    request = APIRequestFactory().get("/v1/sessions")
    response = exception_handler(error, {"view": None, "request": request})
    assert response.status_code == status
    retry_after = getattr(error, "retry_after", None)
    assert response.get("Retry-After") == (None if retry_after is None else str(retry_after))
    body = response.data["error"]
    assert body["code"] == code
    if error.field:
        assert body["message"] == f"{error.field}: {error.message}"
        assert body["fields"] == {error.field: [error.message]}
    else:
        assert body == {"code": code, "message": error.message}


def test_every_domain_error_is_covered() -> None:
    defined = {
        cls
        for cls in vars(domain_errors).values()
        if isinstance(cls, type)
        and issubclass(cls, domain_errors.DomainError)
        and cls is not domain_errors.DomainError
    }
    assert defined == {type(error) for error, _, _ in CASES}
