"""Benchmark: rendering response bodies, typed-dict functions against DRF serializers.

The views render each response shape with a plain function whose result is a
``TypedDict`` (``sessions/shapes.py`` and the other apps' ``shapes.py``); the schema is
generated from the same class. The alternative was DRF serializers used for both
(``SessionOutSerializer(session).data``). This script measures both on the hot paths,
with serializers written here to produce exactly the same JSON (checked before timing):

1. Render only, µs per render, objects already loaded: the session snapshot with 10
   and 100 items, a page of 20 session list rows, 20 agents, 20 runners, one response
   with 10 output items.
2. The whole request in-process (Django test client, SQLite, ``DJANGO_DEBUG=0``), µs per
   request: ``GET /v1/sessions/{id}`` with 10 and 100 items, ``GET /v1/sessions``,
   ``GET /v1/agents`` and ``GET /v1/runners`` (20 rows each), once as the views are and
   once with the serializer swapped into the view.

Run: ``.venv/bin/python -m bench.render [-n 300] [--repeat 5]``.
The last line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import tempfile
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

USER = "bench@example.com"


@contextlib.contextmanager
def django_project(tmp: Path) -> Iterator[None]:
    """The project configured in this process on a fresh SQLite file, production-like."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="omnigent_site.settings",
        DATABASE_URL=f"sqlite:///{tmp / 'render.sqlite3'}",
        DJANGO_DEBUG="0",
        DJANGO_SECURE_SSL_REDIRECT="0",  # the test client speaks plain HTTP
        DJANGO_ALLOWED_HOSTS="testserver",  # ... to the test client's host
        DJANGO_SECRET_KEY=secrets.token_urlsafe(48),
        OMNIGENT_DATA_DIR=str(tmp / "data"),
        OMNIGENT_LOG_LEVEL="WARNING",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    yield


def drf_serializers() -> dict[str, Any]:
    """The DRF-serializer alternative, written for the same JSON as the shapes."""
    from rest_framework import serializers

    from omnigent_site.timeutil import unix

    class UnixField(serializers.Field):
        def to_representation(self, value: Any) -> Any:
            return unix(value)

    class AgentSerializer(serializers.Serializer):
        id = serializers.CharField()
        object = serializers.SerializerMethodField()
        name = serializers.CharField()
        description = serializers.CharField()
        created_at = UnixField()
        model = serializers.SerializerMethodField()
        version = serializers.IntegerField()

        def get_object(self, agent: Any) -> str:
            return "agent"

        def get_model(self, agent: Any) -> str | None:
            return agent.model or None

    class ItemSerializer(serializers.Serializer):
        id = serializers.CharField()
        type = serializers.CharField()
        status = serializers.CharField()
        response_id = serializers.CharField(allow_null=True)
        created_at = UnixField()
        created_by = serializers.CharField(allow_null=True)
        data = serializers.JSONField()

    class SessionRowSerializer(serializers.Serializer):
        id = serializers.CharField()
        object = serializers.SerializerMethodField()
        agent_id = serializers.CharField()
        agent_name = serializers.CharField(source="agent.name")
        status = serializers.CharField()
        created_at = UnixField()
        updated_at = UnixField()
        title = serializers.CharField(allow_null=True)
        labels = serializers.SerializerMethodField()
        runner_id = serializers.CharField(allow_null=True)
        runner_online = serializers.SerializerMethodField()
        last_task_error = serializers.JSONField(allow_null=True)
        active_response_id = serializers.CharField(allow_null=True)
        permission_level = serializers.SerializerMethodField()
        pending_elicitations_count = serializers.SerializerMethodField()
        share_workspace_files = serializers.BooleanField()

        def get_object(self, session: Any) -> str:
            return "session"

        def get_pending_elicitations_count(self, session: Any) -> int:
            return int(getattr(session, "pending_elicitations_count", 0) or 0)

        def get_labels(self, session: Any) -> dict[str, str]:
            return session.labels or {}

        def get_runner_online(self, session: Any) -> bool:
            return session.runner.online if session.runner is not None else True

        def get_permission_level(self, session: Any) -> int:
            return int(self.context["levels"].get(session.id, 0))

    class SessionSerializer(SessionRowSerializer):
        items = serializers.SerializerMethodField()
        pending_elicitations = serializers.SerializerMethodField()

        def get_items(self, session: Any) -> Any:
            return ItemSerializer(self.context["items"], many=True).data

        def get_pending_elicitations(self, session: Any) -> list[Any]:
            return []  # the benchmark's sessions have no open questions

    class RunnerSerializer(serializers.Serializer):
        runner_id = serializers.CharField(source="id")
        name = serializers.CharField()
        online = serializers.BooleanField()
        last_seen_at = UnixField()
        connected_at = UnixField()
        runner_version = serializers.CharField()

    class ResponseSerializer(serializers.Serializer):
        id = serializers.CharField()
        object = serializers.SerializerMethodField()
        status = serializers.CharField()
        error = serializers.JSONField(allow_null=True)
        output = serializers.SerializerMethodField()
        created_at = UnixField()
        completed_at = UnixField()

        def get_object(self, turn: Any) -> str:
            return "response"

        def get_output(self, turn: Any) -> Any:
            return self.context["output"]

    return {
        "agent": AgentSerializer,
        "session": SessionSerializer,
        "session_row": SessionRowSerializer,
        "runner": RunnerSerializer,
        "response": ResponseSerializer,
    }


def seed() -> dict[str, Any]:
    """20 template agents, 20 runners, 20 sessions (one with 10 items, one with 100)."""
    from omnigent_runner.bundles import build_bundle
    from omnigent_site.users import get_or_create_user
    from runners.models import Runner
    from runners.services import register_runner
    from sessions import selectors, services
    from sessions.models import Item, Session, Turn

    user = get_or_create_user(USER)

    def bundle(name: str) -> bytes:
        agent_yaml = f"name: {name}\ndescription: d\nprompt: p\nexecutor:\n  model: m\n"
        return build_bundle({"agent.yaml": agent_yaml})

    agents = [services.create_template_agent(data=bundle(f"a{i}"), user=user) for i in range(20)]
    for i in range(20):
        register_runner(owner=user, name=f"runner-{i}")
    Runner.objects.update(runner_version="1.0")
    sessions = {}
    for count in (10, 100):
        items = [
            {
                "type": "message",
                "role": "user" if n % 2 == 0 else "assistant",
                "content": [{"type": "input_text", "text": f"message {n} " * 8}],
            }
            for n in range(count)
        ]
        session = services.create_session(
            user=user, agent=agents[0], title=f"{count} items", initial_items=items
        )
        sessions[count] = session.id
    for i in range(18):
        services.create_session(user=user, agent=agents[i + 1], labels={"n": str(i)})
    turn = Turn.objects.create(session_id=sessions[10], status="completed")
    Item.objects.filter(session_id=sessions[10], data__role="assistant").update(response_id=turn.id)
    loaded = {
        count: selectors.session_for(session_id=sid, user=user, level=1)
        for count, sid in sessions.items()
    }
    return {
        "user": user,
        "sessions": sessions,
        "loaded": loaded,
        "items": {
            count: list(Item.objects.filter(session_id=sid).order_by("seq"))
            for count, sid in sessions.items()
        },
        "rows": list(selectors.sessions_granted_to(user=user).order_by("-created_at")[:20]),
        "agents": list(selectors.template_agents().order_by("-created_at")[:20]),
        "runners": list(Runner.objects.all()[:20]),
        "turn": turn,
        "output": selectors.response_output(response=turn),
        "Session": Session,
    }


def per_call_us(fn: Callable[[], Any], *, number: int, repeat: int) -> float:
    """Best of ``repeat`` runs of ``number`` calls, in µs per call (least disturbed run)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def render_cases(data: dict[str, Any], drf: dict[str, Any]) -> dict[str, tuple[Callable, Callable]]:
    """Each case: (typed-dict function, DRF serializer), both giving the same JSON."""
    from runners.shapes import runner_body
    from sessions.shapes import agent_body, response_body, session_body, session_row

    cases: dict[str, tuple[Callable, Callable]] = {}
    for count in (10, 100):
        session, level = data["loaded"][count]
        items = data["items"][count]
        cases[f"snapshot_{count}_items"] = (
            lambda s=session, lv=level, it=items: session_body(s, level=lv, items=it),
            lambda s=session, lv=level, it=items: (
                drf["session"](s, context={"items": it, "levels": {s.id: lv}}).data
            ),
        )
    rows, levels = data["rows"], {row.id: 4 for row in data["rows"]}
    cases["session_rows_20"] = (
        lambda: [session_row(row, level=levels[row.id]) for row in rows],
        lambda: drf["session_row"](rows, many=True, context={"levels": levels}).data,
    )
    cases["agents_20"] = (
        lambda: [agent_body(agent) for agent in data["agents"]],
        lambda: drf["agent"](data["agents"], many=True).data,
    )
    cases["runners_20"] = (
        lambda: [runner_body(runner) for runner in data["runners"]],
        lambda: drf["runner"](data["runners"], many=True).data,
    )
    turn, output = data["turn"], data["output"]
    cases["response_10_output_items"] = (
        lambda: response_body(turn, output=output),
        lambda: drf["response"](turn, context={"output": output}).data,
    )
    for name, (typed, serializer) in cases.items():
        if json.loads(json.dumps(typed())) != json.loads(json.dumps(serializer())):
            raise SystemExit(f"{name}: the serializer does not render the same JSON")
    return cases


class _Owner(dict):
    """Every session's level is owner's: the bench user created them all."""

    def get(self, key: Any, default: Any = None) -> int:
        return 4


@contextlib.contextmanager
def serializers_in_views(drf: dict[str, Any]) -> Iterator[None]:
    """The views render with the DRF serializers instead of the shape functions.

    Lists are rendered the way a serializer-based view would, one ``many=True``
    serializer per page (not one serializer per row), so the comparison is fair.
    """
    from api import runner_views, session_views
    from omnigent_site.pagination import Page
    from sessions.models import Agent, Session

    def snapshot(session: Any, *, level: int, items: Any) -> Any:
        context = {"items": list(items), "levels": {session.id: level}}
        return drf["session"](session, context=context).data

    original_body = Page.body

    def page_body(self: Page, render: Any, id_of: Any) -> Any:
        body: dict[str, Any] = dict(original_body(self, lambda obj: None, id_of))
        if self.objects and isinstance(self.objects[0], Session):
            body["data"] = drf["session_row"](
                self.objects, many=True, context={"levels": _Owner()}
            ).data
        elif self.objects and isinstance(self.objects[0], Agent):
            body["data"] = drf["agent"](self.objects, many=True).data
        else:
            body["data"] = [render(obj) for obj in self.objects]
        return body

    def runner_list(runners: Any) -> Any:
        return {"object": "list", "data": drf["runner"](runners, many=True).data}

    with (
        mock.patch.object(session_views, "session_body", snapshot),
        mock.patch.object(Page, "body", page_body),
        mock.patch.object(runner_views, "runner_list_body", runner_list),
    ):
        yield


def request_cases(data: dict[str, Any]) -> dict[str, str]:
    sessions = data["sessions"]
    return {
        "GET /v1/sessions/{id} (10 items)": f"/v1/sessions/{sessions[10]}",
        "GET /v1/sessions/{id} (100 items)": f"/v1/sessions/{sessions[100]}",
        "GET /v1/sessions (20 rows)": "/v1/sessions?limit=20",
        "GET /v1/agents (20 rows)": "/v1/agents?limit=20",
        "GET /v1/runners (20 rows)": "/v1/runners",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300, help="calls per timing run")
    parser.add_argument("--repeat", type=int, default=5, help="timing runs; the best counts")
    args = parser.parse_args()
    results: dict[str, Any] = {"render_us": {}, "request_us": {}}
    with tempfile.TemporaryDirectory(prefix="omnigent-bench-render-") as tmp:
        with django_project(Path(tmp)):
            from django.test import Client

            data = seed()
            drf = drf_serializers()
            print("render only, µs per render (best of runs):")
            print(f"  {'case':36} {'typed dict':>11} {'DRF':>11} {'DRF/typed':>10}")
            for name, (typed, serializer) in render_cases(data, drf).items():
                fast = per_call_us(typed, number=args.n, repeat=args.repeat)
                slow = per_call_us(serializer, number=args.n, repeat=args.repeat)
                results["render_us"][name] = {"typed_dict": round(fast, 1), "drf": round(slow, 1)}
                print(f"  {name:36} {fast:11.1f} {slow:11.1f} {slow / fast:9.1f}x")

            client = Client(HTTP_X_FORWARDED_EMAIL=USER)
            print("whole request in-process, µs per request (best of runs):")
            print(f"  {'request':36} {'typed dict':>11} {'DRF':>11} {'difference':>10}")
            requests = max(args.n // 5, 20)
            for name, path in request_cases(data).items():
                as_is = client.get(path)
                with serializers_in_views(drf):
                    swapped = client.get(path)
                if as_is.status_code != 200 or as_is.json() != swapped.json():
                    raise SystemExit(f"{name}: the two views do not answer the same")
                fast = per_call_us(
                    lambda p=path: client.get(p), number=requests, repeat=args.repeat
                )
                with serializers_in_views(drf):
                    slow = per_call_us(
                        lambda p=path: client.get(p), number=requests, repeat=args.repeat
                    )
                results["request_us"][name] = {"typed_dict": round(fast), "drf": round(slow)}
                print(f"  {name:36} {fast:11.0f} {slow:11.0f} {slow - fast:+10.0f}")
    results["n"], results["repeat"] = args.n, args.repeat
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
