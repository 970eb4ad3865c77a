"""``GET /v1/inbox``: what waits for the caller across sessions (docs/web.md, Inbox):
open questions where they may answer (edit or more), their failed sessions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runners import runner_events
from sessions.models import Session

from .conftest import ALICE, BOB, ask

pytestmark = pytest.mark.django_db

USER_MESSAGE = {"role": "user", "content": [{"type": "input_text", "text": "go"}]}


def _ask(session_id: str, call_id: str = "call_1") -> str:
    _item, turn = runner_events.accept_message(
        session_id=session_id, created_by=ALICE, data=USER_MESSAGE, tools=[]
    )
    return ask(session_id, turn=turn, call_id=call_id).id


def test_the_inbox_lists_questions_where_the_user_may_answer_and_failed_sessions(
    client_for: Callable[[str | None], Any],
    create_session: Callable[..., str],
    grant: Callable[..., None],
    django_assert_max_num_queries: Callable[..., Any],
) -> None:
    asked = create_session(ALICE, title="asks")
    shared_read = create_session(ALICE, title="read only for bob")
    failed = create_session(ALICE, title="broke")
    quiet = create_session(ALICE, title="quiet")
    question = _ask(asked)
    _ask(shared_read)
    grant(asked, BOB, 2)
    grant(shared_read, BOB, 1)
    grant(failed, BOB, 1)
    error = {"code": "llm_error", "message": "the model refused"}
    Session.objects.filter(pk=failed).update(status="failed", last_task_error=error)
    assert quiet

    alice = client_for(ALICE).get("/v1/inbox")
    assert alice.status_code == 200
    body = alice.json()
    assert body["object"] == "inbox"
    assert [(row["session_id"], row["session_title"]) for row in body["approvals"]] == [
        (asked, "asks"),
        (shared_read, "read only for bob"),
    ]
    first = body["approvals"][0]
    assert (first["elicitation_id"], first["tool"]) == (question, "sys_os_shell")
    assert isinstance(first["created_at"], int) and first["message"]
    assert [(row["session_id"], row["error"]) for row in body["failed"]] == [(failed, error)]
    assert body["count"] == 3

    # Bob may answer only where he can edit; he sees the failure of a session shared
    # with him read-only.
    with django_assert_max_num_queries(4):  # the user, the grants' approvals, failures
        bob = client_for(BOB).get("/v1/inbox").json()
    assert [row["session_id"] for row in bob["approvals"]] == [asked]
    assert [row["session_id"] for row in bob["failed"]] == [failed]
    assert bob["count"] == 2
    assert client_for("carol@example.com").get("/v1/inbox").json()["count"] == 0
    assert client_for(None).get("/v1/inbox").status_code in (401, 403)
