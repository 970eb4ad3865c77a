"""Bundle validation and loading (omnigent_runner.bundles), without Django.

Every rejection rule of shared/spec/agents.md ("Bundles") gets a crafted archive and a
check that the message names the problem; hostile archives are built by hand with
tarfile.TarInfo, since build_bundle only writes regular files.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from omnigent_runner.bundles import (
    AgentSpec,
    BundleError,
    OsEnv,
    build_bundle,
    parse_bundle,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-test-0123456789abcdef"
MINIMAL = "name: helper\nprompt: You help.\n"


def crafted(*entries: tuple[tarfile.TarInfo, bytes | None], compress: bool = True) -> bytes:
    """A tar of hand-made entries; ``None`` content means a header with no data."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in entries:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    data = buffer.getvalue()
    return gzip.compress(data) if compress else data


def regular(name: str, content: bytes | str = b"x") -> tuple[tarfile.TarInfo, bytes]:
    payload = content.encode() if isinstance(content, str) else content
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    return info, payload


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


def rejected(data: bytes, **limits: int) -> str:
    with pytest.raises(BundleError) as caught:
        parse_bundle(data, **limits)
    return str(caught.value)


def single(yaml_text: str) -> bytes:
    return build_bundle({"agent.yaml": yaml_text})


def spec_of(yaml_text: str) -> AgentSpec:
    return parse_bundle(single(yaml_text)).spec


# --- archive-level rejections ----------------------------------------------------------


def test_rejects_symlink() -> None:
    data = crafted(regular("agent.yaml", MINIMAL), special("link", tarfile.SYMTYPE, "/etc/passwd"))
    assert "symbolic link" in rejected(data)


def test_rejects_hardlink() -> None:
    data = crafted(regular("agent.yaml", MINIMAL), special("hard", tarfile.LNKTYPE, "agent.yaml"))
    assert "hard link" in rejected(data)


def test_rejects_fifo() -> None:
    data = crafted(regular("agent.yaml", MINIMAL), special("pipe", tarfile.FIFOTYPE))
    assert "FIFO" in rejected(data)


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE])
def test_rejects_device(kind: bytes) -> None:
    data = crafted(regular("agent.yaml", MINIMAL), special("dev", kind))
    assert "device" in rejected(data)


def test_rejects_absolute_path() -> None:
    message = rejected(crafted(regular("agent.yaml", MINIMAL), regular("/etc/cron.d/x")))
    assert "'/etc/cron.d/x'" in message and "absolute path" in message


@pytest.mark.parametrize("name", ["../x", "sub/../../x", "./sub/../x", "sub\\..\\x"])
def test_rejects_dotdot_segment(name: str) -> None:
    message = rejected(crafted(regular("agent.yaml", MINIMAL), regular(name)))
    assert "escapes the archive root" in message and repr(name) in message


def test_rejects_too_many_entries() -> None:
    entries = [regular("agent.yaml", MINIMAL)] + [regular(f"f{i}") for i in range(5)]
    assert "more than 5 entries" in rejected(crafted(*entries), max_entries=5)


def test_five_entries_pass_a_limit_of_five() -> None:
    entries = [regular("agent.yaml", MINIMAL)] + [regular(f"f{i}") for i in range(4)]
    assert parse_bundle(crafted(*entries), max_entries=5).spec.name == "helper"


def test_rejects_too_many_entries_with_default_limit() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info, payload = regular("agent.yaml", MINIMAL)
        archive.addfile(info, io.BytesIO(payload))
        empty = io.BytesIO(b"")
        for i in range(10_000):
            archive.addfile(tarfile.TarInfo(f"f{i}"), empty)
    data = gzip.compress(buffer.getvalue(), compresslevel=1)
    assert "more than 10000 entries" in rejected(data)


def test_rejects_too_large_unpacked() -> None:
    data = crafted(regular("agent.yaml", MINIMAL), regular("big.bin", b"\0" * 1000))
    assert "too large when unpacked" in rejected(data, max_unpacked_bytes=500)


def test_rejects_lying_size_header_before_reading() -> None:
    info = tarfile.TarInfo("huge.bin")
    info.size = 2**40  # claims a terabyte; the archive holds nothing of it
    assert "too large when unpacked" in rejected(_header_only(info))


def _header_only(info: tarfile.TarInfo) -> bytes:
    """A tar whose only entry is a header with no data after it (a lying size)."""
    return gzip.compress(info.tobuf(format=tarfile.PAX_FORMAT) + b"\0" * 1024)


def test_rejects_gzip_bomb_in_tar_headers() -> None:
    info = tarfile.TarInfo("agent.yaml")
    info.pax_headers = {"comment": "A" * (4 * 1024 * 1024)}  # read by tarfile in one piece
    content = MINIMAL.encode()
    info.size = len(content)
    data = crafted((info, content))
    assert len(data) < 64 * 1024
    assert "too large when unpacked" in rejected(data, max_entries=5, max_unpacked_bytes=1000)


def test_rejects_truncated_archive() -> None:
    data = crafted(regular("agent.yaml", MINIMAL), regular("big.bin", b"z" * 5000), compress=False)
    assert "not a readable tar" in rejected(data[:2048])  # cut inside big.bin's data


def test_rejects_not_a_tar() -> None:
    assert "not a readable tar" in rejected(b"this is not a tar archive at all" * 40)


def test_rejects_corrupt_gzip() -> None:
    data = bytearray(build_bundle({"agent.yaml": MINIMAL}))
    data[20:40] = b"\xff" * 20
    assert "not a readable tar" in rejected(bytes(data))


def test_rejects_empty() -> None:
    assert "empty" in rejected(b"")


def test_rejects_duplicate_entry() -> None:
    data = crafted(regular("agent.yaml", MINIMAL), regular("./agent.yaml", MINIMAL))
    assert "more than once" in rejected(data)


# --- layout rejections -----------------------------------------------------------------


def test_rejects_no_yaml() -> None:
    assert "no agent YAML found" in rejected(build_bundle({"README.md": "hi"}))


def test_no_yaml_hint_names_yaml_inside_a_folder() -> None:
    message = rejected(build_bundle({"helper/config.yaml": "spec_version: 1\nname: x\n"}))
    assert "no agent YAML found" in message and "'helper/config.yaml'" in message


def test_rejects_two_root_yamls() -> None:
    message = rejected(build_bundle({"a.yaml": MINIMAL, "b.yml": MINIMAL}))
    assert "2 YAML files" in message and "a.yaml" in message and "b.yml" in message


def test_rejects_bad_yaml_syntax() -> None:
    message = rejected(single("name: x\nprompt: [unclosed\n"))
    assert "'agent.yaml' is not valid YAML" in message


def test_rejects_yaml_list_not_mapping() -> None:
    message = rejected(single("- name: x\n- prompt: y\n"))
    assert "must hold a mapping" in message and "a list" in message


def test_rejects_empty_yaml_document() -> None:
    assert "must hold a mapping" in rejected(single(""))


def test_rejects_yaml_alias_bomb() -> None:
    lines = ["name: bomb", "prompt: p", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    assert "too large" in rejected(single("\n".join(lines) + "\n"))


def test_rejects_missing_name() -> None:
    assert "missing the required 'name'" in rejected(single("prompt: hi\n"))


@pytest.mark.parametrize("name", ["has space", "x" * 129, "", "ünï", "a/b"])
def test_rejects_bad_name(name: str) -> None:
    message = rejected(single(f"name: {json.dumps(name)}\nprompt: hi\n"))
    assert "name" in message and "invalid" in message


def test_accepts_longest_name() -> None:
    assert spec_of(f"name: {'x' * 128}\nprompt: hi\n").name == "x" * 128


def test_rejects_spec_version_2() -> None:
    message = rejected(build_bundle({"config.yaml": "spec_version: 2\nname: x\nprompt: p\n"}))
    assert "spec_version: 1" in message and "2" in message


def test_rejects_config_yaml_without_spec_version() -> None:
    message = rejected(build_bundle({"config.yaml": MINIMAL}))
    assert "spec_version: 1" in message


def test_rejects_spec_version_in_single_file() -> None:
    message = rejected(single("spec_version: 1\n" + MINIMAL))
    assert "spec_version" in message and "config.yaml" in message


def test_rejects_single_file_without_prompt() -> None:
    assert "no 'prompt'" in rejected(single("name: x\n"))


# --- field rejections ------------------------------------------------------------------


def test_rejects_auth_type_oauth() -> None:
    message = rejected(single(MINIMAL + "executor:\n  auth: {type: oauth, api_key: k}\n"))
    assert "executor.auth.type" in message and "'oauth'" in message


@pytest.mark.parametrize("auth", ["{type: api_key}", "{type: api_key, api_key: ''}"])
def test_rejects_auth_api_key_missing(auth: str) -> None:
    message = rejected(single(MINIMAL + f"executor:\n  auth: {auth}\n"))
    assert "executor.auth.api_key is missing" in message


def test_error_message_never_echoes_api_key() -> None:
    message = rejected(single(MINIMAL + "executor:\n  auth: {type: api_key, api_key: 987654321}\n"))
    assert "executor.auth.api_key must be a string" in message and "987654321" not in message


def test_rejects_cwd_absolute() -> None:
    message = rejected(single(MINIMAL + "os_env: {type: caller_process, cwd: /etc}\n"))
    assert "os_env.cwd" in message and "relative" in message


@pytest.mark.parametrize("cwd", ["..", "sub/../..", "a/.."])
def test_rejects_cwd_with_dotdot(cwd: str) -> None:
    message = rejected(single(MINIMAL + f"os_env: {{type: caller_process, cwd: '{cwd}'}}\n"))
    assert "os_env.cwd" in message and "'..'" in message


def test_rejects_os_env_type_unknown() -> None:
    message = rejected(single(MINIMAL + "os_env: {type: remote_vm}\n"))
    assert "os_env.type" in message and "'remote_vm'" in message


def test_rejects_sandbox_docker() -> None:
    message = rejected(
        single(MINIMAL + "os_env: {type: caller_process, sandbox: {type: docker}}\n")
    )
    assert "os_env.sandbox.type 'docker' is not supported" in message


def test_rejects_api_foo() -> None:
    message = rejected(single(MINIMAL + "executor: {api: foo}\n"))
    assert "executor.api" in message and "'foo'" in message


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("executor: [a, b]\n", "executor"),
        ("executor: {max_iterations: abc}\n", "executor.max_iterations"),
        ("executor: {max_iterations: 0}\n", "executor.max_iterations"),
        ("executor: {max_iterations: true}\n", "executor.max_iterations"),
        ("executor: {timeout: -1}\n", "executor.timeout"),
        ("executor: {timeout: .nan}\n", "executor.timeout"),
        ("executor: {timeout: soon}\n", "executor.timeout"),
        ("executor: {model: 4}\n", "executor.model"),
        ("executor: {auth: key}\n", "executor.auth"),
        ("description: [x]\n", "description"),
        ("os_env: caller_process\n", "os_env"),
        ("os_env: {cwd: 3}\n", "os_env.cwd"),
        ("os_env: {sandbox: none}\n", "os_env.sandbox"),
    ],
)
def test_rejects_field_type_errors(extra: str, field: str) -> None:
    assert rejected(single(MINIMAL + extra)).startswith(f"{field} must be")


def test_rejects_name_not_a_string() -> None:
    assert "'name' must be a string" in rejected(single("name: 42\nprompt: hi\n"))


# --- acceptance ------------------------------------------------------------------------


def test_single_file_layout_with_any_filename() -> None:
    data = build_bundle(
        {"./workspace-file-writer.yaml": "name: workspace-file-writer\nprompt: Write.\n"}
    )
    bundle = parse_bundle(data)
    assert bundle.layout == "single_file"
    assert bundle.spec.name == "workspace-file-writer"
    assert bundle.spec.prompt == "Write."


def test_single_file_with_instructions_uses_the_text() -> None:
    assert spec_of("name: x\ninstructions: Be brief.\n").prompt == "Be brief."


def test_plain_tar_accepted() -> None:
    data = build_bundle({"agent.yml": MINIMAL}, gzip=False)
    assert not data.startswith(b"\x1f\x8b")
    assert parse_bundle(data).spec.prompt == "You help."


def test_directory_layout_reads_instructions_file() -> None:
    data = build_bundle(
        {
            "./config.yaml": "spec_version: 1\nname: file-helper\ninstructions: AGENTS.md\n",
            "./AGENTS.md": "# Helper\nYou edit files.\n",
            "./tools/extra.yaml": "ignored: true\n",
            "./notes.yaml": "another root yaml is fine next to config.yaml\n",
        }
    )
    bundle = parse_bundle(data)
    assert bundle.layout == "directory"
    assert bundle.spec.prompt == "# Helper\nYou edit files.\n"
    assert bundle.spec.raw["instructions"] == "AGENTS.md"


def test_directory_layout_instructions_text_when_no_such_file() -> None:
    data = build_bundle({"config.yaml": "spec_version: 1\nname: x\ninstructions: Just do it.\n"})
    assert parse_bundle(data).spec.prompt == "Just do it."


def test_directory_entries_and_dot_prefixes_accepted() -> None:
    root = tarfile.TarInfo("./")
    root.type = tarfile.DIRTYPE
    sub = tarfile.TarInfo("./docs")
    sub.type = tarfile.DIRTYPE
    data = crafted(
        (root, None), (sub, None), regular(".//agent.yaml", MINIMAL), regular("./docs/a.md")
    )
    assert parse_bundle(data).spec.name == "helper"


def test_defaults() -> None:
    spec = spec_of(MINIMAL)
    assert spec.description == ""
    assert spec.model is None
    assert spec.api == "responses"
    assert spec.api_key is None and spec.base_url is None
    assert spec.max_iterations == 50
    assert spec.timeout == 600
    assert spec.os_env is None
    assert spec.unknown_keys == ()


def test_all_implemented_fields() -> None:
    spec = spec_of(
        f"""
name: file-helper
description: Edits files.
prompt: |
  You edit files.
executor:
  model: gpt-4o-mini
  api: chat_completions
  auth: {{type: api_key, api_key: {SECRET}, base_url: "http://127.0.0.1:9999/v1"}}
  max_iterations: 7
  timeout: 12.5
os_env:
  type: caller_process
  cwd: ./sub
  sandbox: {{type: none}}
"""
    )
    assert (spec.name, spec.description, spec.prompt) == (
        "file-helper",
        "Edits files.",
        "You edit files.\n",
    )
    assert (spec.model, spec.api) == ("gpt-4o-mini", "chat_completions")
    assert (spec.api_key, spec.base_url) == (SECRET, "http://127.0.0.1:9999/v1")
    assert (spec.max_iterations, spec.timeout) == (7, 12.5)
    assert spec.os_env == OsEnv(type="caller_process", cwd="./sub", sandbox_type="none")


def test_os_env_defaults() -> None:
    assert spec_of(MINIMAL + "os_env: {}\n").os_env == OsEnv(
        type="caller_process", cwd=".", sandbox_type="none"
    )


def test_max_iterations_capped() -> None:
    assert spec_of(MINIMAL + "executor: {max_iterations: 5000}\n").max_iterations == 1000


def test_unknown_keys_kept_and_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="omnigent_runner.bundles"):
        spec = spec_of(MINIMAL + "tools: [web]\nskills: [web]\nmemory: {kind: long}\n")
    # ``tools`` is read for its MCP declarations (mcp.md); any other shape is kept.
    assert spec.unknown_keys == ("skills", "memory")
    assert spec.raw["tools"] == ["web"] and spec.mcp_servers == ()
    warnings = [r for r in caplog.records if r.name == "omnigent_runner.bundles"]
    assert len(warnings) == 1 and "skills, memory" in warnings[0].getMessage()


def test_environment_variables_not_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/should-not-appear")
    spec = spec_of("name: x\nprompt: 'Home is ${HOME} and $HOME'\nos_env: {cwd: '$HOME'}\n")
    assert spec.prompt == "Home is ${HOME} and $HOME"
    assert spec.os_env is not None and spec.os_env.cwd == "$HOME"


def test_sha256_and_size_of_exact_bytes() -> None:
    data = single(MINIMAL)
    bundle = parse_bundle(data)
    assert bundle.sha256 == hashlib.sha256(data).hexdigest()
    assert bundle.size == len(data)


def test_build_bundle_is_deterministic() -> None:
    assert build_bundle({"a.yaml": MINIMAL}) == build_bundle({"a.yaml": MINIMAL})


def test_public_dict_hides_api_key() -> None:
    spec = spec_of(
        MINIMAL
        + f"executor:\n  model: m\n  auth: {{type: api_key, api_key: {SECRET}, "
        + f"base_url: 'http://u:{SECRET}@h/v1'}}\n"
        + f"mcp: {{server: {{token: other-token-value, note: 'uses {SECRET}'}}}}\n"
    )
    public = spec.public_dict()
    text = json.dumps(public)
    assert SECRET not in text
    assert "other-token-value" not in text
    assert public["api_key"] == "***"
    assert public["raw"]["executor"]["auth"]["api_key"] == "***"
    assert public["model"] == "m" and public["name"] == "helper"
    assert spec.api_key == SECRET  # the spec itself keeps it for the runner


def test_repr_hides_api_key() -> None:
    bundle = parse_bundle(
        single(MINIMAL + f"executor: {{auth: {{type: api_key, api_key: {SECRET}}}}}\n")
    )
    assert bundle.spec.api_key == SECRET
    assert SECRET not in repr(bundle)


def test_public_dict_is_json_safe_for_odd_yaml_values() -> None:
    spec = spec_of(MINIMAL + "when: 2024-01-02\nratio: .inf\nset: !!set {a, b}\n")
    json.dumps(spec.public_dict(), allow_nan=False)


def test_module_does_not_import_django() -> None:
    code = (
        "import omnigent_runner.bundles, sys; assert 'django' not in sys.modules, 'django imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
