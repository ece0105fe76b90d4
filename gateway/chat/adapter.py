"""Chat Completions: parsing and validating a request body (400 on what we cannot route).

Only what the gateway itself depends on is checked: JSON object, ``model`` a string,
``messages`` a non-empty list of objects with string roles, each tool call (and legacy
``function_call``) an object whose ``function`` is an object with string ``name`` and
``arguments``, ``stream`` a boolean. Everything else, unknown fields included, is the provider's
business and is passed on unchanged.
"""

from __future__ import annotations

from gateway.http.errors import BadRequest
from gateway.pipeline.request import ChatRequest, json_object
from store.canonical import is_instruction, path_ids

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _check_call(function, where: str, *, required: bool) -> None:
    """A call's ``function``: an object, its ``name`` and ``arguments`` strings when present."""
    if function is None and not required:
        return
    if not isinstance(function, dict):
        raise BadRequest(f"'{where}' must be an object with 'name' and 'arguments'.", param=where)
    for key in ("name", "arguments"):
        if function.get(key) is not None and not isinstance(function[key], str):
            raise BadRequest(f"'{where}.{key}' must be a string.", param=f"{where}.{key}")


def parse_chat_request(raw: bytes) -> ChatRequest:
    body = json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string.", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"'messages[{i}]' must be an object.", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(f"'messages[{i}].role' must be one of {sorted(ROLES)}.", param=f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"'messages[{i}].content' must be a string or an array of parts.", param=f"messages[{i}].content")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not (isinstance(tool_calls, list) and all(isinstance(c, dict) for c in tool_calls)):
            raise BadRequest(f"'messages[{i}].tool_calls' must be an array of objects.", param=f"messages[{i}].tool_calls")
        for j, call in enumerate(tool_calls or ()):
            _check_call(call.get("function"), f"messages[{i}].tool_calls[{j}].function", required=True)
            if call.get("id") is not None and not isinstance(call["id"], str):
                raise BadRequest(f"'messages[{i}].tool_calls[{j}].id' must be a string.", param=f"messages[{i}].tool_calls[{j}].id")
        if message.get("function_call") is not None:
            _check_call(message["function_call"], f"messages[{i}].function_call", required=False)
        for name in ("tool_call_id", "name"):
            if message.get(name) is not None and not isinstance(message[name], str):
                raise BadRequest(f"'messages[{i}].{name}' must be a string.", param=f"messages[{i}].{name}")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean.", param="stream")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("'tools' must be an array of objects.", param="tools")
    max_out = 0
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"'{name}' must be a non-negative integer.", param=name)
        max_out = max(max_out, value)
    instructions = [m for m in messages if is_instruction(m)]
    history = [m for m in messages if not is_instruction(m)]
    return ChatRequest(raw, body, model, stream, instructions, history, max_out)


def parse_and_hash(raw: bytes) -> tuple[ChatRequest, list[str]]:
    """The parsed request and its history's content addresses (``path_ids``)."""
    chat = parse_chat_request(raw)
    return chat, path_ids(chat.history) if chat.history else []
