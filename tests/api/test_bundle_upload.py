"""Bundle rules at the HTTP level (agents.md, Bundles): every rejection is a 400 that says
why, before anything is stored; accepted layouts create the agent from the exact bytes."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest

from omnigent_runner.bundles import build_bundle
from sessions import blobs
from sessions.models import Agent, Session

from .conftest import ALICE, assert_error, assert_nothing_written, stored_files, upload

pytestmark = pytest.mark.django_db

GOOD_YAML = "name: helper\nprompt: You help.\n"


def regular(name: str, content: str | bytes) -> tuple[tarfile.TarInfo, bytes]:
    payload = content.encode() if isinstance(content, str) else content
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    info.mode = 0o644
    return info, payload


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


def crafted(*entries: tuple[tarfile.TarInfo, bytes | None], compress: bool = True) -> bytes:
    """A tar of hand-made entries (``None`` content: a header without data)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in entries:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    data = buffer.getvalue()
    return gzip.compress(data, mtime=0) if compress else data


def single(yaml_text: str) -> bytes:
    return crafted(regular("agent.yaml", yaml_text))


def with_executor(auth: str) -> str:
    return GOOD_YAML + "executor:\n  model: m\n  auth:\n" + auth


def huge_bundle() -> bytes:
    """One 65 MiB file of zeros: small compressed, over the 64 MiB unpacked limit."""
    return crafted(regular("agent.yaml", GOOD_YAML), regular("big.bin", bytes(65 * 1024 * 1024)))


# (id, archive builder, words the message must contain)
REJECTED = [
    (
        "symlink",
        lambda: crafted(
            regular("agent.yaml", GOOD_YAML), special("link", tarfile.SYMTYPE, "/etc/passwd")
        ),
        "symbolic link",
    ),
    (
        "hardlink",
        lambda: crafted(regular("agent.yaml", GOOD_YAML), special("hl", tarfile.LNKTYPE, "x")),
        "hard link",
    ),
    (
        "fifo",
        lambda: crafted(regular("agent.yaml", GOOD_YAML), special("pipe", tarfile.FIFOTYPE)),
        "FIFO",
    ),
    (
        "device",
        lambda: crafted(regular("agent.yaml", GOOD_YAML), special("dev", tarfile.CHRTYPE)),
        "device",
    ),
    (
        "dotdot",
        lambda: crafted(regular("agent.yaml", GOOD_YAML), regular("../escape.txt", "x")),
        "'..' segment",
    ),
    (
        "dotdot-nested",
        lambda: crafted(regular("agent.yaml", GOOD_YAML), regular("sub/../../x", "x")),
        "escapes the archive root",
    ),
    (
        "absolute",
        lambda: crafted(regular("agent.yaml", GOOD_YAML), regular("/etc/cron.d/x", "x")),
        "absolute path",
    ),
    ("not-a-tar", lambda: b"PK\x03\x04 a zip file", "not a readable tar"),
    ("empty", lambda: b"", "empty"),
    ("no-yaml", lambda: crafted(regular("README.md", "# hi")), "no agent YAML"),
    (
        "nested-yaml-only",
        lambda: crafted(regular("folder/agent.yaml", GOOD_YAML)),
        "pack the folder's contents",
    ),
    (
        "two-root-yamls",
        lambda: crafted(regular("a.yaml", GOOD_YAML), regular("b.yml", GOOD_YAML)),
        "exactly one",
    ),
    ("bad-yaml", lambda: single("name: [unclosed\nprompt: x\n"), "not valid YAML"),
    ("yaml-not-a-mapping", lambda: single("- a\n- b\n"), "mapping"),
    ("missing-name", lambda: single("prompt: You help.\n"), "missing the required 'name'"),
    ("bad-name", lambda: single("name: has spaces!\nprompt: x\n"), "is invalid"),
    ("name-not-a-string", lambda: single("name: [1]\nprompt: x\n"), "'name' must be a string"),
    ("no-prompt", lambda: single("name: helper\n"), "no 'prompt'"),
    (
        "bad-auth-type",
        lambda: single(with_executor("    type: oauth\n")),
        "executor.auth.type must be 'api_key'",
    ),
    (
        "auth-without-key",
        lambda: single(with_executor("    type: api_key\n")),
        "api_key is missing",
    ),
    (
        "absolute-cwd",
        lambda: single(GOOD_YAML + "os_env:\n  type: caller_process\n  cwd: /etc\n"),
        "os_env.cwd must be relative",
    ),
    (
        "dotdot-cwd",
        lambda: single(GOOD_YAML + "os_env:\n  cwd: sub/../..\n"),
        "os_env.cwd must not contain a '..'",
    ),
    (
        "sandbox-type",
        lambda: single(GOOD_YAML + "os_env:\n  sandbox: {type: docker}\n"),
        "sandbox.type",
    ),
    (
        "spec-version-2",
        lambda: crafted(regular("config.yaml", "spec_version: 2\n" + GOOD_YAML)),
        "spec_version: 1",
    ),
    (
        "spec-version-in-single-file",
        lambda: single("spec_version: 1\n" + GOOD_YAML),
        "only a root config.yaml",
    ),
    ("bad-api", lambda: single(GOOD_YAML + "executor:\n  api: grpc\n"), "executor.api"),
    (
        "nul-in-yaml",
        lambda: single(GOOD_YAML + 'description: "a\\0b"\n'),
        "NUL character",
    ),
    (
        "lone-surrogate-in-yaml",
        lambda: single(GOOD_YAML + 'description: "a\\ud800b"\n'),
        # libyaml (the loader's parser) refuses the escape itself; PyYAML's Python
        # parser accepts it and the spec check says "lone surrogate".
        "invalid Unicode character",
    ),
    (
        "nul-in-instructions-file",
        lambda: crafted(
            regular("config.yaml", "spec_version: 1\nname: d\ninstructions: AGENTS.md\n"),
            regular("AGENTS.md", "hi\x00there"),
        ),
        "NUL character",
    ),
    ("too-large-unpacked", huge_bundle, "too large when unpacked"),
]


@pytest.mark.parametrize(
    ("build", "reason"),
    [(build, reason) for _, build, reason in REJECTED],
    ids=[case_id for case_id, _, _ in REJECTED],
)
def test_rejected_bundle_on_session_create(client_for, build, reason) -> None:
    response = client_for(ALICE).post(
        "/v1/sessions",
        {"metadata": json.dumps({"title": "t"}), "bundle": upload(build())},
        format="multipart",
    )
    error = assert_error(response, 400, "invalid_input", mentions=reason)
    assert error["message"].startswith("bundle: ")
    assert list(error["fields"]) == ["bundle"]
    assert_nothing_written()


@pytest.mark.parametrize(
    ("build", "reason"),
    [(build, reason) for case_id, build, reason in REJECTED if case_id != "too-large-unpacked"],
    ids=[case_id for case_id, _, _ in REJECTED if case_id != "too-large-unpacked"],
)
def test_rejected_bundle_on_agent_upload(client_for, build, reason) -> None:
    response = client_for(ALICE).post("/v1/agents", {"bundle": upload(build())}, format="multipart")
    assert_error(response, 400, "invalid_input", mentions=reason)
    assert_nothing_written()


# --- accepted layouts ------------------------------------------------------------------


def create(client, data: bytes) -> Session:
    response = client.post("/v1/sessions", {"bundle": upload(data)}, format="multipart")
    assert response.status_code == 201, response.content
    return Session.objects.select_related("agent").get(pk=response.json()["session_id"])


def test_single_file_layout_any_file_name(client_for) -> None:
    data = crafted(
        regular("./workspace-file-writer.yaml", "name: writer\ndescription: Writes.\nprompt: p\n")
    )
    session = create(client_for(ALICE), data)
    assert session.agent.name == "writer"
    assert session.agent.description == "Writes."
    assert session.agent.spec["prompt"] == "p"
    assert blobs.read_bundle(session.agent.bundle_sha256) == data


def test_directory_layout_with_instructions_file(client_for) -> None:
    data = build_bundle(
        {
            "config.yaml": "spec_version: 1\nname: dir-agent\ninstructions: AGENTS.md\n",
            "AGENTS.md": "You are a directory agent.",
            "docs/notes.yaml": "not: the spec",
        }
    )
    session = create(client_for(ALICE), data)
    assert session.agent.name == "dir-agent"
    assert session.agent.spec["prompt"] == "You are a directory agent."


def test_plain_tar_is_accepted(client_for) -> None:
    data = crafted(regular("agent.yaml", GOOD_YAML), compress=False)
    session = create(client_for(ALICE), data)
    assert session.agent.name == "helper"
    assert session.agent.bundle_size == len(data)


def test_unknown_top_level_keys_are_kept_and_env_vars_not_expanded(client_for) -> None:
    text = GOOD_YAML + "memory: {kind: long}\nexecutor:\n  model: ${MODEL_NAME}\n"
    session = create(client_for(ALICE), single(text))
    assert session.agent.model == "${MODEL_NAME}"
    assert session.agent.spec["unknown_keys"] == ["memory"]
    assert session.agent.spec["raw"]["memory"] == {"kind": "long"}


def test_api_key_is_never_stored_in_the_spec_or_returned(client_for) -> None:
    secret = "sk-live-abcdef0123456789"
    text = with_executor(f"    type: api_key\n    api_key: {secret}\n")
    client = client_for(ALICE)
    session = create(client, single(text))
    assert secret not in json.dumps(session.agent.spec)
    assert session.agent.spec["api_key"] == "***"
    for path in ("", "/agent"):
        assert secret not in client.get(f"/v1/sessions/{session.id}{path}").content.decode()


def test_rejection_keeps_an_existing_blob(client_for, make_bundle) -> None:
    """A failed upload never removes a bundle another agent already stored."""
    client = client_for(ALICE)
    kept = create(client, make_bundle("kept"))
    before = stored_files()
    response = client.post(
        "/v1/sessions", {"bundle": upload(single("name: bad name\n"))}, format="multipart"
    )
    assert_error(response, 400, "invalid_input")
    assert stored_files() == before == [blobs.bundle_path(kept.agent.bundle_sha256)]
    assert Agent.objects.count() == 1
