"""Real responses match the OpenAPI schema documented for them.

docs/architecture.md: one definition per response shape, used both to render and to
document. This holds the two ends together: the schema is generated as it is served
(``GET /v1/schema``), turned into plain JSON Schema for validation, and a scenario
drives every operation that can be reached without a live runner through the test
client. For each response:

- its (path, method, status) must be documented, and its media type under that status;
- a JSON body must validate against the documented schema, ``$ref``s resolved against
  the components. In the validation copy every documented object that does not state
  ``additionalProperties`` gets ``false``, so a field the schema does not list fails,
  as does a missing required field, a wrong type or a value outside an enum;
- OpenAPI 3.0's ``nullable`` becomes a union with ``null``.

At the end every documented (path, method, status) must have been produced, except the
few in ``NOT_PRODUCED`` (each with its reason), so a newly documented status needs a
request here. ``test_the_check_fails_when_it_should`` keeps the checker honest.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from jsonschema import Draft202012Validator
from rest_framework.test import APIClient

from omnigent_site.stream_slots import stream_slots
from omnigent_site.users import get_or_create_user
from runners.models import Runner
from sessions.models import Item, Session, Turn
from sessions.shapes import ItemHeader
from workspaces.services import apply_workspace_changes

from .conformance_approvals import exercise_approvals
from .conformance_files import exercise_fork, exercise_session_files
from .conformance_schedules import exercise_schedules
from .conformance_transfer import exercise_transfer
from .conformance_webhooks import exercise_webhooks
from .conftest import ALICE, BOB, CAROL, upload
from .workspace_conformance import exercise_workspace

pytestmark = pytest.mark.django_db

SESSION = "/v1/sessions/{session_id}"
STREAM = SESSION + "/stream"
CHANGES = SESSION + "/resources/environments/{env}/changes"
DIFF = SESSION + "/resources/environments/{env}/diff/{path}"

# Documented, but not produced by this test, and why (none at the moment).
NOT_PRODUCED: dict[tuple[str, str, str], str] = {}


# --- the validation copy of the schema ---------------------------------------------------


def strict(node: Any) -> Any:
    """An OpenAPI 3.0 schema object as JSON Schema that refuses undocumented keys."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if isinstance(node.get("properties"), dict):
        node["properties"] = {name: strict(sub) for name, sub in node["properties"].items()}
        node.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            node[key] = strict(node[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            node[key] = [strict(sub) for sub in node[key]]
    if node.pop("nullable", False):
        node = {"anyOf": [node, {"type": "null"}]}
    return node


@dataclass
class Conformance:
    """Checks responses against the schema and remembers which ones it saw."""

    schema: dict[str, Any]
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        schemas = self.schema["components"]["schemas"]
        self.components = {"schemas": {name: strict(sub) for name, sub in schemas.items()}}

    def problems_of(self, response: Any, method: str, template: str) -> list[str]:
        status = str(response.status_code)
        where = f"{method.upper()} {template} -> {status}"
        self.seen.add((template, method, status))
        operation = self.schema["paths"].get(template, {}).get(method)
        if operation is None:
            return [f"{where}: the operation is not documented"]
        documented = operation["responses"].get(status)
        if documented is None:
            return [
                f"{where}: status not documented (documented: {sorted(operation['responses'])})"
            ]
        content = documented.get("content") or {}
        if not content:
            return [f"{where}: a body, documented without one"] if response.content else []
        media = response.get("Content-Type", "").split(";")[0].strip()
        if media not in content:
            # A documented range (``*/*``, ``image/*``) covers the media types in it.
            media = next((r for r in ("*/*", media.split("/")[0] + "/*") if r in content), media)
        if media not in content:
            return [f"{where}: media type {media!r} not documented ({sorted(content)})"]
        if media != "application/json":
            return []
        body = json.loads(response.content)
        validator = Draft202012Validator(
            {**strict(content[media]["schema"]), "components": self.components}
        )
        return [
            f"{where}: {error.message} at {'/'.join(map(str, error.absolute_path)) or 'the body'}"
            for error in sorted(validator.iter_errors(body), key=str)
        ]

    def check(self, response: Any, method: str, template: str) -> Any:
        self.problems.extend(self.problems_of(response, method, template))
        return response

    def documented(self) -> set[tuple[str, str, str]]:
        return {
            (path, method, status)
            for path, operations in self.schema["paths"].items()
            for method, operation in operations.items()
            for status in operation["responses"]
        }


@pytest.fixture
def conformance() -> Conformance:
    response = APIClient().get("/v1/schema?format=json")
    assert response.status_code == 200
    return Conformance(json.loads(response.content))


@dataclass
class Caller:
    """One identity (or none) calling the API by path template; every response is checked."""

    client: APIClient
    conformance: Conformance

    def __call__(
        self,
        method: str,
        template: str,
        data: Any = None,
        *,
        query: str = "",
        format: str | None = "json",
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
        **params: str,
    ) -> Any:
        path = template.format(**params) + query
        kwargs: dict[str, Any] = dict(headers or {})
        if content_type is not None:
            kwargs["content_type"] = content_type
        elif data is not None:
            kwargs["format"] = format
        response = getattr(self.client, method)(path, data, **kwargs)
        return self.conformance.check(response, method, template)


@pytest.fixture
def caller(
    client_for: Callable[[str | None], APIClient], conformance: Conformance
) -> Callable[[str | None], Caller]:
    return lambda user: Caller(client_for(user), conformance)


def online_runner(owner: str) -> Runner:
    """A runner that reads online (the binding's ``session.open`` goes to the in-memory layer)."""
    now = timezone.now()
    return Runner.objects.create(
        id="runner_token_conformance",
        name="laptop",
        owner=get_or_create_user(owner),
        channel_name="specific.conformance!x",
        connected_at=now,
        last_seen_at=now,
        runner_version="1.0",
    )


def add_turns(session_id: str) -> tuple[str, str]:
    """A completed turn with output and a failed one, as the runner would leave them."""
    session = Session.objects.get(pk=session_id)
    done = Turn.objects.create(session=session, status="completed", completed_at=timezone.now())
    failed = Turn.objects.create(
        session=session, status="failed", error={"code": "timeout", "message": "too slow"}
    )
    Item.objects.create(
        session=session,
        id="item_out",
        type="message",
        response_id=done.id,
        data={"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    )
    Item.objects.create(
        session=session,
        id="call_1",
        type="function_call",
        status="action_required",
        response_id=done.id,
        data={"call_id": "call_1", "name": "lookup", "arguments": "{}"},
    )
    Session.objects.filter(pk=session_id).update(
        status="failed", last_task_error={"code": "timeout", "message": "too slow"}
    )
    return done.id, failed.id


def add_changes(session_id: str) -> None:
    apply_workspace_changes(
        session=Session.objects.get(pk=session_id),
        payload={
            "environment_id": "default",
            "mode": "git",
            "entries": [
                {
                    "path": "sub/hello.txt",
                    "name": "hello.txt",
                    "status": "modified",
                    "bytes": 12,
                    "modified_at": 1718000000,
                    "lines_added": 1,
                    "lines_removed": 1,
                    "before": "hi\n",
                    "after": "hello\n",
                },
                {"path": "gone.txt", "status": "deleted"},
            ],
        },
    )


# --- the scenario -------------------------------------------------------------------------


def exercise_agents(alice: Caller, bob: Caller, anon: Caller, make_bundle: Any) -> str:
    """Returns a template agent's id."""
    agents, agent = "/v1/agents", "/v1/agents/{agent_id}"
    created = alice("post", agents, {"bundle": upload(make_bundle("tmpl"))}, format="multipart")
    assert created.status_code == 201, created.content
    template = created.json()["id"]
    doomed = alice("post", agents, {"bundle": upload(make_bundle("doomed"))}, format="multipart")
    assert doomed.status_code == 201
    statuses = [
        alice("post", agents, {"bundle": upload(make_bundle("tmpl"))}, format="multipart"),
        alice("post", agents, {"bundle": upload(b"not a bundle")}, format="multipart"),
        alice("post", agents, {"bundle": "x"}),
        anon("post", agents, {"bundle": upload(make_bundle("x"))}, format="multipart"),
        alice("get", agents),
        alice("get", agents, query="?limit=1&order=asc"),
        alice("get", agents, query="?limit=0"),
        anon("get", agents),
        alice("get", agent, agent_id=template),
        alice("get", agent, agent_id="ag_unknown"),
        anon("get", agent, agent_id=template),
        bob("delete", agent, agent_id=doomed.json()["id"]),
        alice("delete", agent, agent_id=doomed.json()["id"]),
        alice("delete", agent, agent_id="ag_unknown"),
        anon("delete", agent, agent_id=template),
    ]
    assert [r.status_code for r in statuses] == [
        *[409, 400, 415, 401],
        *[200, 200, 400, 401],
        *[200, 404, 401],
        *[403, 200, 404, 401],
    ]
    with override_settings(OMNIGENT_MAX_BUNDLE_BYTES=10):
        big = alice("post", agents, {"bundle": upload(make_bundle("big"))}, format="multipart")
    assert big.status_code == 413
    return template


def exercise_sessions(
    alice: Caller, bob: Caller, anon: Caller, template: str, make_bundle: Any
) -> str:
    """Returns a session of ALICE's, BOB holding read on it."""
    sessions = "/v1/sessions"
    made = alice(
        "post",
        sessions,
        {"metadata": json.dumps({"title": "multipart"}), "bundle": upload(make_bundle())},
        format="multipart",
    )
    assert made.status_code == 201, made.content
    created = alice(
        "post",
        sessions,
        {
            "agent_id": template,
            "title": "JSON",
            "labels": {"team": "core"},
            "initial_items": [
                {"type": "message", "role": "user", "content": "hello"},
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            ],
        },
    )
    assert created.status_code == 201, created.content
    session_id = created.json()["id"]
    alice("put", SESSION + "/permissions", {"user_id": BOB, "level": 1}, session_id=session_id)
    statuses = [
        alice("post", sessions, {"agent_id": "ag_unknown"}),
        alice("post", sessions, {"agent_id": template, "model": "x"}),
        alice("post", sessions, "plain", content_type="text/plain"),
        anon("post", sessions, {"agent_id": template}),
        alice("get", sessions),
        alice("get", sessions, query="?sort_by=updated_at&order=asc&limit=1"),
        bob("get", sessions),
        alice("get", sessions, query="?sort_by=title"),
        anon("get", sessions),
        alice("get", SESSION, session_id=session_id),
        bob("get", SESSION, query="?include_items=false", session_id=session_id),
        alice("get", SESSION, session_id="conv_unknown"),
        anon("get", SESSION, session_id=session_id),
        alice("patch", SESSION, {"title": "renamed", "labels": {}}, session_id=session_id),
        alice("patch", SESSION, {"bogus": 1}, session_id=session_id),
        alice("patch", SESSION, "t", content_type="text/plain", session_id=session_id),
        bob("patch", SESSION, {"title": "mine"}, session_id=session_id),
        alice("patch", SESSION, {"title": "x"}, session_id="conv_unknown"),
        anon("patch", SESSION, {"title": "x"}, session_id=session_id),
        alice("get", SESSION + "/items", session_id=session_id),
        alice("get", SESSION + "/items", query="?order=desc&limit=1", session_id=session_id),
        alice("get", SESSION + "/items", query="?limit=1001", session_id=session_id),
        alice("get", SESSION + "/items", session_id="conv_unknown"),
        anon("get", SESSION + "/items", session_id=session_id),
        bob("get", SESSION + "/agent", session_id=session_id),
        alice("get", SESSION + "/agent", session_id="conv_unknown"),
        anon("get", SESSION + "/agent", session_id=session_id),
    ]
    assert [r.status_code for r in statuses] == [
        *[404, 400, 415, 401],
        *[200, 200, 200, 400, 401],
        *[200, 200, 404, 401],
        *[200, 400, 415, 403, 404, 401],
        *[200, 200, 400, 404, 401],
        *[200, 404, 401],
    ]
    assert made.json().keys() == {"session_id", "agent_id", "agent_name"}
    etag = alice("get", SESSION, session_id=session_id)["ETag"]
    unchanged = alice("get", SESSION, headers={"HTTP_IF_NONE_MATCH": etag}, session_id=session_id)
    assert unchanged.status_code == 304
    with override_settings(OMNIGENT_MAX_BUNDLE_BYTES=10):
        big = alice("post", sessions, {"bundle": upload(make_bundle())}, format="multipart")
    assert big.status_code == 413

    runner = online_runner(ALICE)
    bound = alice("patch", SESSION, {"runner_id": runner.id}, session_id=session_id)
    assert bound.status_code == 200 and bound.json()["runner_id"] == runner.id
    listed = alice("get", "/v1/sessions")
    assert any(row["runner_id"] == runner.id for row in listed.json()["data"])
    unbound = alice("patch", SESSION, {"runner_id": ""}, session_id=session_id)
    assert unbound.status_code == 200 and unbound.json()["runner_id"] is None
    return session_id


def exercise_responses(alice: Caller, bob: Caller, anon: Caller, session_id: str) -> None:
    done, failed = add_turns(session_id)
    responses, response = SESSION + "/responses", SESSION + "/responses/{response_id}"
    statuses = [
        bob("get", responses, session_id=session_id),
        alice("get", responses, query="?order=desc&limit=1", session_id=session_id),
        alice("get", responses, query="?order=sideways", session_id=session_id),
        alice("get", responses, session_id="conv_unknown"),
        anon("get", responses, session_id=session_id),
        alice("get", response, session_id=session_id, response_id=done),
        alice("get", response, session_id=session_id, response_id=failed),
        alice("get", response, session_id=session_id, response_id="resp_unknown"),
        anon("get", response, session_id=session_id, response_id=done),
        # The snapshot and the list again, now with a failed turn and flat outputs.
        alice("get", SESSION, session_id=session_id),
        alice("get", "/v1/sessions"),
        alice("get", SESSION + "/items", session_id=session_id),
    ]
    assert [r.status_code for r in statuses] == [
        *[200, 200, 400, 404, 401],
        *[200, 200, 404, 401],
        *[200, 200, 200],
    ]
    assert statuses[0].json()["data"][0]["output"], "the completed turn has output"


def exercise_permissions(
    alice: Caller, bob: Caller, carol: Caller, anon: Caller, session_id: str
) -> None:
    grants, grant = SESSION + "/permissions", SESSION + "/permissions/{user_id}"
    statuses = [
        alice("put", grants, {"user_id": CAROL, "level": 2}, session_id=session_id),
        alice("put", grants, {"user_id": CAROL, "level": 9}, session_id=session_id),
        alice("put", grants, {"user_id": ALICE, "level": 1}, session_id=session_id),
        alice("put", grants, "x", content_type="text/plain", session_id=session_id),
        alice("put", grants, {"user_id": CAROL, "level": 1}, session_id="conv_unknown"),
        anon("put", grants, {"user_id": CAROL, "level": 1}, session_id=session_id),
        alice("get", grants, session_id=session_id),
        alice("get", grants, query="?limit=1", session_id=session_id),
        alice("get", grants, query="?limit=x", session_id=session_id),
        bob("get", grants, session_id=session_id),
        alice("get", grants, session_id="conv_unknown"),
        anon("get", grants, session_id=session_id),
        carol("delete", grant, session_id=session_id, user_id=CAROL),
        bob("delete", grant, session_id=session_id, user_id=ALICE),
        alice("delete", grant, session_id=session_id, user_id="nobody@example.com"),
        anon("delete", grant, session_id=session_id, user_id=BOB),
    ]
    assert [r.status_code for r in statuses] == [
        *[200, 400, 403, 415, 404, 401],
        *[200, 200, 400, 403, 404, 401],
        *[204, 403, 404, 401],
    ]


def exercise_events_and_stream(
    alice: Caller, bob: Caller, anon: Caller, session_id: str, other_id: str
) -> None:
    events = SESSION + "/events"
    statuses = [
        alice("post", events, {"type": "interrupt"}, session_id=session_id),
        alice("post", events, {"type": "dance"}, session_id=session_id),
        alice("post", events, "x", content_type="text/plain", session_id=session_id),
        bob("post", events, {"type": "interrupt"}, session_id=session_id),
        alice("post", events, {"type": "interrupt"}, session_id="conv_unknown"),
        anon("post", events, {"type": "interrupt"}, session_id=session_id),
        alice(
            "post",
            events,
            {"type": "message", "data": {"role": "user", "content": "hi"}},
            session_id=other_id,
        ),
        alice(
            "post",
            events,
            {"type": "function_call_output", "data": {"call_id": "c1", "output": "42"}},
            session_id=other_id,
        ),
        alice("get", STREAM, session_id="conv_unknown"),
        anon("get", STREAM, session_id=session_id),
    ]
    assert [r.status_code for r in statuses] == [
        *[202, 400, 415, 403, 404, 401, 503, 503],
        *[404, 401],
    ]
    # The stream itself: its status and media type are checked, its body is not read (it
    # never ends) nor closed (closing fires request_finished, which closes the test
    # database's connection). Nothing has started: the event source starts when iterated.
    stream = alice("get", STREAM, headers={"HTTP_LAST_EVENT_ID": "0"}, session_id=session_id)
    assert stream.status_code == 200 and stream.streaming
    # The session-list updates stream, the same way.
    updates = alice("get", "/v1/sessions/updates")
    assert updates.status_code == 200 and updates.streaming
    assert anon("get", "/v1/sessions/updates").status_code == 401
    # An unknown ``?format=`` is DRF's 404 (found by the schemathesis run, tests/fuzz).
    unknown_format = alice("get", "/v1/sessions/updates", query="?format=nope")
    assert unknown_format.status_code == 404
    bad_resume = alice("get", "/v1/sessions/updates", headers={"HTTP_LAST_EVENT_ID": "x1"})
    assert bad_resume.status_code == 400
    # Past the open-stream bound, both streams are 429 (tests/consumers/test_stream_limit_asgi.py).
    with override_settings(OMNIGENT_MAX_STREAMS_PER_USER=1):
        held = stream_slots.try_acquire(str(get_or_create_user(ALICE).pk), limit=1)
        assert held is not None
        try:
            assert alice("get", STREAM, session_id=session_id).status_code == 429
            assert alice("get", "/v1/sessions/updates").status_code == 429
        finally:
            held.release()


def exercise_changes(alice: Caller, anon: Caller, session_id: str) -> None:
    add_changes(session_id)
    ids = {"session_id": session_id, "env": "default"}
    statuses = [
        alice("get", CHANGES, **ids),
        alice("get", CHANGES, session_id=session_id, env="scratch"),
        anon("get", CHANGES, **ids),
        alice("get", DIFF, path="sub/hello.txt", **ids),
        alice("get", DIFF, path="gone.txt", **ids),
        alice("get", DIFF, path="a/../b", **ids),
        alice("get", DIFF, path="never.txt", **ids),
        anon("get", DIFF, path="sub/hello.txt", **ids),
    ]
    assert [r.status_code for r in statuses] == [200, 404, 401, 200, 200, 400, 404, 401]


def exercise_runners(alice: Caller, bob: Caller, anon: Caller) -> None:
    runners, runner, status = (
        "/v1/runners",
        "/v1/runners/{runner_id}",
        "/v1/runners/{runner_id}/status",
    )
    created = alice("post", runners, {"name": "ci-box"})
    assert created.status_code == 201
    runner_id = created.json()["runner_id"]
    statuses = [
        alice("post", runners),
        alice("post", runners, {"bogus": 1}),
        alice("post", runners, "x", content_type="text/plain"),
        anon("post", runners, {"name": "x"}),
        alice("get", runners),
        anon("get", runners),
        alice("get", runner, runner_id=runner_id),
        alice("get", runner, runner_id="runner_token_conformance"),
        bob("get", runner, runner_id=runner_id),
        anon("get", runner, runner_id=runner_id),
        alice("get", status, runner_id=runner_id),
        alice("get", status, runner_id="runner_token_conformance"),
        bob("get", status, runner_id=runner_id),
        anon("get", status, runner_id=runner_id),
        bob("delete", runner, runner_id=runner_id),
        alice("delete", runner, runner_id=runner_id),
        anon("delete", runner, runner_id=runner_id),
    ]
    assert [r.status_code for r in statuses] == [
        *[201, 400, 415, 401],
        *[200, 401],
        *[200, 200, 404, 401],
        *[200, 200, 200, 401],
        *[404, 200, 401],
    ]


def exercise_audit(alice: Caller, anon: Caller) -> None:
    """The audit log: a page, the JSON Lines stream, bad filters, no identity."""
    page = alice("get", "/v1/audit", query="?limit=2")
    assert page.status_code == 200 and page.json()["data"]
    stream = alice("get", "/v1/audit", query="?format=jsonl")
    assert stream.status_code == 200 and stream.streaming
    statuses = [
        alice("get", "/v1/audit", query="?since=yesterday"),
        anon("get", "/v1/audit"),
    ]
    assert [r.status_code for r in statuses] == [400, 401]


def exercise_usage(alice: Caller, anon: Caller) -> None:
    """Usage: the report, a group, a bad range, another user's (not staff), no identity."""
    report = alice("get", "/v1/usage")
    assert report.status_code == 200 and report.json()["object"] == "usage_report"
    groups = alice("get", "/v1/usage", query="?group_by=model")
    assert groups.status_code == 200 and groups.json()["object"] == "list"
    statuses = [
        alice("get", "/v1/usage", query="?since=yesterday"),
        alice("get", "/v1/usage", query="?group_by=user"),
        anon("get", "/v1/usage"),
    ]
    assert [r.status_code for r in statuses] == [400, 403, 401]


def exercise_large_bodies(alice: Caller, template: str, session_id: str) -> None:
    """A JSON body beyond ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is a 413 in the error format."""
    padding = "x" * 4096
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        statuses = [
            alice("patch", SESSION, {"title": padding}, session_id=session_id),
            alice(
                "put",
                SESSION + "/permissions",
                {"user_id": padding, "level": 1},
                session_id=session_id,
            ),
            alice("post", SESSION + "/events", {"type": padding}, session_id=session_id),
            alice("post", "/v1/runners", {"name": padding}),
            alice("post", "/v1/sessions", {"agent_id": template, "title": padding}),
        ]
    assert [r.status_code for r in statuses] == [413] * 5


def exercise_hostile_input(alice: Caller, template: str, session_id: str) -> None:
    """Deep nesting, lone surrogates, wrong JSON types, malformed resume points: 400s in
    the error format (http-api.md, Input strictness)."""
    deep = "[" * 65 + "]" * 65
    raw = "application/json"
    events = SESSION + "/events"
    statuses = [
        alice(
            "post",
            "/v1/sessions",
            f'{{"agent_id": "{template}", "title": {deep}}}',
            content_type=raw,
        ),
        alice(
            "patch",
            SESSION,
            f'{{"labels": {{"\\ud800": {deep}}}}}',
            content_type=raw,
            session_id=session_id,
        ),
        alice(
            "put",
            SESSION + "/permissions",
            f'{{"user_id": {deep}, "level": 1}}',
            content_type=raw,
            session_id=session_id,
        ),
        alice(
            "post",
            events,
            '{"type": "message", "data": {"content": "\\udfff"}}',
            content_type=raw,
            session_id=session_id,
        ),
        alice("post", "/v1/runners", f'{{"name": {deep}}}', content_type=raw),
        alice("post", "/v1/runners", {"name": 0}),
        alice(
            "post",
            events,
            {"type": "function_call_output", "data": {"call_id": 5, "output": "x"}},
            session_id=session_id,
        ),
        alice("get", STREAM, headers={"HTTP_LAST_EVENT_ID": "9" * 5000}, session_id=session_id),
        alice("get", STREAM, query="?after=%C2%B2", session_id=session_id),
    ]
    assert [r.status_code for r in statuses] == [400] * 9


def exercise_pin(alice: Caller, anon: Caller, admin: Caller, session_id: str) -> None:
    """A session pinned in the caller's own list; an admin without a grant has none."""
    pin = SESSION + "/pin"
    statuses = [
        alice("put", pin, session_id=session_id),
        alice("delete", pin, session_id=session_id),
        alice("put", pin, session_id="conv_missing"),
        alice("delete", pin, session_id="conv_missing"),
        anon("put", pin, session_id=session_id),
        anon("delete", pin, session_id=session_id),
        admin("put", pin, session_id=session_id),
        admin("delete", pin, session_id=session_id),
    ]
    assert [r.status_code for r in statuses] == [200, 200, 404, 404, 401, 401, 403, 403]


def exercise_deletes_and_identity(
    alice: Caller, bob: Caller, anon: Caller, session_id: str
) -> None:
    statuses = [
        alice("get", "/v1/me"),
        anon("get", "/v1/me"),
        alice("get", "/v1/inbox"),
        anon("get", "/v1/inbox"),
        anon("get", "/v1/"),
        bob("delete", SESSION, session_id=session_id),
        anon("delete", SESSION, session_id=session_id),
        alice("delete", SESSION, session_id=session_id),
        alice("delete", SESSION, session_id=session_id),
    ]
    assert [r.status_code for r in statuses] == [200, 401, 200, 401, 200, 403, 401, 200, 404]


def exercise_rate_limits(alice: Caller, conformance: Conformance, session_id: str) -> None:
    """Past the per-user rates, every authenticated operation answers 429.

    DRF checks the throttle after the permission (a session the caller may see) and
    before the view looks at other ids or bodies, so placeholders do for those. The
    snapshot ``GET`` counts against the poll rate, everything else against the user rate.
    """
    from django.conf import settings
    from django.core.cache import caches

    pending = sorted(
        (path, method)
        for path, method, status in conformance.documented() - conformance.seen
        if status == "429"
    )
    assert pending, "the user rate documents a 429 on the authenticated operations"
    caches["throttle"].clear()
    with override_settings(
        OMNIGENT_THROTTLE_USER_RATE="1/hour", OMNIGENT_THROTTLE_POLL_RATE="1/hour"
    ):
        assert settings.OMNIGENT_THROTTLE_USER_RATE == "1/hour"
        alice("get", "/v1/sessions")  # uses up the hour's one request
        alice("get", SESSION, session_id=session_id)  # and the hour's one poll
        for path, method in pending:
            params = {name: "placeholder" for name in _path_parameters(path)}
            if "session_id" in params:
                params["session_id"] = session_id
            response = alice(method, path, **params)
            assert response.status_code == 429, (method, path, response.status_code)
            assert int(response["Retry-After"]) >= 1
    caches["throttle"].clear()


def exercise_cross_site_refusals(alice: Caller, conformance: Conformance, session_id: str) -> None:
    """Every state change answers 403 when the browser says another site sent it, and 415
    to a form body (omnigent_site/cross_site.py); both before the view looks at ids."""
    for refused, kwargs in (
        ("403", {"headers": {"HTTP_ORIGIN": "https://evil.example"}}),
        ("415", {"data": "a=1", "content_type": "application/x-www-form-urlencoded"}),
    ):
        pending = sorted(
            (path, method)
            for path, method, status in conformance.documented() - conformance.seen
            if status == refused
        )
        for path, method in pending:
            params = {name: "placeholder" for name in _path_parameters(path)}
            if "session_id" in params:
                params["session_id"] = session_id
            response = alice(method, path, **kwargs, **params)
            assert str(response.status_code) == refused, (method, path, response.status_code)


def exercise_budgets(alice: Caller, root: Caller, anon: Caller, session_id: str) -> None:
    """Budgets: the session's (PATCH), a user's daily budget (staff), its refusals."""
    patched = alice("patch", "/v1/sessions/{session_id}", {"budget_usd": 3}, session_id=session_id)
    assert patched.status_code == 200 and patched.json()["budget_usd"] == 3.0
    put = root("put", "/v1/users/{user_id}/budget", {"daily_usd": 20}, user_id=ALICE)
    assert put.status_code == 200 and put.json()["daily_usd"] == 20.0
    statuses = [
        root("get", "/v1/users/{user_id}/budget", user_id=ALICE),
        root("put", "/v1/users/{user_id}/budget", {"daily_usd": "20"}, user_id=ALICE),
        root("get", "/v1/users/{user_id}/budget", user_id="nobody@example.com"),
        root("put", "/v1/users/{user_id}/budget", {"daily_usd": 1}, user_id="nobody@example.com"),
        alice("get", "/v1/users/{user_id}/budget", user_id=ALICE),
        alice("put", "/v1/users/{user_id}/budget", {"daily_usd": 1}, user_id=ALICE),
        anon("get", "/v1/users/{user_id}/budget", user_id=ALICE),
        anon("put", "/v1/users/{user_id}/budget", {"daily_usd": 1}, user_id=ALICE),
    ]
    assert [r.status_code for r in statuses] == [200, 400, 404, 404, 403, 403, 401, 401]
    cleared = root("put", "/v1/users/{user_id}/budget", {"daily_usd": None}, user_id=ALICE)
    assert cleared.status_code == 200


def _path_parameters(template: str) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def test_every_response_matches_its_documented_schema(
    caller: Callable[[str | None], Caller], conformance: Conformance, make_bundle: Any
) -> None:
    alice, bob, carol, anon = caller(ALICE), caller(BOB), caller(CAROL), caller(None)
    template = exercise_agents(alice, bob, anon, make_bundle)
    session_id = exercise_sessions(alice, bob, anon, template, make_bundle)
    other = alice("post", "/v1/sessions", {"agent_id": template}).json()["id"]
    exercise_responses(alice, bob, anon, session_id)
    exercise_permissions(alice, bob, carol, anon, session_id)
    exercise_events_and_stream(alice, bob, anon, session_id, other)
    exercise_approvals(alice, bob, anon, session_id)
    exercise_changes(alice, anon, session_id)
    exercise_workspace(alice, bob, anon, template)
    exercise_runners(alice, bob, anon)
    exercise_webhooks(alice, bob, anon)
    exercise_audit(alice, anon)
    exercise_usage(alice, anon)
    exercise_schedules(carol, alice, anon, template)
    exercise_large_bodies(alice, template, session_id)
    exercise_hostile_input(alice, template, session_id)
    exercise_session_files(alice, bob, anon, session_id)
    exercise_fork(alice, anon, session_id)
    exercise_transfer(alice, anon, session_id)
    admin = get_or_create_user("root@example.com")
    admin.is_staff = True
    admin.save(update_fields=["is_staff"])
    exercise_pin(alice, anon, caller("root@example.com"), session_id)
    exercise_budgets(alice, caller("root@example.com"), anon, session_id)
    exercise_deletes_and_identity(alice, bob, anon, session_id)
    exercise_cross_site_refusals(alice, conformance, other)
    exercise_rate_limits(alice, conformance, other)

    assert conformance.problems == [], "\n".join(conformance.problems)
    missing = conformance.documented() - conformance.seen - set(NOT_PRODUCED)
    assert not missing, f"documented but never produced here: {sorted(missing)}"
    assert set(NOT_PRODUCED) <= conformance.documented(), "NOT_PRODUCED lists a stale entry"


def test_the_check_fails_when_it_should(
    caller: Callable[[str | None], Caller], conformance: Conformance, create_session: Any
) -> None:
    """An extra field (top level or nested), a missing field, a wrong type, a value outside
    an enum, an undocumented status: each is reported, naming what is wrong."""
    session_id = create_session(ALICE)
    Item.objects.create(session_id=session_id, id="item_1", type="message", data={"role": "user"})
    response = caller(ALICE)("get", SESSION, session_id=session_id)
    assert conformance.problems == []
    good = response.json()

    def problems_with(body: dict[str, Any], status: int = 200) -> str:
        fake = copy.copy(response)
        fake.status_code = status
        fake.content = json.dumps(body).encode()
        return "\n".join(conformance.problems_of(fake, "get", SESSION))

    assert problems_with(good) == ""
    assert "'surprise' was unexpected" in problems_with({**good, "surprise": 1})
    nested = {**good, "items": [{**good["items"][0], "surprise": 1}]}
    assert "('surprise' was unexpected) at items/0" in problems_with(nested)
    missing = {key: value for key, value in good.items() if key != "runner_online"}
    assert "'runner_online' is a required property" in problems_with(missing)
    assert "at created_at" in problems_with({**good, "created_at": "yesterday"})
    assert "at status" in problems_with({**good, "status": "sleeping"})
    assert "at last_task_error" in problems_with({**good, "last_task_error": {"code": "x"}})
    assert problems_with({**good, "title": None, "last_task_error": None}) == ""
    assert "status not documented" in problems_with(good, status=418)
    error = {"error": {"code": "not_found", "message": "no such session"}}
    assert problems_with(error, status=404) == ""
    assert "'message' is a required property" in problems_with(
        {"error": {"code": "not_found"}}, status=404
    )


def test_item_header_is_what_the_model_renders() -> None:
    """Items are rendered by ``Item.header`` (sessions/models.py), documented by ``ItemHeader``."""
    item = Item(id="item_x", type="message", created_at=timezone.now())
    assert list(item.header()) == list(ItemHeader.__annotations__)
