"""Request rates per user and per runner (issue 15, item 9; http-api.md, "Limits on
clients"): 429 ``rate_limited`` with ``Retry-After`` past the rate, each user and each
runner counted apart, nothing throttled in local single-user mode.

The suite turns the limits off (``tests/conftest.py``); these tests set small rates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.utils import timezone
from rest_framework.test import APIClient

from omnigent_site.users import get_or_create_user
from runners.models import Runner
from sessions.models import Session

from .conftest import ALICE, BOB, CAROL, assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    caches["throttle"].clear()
    yield
    caches["throttle"].clear()


def test_a_user_past_the_rate_gets_429_with_retry_after(
    settings: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    settings.OMNIGENT_THROTTLE_USER_RATE = "3/min"
    alice = client_for(ALICE)
    assert [alice.get("/v1/me").status_code for _ in range(3)] == [200, 200, 200]
    refused = alice.get("/v1/me")
    assert_error(refused, 429, "rate_limited")
    assert 1 <= int(refused["Retry-After"]) <= 60
    # Every endpoint counts against the same budget, and other users have their own.
    assert_error(alice.get("/v1/sessions"), 429, "rate_limited")
    assert client_for(BOB).get("/v1/me").status_code == 200


def test_snapshot_polls_count_against_the_poll_rate_not_the_users(
    settings: Any,
    client_for: Callable[[str | None], APIClient],
    create_session: Callable[..., str],
    grant: Callable[..., None],
) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 1)
    caches["throttle"].clear()
    settings.OMNIGENT_THROTTLE_USER_RATE = "3/min"
    settings.OMNIGENT_THROTTLE_POLL_RATE = "5/min"
    snapshot = f"/v1/sessions/{session_id}"
    alice = client_for(ALICE)
    assert [alice.get(snapshot).status_code for _ in range(5)] == [200] * 5
    refused = alice.get(snapshot)
    assert_error(refused, 429, "rate_limited")
    assert 1 <= int(refused["Retry-After"]) <= 60
    # The polls left the user's own budget whole; changing the session spends it.
    assert alice.get("/v1/me").status_code == 200
    assert alice.patch(snapshot, {"title": "renamed"}, format="json").status_code == 200
    assert alice.get("/v1/sessions").status_code == 200
    assert_error(alice.patch(snapshot, {"title": "again"}, format="json"), 429, "rate_limited")
    # Another user polls on a budget of their own.
    assert client_for(BOB).get(snapshot).status_code == 200


def test_a_burst_of_the_rate_then_one_request_per_interval(
    settings: Any, client_for: Callable[[str | None], APIClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """3/min: three at once, then one every 20 s; a refused request does not count, and
    ``Retry-After`` says when the next one is admitted."""
    from omnigent_site.throttling import UserRateThrottle

    clock = [1_000_000.0]
    monkeypatch.setattr(UserRateThrottle, "timer", lambda self: clock[0])
    settings.OMNIGENT_THROTTLE_USER_RATE = "3/min"
    alice = client_for(ALICE)
    assert [alice.get("/v1/me").status_code for _ in range(3)] == [200, 200, 200]
    refused = alice.get("/v1/me")
    assert_error(refused, 429, "rate_limited")
    assert refused["Retry-After"] == "20"
    clock[0] += 15
    assert alice.get("/v1/me")["Retry-After"] == "5"  # refusals did not push it later
    clock[0] += 5
    assert alice.get("/v1/me").status_code == 200
    assert_error(alice.get("/v1/me"), 429, "rate_limited")
    clock[0] += 60  # a quiet minute makes the allowance whole again
    assert [alice.get("/v1/me").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_a_client_s_count_is_one_number_however_many_requests(
    settings: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    """Not DRF's list of request times, read and written whole on every request."""
    from omnigent_site.throttling import UserRateThrottle

    settings.OMNIGENT_THROTTLE_USER_RATE = "6000/min"
    alice = client_for(ALICE)
    assert {alice.get("/v1/me").status_code for _ in range(200)} == {200}
    key = UserRateThrottle.cache_format % {
        "scope": "user",
        "ident": get_or_create_user(ALICE).pk,
    }
    assert isinstance(caches["throttle"].get(key), float)
    # A list of times under the key (DRF's own throttle, an older server's) starts afresh.
    caches["throttle"].set(key, [1.0, 2.0], 60)
    assert alice.get("/v1/me").status_code == 200
    assert isinstance(caches["throttle"].get(key), float)


def test_requests_without_identity_are_401_not_counted(
    settings: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    settings.OMNIGENT_THROTTLE_USER_RATE = "1/min"
    anonymous = client_for(None)
    for _ in range(3):
        assert_error(anonymous.get("/v1/me"), 401, "unauthorized")


def test_rates_are_off_in_local_single_user_mode(
    settings: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    settings.OMNIGENT_LOCAL_SINGLE_USER = True
    settings.OMNIGENT_THROTTLE_USER_RATE = "1/min"
    settings.OMNIGENT_THROTTLE_RUNNER_RATE = "1/min"
    local = client_for(None)
    assert {local.get("/v1/me").status_code for _ in range(5)} == {200}


def test_a_rate_of_zero_is_no_limit(
    settings: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    settings.OMNIGENT_THROTTLE_USER_RATE = "0"
    alice = client_for(ALICE)
    assert {alice.get("/v1/me").status_code for _ in range(5)} == {200}


def test_an_unavailable_throttle_cache_lets_requests_through(
    settings: Any, client_for: Callable[[str | None], APIClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.OMNIGENT_THROTTLE_USER_RATE = "1/min"

    def down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("cache down")

    monkeypatch.setattr(caches["throttle"], "get", down)
    alice = client_for(ALICE)
    assert {alice.get("/v1/me").status_code for _ in range(3)} == {200}


def bound_session(
    create_session: Callable[..., str], grant: Callable[..., None], runner_id: str
) -> str:
    """A session of ALICE's, BOB and CAROL editors, bound to ``runner_id`` (offline)."""
    session_id = create_session(ALICE)
    grant(session_id, BOB, 2)
    grant(session_id, CAROL, 2)
    runner, _ = Runner.objects.get_or_create(
        id=runner_id,
        defaults={
            "name": runner_id,
            "owner": get_or_create_user(ALICE),
            "last_seen_at": timezone.now(),
        },
    )
    Session.objects.filter(pk=session_id).update(runner=runner)
    return session_id


def interrupt(client: APIClient, session_id: str) -> Any:
    return client.post(f"/v1/sessions/{session_id}/events", {"type": "interrupt"}, format="json")


def test_calls_to_one_runner_are_counted_together_whoever_sends_them(
    settings: Any,
    client_for: Callable[[str | None], APIClient],
    create_session: Callable[..., str],
    grant: Callable[..., None],
) -> None:
    settings.OMNIGENT_THROTTLE_RUNNER_RATE = "3/min"
    first = bound_session(create_session, grant, "runner_token_" + "a" * 32)
    other = bound_session(create_session, grant, "runner_token_" + "b" * 32)
    unbound = create_session(ALICE)
    senders = [client_for(user) for user in (ALICE, BOB, CAROL)]
    assert [interrupt(sender, first).status_code for sender in senders] == [202, 202, 202]
    refused = interrupt(client_for(BOB), first)
    assert_error(refused, 429, "rate_limited")
    assert int(refused["Retry-After"]) >= 1
    # Another runner, a session without one, and reads of the same session are not counted.
    assert interrupt(client_for(BOB), other).status_code == 202
    assert {interrupt(client_for(ALICE), unbound).status_code for _ in range(4)} == {202}
    assert client_for(BOB).get(f"/v1/sessions/{first}").status_code == 200


@pytest.mark.redis
def test_with_redis_the_counts_are_shared_through_it(
    settings: Any, client_for: Callable[[str | None], APIClient]
) -> None:
    """With ``REDIS_URL`` the ``throttle`` cache is Redis: what one process counted,
    every other process reads (here: the count survives this process's memory)."""
    from tests.conftest import on_redis

    with on_redis(settings, "throttle") as (prefix, store):
        settings.OMNIGENT_THROTTLE_USER_RATE = "2/min"
        alice = client_for(ALICE)
        assert [alice.get("/v1/me").status_code for _ in range(2)] == [200, 200]
        assert store.keys(f"{prefix}:*"), "the count is in Redis"
        caches["default"].clear()  # another process: nothing of this one's memory
        assert_error(alice.get("/v1/me"), 429, "rate_limited")
