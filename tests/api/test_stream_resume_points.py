"""Resume points of the streams: ``Last-Event-ID`` and ``?after=`` (issue 15, item 2).

Absent or blank: no resume point. 1 to 19 ASCII digits up to the largest int64: resume
after that event. Anything else: 400 ``invalid_input`` naming the parameter, never a 500
(``str.isdigit`` took ``²``; ``int`` refused 5,000 digits) and never the value echoed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from omnigent_site.domain_errors import InvalidInput
from sessions.stream import parse_resume_point

from .conftest import ALICE, assert_error

pytestmark = pytest.mark.django_db

MALFORMED = [
    "9" * 5000,
    "9" * 20,
    "9223372036854775808",  # int64 max + 1
    "²",
    "١٢",  # Arabic-Indic digits: str.isdigit() says yes
    "1\xff",  # a byte that is not ASCII, as a header arrives (latin-1)
    "\xe9",
    "-1",
    "+1",
    "1.5",
    "1e3",
    "0x10",
    "1 2",
    "abc",
]


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_resume_points_are_refused(value: str) -> None:
    with pytest.raises(InvalidInput) as header:
        parse_resume_point(value, None)
    assert header.value.field == "Last-Event-ID"
    with pytest.raises(InvalidInput) as query:
        parse_resume_point(None, value)
    assert query.value.field == "after"
    assert value not in header.value.public_message


@pytest.mark.parametrize(
    ("header", "query", "expected"),
    [
        (None, None, None),
        ("", None, None),
        ("  ", "", None),
        ("0", None, 0),
        (" 42 ", None, 42),
        (None, "7", 7),
        ("3", "9", 3),  # the header wins
        ("", "9", 9),
        ("9223372036854775807", None, 2**63 - 1),
        ("0000000000000000012", None, 12),
    ],
)
def test_valid_and_absent_resume_points(
    header: str | None, query: str | None, expected: int | None
) -> None:
    assert parse_resume_point(header, query) == expected


@pytest.mark.parametrize("path", ["/v1/sessions/{sid}/stream", "/v1/sessions/updates"])
@pytest.mark.parametrize("value", ["9" * 5000, "²", "1\xff", "-1"])
def test_the_streams_answer_400(
    client_for: Callable[[str | None], APIClient],
    create_session: Callable[..., str],
    path: str,
    value: str,
) -> None:
    url = path.format(sid=create_session(ALICE))
    client = client_for(ALICE)
    error = assert_error(client.get(url, HTTP_LAST_EVENT_ID=value), 400, "invalid_input")
    assert set(error["fields"]) == {"Last-Event-ID"}
    error = assert_error(client.get(url, {"after": value}), 400, "invalid_input")
    assert set(error["fields"]) == {"after"}


def test_an_empty_resume_point_streams_from_now(
    client_for: Callable[[str | None], APIClient], create_session: Callable[..., str]
) -> Any:
    # The body is not read (the stream never ends) nor closed (closing fires
    # request_finished, which closes the test database's connection).
    url = f"/v1/sessions/{create_session(ALICE)}/stream"
    response = client_for(ALICE).get(url + "?after=", HTTP_LAST_EVENT_ID="")
    assert response.status_code == 200 and response.streaming
