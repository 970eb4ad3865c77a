"""The OpenAPI schema documents each stream's events: the frame of each SSE operation
names, by type, the component of every event its stream sends (``x-events`` of
``data``), and each component lists its shape's fields."""

from __future__ import annotations

import json

import pytest

from sessions import stream_events, updates_events

from .conftest import ALICE

pytestmark = pytest.mark.django_db

STREAMS = [
    ("/v1/sessions/{session_id}/stream", stream_events.EVENTS),
    ("/v1/sessions/updates", updates_events.EVENTS),
]


@pytest.mark.parametrize(("path", "events"), STREAMS)
def test_each_stream_documents_every_event_shape(
    client_for, path: str, events: dict[str, type]
) -> None:
    response = client_for(ALICE).get("/v1/schema?format=json")
    schema = json.loads(response.content)
    components = schema["components"]["schemas"]
    content = schema["paths"][path]["get"]["responses"]["200"]["content"]
    frame_ref = content["text/event-stream"]["schema"]["$ref"]
    frame = components[frame_ref.rsplit("/", 1)[1]]
    documented = frame["properties"]["data"]["x-events"]
    assert list(documented) == list(events)
    for kind, shape in events.items():
        assert documented[kind] == {"$ref": f"#/components/schemas/{shape.__name__}"}
        component = components[shape.__name__]
        assert list(component["properties"]) == list(shape.__annotations__), kind
        assert f"`{kind}`" in frame["description"]
