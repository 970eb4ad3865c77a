"""The one mapping from failures to what the tunnel consumer answers (docs/protocol.md).

Views map domain errors to the HTTP error format (``omnigent_site.errors``); the tunnel
consumer maps them, and protocol errors, here: to a WebSocket close code when the failure
ends the tunnel, and to the ``{"code", "message"}`` error of a ``tunnel.reply`` when it
fails one relayed command (the caller, usually an HTTP view, then raises
``RunnerUnavailable``). Keeping both in one place means a new error gets one decision,
not one per call site.
"""

from __future__ import annotations

from omnigent_runner.protocol import UNSUPPORTED_PROTOCOL, ErrorInfo, ProtocolError
from omnigent_site.domain_errors import DomainError, Forbidden

# Close codes (tunnel.md, docs/protocol.md "Close codes").
CLOSE_REPLACED = 4000
CLOSE_BAD_HELLO = 4001
CLOSE_BAD_PROTOCOL = 4002
CLOSE_DEAD_PEER = 4003
CLOSE_REVOKED = 4004
# The server process is stopping (a restart): the runner reconnects at once, and the
# proxy in front sends it to another process. (1012, "service restart", is not a code
# an application may send through autobahn.)
CLOSE_SERVER_STOPPING = 4005
CLOSE_SERVER_ERROR = 1011

# ``tunnel.reply`` error codes the consumer itself produces (a runner's nack code is
# forwarded as the runner sent it).
TUNNEL_CLOSED = "tunnel_closed"
INVALID_REPLY = "invalid_reply"
INTERNAL_ERROR = "internal_error"


class TunnelClosed(Exception):
    """The command cannot reach the runner: the tunnel is closing or closed."""


def close_code_for(exc: BaseException) -> int:
    """The close code for a failure that ends the tunnel.

    Protocol errors only end a tunnel before ``hello`` was accepted (afterwards a bad
    frame is logged and ignored); a runner that may no longer use the tunnel gets the
    revoked code; anything else is a server error, after which the runner reconnects and
    resends what was not acknowledged.
    """
    if isinstance(exc, ProtocolError):
        return CLOSE_BAD_PROTOCOL if exc.code == UNSUPPORTED_PROTOCOL else CLOSE_BAD_HELLO
    if isinstance(exc, Forbidden):
        return CLOSE_REVOKED
    return CLOSE_SERVER_ERROR


def reply_error_for(exc: BaseException) -> ErrorInfo:
    """The error a relayed command's caller gets when the consumer fails it."""
    if isinstance(exc, TunnelClosed):
        return ErrorInfo(code=TUNNEL_CLOSED, message=str(exc))
    if isinstance(exc, ProtocolError):
        return ErrorInfo(code=INVALID_REPLY, message=f"the runner's answer was unreadable: {exc}")
    if isinstance(exc, DomainError):
        return ErrorInfo(code=exc.code, message=exc.public_message)
    return ErrorInfo(code=INTERNAL_ERROR, message="the command could not be relayed")


def nack_error(error: ErrorInfo | None) -> ErrorInfo:
    """A runner's nack or rpc error as the caller sees it: never without a code or message."""
    error = error or ErrorInfo()
    return ErrorInfo(
        code=error.code or "rejected",
        message=error.message or "the runner rejected the command",
    )
