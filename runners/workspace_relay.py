"""The workspace through the server (files.md §2): ``workspace.*`` rpc to the session's runner.

Every browse, read, write and search is one ``rpc`` command relayed with the relay's
deadline (``runners.relay.send_command``); a download is a series of
``workspace.read_chunk`` calls, each small enough for one tunnel frame. The runner
answers errors with the HTTP status to use; they become the matching domain errors.
No runner bound is a 409, a runner offline, gone mid-request or silent past the
deadline a 503 (``RunnerUnavailable``), never a hang.

The session must be open on the runner's current connection (its tool root and change
tracker live there): ``session.open`` goes first when this connection has not
acknowledged it, and once more if the runner answers ``session_not_open`` (it restarted
or closed the session since).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from omnigent_runner.protocol import Rpc
from omnigent_site.domain_errors import (
    AgentUnavailable,
    Conflict,
    DomainError,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RunnerUnavailable,
)
from sessions.blobs import BundleMissing
from sessions.models import Session

from . import runner_events
from .models import Runner
from .relay import RelayError, send_command

log = logging.getLogger(__name__)

SESSION_NOT_OPEN = "session_not_open"
# The largest download chunk asked for, and the room a chunk's frame needs besides its
# base64 data (envelope, path, numbers).
MAX_CHUNK_BYTES = 4 * 1024 * 1024
_FRAME_OVERHEAD = 64 * 1024

_BY_STATUS: dict[int, type[DomainError]] = {
    400: InvalidInput,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


def chunk_bytes() -> int:
    """Bytes per ``workspace.read_chunk``: base64 (4/3) plus envelope fit one frame."""
    frame_max = settings.OMNIGENT_MAX_FRAME_BYTES
    if frame_max <= 0:
        return MAX_CHUNK_BYTES
    return max(1024, min(MAX_CHUNK_BYTES, (frame_max - _FRAME_OVERHEAD) * 3 // 4))


def _runner_or_error(session: Session) -> Runner:
    runner = session.runner
    if runner is None:
        raise Conflict("no runner is bound to this session: bind one to reach its workspace")
    if not runner.online:
        raise RunnerUnavailable(f"runner '{runner.id}' is offline")
    return runner


async def _open(session: Session, runner: Runner) -> None:
    try:
        command = await sync_to_async(runner_events.session_open_command)(session=session)
    except BundleMissing as exc:
        log.error("session %s: %s", session.id, exc)
        raise AgentUnavailable(str(exc)) from exc
    await send_command(channel_name=runner.channel_name, command=command)


# An OSError's text as Python writes it: "[Errno 36] File name too long: '/abs/path'".
_OS_ERROR_PATHS = re.compile(r"(\[Errno \d+\] [^:'\"]+): '[^']*'(?: -> '[^']*')?")


def _without_machine_paths(message: str, runner: Runner) -> str:
    """The runner's text without absolute paths of its machine: an OSError's file names
    and the workspace root it reported in ``hello``. The runner answers with paths
    relative to the workspace; this covers a runner that does not (an older one)."""
    message = _OS_ERROR_PATHS.sub(r"\1", message)
    root = runner.workspace.get("root") if isinstance(runner.workspace, dict) else None
    if isinstance(root, str) and len(root.rstrip("/")) > 1:
        root = root.rstrip("/")
        message = message.replace(root + "/", "").replace(root, ".")
    return message


def _domain_error(exc: RelayError, runner: Runner) -> DomainError:
    message = _without_machine_paths(exc.message, runner)
    error_class = _BY_STATUS.get(exc.status or 0)
    if error_class is None:
        return RunnerUnavailable(f"the runner did not answer the request: {message}")
    return error_class(message)


async def call(*, session: Session, method: str, params: Mapping[str, Any]) -> Any:
    """One ``workspace.*`` request to the session's runner; its result, or a domain error."""
    runner = _runner_or_error(session)
    command = Rpc(method=method, params={**params, "session_id": session.id})
    opened = session.runner_generation_opened == runner.generation
    for attempt in range(2):
        try:
            if not opened:
                await _open(session, runner)
                opened = True
            reply = await send_command(channel_name=runner.channel_name, command=command)
        except RelayError as exc:
            if exc.code == SESSION_NOT_OPEN and attempt == 0:
                opened = False
                continue
            error = _domain_error(exc, runner)
            if exc.status is None:
                log.info("workspace rpc %s on %s failed: %s", method, session.id, error.message)
            raise error from None
        return reply.result
    raise RunnerUnavailable("the runner did not open the session")  # pragma: no cover


def _chunk_data(result: Any) -> tuple[bytes, int, Any]:
    """The bytes, the file's size and its version stamp from a ``read_chunk`` answer."""
    if not isinstance(result, dict):
        raise ValueError("the runner's chunk is not an object")
    size = result.get("bytes")
    data = result.get("data")
    if isinstance(size, bool) or not isinstance(size, int) or not isinstance(data, str):
        raise ValueError("the runner's chunk has no size or data")
    try:
        return base64.b64decode(data, validate=True), size, result.get("modified_at_ns")
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"the runner's chunk is not base64: {exc}") from None


async def first_chunk(*, session: Session, path: str) -> tuple[bytes, int, Any]:
    """The start of a download: the first chunk, the file's size and version stamp.

    Asked before the response starts, so a missing file, a folder or an absent runner
    still get their status code.
    """
    result = await call(
        session=session,
        method="workspace.read_chunk",
        params={"path": path, "offset": 0, "length": chunk_bytes()},
    )
    try:
        return _chunk_data(result)
    except ValueError as exc:
        raise RunnerUnavailable(str(exc)) from None


async def rest_of_file(
    *, session: Session, path: str, first: bytes, size: int, stamp: Any
) -> AsyncIterator[bytes]:
    """The download's body: ``first``, then chunk after chunk until ``size`` bytes.

    The next chunk is asked for while the current one is written to the client, so
    the runner's read and the tunnel's transfer overlap the response's writing.

    The headers (with ``Content-Length``) are sent by then, so a failure can only cut
    the body short: a runner gone, or a file that changed while it was read (its size
    or modification time differs), ends the body early and the client sees a short
    download, never a mixed one.
    """
    length = chunk_bytes()

    def fetch(offset: int) -> asyncio.Task[Any]:
        return asyncio.ensure_future(
            call(
                session=session,
                method="workspace.read_chunk",
                params={"path": path, "offset": offset, "length": length},
            )
        )

    offset = len(first)
    pending = fetch(offset) if offset < size else None
    try:
        yield first
        while pending is not None:
            data, now_size, now_stamp = _chunk_data(await pending)
            if now_size != size or now_stamp != stamp or not data:
                raise RuntimeError(f"'{path}' changed during its download; the body was cut")
            offset += len(data)
            pending = fetch(offset) if offset < size else None
            yield data
    finally:
        if pending is not None:
            pending.cancel()
