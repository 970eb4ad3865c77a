"""A runner is online only while a tunnel is connected to a live server process
(``runners/liveness.py``): the process marks its tunnels offline as it stops, marks
offline the tunnels of processes without a liveness mark, and puts its own back when
its mark had lapsed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.utils import timezone

from runners import liveness, services
from runners.models import Runner
from sessions.models import Session

from .stubs import MESSAGE, Stubs, bind, error_of, in_db, post_event

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _no_marks() -> Iterator[None]:
    caches["presence"].clear()
    yield
    caches["presence"].clear()


def _online(runner_id: str) -> bool:
    return Runner.objects.get(pk=runner_id).online


async def test_a_stopping_process_marks_its_tunnels_offline_and_a_message_gets_503_at_once(
    stubs: Stubs, runner_token: tuple[Runner, str], session: Session, settings: Any
) -> None:
    # Without the wait for a reconnecting runner (tested in test_relay_contract.py).
    settings.OMNIGENT_RUNNER_RECONNECT_WAIT_S = 0
    runner, token = runner_token
    await bind(session, runner)
    await stubs.online(token)
    held = await in_db(Runner.objects.get)(pk=runner.pk)
    assert held.tunnel_process == liveness.PROCESS_ID and held.online

    await liveness.stop()  # what the server's clean stop runs (runtime.on_stop)

    assert not await in_db(_online)(runner.pk)
    started = time.monotonic()
    response = await post_event(session.id, {"type": "message", "data": MESSAGE})
    assert "offline" in error_of(response, 503, "runner_unavailable")
    assert time.monotonic() - started < 3.0


def _connected(runner: Runner, *, channel: str, process: str) -> None:
    Runner.objects.filter(pk=runner.pk).update(
        channel_name=channel, generation=1, tunnel_process=process, last_seen_at=timezone.now()
    )


def test_tunnels_of_a_process_without_a_mark_go_offline_and_the_others_stay(
    alice: Any,
) -> None:
    dead, _ = services.register_runner(owner=alice, name="dead")
    live, _ = services.register_runner(owner=alice, name="live")
    mine, _ = services.register_runner(owner=alice, name="mine")
    _connected(dead, channel="specific.a!1", process="srv_dead")
    _connected(live, channel="specific.b!1", process="srv_live")
    _connected(mine, channel="specific.c!1", process=liveness.PROCESS_ID)
    caches["presence"].set(liveness.mark_key("srv_live"), 1, 60)

    assert liveness.sweep_dead_processes() == [dead.pk]

    assert not _online(dead.pk) and _online(live.pk) and _online(mine.pk)
    assert Runner.objects.get(pk=dead.pk).disconnected_at is not None
    assert liveness.sweep_dead_processes() == []


def test_a_process_whose_mark_lapsed_puts_its_tunnels_back(alice: Any) -> None:
    runner, _ = services.register_runner(owner=alice)
    _connected(runner, channel="specific.c!1", process=liveness.PROCESS_ID)
    liveness.hold(channel_name="specific.c!1", runner_id=runner.pk, generation=1)
    try:
        # Another process found this one's mark gone (Redis emptied, say).
        assert services.release_tunnels(process_id=liveness.PROCESS_ID) == [runner.pk]
        assert not _online(runner.pk)

        liveness.beat()

        restored = Runner.objects.get(pk=runner.pk)
        assert restored.online and restored.channel_name == "specific.c!1"
        assert caches["presence"].get(liveness.mark_key(liveness.PROCESS_ID)) is not None
        # A newer connection is never overwritten by an older one's restore.
        Runner.objects.filter(pk=runner.pk).update(channel_name="", generation=2)
        caches["presence"].clear()
        liveness.beat()
        assert not _online(runner.pk)
    finally:
        liveness.let_go(channel_name="specific.c!1")
