"""Scripted, OpenAI-compatible mock LLM server (stdlib only, no Django).

Tests and the offline demo need an LLM that answers deterministically, without network
access or an API key. This module serves the subset of the OpenAI HTTP API the agent
loop uses (Responses API, Chat Completions, model list) and answers from per-key queues
of scripted entries that tests push over HTTP (``/mock/configure``) or in-process
(:meth:`MockLLMServer.configure`).

Run standalone::

    python -m testing.mockllm --host 127.0.0.1 --port 0

which prints exactly one line ``MOCKLLM_URL=http://127.0.0.1:<port>/v1`` and serves until
SIGTERM/SIGINT. See the "Mock LLM server" section of the agents spec for the contract.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

DEFAULT_TEXT = "Mock LLM response"
DEFAULT_KEY = "default"
DEFAULT_MODEL = "mock-model"

JsonDict = dict[str, Any]


# --------------------------------------------------------------------------- script model


@dataclass(frozen=True)
class ToolCall:
    """One scripted function call; ``arguments`` is kept as the JSON string the API sends."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Reply:
    """A parsed script entry: what one request to the mock should answer."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    error_status: int | None = None
    error_message: str = ""
    stream_words: bool = False
    delay_s: float = 0.0
    # Answer with the tool outputs the request carries (see ``tool_outputs``), after
    # ``text`` if that is set: tests read back exactly what the model was given.
    echo_tool_output: bool = False
    # The usage to report instead of the estimate: ``input_tokens`` (cached included, as
    # providers count), ``output_tokens``, ``cached_tokens``, ``reasoning_tokens``.
    usage: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_entry(cls, entry: Any) -> Reply:
        """Validate a configure entry early so a bad script fails at configure time, not mid-test."""
        if not isinstance(entry, dict):
            raise ValueError(f"entry must be an object, got {type(entry).__name__}")
        reply = cls._from_entry(entry)
        usage = entry.get("usage")
        if usage is None:
            return reply
        if not isinstance(usage, dict) or not all(
            key in USAGE_KEYS and isinstance(value, int) and value >= 0
            for key, value in usage.items()
        ):
            raise ValueError(f"'usage' must map some of {', '.join(USAGE_KEYS)} to counts")
        return dataclasses.replace(reply, usage=tuple(sorted(usage.items())))

    @classmethod
    def _from_entry(cls, entry: dict[str, Any]) -> Reply:
        delay_s = float(entry.get("delay_s") or 0.0)
        stream_words = bool(entry.get("stream", False))
        error = entry.get("error")
        if error is not None:
            if not isinstance(error, dict):
                raise ValueError("'error' must be an object")
            return cls(
                error_status=int(error.get("status_code", 500)),
                error_message=str(error.get("message", "Mock LLM error")),
                delay_s=delay_s,
                stream_words=stream_words,
            )
        text = entry.get("text")
        if text is not None and not isinstance(text, str):
            raise ValueError("'text' must be a string")
        calls = tuple(_parse_tool_call(raw) for raw in entry.get("tool_calls") or [])
        echo = entry.get("echo_tool_output", False)
        if not isinstance(echo, bool):
            raise ValueError("'echo_tool_output' must be true or false")
        if echo:
            if calls:
                raise ValueError("'echo_tool_output' answers with text; it takes no tool_calls")
            return cls(
                text=text or "", echo_tool_output=True, stream_words=stream_words, delay_s=delay_s
            )
        if text is None and not calls:
            # An entry that only sets timing (e.g. {"delay_s": 1}) still needs a body.
            text = DEFAULT_TEXT
        return cls(text=text, tool_calls=calls, stream_words=stream_words, delay_s=delay_s)


USAGE_KEYS = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")


def _parse_tool_call(raw: Any) -> ToolCall:
    """Accept arguments as a JSON string (API form) or, for convenience, as an object."""
    if not isinstance(raw, dict) or not raw.get("name"):
        raise ValueError("each tool call needs at least a 'name'")
    arguments = raw.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = str(raw.get("call_id") or _new_id("call"))
    return ToolCall(call_id=call_id, name=str(raw["name"]), arguments=arguments)


DEFAULT_REPLY = Reply(text=DEFAULT_TEXT)


def tool_then_echo(
    name: str, arguments: dict[str, Any] | str, *, call_id: str = "call_echo", prefix: str = ""
) -> list[JsonDict]:
    """A two-entry script: call ``name``, then answer with the tool output the model was
    given (``prefix`` first). Configure it like any script, e.g. with a ``match`` token,
    to assert what the model saw after a tool ran, was denied or was declined."""
    return [
        {"tool_calls": [{"call_id": call_id, "name": name, "arguments": arguments}]},
        {"echo_tool_output": True, "text": prefix},
    ]


def describe_reply(reply: Reply) -> str:
    """One line a person can read: what the mock answered."""
    if reply.error_status is not None:
        return f"error {reply.error_status}"
    calls = ", ".join(f"{call.name}({call.arguments})" for call in reply.tool_calls)
    text = f"text {reply.text!r}" if reply.text else ""
    return " and ".join(part for part in (f"tool call {calls}" if calls else "", text) if part)


# ``make run LLM=mock``: the README walkthrough's request ("Write hello.txt") gets a
# ``sys_os_write`` call and then a short reply, as a real model would answer it.
WALKTHROUGH_MATCH = "hello.txt"
WALKTHROUGH_TURN: list[JsonDict] = [
    {
        "tool_calls": [
            {
                "call_id": "call_walkthrough",
                "name": "sys_os_write",
                "arguments": {"path": "hello.txt", "content": "Hello from the agent.\n"},
            }
        ]
    },
    {"text": "I wrote hello.txt."},
]
# Enough turns for a person to repeat the walkthrough as often as they like.
WALKTHROUGH_REPEATS = 100


# Switchable behaviours of real OpenAI-compatible servers (issue 44), off by default;
# each is named after what it does. Set in process (``MockLLMServer.set_quirks``) or
# over HTTP (``POST /mock/quirks``); ``/mock/reset`` turns them all off.
QUIRKS = (
    # Chat Completions: an assistant message whose ``content`` is null or missing gets
    # HTTP 500, like llama-cpp-python's request validation.
    "reject_null_content",
    # A streamed request (either API) gets 200 ``text/event-stream`` with no data and a
    # clean end, as llama-cpp-python reports errors raised after its stream began.
    # It takes no scripted entry.
    "empty_stream",
    # Scripted tool calls are answered only when the request sets ``tool_choice`` (not
    # ``none``); otherwise the model answers with text, as if it had no tools.
    "tool_choice_required",
    # ``/v1/responses`` answers 404, as a server with only Chat Completions.
    "no_responses",
    # A streamed answer sends half its text deltas (at least one), then the connection
    # is dropped without the stream's end.
    "cut_mid_stream",
    # No usage in any answer (Responses ``usage: null``; no Chat usage chunk), as
    # servers that do not count tokens answer.
    "no_usage",
)
NO_TOOLS_TEXT = "I have no tools to call."


@dataclass
class _Queue:
    match: str | None
    replies: deque[Reply] = field(default_factory=deque)


class ScriptStore:
    """Thread-safe queues of replies plus the log of captured requests.

    Queues are identified by ``(key, match)`` so that configuring a match-routed queue never
    clobbers the plain ``default`` (or per-model) queue of the same key.
    """

    def __init__(self, announce: Callable[[str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str | None], _Queue] = {}
        self._requests: list[JsonDict] = []
        self._quirks: set[str] = set()
        # Told what each answer was (the CLI's ``--announce`` prints it for a person).
        self._announce = announce

    def configure(
        self, responses: Iterable[Any], *, key: str = DEFAULT_KEY, match: str | None = None
    ) -> None:
        """Replace the queue for ``(key, match)``; raises ValueError on a malformed entry."""
        replies = deque(Reply.from_entry(entry) for entry in responses)
        with self._lock:
            self._queues[(key, match or None)] = _Queue(match=match or None, replies=replies)

    def reset(self) -> None:
        with self._lock:
            self._queues.clear()
            self._requests.clear()
            self._quirks.clear()

    def set_quirks(self, flags: dict[str, Any]) -> None:
        """Turn quirks on (true) or off (false); quirks not named keep their state.
        Raises ValueError for an unknown name or a value that is not a boolean."""
        for name, on in flags.items():
            if name not in QUIRKS:
                raise ValueError(f"unknown quirk {name!r}; known: {', '.join(QUIRKS)}")
            if not isinstance(on, bool):
                raise ValueError(f"quirk {name!r} must be true or false")
        with self._lock:
            for name, on in flags.items():
                if on:
                    self._quirks.add(name)
                else:
                    self._quirks.discard(name)

    def quirk(self, name: str) -> bool:
        with self._lock:
            return name in self._quirks

    @property
    def quirks(self) -> list[str]:
        with self._lock:
            return sorted(self._quirks)

    def record(self, path: str, body: Any, headers: dict[str, str]) -> None:
        entry = {"path": path, "body": body, "headers": headers, "files": files_received(body)}
        with self._lock:
            self._requests.append(entry)

    @property
    def requests(self) -> list[JsonDict]:
        with self._lock:
            return list(self._requests)

    def next_reply(self, *, user_text: str, model: str | None) -> Reply:
        """Pick the queue (match token, then model key, then default) and pop its head.

        The chosen queue wins even when exhausted: falling through silently would make a
        script that ran out of entries look like it was routed elsewhere.
        """
        with self._lock:
            queue = self._choose_queue(user_text, model)
            reply = DEFAULT_REPLY if queue is None or not queue.replies else queue.replies.popleft()
        if self._announce is not None:
            self._announce(f"asked {user_text[:60]!r}: answered {describe_reply(reply)}")
        return reply

    def _choose_queue(self, user_text: str, model: str | None) -> _Queue | None:
        for queue in self._queues.values():
            if queue.match is not None and queue.match in user_text:
                return queue
        if model is not None and (model, None) in self._queues:
            return self._queues[(model, None)]
        return self._queues.get((DEFAULT_KEY, None))


# --------------------------------------------------------------------------- request helpers


def _decode_data_uri(uri: Any) -> tuple[str, bytes] | None:
    if not isinstance(uri, str) or not uri.startswith("data:") or "," not in uri:
        return None
    head, data = uri[5:].split(",", 1)
    try:
        raw = base64.b64decode(data) if head.endswith(";base64") else data.encode()
    except ValueError:
        return None
    return head.split(";", 1)[0], raw


def files_received(body: Any) -> list[JsonDict]:
    """The images and files a request carried, for tests to check what the model got.

    Responses API: ``input_image`` (``image_url``) and ``input_file`` (``file_data``)
    parts; Chat Completions: ``image_url`` and ``file`` parts. Each as ``{"part",
    "filename", "media_type", "bytes", "sha256"}`` (``filename`` None for images).
    """
    if not isinstance(body, dict):
        return []
    messages = body.get("input") if "input" in body else body.get("messages")
    found: list[JsonDict] = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            kind, filename, uri = part.get("type"), None, None
            if kind == "input_image":
                uri = part.get("image_url")
            elif kind == "input_file":
                uri, filename = part.get("file_data"), part.get("filename")
            elif kind == "image_url" and isinstance(part.get("image_url"), dict):
                uri = part["image_url"].get("url")
            elif kind == "file" and isinstance(part.get("file"), dict):
                uri, filename = part["file"].get("file_data"), part["file"].get("filename")
            decoded = _decode_data_uri(uri)
            if decoded is None:
                continue
            media_type, raw = decoded
            found.append(
                {
                    "part": kind,
                    "filename": filename,
                    "media_type": media_type,
                    "bytes": len(raw),
                    "sha256": hashlib.sha256(raw).hexdigest(),
                }
            )
    return found


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _text_of_content(content: Any) -> str:
    """User content is either a plain string or a list of text parts (input_text / text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") in ("input_text", "text")
        ]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def _last_user_text(items: Any) -> str:
    """Text of the last ``role == "user"`` item of a Responses input or Chat messages list."""
    if isinstance(items, str):
        return items
    if not isinstance(items, list):
        return ""
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            return _text_of_content(item.get("content"))
    return ""


def tool_outputs(path: str, body: JsonDict) -> list[str]:
    """The tool outputs at the end of the request, in order: the results of the calls
    the model made in its previous answer (Responses ``function_call_output`` items,
    Chat ``tool`` messages; the calls between them are skipped)."""
    chat = path == "/v1/chat/completions"
    items = body.get("messages") if chat else body.get("input")
    outputs: list[str] = []
    for item in reversed(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            break
        if chat and item.get("role") == "tool":
            value = item.get("content")
        elif not chat and item.get("type") == "function_call_output":
            value = item.get("output")
        elif not chat and item.get("type") == "function_call":
            continue
        else:
            break
        outputs.append(value if isinstance(value, str) else json.dumps(value))
    return outputs[::-1]


def user_text_for(path: str, body: JsonDict) -> str:
    if path == "/v1/chat/completions":
        return _last_user_text(body.get("messages"))
    return _last_user_text(body.get("input"))


def split_words(text: str) -> list[str]:
    """Split into word-sized deltas that concatenate back to exactly ``text``."""
    return [part for part in re.split(r"(?<=\s)(?=\S)", text) if part]


def _text_deltas(reply: Reply) -> list[str]:
    text = reply.text or ""
    if not text:
        return []
    return split_words(text) if reply.stream_words else [text]


def _estimate_tokens(text: str) -> int:
    """A crude, deterministic token count: enough for usage plumbing tests."""
    return max(1, len(text) // 4) if text else 0


def _output_tokens(reply: Reply) -> int:
    parts = [reply.text or ""] + [c.name + c.arguments for c in reply.tool_calls]
    return sum(_estimate_tokens(p) for p in parts)


def _usage_counts(reply: Reply, prompt: Any) -> dict[str, int]:
    """The reply's scripted usage, else estimates (nothing cached, no reasoning)."""
    counts = {
        "input_tokens": _estimate_tokens(json.dumps(prompt)),
        "output_tokens": _output_tokens(reply),
        "cached_tokens": 0,
        "reasoning_tokens": 0,
    }
    counts.update(dict(reply.usage))
    return counts


def error_body(message: str, status: int) -> JsonDict:
    """OpenAI's error envelope, so SDKs map it to the right exception class."""
    if status >= 500:
        kind = "server_error"
    elif status == 404:
        kind = "not_found_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# --------------------------------------------------------------------------- Responses API


@dataclass
class ResponsesTurn:
    """Identifiers and request echoes shared by every object of one Responses answer."""

    reply: Reply
    request: JsonDict
    response_id: str = field(default_factory=lambda: _new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    message_id: str = field(default_factory=lambda: _new_id("msg"))
    call_item_ids: list[str] = field(default_factory=list)
    report_usage: bool = True  # False: the ``no_usage`` quirk

    def __post_init__(self) -> None:
        self.call_item_ids = [_new_id("fc") for _ in self.reply.tool_calls]

    def message_item(self, *, done: bool) -> JsonDict:
        content = [self.text_part(done=True)] if done else []
        return {
            "type": "message",
            "id": self.message_id,
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": content,
        }

    def text_part(self, *, done: bool) -> JsonDict:
        return {
            "type": "output_text",
            "text": (self.reply.text or "") if done else "",
            "annotations": [],
            "logprobs": [],
        }

    def call_item(self, index: int, *, done: bool) -> JsonDict:
        call = self.reply.tool_calls[index]
        return {
            "type": "function_call",
            "id": self.call_item_ids[index],
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments if done else "",
            "status": "completed" if done else "in_progress",
        }

    def output_items(self) -> list[JsonDict]:
        items = [self.message_item(done=True)] if self.reply.text is not None else []
        items += [self.call_item(i, done=True) for i in range(len(self.reply.tool_calls))]
        return items

    def usage(self) -> JsonDict:
        counts = _usage_counts(self.reply, self.request.get("input", ""))
        return {
            "input_tokens": counts["input_tokens"],
            "input_tokens_details": {"cached_tokens": counts["cached_tokens"]},
            "output_tokens": counts["output_tokens"],
            "output_tokens_details": {"reasoning_tokens": counts["reasoning_tokens"]},
            "total_tokens": counts["input_tokens"] + counts["output_tokens"],
        }

    def response_object(self, *, done: bool) -> JsonDict:
        """The full ``response`` object; in-progress snapshots carry no output or usage."""
        req = self.request
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": "completed" if done else "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"),
            "model": req.get("model") or DEFAULT_MODEL,
            "output": self.output_items() if done else [],
            "parallel_tool_calls": req.get("parallel_tool_calls", True),
            "previous_response_id": req.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": req.get("store", True),
            "temperature": req.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": req.get("tool_choice", "auto"),
            "tools": req.get("tools", []),
            "top_p": req.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": self.usage() if done and self.report_usage else None,
            "user": None,
            "metadata": req.get("metadata") or {},
        }

    def events(self) -> Iterator[JsonDict]:
        """The SSE event sequence, without sequence numbers (added by the writer)."""
        yield {"type": "response.created", "response": self.response_object(done=False)}
        yield {"type": "response.in_progress", "response": self.response_object(done=False)}
        index = 0
        if self.reply.text is not None:
            yield from self._message_events(index)
            index += 1
        for call_index in range(len(self.reply.tool_calls)):
            yield from self._call_events(index, call_index)
            index += 1
        yield {"type": "response.completed", "response": self.response_object(done=True)}

    def _message_events(self, output_index: int) -> Iterator[JsonDict]:
        where = {"item_id": self.message_id, "output_index": output_index}
        yield {
            "type": "response.output_item.added",
            "output_index": output_index,
            "item": self.message_item(done=False),
        }
        yield {
            "type": "response.content_part.added",
            **where,
            "content_index": 0,
            "part": self.text_part(done=False),
        }
        for delta in _text_deltas(self.reply):
            yield {
                "type": "response.output_text.delta",
                **where,
                "content_index": 0,
                "delta": delta,
                "logprobs": [],
            }
        yield {
            "type": "response.output_text.done",
            **where,
            "content_index": 0,
            "text": self.reply.text or "",
            "logprobs": [],
        }
        yield {
            "type": "response.content_part.done",
            **where,
            "content_index": 0,
            "part": self.text_part(done=True),
        }
        yield {
            "type": "response.output_item.done",
            "output_index": output_index,
            "item": self.message_item(done=True),
        }

    def _call_events(self, output_index: int, call_index: int) -> Iterator[JsonDict]:
        call = self.reply.tool_calls[call_index]
        where = {"item_id": self.call_item_ids[call_index], "output_index": output_index}
        yield {
            "type": "response.output_item.added",
            "output_index": output_index,
            "item": self.call_item(call_index, done=False),
        }
        yield {"type": "response.function_call_arguments.delta", **where, "delta": call.arguments}
        yield {
            "type": "response.function_call_arguments.done",
            **where,
            "name": call.name,
            "arguments": call.arguments,
        }
        yield {
            "type": "response.output_item.done",
            "output_index": output_index,
            "item": self.call_item(call_index, done=True),
        }


# --------------------------------------------------------------------------- Chat Completions


@dataclass
class ChatTurn:
    """One Chat Completions answer, as a whole object or as a chunk stream."""

    reply: Reply
    request: JsonDict
    completion_id: str = field(default_factory=lambda: _new_id("chatcmpl"))
    created: int = field(default_factory=lambda: int(time.time()))
    report_usage: bool = True  # False: the ``no_usage`` quirk

    @property
    def model(self) -> str:
        return self.request.get("model") or DEFAULT_MODEL

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.reply.tool_calls else "stop"

    def usage(self) -> JsonDict:
        counts = _usage_counts(self.reply, self.request.get("messages", []))
        return {
            "prompt_tokens": counts["input_tokens"],
            "completion_tokens": counts["output_tokens"],
            "total_tokens": counts["input_tokens"] + counts["output_tokens"],
            "prompt_tokens_details": {"cached_tokens": counts["cached_tokens"]},
            "completion_tokens_details": {"reasoning_tokens": counts["reasoning_tokens"]},
        }

    def _tool_calls(self) -> list[JsonDict]:
        return [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in self.reply.tool_calls
        ]

    def completion(self) -> JsonDict:
        message: JsonDict = {"role": "assistant", "content": self.reply.text, "refusal": None}
        if self.reply.tool_calls:
            message["tool_calls"] = self._tool_calls()
        return {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": self.usage() if self.report_usage else None,
            "system_fingerprint": None,
        }

    def _chunk(self, delta: JsonDict, finish_reason: str | None = None) -> JsonDict:
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }

    def chunks(self) -> Iterator[JsonDict]:
        """Role chunk, text deltas, one name + one arguments chunk per call, finish, usage."""
        first: JsonDict = {"role": "assistant"}
        first["content"] = "" if self.reply.text is not None else None
        yield self._chunk(first)
        for delta in _text_deltas(self.reply):
            yield self._chunk({"content": delta})
        for index, call in enumerate(self.reply.tool_calls):
            head = {
                "index": index,
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            yield self._chunk({"tool_calls": [head]})
            args = {"index": index, "function": {"arguments": call.arguments}}
            yield self._chunk({"tool_calls": [args]})
        yield self._chunk({}, finish_reason=self.finish_reason)
        options = self.request.get("stream_options") or {}
        if options.get("include_usage") and self.report_usage:
            yield {**self._chunk({}), "choices": [], "usage": self.usage()}


# --------------------------------------------------------------------------- quirks

# Stands in an event sequence for "drop the connection here" (``cut_mid_stream``).
_CUT: JsonDict = {"type": "<cut>"}


def _cut_after_half_the_text(events: Iterable[JsonDict], delta_type: str | None) -> list[JsonDict]:
    """``events`` up to half their text deltas (at least one), then ``_CUT``; without
    text, half the events. ``delta_type`` None: Chat chunks, whose deltas carry content."""

    def is_text(event: JsonDict) -> bool:
        if delta_type is not None:
            return event.get("type") == delta_type
        choices = event.get("choices") or [{}]
        return bool((choices[0].get("delta") or {}).get("content"))

    events = list(events)
    text_at = [index for index, event in enumerate(events) if is_text(event)]
    if text_at:
        keep = text_at[max(1, len(text_at) // 2) - 1] + 1
    else:
        keep = max(1, len(events) // 2)
    return [*events[:keep], _CUT]


def _null_content_problem(messages: Any) -> str:
    """llama-cpp-python's complaint about assistant messages without string content."""
    bad = [
        index
        for index, message in enumerate(messages if isinstance(messages, list) else [])
        if isinstance(message, dict)
        and message.get("role") == "assistant"
        and not isinstance(message.get("content"), str | list)
    ]
    if not bad:
        return ""
    return (
        f"{len(bad)} validation errors: messages.{bad[0]}.content: "
        "'msg': 'Input should be a valid string', 'input': None"
    )


# --------------------------------------------------------------------------- HTTP layer


class _MockHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its script and its open connections.

    Tracking connections lets :meth:`MockLLMServer.stop` cut idle keep-alive sockets, so a
    stopped server does not leave clients hanging on a half-alive connection.
    """

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog is 5: a runner starting 20 turns at once opens 20
    # connections, the kernel drops the handshakes beyond the backlog, and each dropped
    # one is retried a whole second later (TCP's first retransmission), which stalled
    # a few turns of every concurrent benchmark round by ~1 s. A real model API does
    # not refuse connections, so neither does the mock.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], store: ScriptStore) -> None:
        self.store = store
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up mid-response (e.g. the SDK closing a stream right after
        ``[DONE]``) are normal here; only report real bugs, or everything when verbose."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError) and os.environ.get("MOCKLLM_VERBOSE") != "1":
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _BadRequest(Exception):
    """A client mistake that should become a 400 OpenAI-style error."""


class _Handler(BaseHTTPRequestHandler):
    """Routes requests; keeps HTTP concerns here and the answer building in the turn classes."""

    protocol_version = "HTTP/1.1"
    server: _MockHTTPServer
    server_version = "MockLLM/1.0"

    # -- connection bookkeeping

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet by default: test output should not be buried in access logs."""
        if os.environ.get("MOCKLLM_VERBOSE") == "1":
            super().log_message(format, *args)

    # -- routing

    @property
    def route(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch(
            {
                "/v1/models": self._models,
                "/mock/requests": self._mock_requests,
                "/mock/quirks": self._mock_quirks_get,
            }
        )

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch(
            {
                "/v1/responses": self._responses,
                "/v1/chat/completions": self._chat,
                "/mock/configure": self._mock_configure,
                "/mock/reset": self._mock_reset,
                "/mock/quirks": self._mock_quirks,
            }
        )

    def _dispatch(self, routes: dict[str, Any]) -> None:
        route = self.route
        raw = self._read_body()
        body: Any = None
        bad_json = False
        try:
            body = json.loads(raw) if raw.strip() else None
        except (ValueError, UnicodeDecodeError):
            bad_json = True
        if route.startswith("/v1/"):
            self.server.store.record(route, body, self._captured_headers())
        handler = routes.get(route)
        if route == "/v1/responses" and self.server.store.quirk("no_responses"):
            self._send_json(404, {"detail": "Not Found"})  # FastAPI's words for a missing route
            return
        if handler is None:
            self._send_json(404, error_body(f"Unknown path: {self.command} {route}", 404))
            return
        if bad_json:
            self._send_json(400, error_body("Request body is not valid JSON", 400))
            return
        try:
            handler(body)
        except _BadRequest as exc:
            self._send_json(400, error_body(str(exc), 400))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _captured_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items() if k.lower() != "authorization"}

    # -- /v1 endpoints

    def _models(self, _body: Any) -> None:
        model = {"id": DEFAULT_MODEL, "object": "model", "created": 0, "owned_by": "mock"}
        self._send_json(200, {"object": "list", "data": [model]})

    def _responses(self, body: Any) -> None:
        if self._empty_stream(body):
            return
        reply, request = self._take_reply(body)
        if reply is None:
            return
        report = not self.server.store.quirk("no_usage")
        turn = ResponsesTurn(reply=reply, request=request, report_usage=report)
        if request.get("stream"):
            events: Iterable[JsonDict] = turn.events()
            if self.server.store.quirk("cut_mid_stream"):
                events = _cut_after_half_the_text(events, "response.output_text.delta")
            self._send_sse(events, named=True, done_marker=False)
        else:
            self._send_json(200, turn.response_object(done=True))

    def _chat(self, body: Any) -> None:
        if self.server.store.quirk("reject_null_content") and isinstance(body, dict):
            problem = _null_content_problem(body.get("messages"))
            if problem:
                self._send_json(500, error_body(problem, 500))
                return
        if self._empty_stream(body):
            return
        reply, request = self._take_reply(body)
        if reply is None:
            return
        report = not self.server.store.quirk("no_usage")
        turn = ChatTurn(reply=reply, request=request, report_usage=report)
        if request.get("stream"):
            chunks: Iterable[JsonDict] = turn.chunks()
            if self.server.store.quirk("cut_mid_stream"):
                chunks = _cut_after_half_the_text(chunks, None)
            self._send_sse(chunks, named=False, done_marker=True)
        else:
            self._send_json(200, turn.completion())

    def _take_reply(self, body: Any) -> tuple[Reply | None, JsonDict]:
        """Pop the scripted reply, apply its delay and answer scripted errors.

        Returns ``(None, body)`` when the error response has already been sent.
        """
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object")
        model = body.get("model") if isinstance(body.get("model"), str) else None
        reply = self.server.store.next_reply(user_text=user_text_for(self.route, body), model=model)
        if (
            reply.tool_calls
            and self.server.store.quirk("tool_choice_required")
            and body.get("tool_choice") in (None, "none")
        ):
            reply = Reply(text=reply.text or NO_TOOLS_TEXT, stream_words=reply.stream_words)
        if reply.echo_tool_output:
            echoed = "\n".join(tool_outputs(self.route, body))
            reply = dataclasses.replace(reply, text=(reply.text or "") + echoed)
        if reply.delay_s > 0:
            time.sleep(reply.delay_s)
        if reply.error_status is not None:
            self._send_json(reply.error_status, error_body(reply.error_message, reply.error_status))
            return None, body
        return reply, body

    # -- /mock control endpoints

    def _mock_configure(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("responses"), list):
            raise _BadRequest("Body must be an object with a 'responses' list")
        try:
            self.server.store.configure(
                body["responses"],
                key=str(body.get("key") or DEFAULT_KEY),
                match=body.get("match"),
            )
        except (ValueError, TypeError) as exc:
            raise _BadRequest(f"Invalid script entry: {exc}") from exc
        self._send_json(200, {"ok": True})

    def _mock_quirks(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise _BadRequest("Body must be an object of quirk names to true or false")
        try:
            self.server.store.set_quirks(body)
        except ValueError as exc:
            raise _BadRequest(str(exc)) from exc
        self._mock_quirks_get(None)

    def _mock_quirks_get(self, _body: Any) -> None:
        self._send_json(200, {"quirks": self.server.store.quirks})

    def _empty_stream(self, body: Any) -> bool:
        """The ``empty_stream`` quirk: answer a streamed request with a clean, empty 200."""
        if not (
            isinstance(body, dict)
            and body.get("stream")
            and self.server.store.quirk("empty_stream")
        ):
            return False
        self._send_sse_head()
        self.wfile.write(b"0\r\n\r\n")
        return True

    def _mock_reset(self, _body: Any) -> None:
        self.server.store.reset()
        self._send_json(200, {"ok": True})

    def _mock_requests(self, _body: Any) -> None:
        self._send_json(200, {"requests": self.server.store.requests})

    # -- writers

    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_sse(self, events: Iterable[JsonDict], *, named: bool, done_marker: bool) -> None:
        """Stream events with chunked transfer encoding so the connection stays reusable.

        ``named`` adds the ``event:`` line (Responses API style) and a ``sequence_number``;
        ``done_marker`` ends with ``data: [DONE]`` (Chat Completions style).
        """
        self._send_sse_head()
        for sequence_number, event in enumerate(events):
            if event is _CUT:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if named:
                event = {**event, "sequence_number": sequence_number}
                frame = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
            else:
                frame = f"data: {json.dumps(event)}\n\n"
            self.wfile.write(self._chunk_frame(frame.encode()))
        # The terminating zero-length chunk goes out in the same write as the last frame:
        # the SDK stops reading at ``[DONE]`` and a late terminator would arrive unread.
        last = self._chunk_frame(b"data: [DONE]\n\n") if done_marker else b""
        self.wfile.write(last + b"0\r\n\r\n")

    def _send_sse_head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    @staticmethod
    def _chunk_frame(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"


# --------------------------------------------------------------------------- public API


class MockLLMServer:
    """In-process handle: start/stop the HTTP server and script it without HTTP round-trips."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self._store = ScriptStore(announce)
        self._httpd = _MockHTTPServer((host, port), self._store)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve in a daemon thread so a crashed test never blocks interpreter exit."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # keeps stop() (and test teardown) fast
            name="mockllm",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.close_connections()
        self._httpd.server_close()

    def __enter__(self) -> MockLLMServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def configure(
        self, responses: list[dict], *, key: str = DEFAULT_KEY, match: str | None = None
    ) -> None:
        self._store.configure(responses, key=key, match=match)

    def reset(self) -> None:
        self._store.reset()

    def set_quirks(self, **flags: bool) -> None:
        """Turn quirks (``QUIRKS``) on or off, e.g. ``set_quirks(empty_stream=True)``."""
        self._store.set_quirks(flags)

    @property
    def requests(self) -> list[dict]:
        return self._store.requests


def main(argv: list[str] | None = None) -> int:
    """CLI entry: print the URL line for the parent process, serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible mock LLM server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--walkthrough",
        action="store_true",
        help="answer the README walkthrough's 'Write hello.txt' with a sys_os_write call",
    )
    parser.add_argument(
        "--announce", action="store_true", help="print one line per answer on stdout"
    )
    args = parser.parse_args(argv)

    def announce(line: str) -> None:
        print(f"mock LLM: {line}", flush=True)

    server = MockLLMServer(
        host=args.host, port=args.port, announce=announce if args.announce else None
    )
    if args.walkthrough:
        server.configure(WALKTHROUGH_TURN * WALKTHROUGH_REPEATS, match=WALKTHROUGH_MATCH)
    stop_requested = threading.Event()

    def _on_signal(_signum: int, _frame: object) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    server.start()
    print(f"MOCKLLM_URL={server.base_url}", flush=True)
    while not stop_requested.wait(timeout=0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
