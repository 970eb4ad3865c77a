"""``GET /metrics`` (operations.md, "Metrics and logs"): off by default, protected by a
token when one is set, the project's figures in the Prometheus text format; the
request id every response carries; 503 when the database is down."""

from __future__ import annotations

import re

import pytest
from django.db import OperationalError
from django.test import override_settings
from rest_framework.test import APIClient

from omnigent_site import metrics
from omnigent_site.errors import exception_handler
from omnigent_site.observability import REQUEST_ID_HEADER

from .conftest import ALICE, assert_error

pytestmark = pytest.mark.django_db


def sample(text: str, name: str, **labels: str) -> float:
    """The value of ``name{labels}`` in a Prometheus text body (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_off_by_default_is_a_404_in_the_error_format() -> None:
    assert_error(APIClient().get("/metrics"), 404, "not_found")


@override_settings(OMNIGENT_METRICS=True, OMNIGENT_METRICS_TOKEN="")
def test_on_counts_requests_by_route_and_status(client_for) -> None:
    before = sample(
        APIClient().get("/metrics").content.decode(),
        "omnigent_http_requests_total",
        route="/v1/me",
        status="200",
    )
    assert client_for(ALICE).get("/v1/me").status_code == 200
    response = APIClient().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    after = sample(text, "omnigent_http_requests_total", route="/v1/me", status="200")
    assert after == before + 1
    assert sample(text, "omnigent_http_request_duration_seconds_count", route="/v1/me") >= 1
    for name in (
        "omnigent_open_streams",
        "omnigent_connected_runners",
        "omnigent_queued_turns",
        "omnigent_turns_started_total",
        "omnigent_turn_duration_seconds",
        "omnigent_runner_event_lag_seconds",
        "omnigent_relay_duration_seconds",
        "omnigent_llm_tokens_total",
        "omnigent_llm_cost_usd_total",
        "omnigent_webhook_deliveries_total",
        "omnigent_backend_errors_total",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name


@override_settings(OMNIGENT_METRICS=True, OMNIGENT_METRICS_TOKEN="s3cret-metrics")
def test_a_token_protects_the_endpoint() -> None:
    error = assert_error(APIClient().get("/metrics"), 401, "unauthorized")
    assert "s3cret" not in error["message"]
    wrong = APIClient(HTTP_AUTHORIZATION="Bearer nope")
    assert_error(wrong.get("/metrics"), 401, "unauthorized")
    right = APIClient(HTTP_AUTHORIZATION="Bearer s3cret-metrics")
    assert right.get("/metrics").status_code == 200
    assert_error(right.post("/metrics"), 405, "method_not_allowed")


@override_settings(OMNIGENT_METRICS=True, OMNIGENT_METRICS_TOKEN="")
def test_queued_turns_are_read_from_the_database(create_session, client_for) -> None:
    from sessions.models import Session, Turn

    session_id = create_session(ALICE)
    Turn.objects.create(session=Session.objects.get(pk=session_id))
    text = APIClient().get("/metrics").content.decode()
    assert sample(text, "omnigent_queued_turns") == Turn.objects.filter(status="queued").count()


def test_every_response_carries_a_request_id(client_for) -> None:
    generated = client_for(ALICE).get("/v1/me")[REQUEST_ID_HEADER]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    kept = client_for(ALICE).get("/v1/me", HTTP_X_REQUEST_ID="req-abc.123")
    assert kept[REQUEST_ID_HEADER] == "req-abc.123"
    # A value that is not a plain token is replaced, never echoed.
    odd = client_for(ALICE).get("/v1/me", HTTP_X_REQUEST_ID="<script>")
    assert re.fullmatch(r"[0-9a-f]{32}", odd[REQUEST_ID_HEADER])
    assert re.fullmatch(r"[0-9a-f]{32}", APIClient().get("/nowhere")[REQUEST_ID_HEADER])


def test_a_database_outage_is_a_503_not_a_500() -> None:
    before = metrics.BACKEND_ERRORS.labels(backend="database")._value.get()
    response = exception_handler(OperationalError("connection refused"), {"view": None})
    assert response.status_code == 503
    assert response.data["error"]["code"] == "service_unavailable"
    assert "database" in response.data["error"]["message"]
    assert response["Retry-After"] == "5"
    assert metrics.BACKEND_ERRORS.labels(backend="database")._value.get() == before + 1


@override_settings(OMNIGENT_METRICS=True, OMNIGENT_METRICS_TOKEN="")
def test_llm_calls_are_counted_once_stored(
    create_session, django_capture_on_commit_callbacks
) -> None:
    from omnigent_site.users import get_or_create_user
    from usage import services as usage_services

    usage_services.prices.clear()
    session_id = create_session(ALICE)
    alice = get_or_create_user(ALICE)
    text = APIClient().get("/metrics").content.decode()
    before = {
        kind: sample(text, "omnigent_llm_tokens_total", model="gpt-4o", kind=kind)
        for kind in ("input", "output")
    }
    cost_before = sample(text, "omnigent_llm_cost_usd_total", model="gpt-4o")
    calls = [
        usage_services.price_call(
            response_id="resp_1",
            usage=usage_services.CallUsage(model="gpt-4o", input_tokens=1000, output_tokens=200),
        ),
        usage_services.price_call(
            response_id="resp_1",
            usage=usage_services.CallUsage(model="gpt-4o", input_tokens=3000, output_tokens=50),
        ),
    ]
    with django_capture_on_commit_callbacks(execute=True):
        usage_services.record_calls(
            session_id=session_id, user_id=alice.pk, agent_name="file-helper", calls=calls
        )
    text = APIClient().get("/metrics").content.decode()
    assert sample(text, "omnigent_llm_tokens_total", model="gpt-4o", kind="input") == (
        before["input"] + 4000
    )
    assert sample(text, "omnigent_llm_tokens_total", model="gpt-4o", kind="output") == (
        before["output"] + 250
    )
    # 4,000 input tokens at $2.50 and 250 output tokens at $10 per million.
    cost = sample(text, "omnigent_llm_cost_usd_total", model="gpt-4o") - cost_before
    assert cost == pytest.approx(0.0125)
