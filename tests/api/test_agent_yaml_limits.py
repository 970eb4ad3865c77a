"""The agent YAML's bounds at the HTTP level (issue 15, item 4; agents.md, "Bundles").

A 24 MiB agent YAML in a small gzip upload and a billion-laughs alias bomb are both a
400 ``invalid_input`` that says why, on ``POST /v1/sessions`` and ``POST /v1/agents``,
with nothing stored. The refusal times are measured in ``bench/hostile.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from omnigent_runner.bundles import build_bundle

from .conftest import ALICE, assert_error, assert_nothing_written, upload

pytestmark = pytest.mark.django_db

GOOD_YAML = "name: helper\nprompt: You help.\n"


def gzip_bomb_bundle() -> bytes:
    """About 24 MiB of valid agent YAML, compressed to some tens of kilobytes."""
    line = "  " + "a" * 77 + "\n"
    text = "name: big\nprompt: |\n" + line * (24 * 1024 * 1024 // len(line))
    data = build_bundle({"agent.yaml": text})
    assert len(data) < 200 * 1024
    return data


def alias_bomb_bundle() -> bytes:
    lines = ["name: bomb", "prompt: p", 'l0: &l0 "lol"']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    return build_bundle({"agent.yaml": "\n".join(lines) + "\n"})


def post_bundle(client: APIClient, endpoint: str, data: bytes) -> Any:
    parts: dict[str, object] = {"bundle": upload(data)}
    if endpoint == "/v1/sessions":
        parts["metadata"] = json.dumps({})
    return client.post(endpoint, parts, format="multipart")


@pytest.mark.parametrize("endpoint", ["/v1/sessions", "/v1/agents"])
@pytest.mark.parametrize(
    ("bundle", "mentions"),
    [(gzip_bomb_bundle, "at most 1048576 bytes"), (alias_bomb_bundle, "aliases")],
    ids=["gzip-bomb", "alias-bomb"],
)
def test_hostile_agent_yaml_is_400_and_nothing_is_stored(
    client_for: Callable[[str | None], APIClient],
    endpoint: str,
    bundle: Callable[[], bytes],
    mentions: str,
) -> None:
    response = post_bundle(client_for(ALICE), endpoint, bundle())
    assert_error(response, 400, "invalid_input", mentions=mentions)
    assert_nothing_written()


def test_the_agent_yaml_cap_is_a_setting(
    client_for: Callable[[str | None], APIClient], settings: Any
) -> None:
    settings.OMNIGENT_MAX_AGENT_YAML_BYTES = len(GOOD_YAML) - 1
    client = client_for(ALICE)
    data = build_bundle({"agent.yaml": GOOD_YAML})
    assert_error(post_bundle(client, "/v1/agents", data), 400, "invalid_input", mentions="at most")
    settings.OMNIGENT_MAX_AGENT_YAML_BYTES = len(GOOD_YAML)
    assert post_bundle(client, "/v1/agents", data).status_code == 201
