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


# --- text that is not UTF-8 ----------------------------------------------------------------

# Raw bytes, not escapes: each makes UTF-8 decoding fail in its own way.
NOT_UTF8 = {
    "brief": b"\xff\xfe\xc3(",
    "overlong": b"\xc0\xaf",
    "encoded_surrogate": b"\xed\xa0\x80",
    "truncated": b"ok\xe2\x82",
    "lone_continuation": b"\x80",
    "truncated_at_the_end": b"\xc3",
}
NOT_UTF8_PARAMS = [pytest.param(raw, id=name) for name, raw in NOT_UTF8.items()]


def send_bytes(client: APIClient, endpoint: str, raw: bytes, template: str, session: str) -> Any:
    """``endpoint``'s body with ``raw`` as the bytes of a JSON string in the value slot."""
    method, path, body = ENDPOINTS[endpoint]
    data = body.format('"@@"', template=template).encode("utf-8").replace(b"@@", raw)
    return getattr(client, method)(
        path.format(session=session), data, content_type="application/json"
    )


def test_the_reported_bodies_are_400_not_500(
    client_for: Callable[[str | None], APIClient], session_id: str
) -> None:
    """The two requests of the report, byte for byte: both answered 500 before."""
    client = client_for(ALICE)
    before = stored()
    patched = client.patch(
        f"/v1/sessions/{session_id}",
        b'{"title": "\xff\xfe\xc3("}',
        content_type="application/json",
    )
    assert_error(patched, 400, "invalid_input", mentions="not UTF-8")
    posted = client.post(
        f"/v1/sessions/{session_id}/events",
        b'{"type":"message","data":{"role":"user","content":"\xc0\xaf\xed\xa0\x80"}}',
        content_type="application/json",
    )
    error = assert_error(posted, 400, "invalid_input", mentions="not UTF-8")
    assert "0xc0" in error["message"]  # names the byte, never echoes it
    assert stored() == before
    assert Session.objects.get(pk=session_id).title == "keep"


@pytest.mark.parametrize("raw", NOT_UTF8_PARAMS)
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_json_bodies_that_are_not_utf8_are_400_and_nothing_is_stored(
    client_for: Callable[[str | None], APIClient],
    template: str,
    session_id: str,
    endpoint: str,
    raw: bytes,
) -> None:
    before = stored()
    response = send_bytes(client_for(ALICE), endpoint, raw, template, session_id)
    assert_error(response, 400, "invalid_input", mentions="not UTF-8")
    response.content.decode("utf-8")
    assert stored() == before
    assert Session.objects.get(pk=session_id).title == "keep"


def multipart_body(*parts: tuple[str, bytes, str | None]) -> tuple[bytes, str]:
    """A multipart body of ``(name, bytes, filename)`` parts, built by hand so that the
    bytes go out exactly as given; returns it and its content type."""
    boundary = b"omnigent-test-boundary"
    out = b""
    for name, data, filename in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += b"--" + boundary + b"\r\nContent-Disposition: " + disposition.encode() + b"\r\n"
        if filename is not None:
            out += b"Content-Type: application/gzip\r\n"
        out += b"\r\n" + data + b"\r\n"
    out += b"--" + boundary + b"--\r\n"
    return out, f"multipart/form-data; boundary={boundary.decode()}"


@pytest.mark.parametrize("raw", NOT_UTF8_PARAMS)
def test_a_multipart_metadata_field_that_is_not_utf8_is_400(
    client_for: Callable[[str | None], APIClient], make_bundle: Any, raw: bytes
) -> None:
    """Django decoded the field with ``errors="replace"``: the session was created with
    U+FFFD in its title."""
    body, content_type = multipart_body(
        ("metadata", b'{"title": "' + raw + b'"}', None),
        ("bundle", make_bundle(), "bundle.tar.gz"),
    )
    response = client_for(ALICE).post("/v1/sessions", body, content_type=content_type)
    assert_error(response, 400, "invalid_input", mentions="not valid UTF-8")
    assert Session.objects.count() == 0


def test_valid_utf8_in_a_multipart_field_still_passes(
    client_for: Callable[[str | None], APIClient], make_bundle: Any
) -> None:
    body, content_type = multipart_body(
        ("metadata", '{"title": "café ☕ 𝄞"}'.encode(), None),
        ("bundle", make_bundle(), "bundle.tar.gz"),
    )
    response = client_for(ALICE).post("/v1/sessions", body, content_type=content_type)
    assert response.status_code == 201, response.content
    assert Session.objects.get().title == "café ☕ 𝄞"


@pytest.mark.parametrize(
    "encoded", ["%C0%AF", "%ED%A0%80", "ok%E2%82", "%80", "%FF%FE%C3(", "caf%C3%A9"]
)
def test_a_form_body_is_refused_before_its_text_is_read(
    client_for: Callable[[str | None], APIClient], encoded: str
) -> None:
    """A runner was registered named U+FFFD before; API bodies outside the uploads are
    JSON only now (security.md, Requests from other sites), so no form is decoded."""
    response = client_for(ALICE).post(
        "/v1/runners", f"name={encoded}", content_type="application/x-www-form-urlencoded"
    )
    assert_error(response, 415, "unsupported_media_type")
    assert Runner.objects.count() == 0


@pytest.mark.parametrize("encoded", ["%C0%AF", "%ED%A0%80", "%E2%82", "%80", "%FF"])
def test_a_query_string_that_is_not_utf8_is_400(
    client_for: Callable[[str | None], APIClient], session_id: str, encoded: str
) -> None:
    """Django turned these into U+FFFD: a filter matched nothing, a cursor was echoed
    as U+FFFD. A 400 says what is wrong instead (the URL's path, which daphne decodes,
    is checked in ``tests/consumers/test_not_utf8_asgi.py``)."""
    client = client_for(ALICE)
    for path in (
        f"/v1/sessions?agent_name={encoded}",
        f"/v1/sessions/{session_id}/items?after=item_{encoded}",
    ):
        response = client.get(path)
        assert_error(response, 400, "invalid_input", mentions="not valid UTF-8")
        assert "\ufffd" not in response.content.decode("utf-8")
    assert client.get("/v1/sessions?agent_name=caf%C3%A9").status_code == 200


@pytest.mark.parametrize("value", ['"a\\u0000b"', '{"k\\u0000": "v"}', '"\\udbff\\u0041"'])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_text_no_database_can_store_is_400_on_every_database(
    client_for: Callable[[str | None], APIClient],
    template: str,
    session_id: str,
    endpoint: str,
    value: str,
) -> None:
    """PostgreSQL refuses NUL in text and JSON where SQLite stores it, and neither can
    store a lone surrogate: the answer is the same 400 on both, decided before the
    write (CI runs this file on PostgreSQL too)."""
    before = stored()
    response = send(client_for(ALICE), endpoint, value, template, session_id)
    assert_error(response, 400, "invalid_input")
    assert stored() == before
