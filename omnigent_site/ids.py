"""Opaque, prefixed identifiers (http-api.md, Conventions: IDs)."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """A random id such as ``conv_3f9a…``; clients must not parse it."""
    return f"{prefix}{secrets.token_hex(12)}"


def new_agent_id() -> str:
    return new_id("ag_")


def new_session_id() -> str:
    return new_id("conv_")


def new_item_id() -> str:
    return new_id("item_")


def new_response_id() -> str:
    return new_id("resp_")


def new_elicitation_id() -> str:
    """``elicit_<32 hex>`` (approvals.md): an approval's id, as Omnigent's clients know it."""
    return f"elicit_{secrets.token_hex(16)}"


def new_file_id() -> str:
    """``file_…``: a session file (files.md §1)."""
    return new_id("file_")
