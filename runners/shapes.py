"""The JSON shapes of the runner endpoints and of the events endpoint (http-api.md).

Typed dicts rendered by plain functions and documented from the same classes
(``omnigent_site/schema.py``); see ``sessions/shapes.py``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Annotated, Literal, NotRequired

from typing_extensions import Doc, TypedDict

from omnigent_site.shapes import ObjectList
from omnigent_site.timeutil import unix

from .models import Runner

OptionalUnixTime = Annotated[int | None, Doc("Unix seconds")]


class RunnerOut(TypedDict):
    """A registered runner."""

    runner_id: str
    name: str
    online: Annotated[bool, Doc("its tunnel is connected and was heard from recently")]
    last_seen_at: OptionalUnixTime
    connected_at: OptionalUnixTime
    runner_version: str


def runner_body(runner: Runner) -> RunnerOut:
    return {
        "runner_id": runner.id,
        "name": runner.name,
        "online": runner.online,
        "last_seen_at": unix(runner.last_seen_at),
        "connected_at": unix(runner.connected_at),
        "runner_version": runner.runner_version,
    }


class RunnerList(ObjectList[RunnerOut]):
    """The caller's runners (an admin's: all of them); not paginated."""


def runner_list_body(runners: Iterable[Runner]) -> RunnerList:
    return {"object": "list", "data": [runner_body(runner) for runner in runners]}


class RunnerCreatedOut(TypedDict):
    """A new runner; the binding token is shown this once."""

    runner_id: str
    name: str
    binding_token: str
    start_command: Annotated[
        str,
        Doc(
            "shell lines that start this runner on a workspace machine with the "
            "omnigent-runner package installed (docs/deployment.md)"
        ),
    ]


def runner_start_command(*, server_url: str, token: str) -> str:
    """What to run on the workspace machine: the token in the environment, not in argv;
    the two things a person must fill in (an existing workspace folder, the LLM) said
    where they are set. The LLM lines are comments: a bundle may carry its own."""
    return (
        f"export RUNNER_SERVER_URL={shlex.quote(server_url)}\n"
        f"export OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN={shlex.quote(token)}\n"
        "# The folder the agents work in: it must exist (the runner will not start otherwise).\n"
        "export OMNIGENT_RUNNER_WORKSPACE=/path/to/workspace\n"
        "# The LLM, unless every bundle has its own executor.auth: uncomment and fill in.\n"
        "# export OPENAI_API_KEY=sk-...\n"
        "# export OPENAI_BASE_URL=https://api.openai.com/v1  # the default; any OpenAI-compatible URL\n"
        "omnigent-runner"
    )


def runner_created_body(runner: Runner, *, token: str, server_url: str) -> RunnerCreatedOut:
    return {
        "runner_id": runner.id,
        "name": runner.name,
        "binding_token": token,
        "start_command": runner_start_command(server_url=server_url, token=token),
    }


class RunnerStatusOut(TypedDict):
    """Whether a runner is online; another user's or an unknown runner reads offline."""

    runner_id: str
    online: bool


def runner_status_body(runner_id: str, *, online: bool) -> RunnerStatusOut:
    return {"runner_id": runner_id, "online": online}


class RunnerDeletedOut(TypedDict):
    runner_id: str
    object: Literal["runner.deleted"]
    deleted: bool


def runner_deleted_body(runner_id: str) -> RunnerDeletedOut:
    return {"runner_id": runner_id, "object": "runner.deleted", "deleted": True}


class EventAcceptedOut(TypedDict):
    """The 202 of ``POST .../events``: ``message`` → queued, item and response ids;
    ``function_call_output`` → queued and the call id as ``item_id``;
    ``interrupt`` and ``approval`` → ``{"queued": false}``. Built by ``runners.dispatch``."""

    queued: bool
    item_id: NotRequired[str]
    response_id: NotRequired[str]
