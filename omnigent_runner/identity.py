"""Runner identity: the id a runner is known by is derived from its binding token.

Shared by the server (which authorises tunnels) and the runner program (which checks its
configuration before dialling), so it must stay standard-library only: the runner runs on
machines without Django. The scheme is Omnigent's, so the same launch recipe and tokens
work against either server. The id is a one-way digest: publishing an id never reveals
the token, and the server never has to store tokens, only ids.
"""

from __future__ import annotations

import hashlib
import secrets

RUNNER_ID_PREFIX = "runner_token_"
_DIGEST_SALT = "omnigent-runner:"
_ID_HEX_CHARS = 32


def derive_runner_id(token: str) -> str:
    """Return ``runner_token_`` + the first 32 hex chars of SHA-256("omnigent-runner:" + token).

    Surrounding whitespace is ignored so a token pasted with a trailing newline still
    maps to the same runner. A blank token would give every misconfigured runner the
    same id, so it is rejected instead.
    """
    stripped = (token or "").strip()
    if not stripped:
        raise ValueError("runner binding token is empty")
    digest = hashlib.sha256((_DIGEST_SALT + stripped).encode("utf-8")).hexdigest()
    return RUNNER_ID_PREFIX + digest[:_ID_HEX_CHARS]


def new_binding_token() -> str:
    """Return a fresh random binding token (256 bits of entropy, URL- and header-safe)."""
    return secrets.token_urlsafe(32)
