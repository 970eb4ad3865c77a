"""OpenAPI schema, Swagger page, Django admin and the browsable API (http-api.md)."""

from __future__ import annotations

import json

import pytest
import yaml
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from runners.models import Runner
from sessions.models import Agent, Permission, Session

from .conftest import ALICE, BOB

pytestmark = pytest.mark.django_db

SESSION_PATHS = [
    "/v1/sessions",
    "/v1/sessions/{session_id}",
    "/v1/sessions/{session_id}/items",
    "/v1/sessions/{session_id}/agent",
    "/v1/sessions/{session_id}/events",
    "/v1/sessions/{session_id}/responses",
    "/v1/sessions/{session_id}/responses/{response_id}",
    "/v1/sessions/{session_id}/permissions",
    "/v1/sessions/{session_id}/permissions/{user_id}",
    "/v1/agents",
    "/v1/agents/{agent_id}",
    "/v1/me",
]


def admin_change_url(model: type, pk: str) -> str:
    """The admin's change page URL, built as the admin builds it.

    The admin escapes a primary key in URLs (``_22`` stands for ``"``), so a random id
    whose hex starts with such a code must be escaped, not pasted (that made the
    change-page tests fail about once in forty runs).
    """
    meta = model._meta  # type: ignore[attr-defined]
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[quote(pk)])


@pytest.fixture
def superuser(django_user_model):
    return django_user_model.objects.create_superuser(
        username="admin", email="admin@example.com", password="pw-for-admin"
    )


@pytest.fixture
def logged_in(superuser) -> APIClient:
    client = APIClient()
    client.force_login(superuser)
    return client


def test_schema_as_json(client_for) -> None:
    response = client_for(ALICE).get("/v1/schema?format=json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Omnigent session server API"
    for path in SESSION_PATHS:
        assert path in schema["paths"], path
    create = schema["paths"]["/v1/sessions"]["post"]
    assert set(create["requestBody"]["content"]) >= {"application/json", "multipart/form-data"}
    assert "201" in create["responses"]
    assert set(schema["paths"]["/v1/sessions/{session_id}"]) >= {"get", "patch", "delete"}


def test_schema_with_accept_header() -> None:
    # The schema is readable without identity (clients fetch it before they log in).
    response = APIClient().get("/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert "/v1/sessions/{session_id}/items" in json.loads(response.content)["paths"]


def test_schema_default_is_yaml() -> None:
    response = APIClient().get("/v1/schema")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    assert document["openapi"].startswith("3.")
    assert "/v1/sessions" in document["paths"]


def test_spectacular_validates_without_warnings(tmp_path) -> None:
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    document = yaml.safe_load(target.read_text())
    assert "/v1/sessions/{session_id}/permissions" in document["paths"]


def test_docs_page_renders(logged_in) -> None:
    response = logged_in.get("/v1/docs")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"swagger" in response.content.lower()
    assert b"/v1/schema" in response.content


def test_admin_changelists_render(logged_in, client_for, create_session, django_user_model):
    session_id = create_session(ALICE, title="admin-visible")
    Runner.objects.create(
        id="runner_token_admin", name="laptop", owner=django_user_model.objects.get(username=ALICE)
    )
    for url, expected in [
        ("/admin/agent_sessions/session/", b"admin-visible"),
        ("/admin/agent_sessions/agent/", b"file-helper"),
        ("/admin/runners/runner/", b"laptop"),
        ("/admin/auth/user/", ALICE.encode()),
        ("/admin/agent_sessions/turn/", b"0 turns"),
        ("/admin/agent_sessions/item/", b"0 items"),
    ]:
        response = logged_in.get(url)
        assert response.status_code == 200, url
        assert expected in response.content, url
    assert Session.objects.filter(pk=session_id).exists()


def test_admin_session_change_page_has_grants_inline(
    logged_in, client_for, create_session, grant
) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 2)
    response = logged_in.get(admin_change_url(Session, session_id))
    assert response.status_code == 200
    content = response.content.decode()
    assert 'name="grants-TOTAL_FORMS"' in content
    assert 'name="grants-INITIAL_FORMS" value="2"' in content
    assert Permission.objects.filter(session_id=session_id).count() == 2


def test_admin_agent_change_page_renders(logged_in, create_session) -> None:
    session_id = create_session(ALICE)
    agent_id = Session.objects.get(pk=session_id).agent_id
    response = logged_in.get(admin_change_url(Agent, agent_id))
    assert response.status_code == 200
    assert Agent.objects.filter(pk=agent_id).exists()


def test_admin_requires_staff(client_for) -> None:
    response = client_for(ALICE).get("/admin/agent_sessions/session/")
    # Header identity does not log into the admin: it redirects to its login page.
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_browsable_api_renders_html(superuser, create_session) -> None:
    client = APIClient()
    client.force_login(superuser)
    response = client.get("/v1/sessions", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"Session List" in response.content


def test_browsable_api_renders_a_session(django_user_model, create_session) -> None:
    session_id = create_session(ALICE, title="browsable")
    client = APIClient()
    client.force_login(django_user_model.objects.get(username=ALICE))
    for path in (f"/v1/sessions/{session_id}", f"/v1/sessions/{session_id}/items", "/v1/agents"):
        response = client.get(path, HTTP_ACCEPT="text/html")
        assert response.status_code == 200, path
        assert response["Content-Type"].startswith("text/html")
    assert b"browsable" in client.get(f"/v1/sessions/{session_id}", HTTP_ACCEPT="text/html").content


async def test_static_assets_are_served_by_the_asgi_application() -> None:
    """daphne serves no files; the ASGI app serves the admin's and DRF's assets."""
    import httpx

    from omnigent_site.asgi import application

    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        css = await client.get("/static/admin/css/base.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        drf = await client.get("/static/rest_framework/css/bootstrap.min.css")
        assert drf.status_code == 200
