"""Health, ``/v1/me`` and every way of saying who is calling (http-api.md, Auth)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from sessions.models import Permission, Session

from .conftest import ALICE, assert_error, upload

User = get_user_model()
pytestmark = pytest.mark.django_db


def test_health_needs_no_auth() -> None:
    response = APIClient().get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"] == "ok"
    assert body["channel_layer"] == "ok"


def test_me_for_a_header_user(client_for) -> None:
    response = client_for(ALICE).get("/v1/me")
    assert response.status_code == 200
    assert response.json() == {"user_id": ALICE, "is_admin": False}


def test_header_creates_the_user_on_first_sight(client_for) -> None:
    assert not User.objects.filter(username="new@example.com").exists()
    assert client_for("new@example.com").get("/v1/me").status_code == 200
    user = User.objects.get(username="new@example.com")
    assert user.email == "new@example.com"
    assert not user.has_usable_password()
    # The second request finds the same user rather than creating another.
    assert client_for("new@example.com").get("/v1/me").status_code == 200
    assert User.objects.filter(username="new@example.com").count() == 1


def test_me_for_a_staff_user_is_admin(client_for) -> None:
    User.objects.create_user(username="root@example.com", is_staff=True)
    response = client_for("root@example.com").get("/v1/me")
    assert response.json() == {"user_id": "root@example.com", "is_admin": True}


def test_inactive_header_user_is_401(client_for) -> None:
    User.objects.create_user(username="gone@example.com", is_active=False)
    assert_error(client_for("gone@example.com").get("/v1/me"), 401, "unauthorized")


def test_overlong_header_identity_is_401_not_500(client_for) -> None:
    response = client_for("x" * 200 + "@example.com").get("/v1/me")
    assert_error(response, 401, "unauthorized")
    assert not User.objects.filter(username__startswith="xxxx").exists()


def test_drf_token_auth() -> None:
    user = User.objects.create_user(username="tok@example.com")
    token = Token.objects.create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    response = client.get("/v1/me")
    assert response.status_code == 200
    assert response.json() == {"user_id": "tok@example.com", "is_admin": False}


def test_bad_drf_token_is_401() -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-key")
    assert_error(client.get("/v1/me"), 401, "unauthorized")


def test_token_user_can_create_a_session(make_bundle) -> None:
    user = User.objects.create_user(username="tok@example.com")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    response = client.post("/v1/sessions", {"bundle": upload(make_bundle())}, format="multipart")
    assert response.status_code == 201, response.content
    session = Session.objects.get(pk=response.json()["session_id"])
    assert session.created_by == user
    assert Permission.objects.get(session=session).user == user


def test_django_session_login_force_login() -> None:
    user = User.objects.create_user(username="web@example.com", is_staff=True)
    client = APIClient()
    client.force_login(user)
    assert client.get("/v1/me").json() == {"user_id": "web@example.com", "is_admin": True}


def test_django_session_login_with_password(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    User.objects.create_user(username="pw@example.com", password="s3cret-pass")
    client = APIClient()
    assert client.login(username="pw@example.com", password="s3cret-pass")
    assert client.get("/v1/me").json() == {"user_id": "pw@example.com", "is_admin": False}


def test_no_identity_is_401(settings) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = False
    for path in ("/v1/me", "/v1/sessions", "/v1/agents", "/v1/sessions/conv_x"):
        assert_error(APIClient().get(path), 401, "unauthorized")
    assert not User.objects.filter(username="local").exists()


def test_local_single_user_mode(settings) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True
    response = APIClient().get("/v1/me")
    assert response.status_code == 200
    assert response.json() == {"user_id": "local", "is_admin": False}
    assert User.objects.filter(username="local").exists()


def test_header_wins_over_local_single_user_mode(settings, client_for) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True
    assert client_for(ALICE).get("/v1/me").json()["user_id"] == ALICE


def test_trusted_proxies_ignore_the_header_from_an_untrusted_peer(settings) -> None:
    settings.OMNIGENT_TRUSTED_PROXIES = ["10.0.0.0/8"]
    client = APIClient()
    # The test client's peer is 127.0.0.1, which is not on the list.
    response = client.get("/v1/me", HTTP_X_FORWARDED_EMAIL=ALICE)
    assert_error(response, 401, "unauthorized")
    assert not User.objects.filter(username=ALICE).exists()
    response = client.get("/v1/me", HTTP_X_FORWARDED_EMAIL=ALICE, REMOTE_ADDR="10.1.2.3")
    assert response.status_code == 200
    assert response.json()["user_id"] == ALICE
    response = client.get("/v1/me", HTTP_X_FORWARDED_EMAIL=ALICE, REMOTE_ADDR="11.1.2.3")
    assert_error(response, 401, "unauthorized")


def test_custom_auth_header_name(settings) -> None:
    settings.OMNIGENT_AUTH_HEADER = "X-Auth-User"
    client = APIClient()
    response = client.get("/v1/me", HTTP_X_AUTH_USER="hdr@example.com")
    assert response.status_code == 200
    assert response.json()["user_id"] == "hdr@example.com"
    # The default header no longer identifies anyone.
    assert_error(client.get("/v1/me", HTTP_X_FORWARDED_EMAIL=ALICE), 401, "unauthorized")


def test_origin_omnigent_internal_is_accepted(client_for, make_bundle) -> None:
    client = client_for(ALICE)
    origin = {"HTTP_ORIGIN": "omnigent://internal"}
    assert client.get("/v1/me", **origin).status_code == 200
    created = client.post(
        "/v1/sessions", {"bundle": upload(make_bundle())}, format="multipart", **origin
    )
    assert created.status_code == 201, created.content
    session_id = created.json()["session_id"]
    patched = client.patch(
        f"/v1/sessions/{session_id}", {"title": "from the SDK"}, format="json", **origin
    )
    assert patched.status_code == 200, patched.content
    assert Session.objects.get(pk=session_id).title == "from the SDK"


def test_unknown_query_parameters_are_ignored(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    client = client_for(ALICE)
    response = client.get("/v1/sessions?visibility=private&foo=bar&sort_by=updated_at")
    assert response.status_code == 200
    assert [row["id"] for row in response.json()["data"]] == [session_id]
    assert client.get(f"/v1/sessions/{session_id}?whatever=1").status_code == 200
    assert client.get("/v1/me?x=y").status_code == 200
