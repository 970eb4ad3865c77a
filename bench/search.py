"""Benchmark: session search, export and import (lifecycle.md; issue 41, Measured).

For each database (SQLite in a temporary folder; PostgreSQL at ``--postgres``, a
database created for the run and dropped after), in a child process of its own:

1. Search: 100,000 items in 1,000 sessions of one user (plus 200 sessions of another
   user with the same words), text drawn from a 5,000-word vocabulary with a Zipf-like
   spread (a few words in most items, most words rare). ``GET /v1/sessions?search_query=``
   (the view, its SQL, the snippets; Django's test client, no socket) for queries of
   each kind: a common word, a rare word, two words, a prefix, a title word, a word
   with punctuation (the literal part), no match. p50/p95 per kind and over all.
2. Export of a 10,000-item session (and of a 1,000-item one, to show memory does not
   grow with the size): wall time, bytes, the peak of Python's allocations while it
   ran (``tracemalloc``) and the process's peak RSS before and after.
3. Import of that export: wall time and the same memory figures.

Run: ``.venv/bin/python -m bench.search [--items 100000] [--queries 30]``. The last
line printed is JSON with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench._stats import fmt, summary_ms

VOCABULARY = 5000
USER = "bench@example.com"
OTHER = "other@example.com"


SYLLABLES = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"]  # 85


def word(rank: int) -> str:
    """The vocabulary's word of this rank: two to four syllables, distinct per rank."""
    out, n = [], rank + len(SYLLABLES)
    while n:
        n, digit = divmod(n, len(SYLLABLES))
        out.append(SYLLABLES[digit])
    return "".join(out)


def _word(rng: random.Random) -> str:
    # Zipf-like: rank ~ 1/frequency; the first words are in most items, the last in few.
    return word(min(int(rng.paretovariate(0.7)), VOCABULARY))


QUERIES = {
    "common_word": word(1),
    "rare_word": word(4321),
    "two_words": f"{word(3)} {word(17)}",
    "prefix": word(12)[:3],
    "title_word": "project",
    "punctuation": f"{word(5)}-{word(6)}",
    "no_match": "zzzz",
}


def _text(rng: random.Random, words: int) -> str:
    parts = [_word(rng) for _ in range(words)]
    if rng.random() < 0.02:
        parts.insert(rng.randrange(len(parts)), f"{word(5)}-{word(6)}")
    return " ".join(parts)


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnigent_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _make_sessions(
    *, owner: Any, agent: Any, sessions: int, items: int, rng: random.Random
) -> list[str]:
    from django.db import transaction

    from sessions.models import Item, Permission, Session

    ids = []
    per = max(1, items // sessions)
    for n in range(sessions):
        with transaction.atomic():
            title = f"project {n} " + _text(rng, 2) if n % 10 == 0 else f"chat {n}"
            session = Session.objects.create(agent=agent, title=title, created_by=owner)
            Permission.objects.create(session=session, user=owner, level=4)
            batch = []
            for i in range(per):
                role = "user" if i % 2 == 0 else "assistant"
                kind = "input_text" if role == "user" else "output_text"
                batch.append(
                    Item(
                        session=session,
                        id=f"item_{n}_{i}",
                        type="message",
                        data={"role": role, "content": [{"type": kind, "text": _text(rng, 30)}]},
                        created_by=USER if role == "user" else None,
                    )
                )
            Item.objects.bulk_create(batch)
        ids.append(session.id)
    return ids


def _agent() -> Any:
    from sessions.models import Agent

    return Agent.objects.create(
        kind="template", name="bench", bundle_sha256="0" * 64, bundle_size=1
    )


def _rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args: argparse.Namespace) -> dict[str, Any]:
    _setup_django()
    from django.db import connection
    from django.test import Client

    from omnigent_site.users import get_or_create_user

    rng = random.Random(41)
    user, other = get_or_create_user(USER), get_or_create_user(OTHER)
    agent = _agent()
    started = time.perf_counter()
    _make_sessions(owner=user, agent=agent, sessions=args.sessions, items=args.items, rng=rng)
    _make_sessions(owner=other, agent=agent, sessions=200, items=20_000, rng=rng)
    load_s = time.perf_counter() - started
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    client = Client(headers={"X-Forwarded-Email": USER})
    search: dict[str, Any] = {}
    everything: list[float] = []
    for kind, text in QUERIES.items():
        samples = []
        found = 0
        for _ in range(args.queries):
            begun = time.perf_counter()
            response = client.get("/v1/sessions", {"search_query": text, "limit": 20})
            samples.append(time.perf_counter() - begun)
            assert response.status_code == 200, (response.status_code, response.content)
            found = len(response.json()["data"])
        everything += samples
        search[kind] = {"query": text, "rows": found, **summary_ms(samples)}
        print(
            f"  [{connection.vendor}] search {kind:12} ({found:2} rows) {fmt(summary_ms(samples))}"
        )
    search["all"] = summary_ms(everything)
    print(f"  [{connection.vendor}] search all {fmt(search['all'])}")

    transfer: dict[str, Any] = {}
    for size in (1_000, 10_000):
        (session_id,) = _make_sessions(
            owner=user, agent=agent, sessions=1, items=size, rng=random.Random(size)
        )
        transfer[f"export_{size}"], content = _export(client, session_id)
        transfer[f"import_{size}"] = _import(client, content)
        for key in (f"export_{size}", f"import_{size}"):
            print(f"  [{connection.vendor}] {key}: {transfer[key]}")
    return {
        "vendor": connection.vendor,
        "items": args.items + 20_000,
        "sessions": args.sessions + 200,
        "load_s": round(load_s, 1),
        "search": search,
        "transfer": transfer,
    }


def _export(client: Any, session_id: str) -> tuple[dict[str, Any], bytes]:
    rss_before = _rss_peak_mib()
    begun = time.perf_counter()
    response = client.get(f"/v1/sessions/{session_id}/export")
    size = 0
    for chunk in response:
        size += len(chunk)
    seconds = time.perf_counter() - begun
    rss_after = _rss_peak_mib()
    tracemalloc.start()
    kept = b"".join(client.get(f"/v1/sessions/{session_id}/export"))
    tracemalloc.stop()
    # Peak without keeping the lines: read again, discarding each chunk.
    tracemalloc.start()
    for _chunk in client.get(f"/v1/sessions/{session_id}/export"):
        pass
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "seconds": round(seconds, 3),
        "bytes": size,
        "python_peak_mib": round(peak / 2**20, 2),
        "rss_peak_mib_before": round(rss_before, 1),
        "rss_peak_mib_after": round(rss_after, 1),
    }, kept


def _import(client: Any, content: bytes) -> dict[str, Any]:
    from django.core.files.uploadedfile import SimpleUploadedFile

    def post() -> Any:
        upload = SimpleUploadedFile("export.jsonl", content, "application/x-ndjson")
        return client.post("/v1/sessions/import", {"file": upload})

    rss_before = _rss_peak_mib()
    begun = time.perf_counter()
    response = post()
    seconds = time.perf_counter() - begun
    assert response.status_code == 201, response.content[:500]
    rss_after = _rss_peak_mib()
    tracemalloc.start()
    assert post().status_code == 201
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "seconds": round(seconds, 3),
        "python_peak_mib": round(peak / 2**20, 2),
        "rss_peak_mib_before": round(rss_before, 1),
        "rss_peak_mib_after": round(rss_after, 1),
    }


def _run_child(env: dict[str, str], argv: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.search", "--child", *argv],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=3600,
        check=True,
    )
    lines = done.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument(
        "--postgres",
        default="postgres://postgres@127.0.0.1:5432",
        help="a server where a database can be created ('' skips PostgreSQL)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    argv = ["--items", str(args.items), "--sessions", str(args.sessions)]
    argv += ["--queries", str(args.queries)]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        base = {
            **os.environ,
            "OMNIGENT_DATA_DIR": str(Path(tmp) / "data"),
            "OMNIGENT_LOG_LEVEL": "ERROR",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "bench-" + "x" * 50,
            "DJANGO_ALLOWED_HOSTS": "testserver,localhost",
            "DJANGO_SECURE_SSL_REDIRECT": "0",
        }
        print("sqlite:", flush=True)
        sqlite_url = f"sqlite:///{Path(tmp) / 'bench.sqlite3'}"
        results["sqlite"] = _run_child({**base, "DATABASE_URL": sqlite_url}, argv)
        if args.postgres:
            import psycopg

            name = f"bench_search_{os.getpid()}"
            with psycopg.connect(f"{args.postgres}/postgres", autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {name}")
            try:
                print("postgresql:", flush=True)
                env = {**base, "DATABASE_URL": f"{args.postgres}/{name}"}
                results["postgresql"] = _run_child(env, argv)
            finally:
                with psycopg.connect(f"{args.postgres}/postgres", autocommit=True) as admin:
                    admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    print(json.dumps(results, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
