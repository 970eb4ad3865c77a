"""Property-based API fuzzing (issue 15): schemathesis against ``/v1/schema`` on a live
daphne, once in local single-user mode and once in header mode.

Each run is bounded (a fixed seed, ``MAX_EXAMPLES`` cases per operation and phase, at
least ``MIN_REQUESTS`` requests) and fails on any 5xx, undocumented status code,
undocumented content type or body that does not match its schema
(``testing/fuzzing.py`` has the checks, the seeded resources the path ids are drawn
from, and why nothing is excluded). Before it, every operation is sent text that is not
UTF-8 in its bodies, query, path and headers (``fuzzing.not_utf8_sweep``): each must be a
4xx in the error format. ``make bench`` runs the long version (``bench/fuzz.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing import fuzzing
from testing.mockllm import MockLLMServer
from testing.processes import Server, base_env, migrate, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MAX_EXAMPLES = 12
MIN_REQUESTS = 1000
# Form bodies are refused whole (415) and no longer documented: about 230 requests.
MIN_NOT_UTF8_REQUESTS = 200
RUN_DEADLINE_S = 240.0
MODES = {
    # No identity on the requests: every one acts as the local user.
    "local": ({"OMNIGENT_LOCAL_SINGLE_USER": "1"}, None),
    # The authenticating proxy's header on every request (the default setting).
    "header": ({}, fuzzing.FUZZ_USER),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_schemathesis_finds_no_failure(mode: str, tmp_path: Path, mock_llm: MockLLMServer) -> None:
    settings, user = MODES[mode]
    env = base_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        OMNIGENT_DATA_DIR=str(tmp_path / "data"),
        **fuzzing.SERVER_SETTINGS,
        **settings,
    )
    migrate(env, tmp_path)
    server: Server = start_server(env=env, log_dir=tmp_path, name=f"daphne-{mode}")
    found = None
    try:
        found = fuzzing.seed_resources(server, user=user, mock_llm=mock_llm, log_dir=tmp_path)
        # Text that is not UTF-8, which schemathesis never sends: every operation, a
        # few seconds.
        not_utf8 = fuzzing.not_utf8_sweep(server, found, user=user)
        assert not not_utf8.failures, not_utf8.failures[:20]
        assert not_utf8.requests >= MIN_NOT_UTF8_REQUESTS, not_utf8.requests
        assert len(not_utf8.operations) > 20, sorted(not_utf8.operations)
        assert not_utf8.swept == not_utf8.operations, not_utf8.operations - not_utf8.swept
        config = fuzzing.write_config(
            tmp_path / "schemathesis.toml",
            found,
            max_examples=MAX_EXAMPLES,
            workers=2,
            stream_paths=fuzzing.event_stream_paths(server),
        )
        result = fuzzing.run_schemathesis(
            server, config=config, report_dir=tmp_path, user=user, timeout_s=RUN_DEADLINE_S
        )
        deep = fuzzing.deep_successes(result, found)
        print(
            json.dumps(
                {
                    "mode": mode,
                    "deep_operations": deep,
                    "not_utf8_requests": not_utf8.requests,
                    **fuzzing.summary(result),
                }
            )
        )
        assert result.returncode == 0, result.output[-20000:]
        assert result.requests >= MIN_REQUESTS, fuzzing.summary(result)
        # The fuzzer reached past the lookups: the seeded sessions' deep operations
        # answered 2xx, not only 404.
        assert deep >= fuzzing.MIN_DEEP_OPERATIONS, (deep, fuzzing.summary(result))
    except BaseException:
        print(server.process.log()[-8000:])
        raise
    finally:
        if found is not None and found.runner_process is not None:
            found.runner_process.stop()
        server.process.stop()
