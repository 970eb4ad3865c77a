"""``GET|PUT /v1/sessions/{id}/policies`` (approvals.md, Sources): the effective list with
each rule's source, validation (400 with ``fields``), permissions, the ask-timeout cap
and the audit of every change. The relay of ``policy.update`` to a running runner is in
``tests/consumers/test_approvals_relay.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from sessions.models import PolicyChange, Session

from .conftest import ALICE, BOB, CAROL, DAVE, assert_error, upload

pytestmark = pytest.mark.django_db

GUARDRAILS = """guardrails:
  ask_on_os_tools: true
  ask_timeout: 120
  policies:
    - {name: no-rm, tools: [sys_os_shell], when: {command: '\\brm\\s'}, action: deny, reason: no deleting}
"""

ASK_WRITES = {
    "name": "ask-writes",
    "tools": ["sys_os_write", "sys_os_edit"],
    "when": {"path": "^(?!docs/)"},
    "action": "ask",
    "reason": "outside docs/",
}
ALLOW_READS = {"name": "reads", "tools": ["sys_os_read"], "action": "allow"}


@pytest.fixture
def guarded_session(client_for, make_bundle) -> str:
    response = client_for(ALICE).post(
        "/v1/sessions",
        {"metadata": json.dumps({}), "bundle": upload(make_bundle(extra=GUARDRAILS))},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    return response.json()["session_id"]


def policies(client: Any, session_id: str) -> Any:
    return client.get(f"/v1/sessions/{session_id}/policies")


def put(client: Any, session_id: str, body: Any) -> Any:
    return client.put(f"/v1/sessions/{session_id}/policies", body, format="json")


BUNDLE_RULES = [
    {
        "name": "ask_on_os_tools",
        "tools": ["sys_os_*"],
        "action": "ask",
        "ask_timeout": 120.0,
        "source": "bundle",
    },
    {
        "name": "no-rm",
        "tools": ["sys_os_shell"],
        "action": "deny",
        "when": {"command": "\\brm\\s"},
        "reason": "no deleting",
        "source": "bundle",
    },
]


def test_a_session_without_rules_lists_none(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    response = policies(client_for(ALICE), session_id)
    assert response.status_code == 200
    assert response.json() == {"object": "list", "data": []}


def test_the_bundle_guardrails_are_listed_with_their_source(client_for, guarded_session) -> None:
    body = policies(client_for(ALICE), guarded_session).json()
    assert body == {"object": "list", "data": BUNDLE_RULES}


def test_put_replaces_the_session_rules_first_and_audits(client_for, guarded_session) -> None:
    client = client_for(ALICE)
    response = put(client, guarded_session, {"rules": [ASK_WRITES, ALLOW_READS]})
    assert response.status_code == 200, response.content
    expected = [
        {**ASK_WRITES, "ask_timeout": 120.0, "source": "session"},
        {**ALLOW_READS, "source": "session"},
        *BUNDLE_RULES,
    ]
    assert response.json() == {"object": "list", "data": expected}
    assert policies(client, guarded_session).json()["data"] == expected
    stored = Session.objects.get(pk=guarded_session).policy_rules
    assert stored == [ASK_WRITES, ALLOW_READS]  # as given: the timeout is filled on the way out

    assert put(client, guarded_session, {"rules": [ALLOW_READS]}).status_code == 200
    changes = list(PolicyChange.objects.filter(session_id=guarded_session).order_by("at", "id"))
    assert [(c.user.username, c.old_rules, c.new_rules) for c in changes] == [
        (ALICE, [], [ASK_WRITES, ALLOW_READS]),
        (ALICE, [ASK_WRITES, ALLOW_READS], [ALLOW_READS]),
    ]
    assert put(client, guarded_session, {"rules": []}).status_code == 200
    assert policies(client, guarded_session).json()["data"] == BUNDLE_RULES


def test_the_server_cap_bounds_every_ask_timeout(client_for, guarded_session) -> None:
    rule = {**ASK_WRITES, "ask_timeout": 5000}
    with override_settings(OMNIGENT_ASK_TIMEOUT_S=60):
        body = put(client_for(ALICE), guarded_session, {"rules": [rule]}).json()
    assert [row.get("ask_timeout") for row in body["data"]] == [60.0, 60.0, None]


BAD_RULES = [
    ({"rules": [{**ALLOW_READS, "action": "maybe"}]}, "rules.0.action"),
    ({"rules": [{**ALLOW_READS, "tools": []}]}, "rules.0.tools"),
    ({"rules": [ALLOW_READS, {**ASK_WRITES, "when": {"path": "(unclosed"}}]}, "rules.1.when.path"),
    ({"rules": [ALLOW_READS, ALLOW_READS]}, "rules.1.name"),
    ({"rules": [{**ASK_WRITES, "ask_timeout": 0}]}, "rules.0.ask_timeout"),
    ({"rules": [{**ASK_WRITES, "ask_timeout": 7 * 24 * 3600 + 1}]}, "rules.0.ask_timeout"),
    ({"rules": [{**ASK_WRITES, "when": {"path": "x" * 1001}}]}, "rules.0.when.path"),
    ({"rules": [{**ALLOW_READS, "surprise": 1}]}, "rules.0.surprise"),
    ({"rules": "all"}, "rules"),
    ({}, "rules"),
    ([ALLOW_READS], "rules"),
]


@pytest.mark.parametrize(("body", "field"), BAD_RULES, ids=range(len(BAD_RULES)))
def test_bad_rules_are_400_naming_the_field_and_change_nothing(
    client_for, guarded_session, body, field
) -> None:
    client = client_for(ALICE)
    assert put(client, guarded_session, {"rules": [ALLOW_READS]}).status_code == 200
    error = assert_error(put(client, guarded_session, body), 400, "invalid_input")
    assert field in error["fields"], error
    assert isinstance(error["fields"][field], str) and error["fields"][field]
    assert Session.objects.get(pk=guarded_session).policy_rules == [ALLOW_READS]
    assert PolicyChange.objects.filter(session_id=guarded_session).count() == 1


def test_permissions_read_reads_manage_writes(client_for, create_session, grant) -> None:
    session_id = create_session(ALICE)
    grant(session_id, BOB, 1)
    grant(session_id, CAROL, 2)
    grant(session_id, DAVE, 3)
    body = {"rules": [ALLOW_READS]}
    assert policies(client_for(BOB), session_id).status_code == 200
    assert_error(put(client_for(BOB), session_id, body), 403, "forbidden", mentions="manage")
    assert_error(put(client_for(CAROL), session_id, body), 403, "forbidden")
    # The permission check comes before validation.
    assert_error(put(client_for(CAROL), session_id, {"rules": 1}), 403, "forbidden")
    stranger = client_for("mallory@example.com")
    assert_error(policies(stranger, session_id), 404, "not_found")
    assert_error(put(stranger, session_id, body), 404, "not_found")
    assert_error(policies(client_for(ALICE), "conv_unknown"), 404, "not_found")
    assert put(client_for(DAVE), session_id, body).status_code == 200
    change = PolicyChange.objects.get(session_id=session_id)
    assert change.user.username == DAVE
