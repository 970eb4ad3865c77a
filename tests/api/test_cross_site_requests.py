"""What a page on another site can make a browser send, with the identity the browser
carries anyway (the proxy's header, or local single-user mode): refused before anything
is stored (security.md, "Requests from other sites").

- a state change whose body is not JSON (an HTML form, ``text/plain``) is 415, except a
  multipart body on the documented upload endpoints;
- a state change the browser marks as coming from another site (``Origin``,
  ``Sec-Fetch-Site``) is 403, uploads included; the compatible clients'
  ``Origin: omnigent://internal`` and clients that send neither header pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from omnigent_runner import protocol
from omnigent_site.users import get_or_create_user
from runners.models import Runner
from sessions import approvals
from sessions.models import Agent, Approval, Session, SessionEvent, SessionFile, Turn

from .conftest import ALICE, assert_error, upload
from .workspace_fakes import FakeWorkspaceRunner, relaying_to

pytestmark = pytest.mark.django_db

FORM = "application/x-www-form-urlencoded"
MULTIPART_BOUNDARY = "forged"


def multipart(fields: dict[str, str]) -> bytes:
    """A multipart body as an HTML form with ``enctype="multipart/form-data"`` sends it."""
    parts = [
        f'--{MULTIPART_BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
        f"{value}\r\n"
        for name, value in fields.items()
    ]
    return ("".join(parts) + f"--{MULTIPART_BOUNDARY}--\r\n").encode()


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[FakeWorkspaceRunner]:
    root = tmp_path / "ws"
    root.mkdir()
    with relaying_to(FakeWorkspaceRunner(root)) as fake:
        yield fake


@pytest.fixture
def bound_session(create_session: Callable[..., str]) -> str:
    """ALICE's session, bound to an online runner of hers, with an open question."""
    session_id = create_session(ALICE, title="before")
    now = timezone.now()
    runner = Runner.objects.create(
        id="runner_token_forms",
        owner=get_or_create_user(ALICE),
        channel_name="specific.forms!1",
        connected_at=now,
        last_seen_at=now,
    )
    session = Session.objects.get(pk=session_id)
    Session.objects.filter(pk=session_id).update(runner=runner)
    turn = Turn.objects.create(session=session, status=Turn.Status.IN_PROGRESS)
    approvals.record_requested(
        session=session,
        turn=turn,
        event=protocol.ApprovalRequested(
            response_id=turn.id,
            call_id="call_1",
            tool="sys_os_shell",
            arguments={"command": "ls"},
            policy_name="ask-shell",
            reason="shell needs a yes",
            ask_timeout=600.0,
        ),
    )
    return session_id


def forged_requests(session_id: str) -> list[tuple[str, str, dict[str, str]]]:
    """The state changes of the probe: (method, path, the form's fields)."""
    eid = Approval.objects.get(session_id=session_id).id
    base = f"/v1/sessions/{session_id}"
    return [
        ("patch", base, {"title": "forged"}),
        ("post", "/v1/runners", {"name": "forged"}),
        ("post", f"{base}/elicitations/{eid}/resolve", {"action": "accept"}),
        ("post", f"{base}/events", {"type": "interrupt"}),
        ("put", f"{base}/resources/environments/default/filesystem/x.txt", {"content": "forged"}),
        ("post", f"{base}/fork", {"title": "forged"}),
        ("put", f"{base}/permissions", {"user_id": "mallory@example.com", "level": "3"}),
    ]


def state_of(session_id: str, workspace: FakeWorkspaceRunner) -> dict[str, Any]:
    """Everything a forged request above would change."""
    session = Session.objects.get(pk=session_id)
    return {
        "title": session.title,
        "sessions": Session.objects.count(),
        "runners": Runner.objects.count(),
        "events": SessionEvent.objects.filter(session=session).count(),
        "open_questions": Approval.objects.filter(status=Approval.Status.PENDING).count(),
        "grants": session.grants.count(),
        "commands": len(workspace.commands),
        "written": (workspace.root / "x.txt").exists(),
    }


@pytest.mark.parametrize(
    ("content_type", "encode"),
    [
        (FORM, lambda fields: "&".join(f"{k}={v}" for k, v in fields.items())),
        (f"multipart/form-data; boundary={MULTIPART_BOUNDARY}", multipart),
        ("text/plain", json.dumps),
    ],
    ids=["urlencoded", "multipart", "text-plain"],
)
@pytest.mark.parametrize("mode", ["header", "local"])
def test_a_state_change_from_a_form_is_415_and_changes_nothing(
    mode: str,
    content_type: str,
    encode: Callable[[dict[str, str]], Any],
    bound_session: str,
    workspace: FakeWorkspaceRunner,
    settings: Any,
) -> None:
    client = APIClient()
    if mode == "header":
        client.credentials(HTTP_X_FORWARDED_EMAIL=ALICE)
    else:
        settings.OMNIGENT_LOCAL_SINGLE_USER = True
        settings.OMNIGENT_LOCAL_USER = ALICE
    before = state_of(bound_session, workspace)
    for method, path, fields in forged_requests(bound_session):
        response = getattr(client, method)(path, encode(fields), content_type=content_type)
        assert_error(response, 415, "unsupported_media_type")
    assert state_of(bound_session, workspace) == before


def test_the_same_changes_as_json_still_work(
    bound_session: str, workspace: FakeWorkspaceRunner
) -> None:
    """The control: the requests above are accepted when they are JSON."""
    client = APIClient()
    client.credentials(HTTP_X_FORWARDED_EMAIL=ALICE)
    statuses = []
    for method, path, fields in forged_requests(bound_session):
        if "level" in fields:
            fields = {**fields, "level": 3}  # type: ignore[dict-item]
        if "name" in fields:
            fields = {}
        statuses.append(getattr(client, method)(path, fields, format="json").status_code)
    assert statuses == [200, 201, 202, 202, 200, 201, 200]
    assert (workspace.root / "x.txt").read_text() == "forged"


def test_a_bodyless_state_change_needs_no_content_type() -> None:
    """Clients that post nothing (register a runner) send no Content-Type; that is fine."""
    client = Client(HTTP_X_FORWARDED_EMAIL=ALICE)
    response = client.generic("POST", "/v1/runners")  # no body, no Content-Type
    assert response.status_code == 201, response.content
    refused = client.generic("POST", "/v1/runners", b"name=x", content_type=FORM)
    assert_error(refused, 415, "unsupported_media_type")
    assert Runner.objects.count() == 1


# --- the browser says where the request comes from ---------------------------------------


CROSS_SITE = [
    {"HTTP_ORIGIN": "https://evil.example"},
    {"HTTP_ORIGIN": "null"},
    {"HTTP_ORIGIN": "http://testserver.evil.example"},
    {"HTTP_SEC_FETCH_SITE": "cross-site"},
    {"HTTP_SEC_FETCH_SITE": "same-site"},
    {"HTTP_ORIGIN": "http://testserver", "HTTP_SEC_FETCH_SITE": "cross-site"},
]
SAME_SITE = [
    {},
    {"HTTP_ORIGIN": "http://testserver"},
    {"HTTP_ORIGIN": "https://testserver", "HTTP_SEC_FETCH_SITE": "same-origin"},
    {"HTTP_SEC_FETCH_SITE": "none"},
    {"HTTP_ORIGIN": "omnigent://internal"},
]


@pytest.mark.parametrize("headers", CROSS_SITE)
@pytest.mark.parametrize("mode", ["header", "local"])
def test_a_cross_site_upload_is_403_and_stores_nothing(
    mode: str, headers: dict[str, str], make_bundle: Callable[..., bytes], settings: Any
) -> None:
    client = APIClient()
    if mode == "header":
        client.credentials(HTTP_X_FORWARDED_EMAIL=ALICE)
    else:
        settings.OMNIGENT_LOCAL_SINGLE_USER = True
    response = client.post(
        "/v1/sessions",
        {"metadata": "{}", "bundle": upload(make_bundle())},
        format="multipart",
        **headers,
    )
    assert_error(response, 403, "forbidden", mentions="another site")
    assert Session.objects.count() == 0 and Agent.objects.count() == 0


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_a_cross_site_json_change_is_403(
    headers: dict[str, str], client_for: Callable[..., Any], create_session: Callable[..., str]
) -> None:
    session_id = create_session(ALICE, title="before")
    response = client_for(ALICE).patch(
        f"/v1/sessions/{session_id}", {"title": "forged"}, format="json", **headers
    )
    assert_error(response, 403, "forbidden")
    response = client_for(ALICE).delete(f"/v1/sessions/{session_id}", **headers)
    assert_error(response, 403, "forbidden")
    assert Session.objects.get(pk=session_id).title == "before"


@pytest.mark.parametrize("headers", SAME_SITE)
def test_same_origin_and_non_browser_clients_pass(
    headers: dict[str, str],
    client_for: Callable[..., Any],
    create_session: Callable[..., str],
    make_bundle: Callable[..., bytes],
) -> None:
    session_id = create_session(ALICE)
    client = client_for(ALICE)
    response = client.patch(
        f"/v1/sessions/{session_id}", {"title": "renamed"}, format="json", **headers
    )
    assert response.status_code == 200, response.content
    uploaded = client.post(
        f"/v1/sessions/{session_id}/resources/files",
        {"file": upload(b"hello", "notes.txt")},
        format="multipart",
        **headers,
    )
    assert uploaded.status_code == 201, uploaded.content
    assert SessionFile.objects.count() == 1


def test_a_trusted_origin_passes(
    client_for: Callable[..., Any], create_session: Callable[..., str], settings: Any
) -> None:
    """Behind a proxy that rewrites ``Host``, the public origin is listed the way Django's
    own CSRF check wants it (``DJANGO_CSRF_TRUSTED_ORIGINS``)."""
    settings.CSRF_TRUSTED_ORIGINS = ["https://omnigent.example.com"]
    session_id = create_session(ALICE)
    response = client_for(ALICE).patch(
        f"/v1/sessions/{session_id}",
        {"title": "renamed"},
        format="json",
        HTTP_ORIGIN="https://omnigent.example.com",
    )
    assert response.status_code == 200, response.content


def test_reads_from_another_site_are_not_refused(
    client_for: Callable[..., Any], create_session: Callable[..., str]
) -> None:
    """A read changes nothing (and its answer cannot be read across sites)."""
    session_id = create_session(ALICE)
    response = client_for(ALICE).get(
        f"/v1/sessions/{session_id}",
        HTTP_ORIGIN="https://evil.example",
        HTTP_SEC_FETCH_SITE="cross-site",
    )
    assert response.status_code == 200


# --- a Django login session: Django's CSRF check, and the browsable API's forms ----------


@pytest.fixture
def signed_in() -> Client:
    get_user_model().objects.create_user("dana", password="pw-dana-1")
    client = Client(enforce_csrf_checks=True)
    assert client.login(username="dana", password="pw-dana-1")
    client.get("/")  # a page with the CSRF token sets its cookie
    return client


def test_the_browsable_upload_form_works_with_a_login_and_its_csrf_token(
    signed_in: Client, make_bundle: Callable[..., bytes]
) -> None:
    token = signed_in.cookies["csrftoken"].value
    fields = {"metadata": '{"title": "from the form"}', "bundle": upload(make_bundle())}
    refused = signed_in.post("/v1/sessions", fields, HTTP_ACCEPT="text/html")
    assert refused.status_code == 403  # no CSRF token
    fields["bundle"] = upload(make_bundle())
    fields["csrfmiddlewaretoken"] = token
    created = signed_in.post(
        "/v1/sessions", fields, HTTP_ACCEPT="text/html", HTTP_ORIGIN="http://testserver"
    )
    assert created.status_code == 201, created.content[:500]


def test_a_login_session_form_on_a_json_endpoint_is_415(signed_in: Client) -> None:
    token = signed_in.cookies["csrftoken"].value
    response = signed_in.post("/v1/runners", {"csrfmiddlewaretoken": token, "name": "x"})
    assert_error(response, 415, "unsupported_media_type")
    assert Runner.objects.count() == 0
