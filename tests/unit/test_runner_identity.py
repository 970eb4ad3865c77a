"""Runner identity, configuration and the event outbox: the Django-free runner pieces
that need no socket."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from pathlib import Path

import pytest

from omnigent_runner.config import ConfigError, RunnerConfig, load_config
from omnigent_runner.identity import RUNNER_ID_PREFIX, derive_runner_id, new_binding_token
from omnigent_runner.outbox import BACKLOG_FULL_CODE, Outbox
from omnigent_runner.protocol import (
    EventFrame,
    OutputItemDone,
    OutputTextDelta,
    SessionStatus,
    WorkspaceChanges,
)

pytestmark = pytest.mark.timeout(30)

TOKEN = "secret-binding-token-123"


# ------------------------------------------------------------------ identity


def test_derive_runner_id_matches_the_omnigent_scheme() -> None:
    expected = "runner_token_" + hashlib.sha256(b"omnigent-runner:abc").hexdigest()[:32]
    assert derive_runner_id("abc") == expected
    assert derive_runner_id(" abc ") == expected
    assert derive_runner_id("abc\n") == expected
    assert expected.startswith(RUNNER_ID_PREFIX)
    assert len(expected) == len(RUNNER_ID_PREFIX) + 32


@pytest.mark.parametrize("token", ["", "   ", "\n\t"])
def test_blank_token_is_rejected(token: str) -> None:
    with pytest.raises(ValueError):
        derive_runner_id(token)


def test_new_binding_token_is_random_and_derivable() -> None:
    first, second = new_binding_token(), new_binding_token()
    assert first != second
    assert len(first) >= 40
    assert derive_runner_id(first) != derive_runner_id(second)


# -------------------------------------------------------------------- config


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": TOKEN,
        "OMNIGENT_RUNNER_WORKSPACE": str(tmp_path),
        **extra,
    }


def test_config_from_env(tmp_path: Path) -> None:
    config = load_config(
        [],
        _env(
            tmp_path,
            RUNNER_SERVER_URL="https://example.com",
            OMNIGENT_RUNNER_ID=derive_runner_id(TOKEN),
            OMNIGENT_RUNNER_PARENT_PID="4242",
            OMNIGENT_RUNNER_ISOLATE_SESSION="1",
        ),
    )
    assert config.server_url == "https://example.com"
    assert config.token == TOKEN
    assert config.runner_id == derive_runner_id(TOKEN)
    assert config.workspace == tmp_path.resolve()
    assert config.parent_pid == 4242
    assert config.isolate_session is True
    assert config.log_level == "INFO"
    assert config.delta_interval_ms == 40  # the default
    assert config.llm_http_client == "aiohttp"  # the default
    assert config.max_turns == 8  # the default
    assert TOKEN not in repr(config)


def test_config_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config([], {"OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": TOKEN})
    assert config.server_url == "http://127.0.0.1:8000"
    assert config.workspace == tmp_path.resolve()
    assert config.parent_pid is None
    assert config.isolate_session is False


def test_flags_override_env(tmp_path: Path) -> None:
    other_token = "flag-token-456"
    flag_workspace = tmp_path / "flagged"
    flag_workspace.mkdir()
    config = load_config(
        [
            "--server-url",
            "http://flag.example:9000/",
            "--token",
            other_token,
            "--runner-id",
            derive_runner_id(other_token),
            "--workspace",
            str(flag_workspace),
            "--parent-pid",
            "77",
            "--isolate-session",
            "--log-level",
            "debug",
        ],
        _env(
            tmp_path,
            RUNNER_SERVER_URL="http://env.example",
            OMNIGENT_RUNNER_PARENT_PID="4242",
            OMNIGENT_RUNNER_ISOLATE_SESSION="0",
        ),
    )
    assert config.server_url == "http://flag.example:9000"
    assert config.token == other_token
    assert config.runner_id == derive_runner_id(other_token)
    assert config.workspace == flag_workspace.resolve()
    assert config.parent_pid == 77
    assert config.isolate_session is True
    assert config.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("argv", "env_value", "expected"),
    [
        ([], "0", 0),  # off: every delta as it comes
        ([], " 25 ", 25),
        ([], "1000", 1000),
        ([], "", 40),  # empty counts as unset
        (["--delta-interval-ms", "5"], "100", 5),  # the flag wins
    ],
)
def test_delta_interval(tmp_path: Path, argv: list[str], env_value: str, expected: int) -> None:
    env = _env(tmp_path, OMNIGENT_RUNNER_DELTA_INTERVAL_MS=env_value)
    assert load_config(argv, env).delta_interval_ms == expected


@pytest.mark.parametrize(
    ("argv", "env_value", "expected"),
    [([], "1", 1), ([], " 4 ", 4), ([], "", 8), (["--max-turns", "2"], "16", 2)],
)
def test_max_turns(tmp_path: Path, argv: list[str], env_value: str, expected: int) -> None:
    env = _env(tmp_path, OMNIGENT_RUNNER_MAX_TURNS=env_value)
    assert load_config(argv, env).max_turns == expected


@pytest.mark.parametrize("value", ["0", "-1", "1001", "2.5", "+5", "many", "\u0663"])
def test_bad_max_turns_is_a_config_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], _env(tmp_path, OMNIGENT_RUNNER_MAX_TURNS=value))
    assert "OMNIGENT_RUNNER_MAX_TURNS" in str(info.value)
    assert "1 to 1000" in str(info.value)


@pytest.mark.parametrize("value", ["-1", "1001", "40.5", "1_000", "+5", "fast", "\u0663"])
def test_bad_delta_interval_is_a_config_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], _env(tmp_path, OMNIGENT_RUNNER_DELTA_INTERVAL_MS=value))
    assert "OMNIGENT_RUNNER_DELTA_INTERVAL_MS" in str(info.value)
    assert "0 (off) to 1000" in str(info.value)
    with pytest.raises(ConfigError):
        load_config(["--delta-interval-ms", value], _env(tmp_path))


@pytest.mark.parametrize(
    ("argv", "env_value", "expected"),
    [
        ([], "", "aiohttp"),
        ([], "httpx", "httpx"),
        ([], "HTTPX", "httpx"),
        ([], " aiohttp ", "aiohttp"),
        (["--llm-http-client", "aiohttp"], "httpx", "aiohttp"),  # the flag wins
        (["--llm-http-client", "HTTPX"], "", "httpx"),
    ],
)
def test_llm_http_client(tmp_path: Path, argv: list[str], env_value: str, expected: str) -> None:
    env = _env(tmp_path, OMNIGENT_RUNNER_LLM_HTTP_CLIENT=env_value)
    assert load_config(argv, env).llm_http_client == expected


@pytest.mark.parametrize("value", ["requests", "curl", "aio-http"])
def test_unknown_llm_http_client_is_a_config_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(
        ConfigError, match="OMNIGENT_RUNNER_LLM_HTTP_CLIENT must be one of aiohttp, httpx"
    ):
        load_config([], _env(tmp_path, OMNIGENT_RUNNER_LLM_HTTP_CLIENT=value))
    with pytest.raises(ConfigError, match="invalid choice"):
        load_config(["--llm-http-client", value], _env(tmp_path))


def test_aiohttp_missing_is_a_config_error_that_names_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "aiohttp" else real_find_spec(name, *args),
    )
    with pytest.raises(ConfigError) as info:
        load_config([], _env(tmp_path))
    assert "OMNIGENT_RUNNER_LLM_HTTP_CLIENT=httpx" in str(info.value)
    # httpx is the SDK's own dependency: choosing it needs nothing more.
    assert (
        load_config([], _env(tmp_path, OMNIGENT_RUNNER_LLM_HTTP_CLIENT="httpx")).llm_http_client
        == "httpx"
    )


def test_runner_id_mismatch_is_a_config_error_without_the_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], _env(tmp_path, OMNIGENT_RUNNER_ID="runner_token_" + "0" * 32))
    message = str(info.value)
    assert "OMNIGENT_RUNNER_ID" in message
    assert TOKEN not in message


@pytest.mark.parametrize(
    ("argv", "env_extra"),
    [
        ([], {"OMNIGENT_RUNNER_TUNNEL_BINDING_TOKEN": "  "}),
        ([], {"RUNNER_SERVER_URL": "ftp://example.com"}),
        ([], {"OMNIGENT_RUNNER_PARENT_PID": "not-a-pid"}),
        ([], {"OMNIGENT_RUNNER_WORKSPACE": "/definitely/not/here"}),
        (["--no-such-flag"], {}),
    ],
)
def test_bad_config_raises_config_error(
    tmp_path: Path, argv: list[str], env_extra: dict[str, str]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(argv, _env(tmp_path, **env_extra))
    assert TOKEN not in str(info.value)


def _config(server_url: str, tmp_path: Path) -> RunnerConfig:
    return RunnerConfig(
        server_url=server_url, token=TOKEN, runner_id="runner_token_x", workspace=tmp_path
    )


@pytest.mark.parametrize(
    ("server_url", "tunnel_url"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/v1/runners/runner_token_x/tunnel"),
        ("https://example.com", "wss://example.com/v1/runners/runner_token_x/tunnel"),
        (
            "https://example.com/omnigent/",
            "wss://example.com/omnigent/v1/runners/runner_token_x/tunnel",
        ),
    ],
)
def test_tunnel_url(server_url: str, tunnel_url: str, tmp_path: Path) -> None:
    assert _config(server_url, tmp_path).tunnel_url == tunnel_url


def test_tunnel_url_via_load_config_keeps_path_prefix(tmp_path: Path) -> None:
    config = load_config([], _env(tmp_path, RUNNER_SERVER_URL="http://h:1/pre/fix/"))
    assert config.tunnel_url == f"ws://h:1/pre/fix/v1/runners/{derive_runner_id(TOKEN)}/tunnel"


# -------------------------------------------------------------------- outbox


def _ev(response_id: str = "resp_1") -> OutputTextDelta:
    return OutputTextDelta(response_id=response_id, item_id="item_1", delta="x")


def _changes() -> WorkspaceChanges:
    return WorkspaceChanges(mode="agent_edit", entries=[])


def _seq(frame: EventFrame | None) -> int:
    assert frame is not None
    return frame.seq


def test_outbox_numbers_each_session_from_one() -> None:
    outbox = Outbox()
    a1 = outbox.emit("a", _ev())
    a2 = outbox.emit("a", _ev())
    b1 = outbox.emit("b", _ev())
    assert a1 == EventFrame(session_id="a", seq=1, event=_ev())
    assert a2 is not None and a2.seq == 2
    assert b1 is not None and b1.seq == 1
    assert [(f.session_id, f.seq) for f in outbox.pending()] == [("a", 1), ("a", 2), ("b", 1)]


def test_outbox_ack_is_cumulative() -> None:
    outbox = Outbox()
    for _ in range(5):
        outbox.emit("a", _ev())
    outbox.emit("b", _ev())
    outbox.ack("a", 3)
    assert [(f.session_id, f.seq) for f in outbox.pending()] == [("a", 4), ("a", 5), ("b", 1)]
    outbox.ack("a", 2)  # a stale ack changes nothing
    outbox.ack("unknown", 9)
    assert len(outbox) == 3
    outbox.ack("a", 5)
    outbox.ack("b", 1)
    assert outbox.pending() == []
    assert _seq(outbox.emit("a", _ev())) == 6


def test_outbox_resync_after_restart_continues_numbering() -> None:
    restarted = Outbox()  # a fresh process: nothing buffered, would start at 1
    restarted.resync("a", 7)
    assert _seq(restarted.emit("a", _ev())) == 8


def test_outbox_resync_drops_what_the_server_stored_and_keeps_the_rest() -> None:
    outbox = Outbox()
    for _ in range(4):
        outbox.emit("a", _ev())
    outbox.resync("a", 2)
    assert [f.seq for f in outbox.pending()] == [3, 4]
    assert _seq(outbox.emit("a", _ev())) == 5


def test_outbox_cap_reports_one_failure_per_session(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="runners")
    outbox = Outbox(max_unacked=3)
    outbox.emit("a", _ev("resp_a"))
    outbox.emit("a", _ev("resp_a"))
    outbox.emit("b", _ev("resp_b"))
    assert len(outbox) == 3

    failure = outbox.emit("a", _ev("resp_a2"))
    assert failure is not None
    assert failure.seq == 3
    assert isinstance(failure.event, SessionStatus)
    assert failure.event.status == "failed"
    assert failure.event.response_id == "resp_a2"
    assert failure.event.error is not None and failure.event.error.code == BACKLOG_FULL_CODE
    assert "backlog full" in caplog.text

    for _ in range(100):
        assert outbox.emit("a", _ev("resp_a2")) is None
    other = outbox.emit("b", _ev("resp_b"))
    assert other is not None and isinstance(other.event, SessionStatus)
    assert other.event.error is not None and other.event.error.code == BACKLOG_FULL_CODE
    assert outbox.emit("b", _ev("resp_b")) is None
    assert len(outbox) == 5  # the cap plus one failure per session, never more

    # Once acknowledged, there is room again; the failed turn stays failed,
    # but a new turn of the session is delivered.
    outbox.ack("a", 3)
    outbox.ack("b", 2)
    assert outbox.emit("a", _ev("resp_a2")) is None
    fresh = outbox.emit("a", _ev("resp_a3"))
    assert fresh is not None and fresh.seq == 4


def test_outbox_failure_without_any_response_id() -> None:
    outbox = Outbox(max_unacked=1)
    outbox.emit("a", _changes())
    failure = outbox.emit("a", _changes())
    assert failure is not None and isinstance(failure.event, SessionStatus)
    assert failure.event.response_id is None


def test_outbox_replaces_an_event_too_large_for_a_frame() -> None:
    from omnigent_runner.outbox import TOO_LARGE_CODE, Outbox

    outbox = Outbox(max_event_bytes=1000)
    small = outbox.emit("conv_1", OutputTextDelta(response_id="r1", item_id="i1", delta="x"))
    big = outbox.emit("conv_1", OutputItemDone(response_id="r1", item={"text": "y" * 5000}))
    assert small is not None and isinstance(small.event, OutputTextDelta)
    assert small.event.delta == "x"
    assert big is not None and big.seq == 2
    assert isinstance(big.event, SessionStatus)
    assert big.event.status == "failed"
    assert big.event.response_id == "r1"
    assert big.event.error is not None and big.event.error.code == TOO_LARGE_CODE
