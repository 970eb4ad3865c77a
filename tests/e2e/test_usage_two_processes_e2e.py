"""Usage totals stay exact with two server processes (docs/usage.md; issue 39).

Two daphne processes share PostgreSQL and Redis, each with a runner of its own. One
user's 20 sessions (half on the Responses API, half on Chat Completions) each take 3
turns of two LLM calls, the messages sent at once and split over both processes, so the
calls of many turns are recorded concurrently by both processes into the same user, day,
month and model total rows. Every total must equal the sum of the per-call rows and the
mock LLM's scripted counts, to the token and to the nano-dollar.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from testing.mockllm import MockLLMServer
from testing.processes import Runner, Server, base_env, bind, create_session, send_message
from testing.processes import wait_turn as wait_turn_on
from tests.e2e.conftest import PRICES, sync_prices

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]

SESSIONS = 20
TURNS = 3
API = ("  api: responses\n", "  api: chat_completions\n")
OS_ENV = "os_env:\n  type: caller_process\n  cwd: .\n"
TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)


def tag(session: int, turn: int) -> str:
    """The text the mock routes a turn's replies by (no tag is a substring of another)."""
    return f"[s{session:02d}t{turn}]"


def scripted(session: int, turn: int) -> list[dict[str, int]]:
    """The provider's counts for the turn's two calls (cached tokens inside the input)."""
    return [
        {"input_tokens": 1000 + 7 * session + turn, "cached_tokens": 100 + session,
         "output_tokens": 20 + turn},
        {"input_tokens": 2000 + session, "cached_tokens": 300 + 11 * turn,
         "output_tokens": 40 + session, "reasoning_tokens": 5 + turn},
    ]  # fmt: skip


def recorded(counts: dict[str, int]) -> dict[str, int]:
    """One call as the server must store it: ``input_tokens`` without the cached part;
    the cost at the test's prices in nano-dollars (1 / 2 / 0.5 USD per million)."""
    calls = {
        "input_tokens": counts["input_tokens"] - counts["cached_tokens"],
        "output_tokens": counts["output_tokens"],
        "cache_read_input_tokens": counts["cached_tokens"],
        "cache_creation_input_tokens": 0,
        "reasoning_tokens": counts.get("reasoning_tokens", 0),
    }
    cost = (
        calls["input_tokens"] * 1000
        + calls["output_tokens"] * 2000
        + calls["cache_read_input_tokens"] * 500
    )
    return {**calls, "llm_calls": 1, "cost_nano": cost}


def summed(rows: list[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for row in rows:
        total.update(row)
    return dict(total)


def turn_script(session: int, turn: int) -> list[dict[str, Any]]:
    write = {
        "call_id": f"call_{session}_{turn}",
        "name": "sys_os_write",
        "arguments": json.dumps({"path": f"note-{session}-{turn}.txt", "content": "noted\n"}),
    }
    first, second = scripted(session, turn)
    return [{"tool_calls": [write], "usage": first}, {"text": "Written.", "usage": second}]


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as conn:
        return list(conn.execute(sql).fetchall())


def sums_by(url: str, table: str, keys: str) -> dict[tuple[Any, ...], dict[str, int]]:
    """``table``'s token, call and cost sums grouped by ``keys`` (SQL expressions)."""
    columns = [*TOKENS, "cost_nano"]
    calls = "count(*)" if table == "usage_llmcall" else "sum(llm_calls)"
    sql = (
        f"SELECT {keys}, {calls}, "
        + ", ".join(f"coalesce(sum({name}), 0)" for name in columns)
        + f" FROM {table} GROUP BY {keys}"
    )
    width = len(keys.split(","))
    return {
        tuple(row[:width]): dict(
            zip(["llm_calls", *columns], (int(v) for v in row[width:]), strict=True)
        )
        for row in query(url, sql)
    }


def test_concurrent_turns_on_two_processes_total_to_the_token(
    two_servers: tuple[Server, Server],
    postgres_url: str,
    launch_runner: Callable[..., Runner],
    mock_llm: MockLLMServer,
    make_bundle: Callable[..., bytes],
    tmp_path: Path,
) -> None:
    servers = two_servers
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES)
    # Before any call: each process reads the price table when it first prices one.
    sync_prices(
        prices, env=base_env(DATABASE_URL=postgres_url, OMNIGENT_DATA_DIR=str(tmp_path / "data"))
    )
    runners = [launch_runner(server) for server in servers]
    for session in range(SESSIONS):
        for turn in range(TURNS):
            mock_llm.configure(turn_script(session, turn), match=tag(session, turn))

    sessions: list[str] = []
    for index in range(SESSIONS):
        # The same agent name on both APIs: every call adds to the same user/day rows.
        session_id = create_session(servers[index % 2], make_bundle(extra=API[index % 2] + OS_ENV))
        bind(servers[index % 2], session_id, runners[index % 2].runner_id)
        sessions.append(session_id)

    def send_all(index: int) -> list[str]:
        """The session's three messages at once, alternating processes."""
        ids = []
        for turn in range(TURNS):
            sent = send_message(
                servers[(index + turn) % 2], sessions[index], f"write a note {tag(index, turn)}"
            )
            assert sent.status_code == 202, sent.text
            ids.append(str(sent.json()["response_id"]))
        return ids

    with ThreadPoolExecutor(SESSIONS) as pool:
        turn_ids = list(pool.map(send_all, range(SESSIONS)))

    expected_turn: dict[str, dict[str, int]] = {}
    expected_session: dict[str, dict[str, int]] = {}
    for index, session_id in enumerate(sessions):
        for turn, response_id in enumerate(turn_ids[index]):
            body = wait_turn_on(servers[turn % 2], session_id, response_id, deadline_s=240)
            assert body["status"] == "completed", body
            expected = summed([recorded(c) for c in scripted(index, turn)])
            expected_turn[response_id] = expected
            usage = body["usage"]
            assert usage["llm_calls"] == 2
            assert {name: usage[name] for name in ("input_tokens", "output_tokens",
                                                   "cache_read_input_tokens")} == {
                name: expected[name]
                for name in ("input_tokens", "output_tokens", "cache_read_input_tokens")
            }  # fmt: skip
            assert usage["output_tokens_details"] == {
                "reasoning_tokens": expected["reasoning_tokens"]
            }
            assert usage["cost_usd"] == round(expected["cost_nano"] / 1e9, 9)
        expected_session[session_id] = summed([expected_turn[t] for t in turn_ids[index]])
    everything = summed(list(expected_session.values()))
    assert everything["llm_calls"] == SESSIONS * TURNS * 2
    assert len(mock_llm.requests) == SESSIONS * TURNS * 2

    # Per call: each stored exactly once, as the mock reported it.
    per_call = sums_by(postgres_url, "usage_llmcall", "response_id")
    assert per_call == {(t,): expected for t, expected in expected_turn.items()}
    # Per turn: the sums on the turn's row are its calls'.
    for response_id, usage in query(
        postgres_url, "SELECT id, usage FROM agent_sessions_turn WHERE usage IS NOT NULL"
    ):
        assert {name: usage.get(name, 0) for name in (*TOKENS, "llm_calls", "cost_nano")} == (
            per_call[(response_id,)]
        )
    # Per session: the session totals, the session row's cost and the snapshot.
    assert sums_by(postgres_url, "usage_llmcall", "session_id") == {
        (s,): expected for s, expected in expected_session.items()
    }
    assert sums_by(postgres_url, "usage_sessionusage", "session_id") == {
        (s,): expected for s, expected in expected_session.items()
    }
    costs = dict(query(postgres_url, "SELECT id, total_cost_nano FROM agent_sessions_session"))
    assert costs == {s: expected["cost_nano"] for s, expected in expected_session.items()}
    with servers[1].client() as client:
        snapshot = client.get(f"/v1/sessions/{sessions[0]}").json()
    assert snapshot["usage"]["input_tokens"] == expected_session[sessions[0]]["input_tokens"]
    # Per user, day and model (the rows every call of both processes collides on), and
    # per month: the calls' sums, and all of them together the mock's.
    by_day = sums_by(
        postgres_url, "usage_llmcall", "user_id, (created_at AT TIME ZONE 'UTC')::date, model"
    )
    assert sums_by(postgres_url, "usage_dailyusage", "user_id, day, model") == by_day
    by_month = defaultdict(list)
    for (user, day, model), sums in by_day.items():
        by_month[(user, day.replace(day=1), model)].append(sums)
    assert sums_by(postgres_url, "usage_monthlyusage", "user_id, month, model") == {
        key: summed(rows) for key, rows in by_month.items()
    }
    assert summed(list(by_day.values())) == everything
    with servers[0].client() as client:
        report = client.get("/v1/usage?group_by=model").json()
    assert report["data"] == [
        {
            "key": "mock-model",
            "input_tokens": everything["input_tokens"],
            "output_tokens": everything["output_tokens"],
            "total_tokens": everything["input_tokens"]
            + everything["cache_read_input_tokens"]
            + everything["output_tokens"],
            "cost_usd": round(everything["cost_nano"] / 1e9, 9),
        }
    ]
