"""Hostile JSON at every JSON endpoint: 400 in the error format, nothing stored (issue 15).

http-api.md, Input strictness: nesting deeper than 64 levels and lone surrogates are a
400 ``invalid_input`` before anything is stored, types are checked rather than coerced
(each field given the wrong JSON type is a 400 naming it), and a malformed resume point
of the stream is a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from runners.models import Runner
from sessions.models import Item, Permission, Session, Turn

from .conftest import ALICE, BOB, assert_error, upload

pytestmark = pytest.mark.django_db


def nested(depth: int) -> str:
    """JSON text of ``depth`` nested arrays around a number."""
    return "[" * depth + "1" + "]" * depth


@pytest.fixture
def template(client_for: Callable[[str | None], APIClient], make_bundle: Any) -> str:
    response = client_for(ALICE).post(
        "/v1/agents", {"bundle": upload(make_bundle("tmpl"))}, format="multipart"
    )
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


@pytest.fixture
def session_id(create_session: Callable[..., str]) -> str:
    return create_session(ALICE, title="keep")


def stored() -> tuple[int, ...]:
    return (
        Session.objects.count(),
        Item.objects.count(),
        Turn.objects.count(),
        Permission.objects.count(),
        Runner.objects.count(),
    )


# Each JSON endpoint, with a body whose ``{}`` slot holds the hostile value.
ENDPOINTS = {
    "create": ("post", "/v1/sessions", '{{"agent_id": "{template}", "labels": {{"a": {}}}}}'),
    "create_items": (
        "post",
        "/v1/sessions",
        '{{"agent_id": "{template}", "initial_items": [{{"type": "x", "blob": {}}}]}}',
    ),
    "patch": ("patch", "/v1/sessions/{session}", '{{"title": {}}}'),
    "grant": ("put", "/v1/sessions/{session}/permissions", '{{"user_id": {}, "level": 1}}'),
    "message": (
        "post",
        "/v1/sessions/{session}/events",
        '{{"type": "message", "data": {{"role": "user", "content": {}}}}}',
    ),
    "tool_parameters": (
        "post",
        "/v1/sessions/{session}/events",
        '{{"type": "message", "data": {{"content": "hi"}}, "tools": [{{"type": "function", '
        '"function": {{"name": "f", "parameters": {}}}}}]}}',
    ),
    "runner": ("post", "/v1/runners", '{{"name": {}}}'),
}


def send(client: APIClient, endpoint: str, value: str, template: str, session: str) -> Any:
    method, path, body = ENDPOINTS[endpoint]
    raw = body.format(value, template=template)
    return getattr(client, method)(
        path.format(session=session), raw.encode("utf-8"), content_type="application/json"
    )


# --- deep nesting -------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [64, 500, 990, 5000])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_nesting_deeper_than_64_is_400_and_nothing_is_stored(
    client_for: Callable[[str | None], APIClient],
    template: str,
    session_id: str,
    endpoint: str,
    depth: int,
) -> None:
    """The whole body nests deeper than 64 (the value sits one level or more inside).
    At ~500 levels a message used to be stored and then answered 503; at ~1,000 every
    endpoint answered 500."""
    before = stored()
    response = send(client_for(ALICE), endpoint, nested(depth), template, session_id)
    assert_error(response, 400, "invalid_input", mentions="nesting deeper than 64 levels")
    assert stored() == before
    assert Session.objects.get(pk=session_id).title == "keep"


def test_nesting_up_to_64_levels_is_accepted(
    client_for: Callable[[str | None], APIClient], template: str
) -> None:
    # body 1 + initial_items 1 + item 1 + blob 61 = 64 levels.
    client = client_for(ALICE)
    ok = send(client, "create_items", nested(61), template, "")
    assert ok.status_code == 201, ok.content
    assert_error(
        send(client, "create_items", nested(62), template, ""),
        400,
        "invalid_input",
        mentions="deeper than 64",
    )


def test_the_depth_limit_is_a_setting(
    client_for: Callable[[str | None], APIClient], template: str, settings: Any
) -> None:
    settings.OMNIGENT_MAX_JSON_DEPTH = 8
    assert send(client_for(ALICE), "create_items", nested(5), template, "").status_code == 201
    response = send(client_for(ALICE), "create_items", nested(6), template, "")
    assert_error(response, 400, "invalid_input", mentions="nesting deeper than 8 levels")


def test_deep_json_in_the_multipart_metadata_is_400(
    client_for: Callable[[str | None], APIClient], make_bundle: Any
) -> None:
    for metadata in ('{"labels": {"a": ' + nested(100) + "}}", nested(5000)):
        response = client_for(ALICE).post(
            "/v1/sessions",
            {"metadata": metadata, "bundle": upload(make_bundle())},
            format="multipart",
        )
        error = assert_error(response, 400, "invalid_input", mentions="nesting deeper than 64")
        assert set(error["fields"]) == {"metadata"}
    assert Session.objects.count() == 0


# --- lone surrogates ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ['"\\ud800"', '"ok\\udfff"', '{"\\ud800": "\\udfff"}'])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_lone_surrogates_are_400_with_a_renderable_message(
    client_for: Callable[[str | None], APIClient],
    template: str,
    session_id: str,
    endpoint: str,
    value: str,
) -> None:
    before = stored()
    response = send(client_for(ALICE), endpoint, value, template, session_id)
    error = assert_error(response, 400, "invalid_input", mentions="lone surrogate")
    response.content.decode("utf-8")  # strict UTF-8: the body never carries the surrogate
    assert "\ud800" not in json.dumps(error, ensure_ascii=False)
    assert stored() == before


def test_a_lone_surrogate_label_key_and_value_in_the_multipart_metadata(
    client_for: Callable[[str | None], APIClient], make_bundle: Any
) -> None:
    response = client_for(ALICE).post(
        "/v1/sessions",
        {"metadata": '{"labels": {"\\ud800": "\\udfff"}}', "bundle": upload(make_bundle())},
        format="multipart",
    )
    assert_error(response, 400, "invalid_input", mentions="lone surrogate")
    assert Session.objects.count() == 0


# --- strict types (http-api.md, Input strictness) ------------------------------------------

# (endpoint, valid body, field, wrong values): each wrong value replaces the field.
WRONG_TYPES: list[tuple[str, str, dict[str, Any], str, list[Any]]] = [
    (
        "post",
        "/v1/sessions",
        {"agent_id": "{template}"},
        "agent_id",
        [5, True, 1.5, ["ag"], {"id": "ag"}],
    ),
    ("post", "/v1/sessions", {"agent_id": "{template}"}, "title", [5, False, ["t"], {"t": 1}]),
    ("post", "/v1/sessions", {"agent_id": "{template}"}, "labels", ["x", 5, ["a"], {"k": 5}]),
    (
        "post",
        "/v1/sessions",
        {"agent_id": "{template}"},
        "labels",
        [{"k": True}, {"k": None}, {"k": {"n": "v"}}],
    ),
    ("post", "/v1/sessions", {"agent_id": "{template}"}, "initial_items", ["x", {"a": 1}, [5]]),
    ("patch", "/v1/sessions/{session}", {}, "title", [5, True, ["t"]]),
    ("patch", "/v1/sessions/{session}", {}, "labels", ["x", [], {"k": 1}]),
    ("patch", "/v1/sessions/{session}", {}, "runner_id", [5, True, {"id": "r"}]),
    (
        "put",
        "/v1/sessions/{session}/permissions",
        {"user_id": BOB, "level": 1},
        "user_id",
        [5, True, [BOB], None],
    ),
    (
        "put",
        "/v1/sessions/{session}/permissions",
        {"user_id": BOB, "level": 1},
        "level",
        ["2", True, 2.0, "read", None, [2]],
    ),
    ("post", "/v1/sessions/{session}/events", {"type": "interrupt"}, "type", [5, True, None]),
    (
        "post",
        "/v1/sessions/{session}/events",
        {"type": "message", "data": {"content": "hi"}},
        "data",
        ["hi", 5, ["hi"]],
    ),
    (
        "post",
        "/v1/sessions/{session}/events",
        {"type": "message", "data": {"content": "hi"}},
        "tools",
        ["f", {"type": "function"}, [5]],
    ),
    ("post", "/v1/runners", {"name": "box"}, "name", [0, 5, True, ["box"], {"n": 1}]),
]
CASES = [
    pytest.param(method, path, body, field, wrong, id=f"{method} {path} {field}={wrong!r}")
    for method, path, body, field, values in WRONG_TYPES
    for wrong in values
]


def fill(value: Any, template: str, session: str) -> Any:
    if isinstance(value, str):
        return value.format(template=template, session=session)
    if isinstance(value, dict):
        return {key: fill(item, template, session) for key, item in value.items()}
    return value


@pytest.mark.parametrize(("method", "path", "body", "field", "wrong"), CASES)
def test_each_field_refuses_another_json_type(
    client_for: Callable[[str | None], APIClient],
    template: str,
    session_id: str,
    method: str,
    path: str,
    body: dict[str, Any],
    field: str,
    wrong: Any,
) -> None:
    before = stored()
    request = {**fill(body, template, session_id), field: wrong}
    response = getattr(client_for(ALICE), method)(
        fill(path, template, session_id), request, format="json"
    )
    error = assert_error(response, 400, "invalid_input")
    assert field in error.get("fields", {}), error
    assert stored() == before
    assert Session.objects.get(pk=session_id).title == "keep"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"call_id": 5, "output": "42"}, "call_id"),
        ({"call_id": True, "output": "42"}, "call_id"),
        ({"call_id": "c1", "output": 42}, "output"),
        ({"call_id": "c1", "output": {"v": 42}}, "output"),
        ({"call_id": None, "output": "42"}, "call_id"),
    ],
)
def test_function_call_output_fields_are_strict(
    client_for: Callable[[str | None], APIClient],
    session_id: str,
    data: dict[str, Any],
    field: str,
) -> None:
    """No runner is bound: a valid body would be a 503, a wrongly typed one is a 400."""
    response = client_for(ALICE).post(
        f"/v1/sessions/{session_id}/events",
        {"type": "function_call_output", "data": data},
        format="json",
    )
    error = assert_error(response, 400, "invalid_input")
    assert field in error["fields"], error


@pytest.mark.parametrize(
    ("metadata", "field"),
    [({"title": 5}, "title"), ({"labels": {"k": 5}}, "labels"), ({"labels": "x"}, "labels")],
)
def test_multipart_metadata_fields_are_strict(
    client_for: Callable[[str | None], APIClient],
    make_bundle: Any,
    metadata: dict[str, Any],
    field: str,
) -> None:
    response = client_for(ALICE).post(
        "/v1/sessions",
        {"metadata": json.dumps(metadata), "bundle": upload(make_bundle())},
        format="multipart",
    )
    error = assert_error(response, 400, "invalid_input")
    assert field in error["fields"], error
    assert Session.objects.count() == 0


def test_right_types_still_pass(
    client_for: Callable[[str | None], APIClient], template: str, session_id: str
) -> None:
    client = client_for(ALICE)
    created = client.post(
        "/v1/sessions",
        {"agent_id": template, "title": "t", "labels": {"k": "v"}, "initial_items": []},
        format="json",
    )
    assert created.status_code == 201, created.content
    granted = client.put(
        f"/v1/sessions/{session_id}/permissions", {"user_id": BOB, "level": 2}, format="json"
    )
    assert granted.status_code == 200, granted.content
    runner = client.post("/v1/runners", {"name": "box"}, format="json")
    assert runner.status_code == 201, runner.content
