"""The browsable API as a person uses it: a bundle upload form on the agents and
sessions pages, and a session page that links its other endpoints."""

from __future__ import annotations

import re

import pytest

from .conftest import ALICE

pytestmark = pytest.mark.django_db


def html(client, path: str) -> str:
    response = client.get(path, HTTP_ACCEPT="text/html")
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/agents"])
def test_collection_pages_have_a_multipart_form_with_a_file_field(client_for, path) -> None:
    page = html(client_for(ALICE), path)
    assert 'enctype="multipart/form-data"' in page
    assert re.search(r'<input name="bundle"\s+type="file"', page)


def test_sessions_form_also_takes_metadata(client_for) -> None:
    assert 'name="metadata"' in html(client_for(ALICE), "/v1/sessions")


def test_the_form_posts_what_the_api_takes(client_for, make_bundle) -> None:
    """What the form sends (multipart: bundle, metadata) creates a session."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = client_for(ALICE)
    response = client.post(
        "/v1/sessions",
        {
            "bundle": SimpleUploadedFile("agent.tar.gz", make_bundle(), "application/gzip"),
            "metadata": '{"title": "from the form"}',
        },
        format="multipart",
        HTTP_ACCEPT="text/html",
    )
    assert response.status_code == 201


def test_session_page_links_its_endpoints(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    page = html(client_for(ALICE), f"/v1/sessions/{session_id}")
    for suffix in (
        "/items",
        "/responses",
        "/stream?after=0",
        "/resources/environments/default/changes",
        "/permissions",
    ):
        assert f'href="/v1/sessions/{session_id}{suffix}"' in page, suffix


def test_json_answers_are_unchanged(client_for, create_session) -> None:
    session_id = create_session(ALICE)
    body = client_for(ALICE).get(f"/v1/sessions/{session_id}", HTTP_ACCEPT="application/json")
    assert "Related" not in body.content.decode()
