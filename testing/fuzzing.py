"""Property-based API fuzzing with schemathesis against a live daphne (docs/testing.md,
"API fuzzing"): used by ``tests/fuzz/test_schemathesis.py`` and ``bench/fuzz.py``.

A run has three steps:

1. ``seed_resources``: a runner (connected, its LLM the mock), agents and sessions with
   finished turns, created through the API as the fuzzing identity, so the fuzzer's
   path parameters can name things that exist;
2. ``write_config``: a ``schemathesis.toml`` whose *dictionaries* hold those ids and
   bind every ``{agent_id}``, ``{runner_id}``, ``{session_id}`` and ``{response_id}`` to
   them most of the time (random strings the rest), so most generated requests reach the
   handler behind the lookup instead of stopping at a 404. ``DELETE`` operations draw
   from ids of their own, so the rest keep finding live resources all run long;
3. ``run_schemathesis``: the schemathesis CLI in a subprocess with a fixed seed, the
   checks we hold the API to, and a HAR report from which the requests are counted.

Nothing is excluded. The event streams (the session stream, the session-list updates)
never end, so schemathesis reads at most ``STREAM_EVENTS`` events or
``STREAM_TIMEOUT_S`` seconds of each (its ``max-stream-events`` and the operation's
request timeout) and validates every event it read; the server under test sends a
stream heartbeat every 0.2 s (``SERVER_SETTINGS``) so that reading is quick. The
runner's WebSocket is not an HTTP operation and is not in the schema.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from omnigent_runner.bundles import build_bundle
from testing.mockllm import MockLLMServer
from testing.processes import (
    Process,
    Server,
    runner_env,
    spawn,
    wait_runner_online,
    wait_until,
)

# What the fuzzer fails on (issue 15): any 5xx, an undocumented status code, a
# content type other than the documented one, a body that does not match its schema.
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)
FUZZ_USER = "fuzz@example.com"
SEED = 20261201
STREAM_EVENTS = 3
STREAM_TIMEOUT_S = 1.0
REQUEST_TIMEOUT_S = 20.0
SERVER_SETTINGS = {"OMNIGENT_STREAM_HEARTBEAT_S": "0.2", "OMNIGENT_LOG_LEVEL": "WARNING"}
# How often a path id is drawn from the live resources (the rest: generated strings).
DICTIONARY_PROBABILITY = 0.85


@dataclass
class Resources:
    """Ids of what ``seed_resources`` created: live, and doomed (for DELETE)."""

    agents: list[str] = field(default_factory=list)
    runners: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    doomed_agents: list[str] = field(default_factory=list)
    doomed_runners: list[str] = field(default_factory=list)
    doomed_sessions: list[str] = field(default_factory=list)
    runner_process: Process | None = None


def _client(server: Server, user: str | None) -> httpx.Client:
    return server.client(user)


def _bundle(name: str) -> bytes:
    spec = f"name: {name}\ndescription: Fuzzing target.\nprompt: Answer.\nexecutor:\n  model: mock-model\n"
    return build_bundle({"agent.yaml": spec})


def _create_session(client: httpx.Client, title: str) -> str:
    response = client.post(
        "/v1/sessions",
        files={"bundle": ("agent.tar.gz", _bundle("fuzz-agent"), "application/gzip")},
        data={"metadata": json.dumps({"title": title, "labels": {"suite": "fuzz"}})},
    )
    response.raise_for_status()
    return str(response.json()["session_id"])


def seed_resources(
    server: Server,
    *,
    user: str | None,
    mock_llm: MockLLMServer,
    log_dir: Path,
    sessions: int = 4,
    turns: int = 2,
) -> Resources:
    """Create what the fuzzer should find, as ``user`` (``None``: local single-user mode).

    One runner program is started (and left running: the caller stops
    ``runner_process``) so that sessions have finished turns, items and responses.
    """
    found = Resources()
    with _client(server, user) as client:
        for index in range(2):
            response = client.post(
                "/v1/agents",
                files={
                    "bundle": ("agent.tar.gz", _bundle(f"fuzz-agent-{index}"), "application/gzip")
                },
            )
            response.raise_for_status()
            found.agents.append(str(response.json()["id"]))
        response = client.post(
            "/v1/agents",
            files={"bundle": ("agent.tar.gz", _bundle("fuzz-doomed"), "application/gzip")},
        )
        response.raise_for_status()
        found.doomed_agents.append(str(response.json()["id"]))
        for name in ("fuzz-runner", "fuzz-doomed"):
            response = client.post("/v1/runners", json={"name": name})
            response.raise_for_status()
            body = response.json()
            (found.runners if name == "fuzz-runner" else found.doomed_runners).append(
                str(body["runner_id"])
            )
            if name == "fuzz-runner":
                token = str(body["binding_token"])
        workspace = log_dir / "fuzz-workspace"
        workspace.mkdir(exist_ok=True)
        (workspace / "notes.txt").write_text("first line\n")
        env = runner_env(
            server_url=server.url,
            token=token,
            workspace=workspace,
            OPENAI_BASE_URL=mock_llm.base_url,
            OPENAI_API_KEY="test-key",
        )
        found.runner_process = spawn(
            "fuzz-runner", [sys.executable, "-m", "omnigent_runner"], env=env, log_dir=log_dir
        )
        wait_runner_online(server, found.runners[0], process=found.runner_process, user=user)
        for index in range(sessions):
            session_id = _create_session(client, f"fuzz {index}")
            found.sessions.append(session_id)
            response = client.patch(
                f"/v1/sessions/{session_id}", json={"runner_id": found.runners[0]}
            )
            response.raise_for_status()
            for turn in range(turns):
                found.responses.append(_turn(client, session_id, f"turn {turn}"))
        for index in range(3):
            found.doomed_sessions.append(_create_session(client, f"doomed {index}"))
    return found


def _turn(client: httpx.Client, session_id: str, text: str) -> str:
    response = client.post(
        f"/v1/sessions/{session_id}/events",
        json={"type": "message", "data": {"role": "user", "content": text}},
    )
    response.raise_for_status()
    response_id = str(response.json()["response_id"])

    def finished() -> bool:
        body = client.get(f"/v1/sessions/{session_id}/responses/{response_id}").json()
        return body.get("status") in ("completed", "failed")

    wait_until(finished, deadline_s=60, what=f"seed turn {response_id}")
    return response_id


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(value) for value in values) + "]"


def event_stream_paths(server: Server) -> list[str]:
    """The paths whose success is a ``text/event-stream`` (they never end by themselves)."""
    schema = httpx.get(f"{server.url}/v1/schema", params={"format": "json"}, timeout=30).json()
    return sorted(
        path
        for path, operations in schema["paths"].items()
        for operation in operations.values()
        if isinstance(operation, dict)
        and "text/event-stream"
        in (operation.get("responses", {}).get("200", {}).get("content") or {})
    )


def write_config(
    path: Path, found: Resources, *, max_examples: int, workers: int, stream_paths: list[str]
) -> Path:
    """A ``schemathesis.toml`` binding path ids to the seeded resources; the event
    streams (``stream_paths``) read for ``STREAM_TIMEOUT_S`` at most."""
    live = {
        "agents": found.agents,
        "runners": found.runners,
        "sessions": found.sessions,
        "responses": found.responses,
        "doomed_agents": found.doomed_agents,
        "doomed_runners": found.doomed_runners,
        "doomed_sessions": found.doomed_sessions,
    }
    lines = [
        f"seed = {SEED}",
        f"workers = {workers}",
        f"request-timeout = {REQUEST_TIMEOUT_S}",
        f"max-stream-events = {STREAM_EVENTS}",
        "",
        "[generation]",
        f"max-examples = {max_examples}",
        'database = "none"',
        "",
        "[checks]",
        "enabled = false",
    ]
    for check in CHECKS:
        lines += [f"{check}.enabled = true"]
    lines.append("")
    for name, values in live.items():
        lines += [f"[dictionaries.{name}]", f"values = {_toml_list(values)}", ""]

    def binding(parameter: str, dictionary: str) -> str:
        return (
            f'"path.{parameter}" = {{ dictionary = "{dictionary}", '
            f"probability = {DICTIONARY_PROBABILITY} }}"
        )

    lines += [
        "[parameters]",
        binding("agent_id", "agents"),
        binding("runner_id", "runners"),
        binding("session_id", "sessions"),
        binding("response_id", "responses"),
        "",
        "[[operations]]",
        'include-method = "DELETE"',
        'include-path-regex = "^/v1/(agents|runners|sessions)/\\\\{[a-z_]+\\\\}$"',
        "[operations.parameters]",
        binding("agent_id", "doomed_agents"),
        binding("runner_id", "doomed_runners"),
        binding("session_id", "doomed_sessions"),
        "",
    ]
    for stream_path in stream_paths:
        lines += [
            "[[operations]]",
            f"include-path = {json.dumps(stream_path)}",
            f"request-timeout = {STREAM_TIMEOUT_S}",
            "",
        ]
    path.write_text("\n".join(lines))
    return path


# A run must get a 2xx from at least this many operations below a seeded session
# (``GET …/items``, ``…/responses/{response_id}``, ``PUT …/permissions``...).
MIN_DEEP_OPERATIONS = 6


@dataclass
class FuzzResult:
    returncode: int
    requests: int
    seconds: float
    statuses: Counter[str]
    # (method, path, status) of every request, from the HAR report.
    calls: list[tuple[str, str, int]]
    output: str


def read_har(har_path: Path) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request in schemathesis's HAR report."""
    if not har_path.exists():
        return []
    entries = json.loads(har_path.read_text())["log"]["entries"]
    return [
        (
            str(entry["request"]["method"]),
            httpx.URL(entry["request"]["url"]).path,
            int(entry["response"]["status"]),
        )
        for entry in entries
    ]


def deep_successes(result: FuzzResult, found: Resources) -> int:
    """How many operations below a seeded session answered 2xx (ids made templates)."""
    names = {
        **{value: "{session_id}" for value in found.sessions + found.doomed_sessions},
        **{value: "{response_id}" for value in found.responses},
    }
    templates = set()
    for method, path, status in result.calls:
        if not 200 <= status < 300:
            continue
        parts = [names.get(part, part) for part in path.split("/")]
        if "{session_id}" in parts and parts.index("{session_id}") < len(parts) - 1:
            templates.add(f"{method} {'/'.join(parts)}")
    return len(templates)


def run_schemathesis(
    server: Server,
    *,
    config: Path,
    report_dir: Path,
    user: str | None,
    timeout_s: float,
    max_time_s: int | None = None,
) -> FuzzResult:
    """Run ``schemathesis run`` on the server's ``/v1/schema``; return what it did."""
    har = report_dir / "fuzz.har"
    argv = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{server.url}/v1/schema",
        "--url",
        server.url,
        "--report",
        "har",
        "--report-har-path",
        str(har),
        "--no-color",
        "--warnings",
        "off",
    ]
    if user is not None:
        argv += ["--header", f"X-Forwarded-Email: {user}"]
    if max_time_s is not None:
        argv += ["--max-time", str(max_time_s)]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1", "COLUMNS": "160"}
    started = time.monotonic()
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=report_dir
    )
    seconds = time.monotonic() - started
    calls = read_har(har)
    return FuzzResult(
        returncode=result.returncode,
        requests=len(calls),
        seconds=seconds,
        statuses=Counter(str(status) for _, _, status in calls),
        calls=calls,
        output=result.stdout + result.stderr,
    )


def summary(result: FuzzResult) -> dict[str, Any]:
    return {
        "requests": result.requests,
        "seconds": round(result.seconds, 1),
        "statuses": dict(sorted(result.statuses.items())),
        "failures": _failure_line(result.output),
    }


def _failure_line(output: str) -> str:
    for line in reversed(output.splitlines()):
        if "failure" in line or "passed" in line or "error" in line:
            return line.strip(" =")
    return ""


# --- text that is not UTF-8 (http-api.md, Input strictness) --------------------------------

# Raw bytes schemathesis never sends (it writes valid UTF-8): an overlong "/", an encoded
# surrogate, a truncated sequence, a lone continuation byte, a sequence cut by the end of
# the string, and the bytes of the first report.
NOT_UTF8_SAMPLES = (b"\xc0\xaf", b"\xed\xa0\x80", b"ok\xe2\x82", b"\x80", b"\xc3", b"\xff\xfe\xc3(")
# The value each path parameter gets, so that a request reaches the handler; ``None``
# means "a seeded id of that kind".
_PATH_VALUES = {"env": "default", "path": "notes.txt"}
_SEEDED = {
    "session_id": "sessions",
    "response_id": "responses",
    "agent_id": "agents",
    "runner_id": "runners",
}


@dataclass
class NotUtf8Result:
    """What ``not_utf8_sweep`` sent, and each request whose answer was not a 4xx in the
    error format (a description per failure)."""

    requests: int = 0
    failures: list[str] = field(default_factory=list)
    # "METHOD /template" of every operation the schema lists, and of those that got at
    # least one request with text that is not UTF-8.
    operations: set[str] = field(default_factory=set)
    swept: set[str] = field(default_factory=set)


def _percent(raw: bytes) -> str:
    return "".join(f"%{byte:02X}" if byte > 0x7E or byte < 0x21 else chr(byte) for byte in raw)


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, operations in sorted(schema["paths"].items())
        for method, operation in sorted(operations.items())
        if isinstance(operation, dict)
    ]


def _properties(schema: dict[str, Any], media: dict[str, Any]) -> dict[str, Any]:
    """The top-level properties of a request body's schema (``$ref`` followed once)."""
    body = media.get("schema") or {}
    ref = body.get("$ref")
    if isinstance(ref, str):
        body = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    properties = body.get("properties")
    return properties if isinstance(properties, dict) and properties else {"value": {}}


def _bodies(properties: dict[str, Any], content_type: str, raw: bytes) -> tuple[bytes, str]:
    """A body of ``content_type`` whose every property holds ``raw`` (files: a bundle,
    and a multipart body gets one more text part)."""
    if content_type == "application/json":
        fields = b", ".join(b'"' + name.encode() + b'": "' + raw + b'"' for name in properties)
        return b"{" + fields + b"}", content_type
    if content_type == "application/x-www-form-urlencoded":
        encoded = "&".join(f"{name}={_percent(raw)}" for name in properties)
        return encoded.encode("ascii"), content_type
    boundary = b"not-utf8-boundary"
    out = b""
    # A text part beside the documented ones: an upload whose only part is a file
    # would hold no text to refuse.
    for name, spec in [*properties.items(), ("note", {})]:
        header = b'Content-Disposition: form-data; name="' + name.encode() + b'"'
        data = raw
        if isinstance(spec, dict) and spec.get("format") == "binary":
            header += b'; filename="part.tar.gz"\r\nContent-Type: application/gzip'
            data = _bundle("not-utf8")
        out += b"--" + boundary + b"\r\n" + header + b"\r\n\r\n" + data + b"\r\n"
    out += b"--" + boundary + b"--\r\n"
    return out, f"multipart/form-data; boundary={boundary.decode()}"


def not_utf8_sweep(
    server: Server, found: Resources, *, user: str | None, deadline_s: float = 120.0
) -> NotUtf8Result:
    """Send every operation of ``/v1/schema`` text that is not UTF-8 where it takes text.

    Each JSON, form and multipart body the operation documents, with every top-level
    field holding each sample (``DELETE`` too: the body is never read before its
    refusal would be); each query parameter, each path parameter and the identity and
    ``Last-Event-ID`` headers, with the samples in turn. Path parameters are seeded ids
    otherwise, so the requests reach the handlers. Every answer must be a 4xx in the
    error format whose message does not carry U+FFFD; a 5xx, a 2xx, a stream that
    starts, or no answer within the request timeout is a failure. Bounded: about 230
    requests (seconds), and ``deadline_s`` for all of them (past it, the rest count as failures).
    """
    schema = httpx.get(f"{server.url}/v1/schema", params={"format": "json"}, timeout=30).json()
    result = NotUtf8Result()
    started = time.monotonic()
    turn = 0

    def sample() -> bytes:
        nonlocal turn
        turn += 1
        return NOT_UTF8_SAMPLES[turn % len(NOT_UTF8_SAMPLES)]

    with httpx.Client(base_url=server.url, timeout=STREAM_TIMEOUT_S * 10) as client:

        def check(what: str, method: str, url: str, **kwargs: Any) -> None:
            if time.monotonic() - started > deadline_s:
                result.failures.append(f"{what}: not sent, past the {deadline_s:.0f} s deadline")
                return
            result.requests += 1
            result.swept.add(what.split(" ", 2)[0] + " " + what.split(" ", 2)[1])
            headers = {**({"X-Forwarded-Email": user} if user else {}), **kwargs.pop("headers", {})}
            try:
                with client.stream(method, url, headers=headers, **kwargs) as response:
                    status = response.status_code
                    body = response.read() if status >= 400 else b""
            except httpx.HTTPError as exc:
                result.failures.append(f"{what}: {type(exc).__name__}")
                return
            problem = _not_a_refusal(status, body)
            if problem:
                result.failures.append(f"{what}: {problem}")

        for method, template, operation in _operations(schema):
            values: dict[str, str] = {}
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path":
                    kind = _SEEDED.get(parameter["name"])
                    seeded = getattr(found, kind) if kind else []
                    values[parameter["name"]] = (
                        seeded[0] if seeded else _PATH_VALUES.get(parameter["name"], "x")
                    )
            url = template.format(**values)
            name = f"{method} {template}"
            result.operations.add(name)
            for parameter in operation.get("parameters", []):
                raw = _percent(sample())
                if parameter["in"] == "query":
                    check(
                        f"{name} ?{parameter['name']}", method, f"{url}?{parameter['name']}={raw}"
                    )
                elif parameter["in"] == "path":
                    bad = template.format(
                        **{**values, parameter["name"]: values[parameter["name"]] + raw}
                    )
                    check(f"{name} {{{parameter['name']}}}", method, bad)
            check(f"{name} identity", method, url, headers={"X-Forwarded-Email": b"f" + sample()})
            if any(
                p["in"] == "header" and p["name"] == "Last-Event-ID"
                for p in operation.get("parameters", [])
            ):
                check(
                    f"{name} Last-Event-ID", method, url, headers={"Last-Event-ID": b"1" + sample()}
                )
            content = (operation.get("requestBody") or {}).get("content") or {}
            for content_type, media in sorted(content.items()):
                properties = _properties(schema, media)
                for sequence in NOT_UTF8_SAMPLES:
                    body, header = _bodies(properties, content_type, sequence)
                    check(
                        f"{name} {content_type} body {sequence!r}",
                        method,
                        url,
                        content=body,
                        headers={"Content-Type": header},
                    )
    return result


def _not_a_refusal(status: int, body: bytes) -> str | None:
    """Why an answer to text that is not UTF-8 is wrong, or None for a 4xx in the format."""
    if not 400 <= status < 500:
        return f"answered {status}"
    try:
        error = json.loads(body.decode("utf-8"))["error"]
    except (ValueError, KeyError, TypeError):
        return f"answered {status} outside the error format: {body[:200]!r}"
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return f"answered {status} outside the error format: {body[:200]!r}"
    if "\ufffd" in error["message"]:
        return f"answered {status} with U+FFFD in its message: {error['message'][:200]}"
    return None
