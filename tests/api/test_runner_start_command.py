"""``POST /v1/runners`` tells the caller how to start the runner: the wheel's
``omnigent-runner`` with the server URL and the token in the environment."""

from __future__ import annotations

import shlex

import pytest

from .conftest import ALICE

pytestmark = pytest.mark.django_db


def test_created_runner_comes_with_its_start_command(client_for) -> None:
    response = client_for(ALICE).post("/v1/runners", {"name": "build box"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    lines = body["start_command"].splitlines()
    assert lines == [
        "export RUNNER_SERVER_URL=http://testserver",
        f"export OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN={shlex.quote(body['binding_token'])}",
        "export OMNIGENT_RUNNER_WORKSPACE=/path/to/workspace",
        "omnigent-runner",
    ]
    # The token is shown this once: the runner list and detail never carry it.
    listed = client_for(ALICE).get("/v1/runners").content.decode()
    assert body["binding_token"] not in listed
