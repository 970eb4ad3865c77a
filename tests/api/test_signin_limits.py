"""Failed sign-ins are limited per user name and per client address (security.md,
"Sign-in"; omnigent_site/signin_limits.py). The clock is the test's: nothing waits."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.test import Client, RequestFactory

from omnigent_site import signin_limits
from omnigent_site.authentication import client_address
from omnigent_site.runtime.redis_cache import RedisCacheWithRates
from tests.conftest import on_redis

pytestmark = pytest.mark.django_db

PASSWORD = "pw-dana-1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, settings: Any) -> FakeClock:
    """5 failures per user, 20 per address, per 15 minutes (the defaults), on a fresh
    count, with the test's clock."""
    settings.OMNIGENT_SIGNIN_FAILURES_PER_USER = 5
    settings.OMNIGENT_SIGNIN_FAILURES_PER_ADDRESS = 20
    settings.OMNIGENT_SIGNIN_WINDOW_S = 900.0
    # Many password checks: the fast hasher (the limits do not depend on it).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    caches["throttle"].clear()
    fake = FakeClock()
    monkeypatch.setattr(signin_limits, "clock", fake)
    return fake


@pytest.fixture
def dana() -> None:
    get_user_model().objects.create_user("dana", password=PASSWORD)


def sign_in(username: str, password: str, *, address: str = "10.0.0.1") -> Any:
    """The web page's form, as a browser posts it (CSRF enforced)."""
    browser = Client(enforce_csrf_checks=True, REMOTE_ADDR=address)
    browser.get("/signin")
    token = browser.cookies["csrftoken"].value
    return browser.post(
        "/signin",
        {"username": username, "password": password, "csrfmiddlewaretoken": token},
    )


def assert_wrong_password(response: Any) -> None:
    assert response.status_code == 200
    assert b"Wrong user name or password." in response.content


def assert_too_many(response: Any, *, minutes: int) -> None:
    assert response.status_code == 429
    body = response.content.decode()
    assert "Too many failed sign-ins" in body
    assert f"Try again in {minutes} minute" in body
    assert int(response["Retry-After"]) > 0
    assert "_auth_user_id" not in response.client.session
    # A page like the others: the same strict headers.
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_five_failures_then_even_the_right_password_waits(clock: FakeClock, dana: None) -> None:
    for _ in range(5):
        assert_wrong_password(sign_in("dana", "guess"))
    refused = sign_in("dana", PASSWORD)
    assert_too_many(refused, minutes=3)
    assert refused["Retry-After"] == "180"
    assert_too_many(sign_in("dana", "guess"), minutes=3)
    # A minute later: two to go.
    clock.now += 60
    assert sign_in("dana", PASSWORD)["Retry-After"] == "120"
    # One place frees every 3 minutes (5 per 15): one more attempt, then wait again.
    clock.now += 120
    assert_wrong_password(sign_in("dana", "guess"))
    assert_too_many(sign_in("dana", PASSWORD), minutes=3)
    clock.now += 180
    signed_in = sign_in("dana", PASSWORD)
    assert signed_in.status_code == 302
    assert signed_in.client.session["_auth_user_id"]


def test_successful_sign_ins_do_not_count(clock: FakeClock, dana: None) -> None:
    for _ in range(4):
        assert_wrong_password(sign_in("dana", "guess"))
    for _ in range(10):
        assert sign_in("dana", PASSWORD).status_code == 302
    assert_wrong_password(sign_in("dana", "guess"))
    assert_too_many(sign_in("dana", PASSWORD), minutes=3)


def test_the_user_name_limit_holds_from_every_address(clock: FakeClock, dana: None) -> None:
    for number in range(5):
        assert_wrong_password(sign_in("dana", "guess", address=f"10.0.1.{number}"))
    assert_too_many(sign_in("dana", PASSWORD, address="10.0.2.1"), minutes=3)
    # Another user name from the same addresses is not held back.
    get_user_model().objects.create_user("erin", password=PASSWORD)
    assert sign_in("erin", PASSWORD, address="10.0.1.0").status_code == 302


def test_twenty_failures_from_one_address_stop_it_whatever_the_names(clock: FakeClock) -> None:
    get_user_model().objects.create_user("frank", password=PASSWORD)
    for number in range(20):
        assert_wrong_password(sign_in(f"user{number}", "guess"))
    # 15 minutes / 20: one place every 45 s.
    assert_too_many(sign_in("frank", PASSWORD), minutes=1)
    assert sign_in("frank", PASSWORD, address="10.9.9.9").status_code == 302
    clock.now += 45
    assert sign_in("frank", PASSWORD).status_code == 302


def test_the_admin_login_counts_too(clock: FakeClock, dana: None) -> None:
    """The admin's (and the browsable API's) login check the password through the same
    backend: they refuse while the limit is used up (with their own wording)."""
    for _ in range(5):
        assert_wrong_password(sign_in("dana", "guess"))
    get_user_model().objects.filter(username="dana").update(is_staff=True)
    admin = Client(REMOTE_ADDR="10.0.0.1")
    response = admin.post("/admin/login/", {"username": "dana", "password": PASSWORD})
    assert response.status_code == 200  # the form again, not the redirect of a sign-in
    assert "_auth_user_id" not in admin.session


def test_the_async_password_check_counts_too(clock: FakeClock, dana: None) -> None:
    from asgiref.sync import async_to_sync
    from django.contrib.auth import aauthenticate

    request = RequestFactory().post("/signin", REMOTE_ADDR="10.0.0.1")
    for _ in range(5):
        assert async_to_sync(aauthenticate)(request, username="dana", password="guess") is None
    assert async_to_sync(aauthenticate)(request, username="dana", password=PASSWORD) is None
    assert getattr(request, signin_limits.WAIT_ATTRIBUTE) == 180.0


def test_zero_turns_a_limit_off(clock: FakeClock, dana: None, settings: Any) -> None:
    settings.OMNIGENT_SIGNIN_FAILURES_PER_USER = 0
    settings.OMNIGENT_SIGNIN_FAILURES_PER_ADDRESS = 0
    for _ in range(8):
        assert_wrong_password(sign_in("dana", "guess"))
    assert sign_in("dana", PASSWORD).status_code == 302


def test_the_counts_are_shared_through_redis(clock: FakeClock, dana: None, settings: Any) -> None:
    with on_redis(settings, "throttle"):
        assert isinstance(caches["throttle"], RedisCacheWithRates)
        for _ in range(4):
            assert_wrong_password(sign_in("dana", "guess"))
        assert sign_in("dana", PASSWORD).status_code == 302  # given back
        assert_wrong_password(sign_in("dana", "guess"))
        assert_too_many(sign_in("dana", PASSWORD), minutes=3)
        clock.now += 180
        assert sign_in("dana", PASSWORD).status_code == 302


def test_an_unreachable_cache_lets_sign_ins_through(
    clock: FakeClock, dana: None, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from omnigent_site.settings import shared_cache

    settings.CACHES = {
        **settings.CACHES,
        "throttle": shared_cache("throttle", "redis://127.0.0.1:1/0"),
    }
    with caplog.at_level("WARNING", logger="omnigent_site.signin_limits"):
        for _ in range(6):
            assert_wrong_password(sign_in("dana", "guess"))
        assert sign_in("dana", PASSWORD).status_code == 302
    assert "sign-in limits not applied" in caplog.text


# --- the client's address ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("trusted", "peer", "forwarded", "expected"),
    [
        ([], "10.0.0.5", "1.2.3.4", "10.0.0.5"),  # no proxy list: the header is not trusted
        (["10.0.0.0/8"], "192.0.2.7", "1.2.3.4", "192.0.2.7"),  # not from a listed proxy
        (["10.0.0.0/8"], "10.0.0.5", "1.2.3.4", "1.2.3.4"),
        (["10.0.0.0/8"], "10.0.0.5", "6.6.6.6, 1.2.3.4", "1.2.3.4"),  # a hop the client wrote
        (["10.0.0.0/8"], "10.0.0.5", "1.2.3.4, 10.0.0.9", "1.2.3.4"),  # two proxies
        (["10.0.0.0/8"], "10.0.0.5", "", "10.0.0.5"),
    ],
)
def test_client_address(
    settings: Any, trusted: list[str], peer: str, forwarded: str, expected: str
) -> None:
    settings.OMNIGENT_TRUSTED_PROXIES = trusted
    request = RequestFactory().get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected
