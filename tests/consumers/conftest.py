"""Fixtures of the consumer tests: users, a registered runner, a session, stub runners."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from channels.layers import get_channel_layer

from omnigent_site.users import get_or_create_user
from runners import services
from runners.models import Runner
from sessions.models import Session
from sessions.services import create_session_from_bundle

from .stubs import ALICE, BOB, Stubs


@pytest.fixture
async def stubs() -> AsyncIterator[Stubs]:
    layer = get_channel_layer()
    await layer.flush()
    opened = Stubs()
    try:
        yield opened
    finally:
        await opened.close_all()
        await layer.flush()


@pytest.fixture
def alice() -> Any:
    return get_or_create_user(ALICE)


@pytest.fixture
def bob() -> Any:
    return get_or_create_user(BOB)


@pytest.fixture
def runner_token(alice: Any) -> tuple[Runner, str]:
    return services.register_runner(owner=alice, name="stub")


@pytest.fixture
def session(alice: Any, make_bundle: Callable[..., bytes]) -> Session:
    return create_session_from_bundle(user=alice, data=make_bundle())
