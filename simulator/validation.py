"""Validation: the provider's structural rules for a chat completions body."""

from __future__ import annotations

from typing import Any

import orjson

from simulator.errors import PuppetError, invalid

VALID_ROLES = ("system", "developer", "user", "assistant", "tool")

def parse_json_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON.)"
        ) from None


def validate_chat(body: Any) -> None:
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise invalid("you must provide a model parameter", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("[] is too short - 'messages'" if messages == [] else
                       "'messages' is a required property and must be a list", param="messages")
    for key in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise invalid(f"Invalid value for '{key}': expected a positive integer.", param=key)
    _check_sampling(body)
    if body.get("stream_options") is not None and not body.get("stream"):
        raise invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       param="stream_options", code="invalid_value")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str)
            for t in tools
        ):
            raise invalid("Invalid 'tools': each tool needs function.name.", param="tools")
    pending: set[str] | None = None  # tool_call ids of the open assistant turn
    pending_at = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"Invalid type for 'messages[{i}]': expected an object.",
                           param=f"messages[{i}]", code="invalid_type")
        role = message.get("role")
        if role not in VALID_ROLES:
            raise invalid(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant',"
                           " 'user', 'function', 'tool', and 'developer'.",
                           param=f"messages[{i}].role", code="invalid_value")
        content = message.get("content")
        if not (isinstance(content, (str, list)) or (content is None and role == "assistant")):
            raise invalid(f"Invalid type for 'messages[{i}].content': expected one of a string "
                           "or array of objects.", param=f"messages[{i}].content",
                           code="invalid_type")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if pending is None or call_id not in pending:
                raise invalid("Invalid parameter: messages with role 'tool' must be a response "
                               "to a preceeding message with 'tool_calls'.",
                               param=f"messages.[{i}].role")
            pending.discard(call_id)
            continue
        if pending:
            raise _unanswered(pending, pending_at)
        pending = None
        if role == "assistant" and message.get("tool_calls"):
            pending, pending_at = _tool_call_ids(message, i), i
        elif role == "assistant" and content is None:
            raise invalid(f"Invalid value for 'messages[{i}].content': content is required "
                           "unless tool_calls are present.", param=f"messages[{i}].content")
    if pending:
        raise _unanswered(pending, pending_at)


# Numeric sampling parameters and their ranges, as the provider documents them.
NUMBER_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0),
                 "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0)}


def _check_sampling(body: dict[str, Any]) -> None:
    """Wrong types get 400 like the provider: numbers in range, booleans, strings, objects."""
    for key, (low, high) in NUMBER_RANGES.items():
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise invalid(f"Invalid type for '{key}': expected a decimal, but got "
                          f"{_json_type(value)} instead.", param=key, code="invalid_type")
        if not low <= value <= high:
            raise invalid(f"Invalid '{key}': decimal above maximum value. Expected a value <= "
                          f"{high:g}, but got {value} instead." if value > high else
                          f"Invalid '{key}': decimal below minimum value. Expected a value >= "
                          f"{low:g}, but got {value} instead.", param=key,
                          code="decimal_above_max_value" if value > high
                          else "decimal_below_min_value")
    for key, kind, name in (("stream", bool, "a boolean"), ("logprobs", bool, "a boolean"),
                            ("parallel_tool_calls", bool, "a boolean"), ("user", str, "a string"),
                            ("stream_options", dict, "an object"), ("metadata", dict, "an object"),
                            ("response_format", dict, "an object")):
        value = body.get(key)
        if value is not None and not isinstance(value, kind):
            raise invalid(f"Invalid type for '{key}': expected {name}, but got "
                          f"{_json_type(value)} instead.", param=key, code="invalid_type")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise invalid("Invalid type for 'seed': expected an integer, but got "
                      f"{_json_type(seed)} instead.", param="seed", code="invalid_type")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (
            isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop))):
        raise invalid("Invalid 'stop': expected a string or an array of at most 4 strings.",
                      param="stop", code="invalid_value")


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else "null"


def _tool_call_ids(message: dict[str, Any], i: int) -> set[str]:
    calls = message["tool_calls"]
    if not isinstance(calls, list):
        raise invalid(f"Invalid type for 'messages[{i}].tool_calls': expected an array.",
                       param=f"messages[{i}].tool_calls", code="invalid_type")
    ids: set[str] = set()
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call.get("id"), str) and isinstance(function, dict)
                and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments"), str)):
            raise invalid(f"Missing required parameter: 'messages[{i}].tool_calls[{j}]' needs "
                           "id, function.name and function.arguments.",
                           param=f"messages[{i}].tool_calls[{j}]", code="missing_required_parameter")
        ids.add(call["id"])
    return ids


def _unanswered(pending: set[str], at: int) -> PuppetError:
    return invalid("An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(sorted(pending))}",
                    param=f"messages.[{at}].role")


def check_window(body: dict[str, Any], prompt_tokens: int, window: int) -> None:
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    if prompt_tokens + completion <= window:
        return
    extra = f" (plus {completion} requested for the completion)" if completion else ""
    raise invalid(f"This model's maximum context length is {window} tokens. However, your "
                   f"messages resulted in {prompt_tokens} tokens{extra}. Please reduce the "
                   "length of the messages or completion.", param="messages",
                   code="context_length_exceeded")


# ---------------------------------------------------------------------------------------------
# The script: what to answer, decided by the last message.


def loads_or_none(raw: bytes | str) -> Any:
    """The JSON value of raw, or None when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
