"""Helpers shared by the API tests: error-shape checks, uploads, stored-file listing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from omnigent_runner import protocol
from sessions import approvals
from sessions.models import Agent, Approval, Item, Permission, Session, Turn

ALICE = "alice@example.com"
BOB = "bob@example.com"
CAROL = "carol@example.com"
DAVE = "dave@example.com"


def assert_error(response: Any, status: int, code: str, *, mentions: str | None = None) -> dict:
    """The response is ``status`` with exactly ``{"error": {"code", "message", ...}}``."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert list(body) == ["error"], body
    error = body["error"]
    assert error["code"] == code, body
    assert isinstance(error["message"], str) and error["message"], body
    assert set(error) <= {"code", "message", "fields"}, body
    if mentions is not None:
        assert mentions.lower() in error["message"].lower(), body
    return error


def upload(data: bytes, name: str = "bundle.tar.gz") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="application/gzip")


def stored_files() -> list[Path]:
    """Every regular file under ``settings.DATA_DIR`` (bundles and temporary uploads)."""
    root = Path(settings.DATA_DIR)
    return sorted(path for path in root.rglob("*") if path.is_file()) if root.exists() else []


def assert_nothing_written() -> None:
    assert Session.objects.count() == 0
    assert Agent.objects.count() == 0
    assert Item.objects.count() == 0
    assert Permission.objects.count() == 0
    assert stored_files() == []


@pytest.fixture
def create_session(
    client_for: Callable[[str | None], APIClient], make_bundle: Callable[..., bytes]
) -> Callable[..., str]:
    """Create a session through the multipart API as ``owner`` and return its id."""

    def make(owner: str = ALICE, *, name: str = "file-helper", **metadata: Any) -> str:
        response = client_for(owner).post(
            "/v1/sessions",
            {"metadata": json.dumps(metadata), "bundle": upload(make_bundle(name))},
            format="multipart",
        )
        assert response.status_code == 201, response.content
        return response.json()["session_id"]

    return make


@pytest.fixture
def grant(client_for: Callable[[str | None], APIClient]) -> Callable[[str, str, int], None]:
    """Give ``user`` ``level`` on a session of ALICE's, through the API."""

    def give(session_id: str, user: str, level: int, *, by: str = ALICE) -> None:
        response = client_for(by).put(
            f"/v1/sessions/{session_id}/permissions",
            {"user_id": user, "level": level},
            format="json",
        )
        assert response.status_code == 200, response.content

    return give


def ask(session_id: str, *, turn: Turn, call_id: str = "call_1") -> Approval:
    """A question as the runner's ``approval.requested`` leaves it (the service it calls)."""
    event = protocol.ApprovalRequested(
        response_id=turn.id,
        call_id=call_id,
        tool="sys_os_shell",
        arguments={"command": "make"},
        policy_name="ask-shell",
        reason="shell needs a yes",
        ask_timeout=600.0,
    )
    session = Session.objects.get(pk=session_id)
    return approvals.record_requested(session=session, turn=turn, event=event).approval


@pytest.fixture
def webhook_subscriber() -> Any:
    """An enabled webhook taking every event type: without one, no event is written to
    the outbox (nobody would receive it), so tests that read the outbox need it."""
    from omnigent_site.users import get_or_create_user
    from webhooks.models import Webhook

    return Webhook.objects.create(
        id="wh_subscriber",
        owner=get_or_create_user("subscriber@example.com"),
        url="https://hooks.example.com/all",
        events=["*"],
        secret="whsec_dGVzdA==",
    )
