"""Benchmark: usage recording and reports (docs/usage.md, "Measured"; issue 39).

1. Server CPU per recorded LLM call: ``usage.recorded`` events applied through
   ``runners.runner_events.record`` (the tunnel consumer's path) in runner batches of
   ``--batch`` events, each call priced and added to the turn, the session row and the
   two totals. Process CPU time per call, over ``--calls`` calls; and the same batches
   of text deltas (one stored event each) for scale.
2. ``GET /v1/usage`` p50 through the Django test client, in process: the report of one
   user with a year of data over 10 models (``since`` a year back), and
   ``group_by=user`` (staff) over ``--users`` users with 30 days of 2 models each.

Runs on a fresh SQLite file, or with ``--database postgres`` on a fresh PostgreSQL
database (created and dropped). Run: ``.venv/bin/python -m bench.usage [--calls 2000]
[--users 1000] [--database sqlite|postgres]``. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._stats import summary_ms
from bench.retention import database, django_project

USER = "bench@example.com"
STAFF = "staff@example.com"
MODELS = [f"gpt-4o-mini-{n}" for n in range(10)]


def bench_recording(*, calls: int, batch: int) -> dict[str, Any]:
    from django.utils import timezone

    from omnigent_runner import protocol
    from omnigent_site.users import get_or_create_user
    from runners import runner_events
    from runners.models import Runner
    from sessions.models import Agent, Permission, Session
    from usage import services as usage_services

    user = get_or_create_user(USER)
    now = timezone.now()
    runner = Runner.objects.create(
        id="runner_bench_usage", name="bench", owner=user, channel_name="specific.bench!x",
        connected_at=now, last_seen_at=now, generation=1,
    )  # fmt: skip
    agent = Agent.objects.create(
        kind="session", name="bench", model="gpt-4o-mini", bundle_sha256="0" * 64,
        bundle_size=0, created_by=user,
    )  # fmt: skip
    session = Session.objects.create(agent=agent, created_by=user, runner=runner)
    Permission.objects.create(session=session, user=user, level=4)
    _item, turn = runner_events.accept_message(
        session_id=session.id,
        created_by=USER,
        data={"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        tools=[],
    )
    usage_services.prices.clear()
    seq = 0

    def run(make: Any) -> float:
        nonlocal seq
        cpu = 0.0
        for _ in range(calls // batch):
            events = []
            for _n in range(batch):
                seq += 1
                events.append((seq, make()))
            started = time.process_time()
            runner_events.record(runner_id=runner.id, session_id=session.id, events=events)
            cpu += time.process_time() - started
        return cpu / (calls // batch * batch)

    def usage_event() -> Any:
        return protocol.UsageRecorded(
            response_id=turn.id,
            model="gpt-4o-mini-2024-07-18",
            input_tokens=1200,
            output_tokens=300,
            cache_read_input_tokens=800,
        )

    def delta_event() -> Any:
        return protocol.OutputTextDelta(response_id=turn.id, item_id="item_1", delta="word ")

    run(usage_event)  # warm-up: statements prepared, prices read
    usage_ms = run(usage_event) * 1000
    delta_ms = run(delta_event) * 1000
    session.refresh_from_db()
    result = {
        "batch": batch,
        "calls": calls,
        "cpu_ms_per_usage_event": round(usage_ms, 4),
        "cpu_ms_per_text_delta_event": round(delta_ms, 4),
        "session_cost_usd": (session.total_cost_nano or 0) / 1e9,
    }
    print(f"  recording: {result}", file=sys.stderr)
    return result


def populate_reports(*, users: int) -> None:
    """One user: a year of 10 models (and a session a day); ``users`` others: 30 days
    of 2 models each."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from omnigent_site.users import get_or_create_user
    from usage.models import DailyUsage, MonthlyUsage, SessionUsage
    from usage.services import SUM_FIELDS

    today = datetime.now(UTC).date()
    user = get_or_create_user(USER)
    User = get_user_model()
    User.objects.create_user(username=STAFF, is_staff=True)

    def totals(n: int) -> dict[str, int]:
        return {
            "input_tokens": 1000 + n,
            "output_tokens": 200,
            "cache_read_input_tokens": 500,
            "llm_calls": 5,
            "priced_calls": 5,
            "cost_nano": 1_000_000 + n,
        }

    with transaction.atomic():
        DailyUsage.objects.bulk_create(
            DailyUsage(
                user_id=user.pk, day=today - timedelta(days=d), model=m, agent_name="bench",
                **totals(d),
            )
            for d in range(365)
            for m in MODELS
        )  # fmt: skip
        SessionUsage.objects.bulk_create(
            SessionUsage(
                session_id=f"conv_bench_{d}", user_id=user.pk, day=today - timedelta(days=d),
                model=m, agent_name="bench", **totals(d),
            )
            for d in range(365)
            for m in MODELS
        )  # fmt: skip
    for start in range(0, users, 200):
        with transaction.atomic():
            others = User.objects.bulk_create(
                User(username=f"user{n}@example.com") for n in range(start, min(users, start + 200))
            )
            DailyUsage.objects.bulk_create(
                DailyUsage(
                    user_id=other.pk, day=today - timedelta(days=d), model=m, agent_name="a",
                    **totals(d),
                )
                for other in others
                for d in range(30)
                for m in MODELS[:2]
            )  # fmt: skip
    # The monthly rows, as recording leaves them: the daily ones summed per month.
    with transaction.atomic():
        MonthlyUsage.objects.all().delete()  # the recording part's, summed again below
        months: dict[tuple[int, Any, str, str], dict[str, int]] = {}
        columns = ("user_id", "day", "model", "agent_name", *SUM_FIELDS)
        for user_id, day, model, agent, *sums in DailyUsage.objects.values_list(*columns):
            key = (user_id, day.replace(day=1), model, agent)
            found = months.setdefault(key, dict.fromkeys(SUM_FIELDS, 0))
            for name, value in zip(SUM_FIELDS, sums, strict=True):
                found[name] += value
        MonthlyUsage.objects.bulk_create(
            MonthlyUsage(user_id=u, month=m, model=model, agent_name=a, **sums)
            for (u, m, model, a), sums in months.items()
        )


def bench_reports(*, users: int, requests: int) -> dict[str, Any]:
    from django.test import Client

    populate_reports(users=users)
    since = (datetime.now(UTC).date() - timedelta(days=364)).isoformat()
    cases = {
        "report_1_user_1_year_10_models": (USER, f"/v1/usage?since={since}"),
        "group_by_model_1_user_1_year": (USER, f"/v1/usage?since={since}&group_by=model"),
        f"group_by_user_{users}_users": (STAFF, "/v1/usage?group_by=user"),
    }
    result: dict[str, Any] = {}
    for name, (user, path) in cases.items():
        client = Client(HTTP_X_FORWARDED_EMAIL=user, HTTP_HOST="127.0.0.1")
        first = client.get(path, secure=True)
        assert first.status_code == 200, (
            first.status_code,
            dict(first.headers),
            first.content[:300],
        )
        samples = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.get(path, secure=True)
            samples.append(time.perf_counter() - started)
            assert response.status_code == 200
        result[name] = summary_ms(samples)
        print(f"  {name}: {result[name]}", file=sys.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="omnigent-bench-usage-") as tmp:
        with database(args.database, Path(tmp)) as url, django_project(Path(tmp), url):
            result: dict[str, Any] = {"database": args.database}
            print("usage recording…", file=sys.stderr)
            result["recording"] = bench_recording(calls=args.calls, batch=args.batch)
            print("GET /v1/usage…", file=sys.stderr)
            result["reports"] = bench_reports(users=args.users, requests=args.requests)
            from django.db import connections

            connections.close_all()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
