"""Session items and tool definitions, translated into what each model API accepts.

The server stores a session as flat items (``message``, ``function_call``,
``function_call_output``, ...), and the runner keeps the same shape in memory. The two
OpenAI API flavours want the conversation in different forms: the Responses API takes
typed input items, Chat Completions takes role messages where calls hang off an
assistant message. Keeping the translation here, pure and Django-free, lets the agent
loop stay about *when* to call the model and the tests check *what* is sent.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Item = dict[str, Any]

_CONVERSATION_TYPES = ("message", "function_call", "function_call_output")


def message_text(item: Item) -> str:
    """The text of a message item: its text parts joined (a plain string is accepted too)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [
        part.get("text")
        for part in content
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
    ]
    return "".join(text for text in texts if isinstance(text, str))


# --- file blocks (files.md §1) ------------------------------------------------------------
# A user message may carry ``input_file`` / ``input_image`` blocks next to its text. In
# the turn input the server has put the bytes in them as data URIs (``image_url`` /
# ``file_data``); in the history of earlier turns (``session.open``) they come without
# bytes, to keep that frame small, and the model gets a short note in their place.

_FILE_BLOCKS = ("input_file", "input_image")


def has_file_blocks(item: Item) -> bool:
    content = item.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") in _FILE_BLOCKS for part in content
    )


def _block_name(part: Item) -> str:
    name = part.get("filename")
    return name if isinstance(name, str) and name else str(part.get("file_id") or "file")


def _data_uri(part: Item) -> str | None:
    uri = part.get("image_url") if part.get("type") == "input_image" else part.get("file_data")
    if isinstance(uri, dict):  # ``{"url": ...}`` as some clients write an image URL
        uri = uri.get("url")
    return uri if isinstance(uri, str) and uri.startswith("data:") else None


def _media_type(uri: str) -> str:
    return uri[5:].split(";", 1)[0].split(",", 1)[0].lower()


def _decoded_text(uri: str) -> str | None:
    """The text of a ``data:…;base64,`` URI of a text type, or None if it is not text."""
    media = _media_type(uri)
    if not (media.startswith("text/") or media in ("application/json", "application/jsonl")):
        return None
    try:
        return base64.b64decode(uri.split(",", 1)[1]).decode("utf-8")
    except (IndexError, ValueError):
        return None


def _missing_note(part: Item) -> str:
    return (
        f"[{'image' if part.get('type') == 'input_image' else 'file'} {_block_name(part)!r} "
        "was attached here; its content is not repeated in this history]"
    )


def _text_part(part: Item) -> str | None:
    text = part.get("text") if part.get("type") in ("input_text", "output_text", "text") else None
    return text if isinstance(text, str) else None


def responses_user_content(item: Item) -> list[Item]:
    """A user message with file blocks as Responses content parts.

    ``input_image`` → ``{"type": "input_image", "image_url": <data URI>}``; any other
    file → ``{"type": "input_file", "file_data": <data URI>, "filename"}``.
    """

    def file_part(part: Item, uri: str) -> Item:
        if part["type"] == "input_image":
            return {"type": "input_image", "image_url": uri, "detail": "auto"}
        return {"type": "input_file", "file_data": uri, "filename": _block_name(part)}

    return _user_content(item, text_type="input_text", file_part=file_part)


def chat_user_content(item: Item) -> list[Item]:
    """A user message with file blocks as Chat Completions content parts.

    Images → ``image_url`` parts; text files (text/*, JSON) → ``text`` parts holding the
    decoded text under a line naming the file; other files (PDF) → a ``file`` part
    with ``file_data`` and ``filename``, which the SDK and OpenAI's API take (a server
    that does not is told by its own error).
    """

    def file_part(part: Item, uri: str) -> Item:
        if _media_type(uri).startswith("image/"):
            return {"type": "image_url", "image_url": {"url": uri}}
        if (decoded := _decoded_text(uri)) is not None:
            return {"type": "text", "text": f"[file {_block_name(part)!r}]\n{decoded}"}
        return {"type": "file", "file": {"file_data": uri, "filename": _block_name(part)}}

    return _user_content(item, text_type="text", file_part=file_part)


def _user_content(
    item: Item, *, text_type: str, file_part: Callable[[Item, str], Item]
) -> list[Item]:
    """A user message's content parts in one API's form: text as ``text_type`` parts,
    file blocks through ``file_part``, a file whose bytes are missing as a text note."""
    parts: list[Item] = []
    for part in item.get("content") or []:
        if not isinstance(part, dict):
            continue
        text = _text_part(part)
        if text is not None:
            parts.append({"type": text_type, "text": text})
        elif part.get("type") in _FILE_BLOCKS:
            uri = _data_uri(part)
            if uri is None:
                parts.append({"type": text_type, "text": _missing_note(part)})
            else:
                parts.append(file_part(part, uri))
    return parts


def usable_history(items: Iterable[Item]) -> list[Item]:
    """The items a model may see, with every call paired with its output.

    APIs reject a function call without its output (and an output without its call),
    and a transcript can hold either: a runner that died while a tool ran, or a client
    call still waiting (``action_required``). Such halves are left out rather than
    invented, so the model simply does not see the unfinished call.
    """
    items = [item for item in items if isinstance(item, dict)]
    call_ids = {
        item.get("call_id")
        for item in items
        if item.get("type") == "function_call" and item.get("status") != "action_required"
    }
    output_ids = {
        item.get("call_id") for item in items if item.get("type") == "function_call_output"
    }
    paired = call_ids & output_ids
    usable = []
    for item in items:
        kind = item.get("type")
        if kind not in _CONVERSATION_TYPES:
            continue
        if kind == "function_call" and (
            item.get("status") == "action_required" or item.get("call_id") not in paired
        ):
            continue
        if kind == "function_call_output" and item.get("call_id") not in paired:
            continue
        usable.append(item)
    return usable


def _output_text(item: Item) -> str:
    output = item.get("output")
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


def output_images(item: Item) -> list[str]:
    """The data URIs of a tool output's images (an MCP tool's, mcp.md): its ``images``
    field's ``input_image`` parts. The text ``output`` keeps a placeholder for each, so
    an entry that is not a well-formed image data URI is simply left out."""
    images = item.get("images")
    uris: list[str] = []
    for part in images if isinstance(images, list) else []:
        if not isinstance(part, dict) or part.get("type") != "input_image":
            continue
        uri = part.get("image_url")
        if isinstance(uri, str) and uri.startswith("data:image/") and ";base64," in uri:
            uris.append(uri)
    return uris


# --- Responses API ----------------------------------------------------------------------


def to_responses_input(items: Iterable[Item]) -> list[Item]:
    """Flat items as Responses ``input``: role messages, function calls and their outputs."""
    result: list[Item] = []
    for item in usable_history(items):
        kind = item["type"]
        if kind == "message":
            role = item.get("role") or "user"
            if role != "assistant" and has_file_blocks(item):
                result.append({"role": role, "content": responses_user_content(item)})
                continue
            part_type = "output_text" if role == "assistant" else "input_text"
            result.append(
                {"role": role, "content": [{"type": part_type, "text": message_text(item)}]}
            )
        elif kind == "function_call":
            result.append(
                {
                    "type": "function_call",
                    "call_id": item.get("call_id"),
                    "name": item.get("name"),
                    "arguments": item.get("arguments") or "{}",
                }
            )
        else:
            output: str | list[Item] = _output_text(item)
            if images := output_images(item):
                # The Responses API takes a tool output as content parts, images included.
                output = [
                    {"type": "input_text", "text": output},
                    *(
                        {"type": "input_image", "image_url": uri, "detail": "auto"}
                        for uri in images
                    ),
                ]
            result.append(
                {"type": "function_call_output", "call_id": item.get("call_id"), "output": output}
            )
    return result


def to_responses_tools(tools: Iterable[Item]) -> list[Item]:
    """Chat-format function tools flattened to the Responses function-tool format."""
    result = []
    for tool in tools:
        function = tool["function"]
        flat: Item = {"type": "function", "name": function["name"]}
        for key in ("description", "parameters", "strict"):
            if key in function:
                flat[key] = function[key]
        result.append(flat)
    return result


# --- Chat Completions -------------------------------------------------------------------


def to_chat_messages(instructions: str, items: Iterable[Item]) -> list[Item]:
    """A system message, then the items as Chat messages.

    A function call joins the assistant message just before it (text and calls of one
    answer form one message); tool outputs become ``tool`` messages. A ``tool`` message
    holds text only, so the images of tool outputs (an MCP tool's) follow the run of
    ``tool`` messages as one ``user`` message of ``image_url`` parts, each output's
    images after a line naming its call (nothing may come between an assistant's calls
    and their ``tool`` messages). An assistant
    message of calls only has ``"content": ""``: servers that type ``content`` as a
    string (llama-cpp-python) answer 500 to ``null``, and leaving the key out breaks
    its chat template; OpenAI accepts the empty string.
    """
    messages: list[Item] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    images: list[Item] = []  # of the tool messages since the last other message

    def flush_images() -> None:
        if images:
            messages.append({"role": "user", "content": list(images)})
            images.clear()

    for item in usable_history(items):
        kind = item["type"]
        if kind != "function_call_output":
            flush_images()
        if kind == "message":
            role = item.get("role") or "user"
            if role != "assistant" and has_file_blocks(item):
                messages.append({"role": role, "content": chat_user_content(item)})
                continue
            messages.append({"role": role, "content": message_text(item)})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _output_text(item)}
            )
            if uris := output_images(item):
                images.append(
                    {
                        "type": "text",
                        "text": f"[images of the output of call {item.get('call_id')}]",
                    }
                )
                images.extend({"type": "image_url", "image_url": {"url": uri}} for uri in uris)
    flush_images()
    return messages


# --- tool definitions -------------------------------------------------------------------


def normalise_tool(tool: Any) -> Item | None:
    """A client tool in Chat format, whichever OpenAI function format it came in.

    Clients send tools as Chat (``{"type": "function", "function": {...}}``) or as
    Responses (``{"type": "function", "name": ...}``) definitions; anything else (not a
    function, no name) is not something the model could call, so it is dropped.
    """
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return None
    nested = tool.get("function")
    function = nested if isinstance(nested, dict) else tool
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return None
    normalised: Item = {"name": name}
    for key in ("description", "parameters", "strict"):
        if function.get(key) is not None:
            normalised[key] = function[key]
    normalised.setdefault("parameters", {"type": "object", "properties": {}})
    return {"type": "function", "function": normalised}


def merge_tools(builtin: Sequence[Item], client: Iterable[Any]) -> tuple[list[Item], set[str]]:
    """All tool definitions (Chat format) and the names of the client tools among them.

    Built-in tools come first and win a name clash; a repeated client name keeps the
    first definition.
    """
    tools = list(builtin)
    names = {tool["function"]["name"] for tool in tools}
    client_names: set[str] = set()
    for raw in client:
        tool = normalise_tool(raw)
        if tool is None or tool["function"]["name"] in names:
            continue
        names.add(tool["function"]["name"])
        client_names.add(tool["function"]["name"])
        tools.append(tool)
    return tools, client_names
