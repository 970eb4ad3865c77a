"""Bounds on the agent YAML itself (issue 15, item 4; agents.md, "Bundles").

The archive limits (entries, unpacked bytes) are in ``test_bundles.py``. Here: the size
cap on the agent YAML, checked before any parsing, and the bounded loader (nesting
depth, alias expansion, no custom tags), each refusing with a ``BundleError`` that
says why. How fast the refusals are is measured by ``bench/hostile.py``, not here.
"""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
import yaml

from omnigent_runner import bundles
from omnigent_runner.bundles import (
    DEFAULT_MAX_YAML_BYTES,
    BundleError,
    build_bundle,
    max_yaml_bytes_from,
    parse_bundle,
)

MINIMAL = "name: helper\nprompt: You help.\n"


def rejected(data: bytes, **limits: int) -> str:
    with pytest.raises(BundleError) as caught:
        parse_bundle(data, **limits)
    return str(caught.value)


def single(text: str) -> bytes:
    return build_bundle({"agent.yaml": text})


def padded_yaml(size: int) -> str:
    """A valid agent YAML of about ``size`` bytes: one long block-literal prompt."""
    line = "  " + "a" * 77 + "\n"
    return "name: big\nprompt: |\n" + line * (size // len(line) + 1)


def test_default_cap_is_one_mebibyte() -> None:
    assert DEFAULT_MAX_YAML_BYTES == 1024 * 1024


def test_gzip_bomb_yaml_is_refused_by_size_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """24 MiB of YAML in a 25 KB-class upload: refused by its size, the parser never runs."""
    text = padded_yaml(24 * 1024 * 1024)
    data = single(text)
    assert len(data) < 200 * 1024
    calls: list[object] = []
    monkeypatch.setattr(bundles, "_load_yaml", lambda *args: calls.append(args))
    message = rejected(data)
    assert "agent.yaml" in message and "1048576" in message, message
    assert calls == []


def test_size_cap_applies_to_config_yaml_too() -> None:
    data = build_bundle({"config.yaml": "spec_version: 1\n" + padded_yaml(3000)})
    assert "at most 2000 bytes" in rejected(data, max_yaml_bytes=2000)


def test_yaml_of_exactly_the_cap_is_parsed() -> None:
    text = MINIMAL + "#" * 100 + "\n"
    size = len(text.encode())
    assert parse_bundle(single(text), max_yaml_bytes=size).spec.name == "helper"
    assert "at most" in rejected(single(text), max_yaml_bytes=size - 1)


def test_billion_laughs_is_refused_while_composing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine levels of ten aliases (10^9 values once expanded) in a few hundred bytes."""
    lines = ["name: bomb", "prompt: p", 'l0: &l0 "lol"']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    text = "\n".join(lines) + "\n"
    assert len(text) < 1000
    constructed: list[str] = []  # node tags only: a node's repr expands every alias
    real = yaml.SafeLoader.construct_document

    def spy(self: yaml.SafeLoader, node: yaml.Node) -> object:
        constructed.append(node.tag)
        return real(self, node)

    monkeypatch.setattr(yaml.SafeLoader, "construct_document", spy)
    message = rejected(single(text))
    assert "aliases" in message and "too large" in message, message
    assert constructed == []  # refused before any Python object was built


def test_aliases_within_the_budget_load() -> None:
    text = MINIMAL + "base: &base {model: m, temperature: 1}\nother: *base\nthird: {<<: *base}\n"
    raw = parse_bundle(single(text)).spec.raw
    assert raw["other"] == raw["base"] == {"model": "m", "temperature": 1}
    assert raw["third"] == raw["base"]


def test_recursive_alias_is_refused() -> None:
    assert "refers to itself" in rejected(single(MINIMAL + "loop: &loop [1, *loop]\n"))


@pytest.mark.parametrize("style", ["flow", "block"])
def test_nesting_deeper_than_64_is_refused_with_a_clear_message(style: str) -> None:
    depth = 65
    if style == "flow":
        nested = "[" * depth + "]" * depth
        text = MINIMAL + f"deep: {nested}\n"
    else:
        text = MINIMAL + "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "x\n"
    assert "nested deeper than 64 levels" in rejected(single(text))


def test_nesting_of_64_levels_loads() -> None:
    # The document is level 0, ``deep`` level 1: 63 lists below it reach level 64.
    text = MINIMAL + "deep: " + "[" * 63 + "1" + "]" * 63 + "\n"
    assert parse_bundle(single(text)).spec.raw["deep"] is not None


def test_half_a_megabyte_of_brackets_is_refused_for_its_nesting() -> None:
    """libyaml's scanner looks ahead and stops at its own limit (1,000 levels) first;
    PyYAML's Python scanner would reach the composer's 65th level."""
    message = rejected(single(MINIMAL + "deep: " + "[" * 500_000 + "\n"))
    assert "nested deeper than 64 levels" in message or "nesting depth" in message, message


def test_custom_and_python_tags_are_refused() -> None:
    for tag in ("!!python/object/apply:os.system ['true']", "!include other.yaml", "!Ref x"):
        assert "not valid YAML" in rejected(single(MINIMAL + f"x: {tag}\n")), tag


def test_integer_too_long_to_convert_is_a_bundle_error() -> None:
    """Python refuses int() of over 4,300 digits with a plain ValueError: still a 400."""
    message = rejected(single(MINIMAL + "n: " + "1" * 5000 + "\n"))
    assert "not valid YAML" in message or "too long" in message, message


def test_cap_from_environment() -> None:
    assert max_yaml_bytes_from({}) == DEFAULT_MAX_YAML_BYTES
    assert max_yaml_bytes_from({"OMNIGENT_MAX_AGENT_YAML_BYTES": "2048"}) == 2048
    assert max_yaml_bytes_from({"OMNIGENT_MAX_AGENT_YAML_BYTES": " "}) == DEFAULT_MAX_YAML_BYTES
    with pytest.raises(ValueError):
        max_yaml_bytes_from({"OMNIGENT_MAX_AGENT_YAML_BYTES": "lots"})
    with pytest.raises(ValueError):
        max_yaml_bytes_from({"OMNIGENT_MAX_AGENT_YAML_BYTES": "0"})


def test_yaml_inside_the_tar_is_counted_unpacked_not_as_uploaded() -> None:
    """The cap is on the YAML's own bytes, whatever the compression ratio."""
    text = padded_yaml(4000).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("agent.yaml")
        info.size = len(text)
        archive.addfile(info, io.BytesIO(text))
    data = gzip.compress(buffer.getvalue())
    assert len(data) < 1000
    assert "at most 3000 bytes" in rejected(data, max_yaml_bytes=3000)


@pytest.mark.parametrize(
    ("text", "mentions"),
    [
        ("a: &a [1, 2]\nb: [" + ", ".join(["*a"] * 60_000) + "]\n", "aliases"),
        ("d: " + "[" * 65 + "]" * 65 + "\n", "nested deeper than 64 levels"),
        ("a: &a [1, *a]\n", "refers to itself"),
    ],
)
def test_the_pure_python_loader_has_the_same_bounds(
    monkeypatch: pytest.MonkeyPatch, text: str, mentions: str
) -> None:
    """Without libyaml (a PyYAML built from source) the Python parser feeds the same
    bounded composer."""
    monkeypatch.setattr(bundles, "_BoundedLoader", bundles._PythonBoundedLoader)
    assert mentions in rejected(single(MINIMAL + text))
    monkeypatch.undo()
    assert mentions in rejected(single(MINIMAL + text))
