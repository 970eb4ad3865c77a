"""Secrets and signatures per Standard Webhooks (automation.md, Signed).

Headers ``webhook-id`` (the event id), ``webhook-timestamp`` (Unix seconds of the
attempt) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``,
one per secret in force, separated by spaces), signed with the ``standardwebhooks``
library so receivers verify with it as they would any Standard Webhooks sender.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterable
from datetime import datetime

from standardwebhooks.webhooks import Webhook as Signer

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def signed_headers(
    *, secrets_in_force: Iterable[str], event_id: str, timestamp: datetime, body: str
) -> dict[str, str]:
    signatures = [
        Signer(secret).sign(msg_id=event_id, timestamp=timestamp, data=body)
        for secret in secrets_in_force
    ]
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": " ".join(signatures),
    }
