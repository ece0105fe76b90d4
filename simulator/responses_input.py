"""The Responses API's input rules, as strict as the provider where a gateway can break them.

`validate_body` checks the request's own fields; `check_context` checks the whole context the
model would see (the stored chain of ``previous_response_id`` plus ``input``): every call has its
output and every output its call, every reasoning item verifies and sits right before the calls
it was emitted with, every call that was emitted after a reasoning item comes with that item,
and every compaction item is one this provider issued. `to_chat` turns a context into the chat
messages the script (simulator.script.decide) reads, and `count_context` counts it.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Any

import orjson

from simulator.counting import content_text, count_text
from simulator.errors import PuppetError, invalid
from simulator.signing import verify

INCLUDABLE = ("code_interpreter_call.outputs", "computer_call_output.output.image_url",
              "file_search_call.results", "message.input_image.image_url",
              "message.output_text.logprobs", "reasoning.encrypted_content",
              "web_search_call.action.sources", "web_search_call.results")
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
# Item types the provider accepts in ``input``; the simulator interprets the first group.
CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output",
         "local_shell_call": "local_shell_call_output", "shell_call": "shell_call_output",
         "apply_patch_call": "apply_patch_call_output", "computer_call": "computer_call_output"}
OUTPUTS = {output: call for call, output in CALLS.items()}
OTHER_ITEMS = ("message", "reasoning", "compaction", "compaction_trigger", "item_reference",
               "web_search_call", "file_search_call", "code_interpreter_call",
               "image_generation_call", "mcp_list_tools", "mcp_approval_request",
               "mcp_approval_response", "mcp_call", "tool_search_call", "tool_search_output")
ITEM_TYPES = (*CALLS, *OUTPUTS, *OTHER_ITEMS)
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_CALL_WORDS = {"function_call": "function call", "custom_tool_call": "custom tool call"}


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), "null")


def validate_body(body: Any) -> None:
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise invalid("Missing required parameter: 'model'.", param="model",
                      code="missing_required_parameter")
    if "input" not in body and not body.get("previous_response_id"):
        raise invalid("Missing required parameter: 'input'.", param="input",
                      code="missing_required_parameter")
    raw_input = body.get("input")
    if raw_input is not None and not isinstance(raw_input, (str, list)):
        raise invalid(f"Invalid type for 'input': expected one of a string or array of input "
                      f"items, but got {_type_name(raw_input)} instead.", param="input",
                      code="invalid_type")
    for key, kind in (("instructions", str), ("stream", bool), ("store", bool),
                      ("previous_response_id", str), ("parallel_tool_calls", bool),
                      ("metadata", dict), ("reasoning", dict), ("text", dict),
                      ("prompt_cache_key", str)):
        value = body.get(key)
        if value is not None and not isinstance(value, kind):
            raise invalid(f"Invalid type for '{key}': expected {_type_name(kind())}, but got "
                          f"{_type_name(value)} instead.", param=key, code="invalid_type")
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise invalid("Invalid type for 'max_output_tokens': expected an integer, but got "
                          f"{_type_name(limit)} instead.", param="max_output_tokens",
                          code="invalid_type")
        if limit < 16:
            raise invalid("Invalid 'max_output_tokens': integer below minimum value. Expected a "
                          f"value >= 16, but got {limit} instead.", param="max_output_tokens",
                          code="integer_below_min_value")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list):
            raise invalid("Invalid type for 'include': expected an array of strings.",
                          param="include", code="invalid_type")
        for i, value in enumerate(include):
            if value not in INCLUDABLE:
                raise invalid(f"Invalid value: '{value}'. Supported values are: "
                              + ", ".join(f"'{v}'" for v in INCLUDABLE) + ".",
                              param=f"include[{i}]", code="invalid_value")
    _validate_tools(body.get("tools"))
    _validate_tool_choice(body.get("tool_choice"))
    if isinstance(raw_input, list):
        for i, item in enumerate(raw_input):
            _validate_item(item, f"input[{i}]")


TOOL_CHOICE_MODES = ("none", "auto", "required")


def _validate_tool_choice(choice: Any) -> None:
    """OpenAI's ``tool_choice``: a mode string, or an object naming a function or a tool type."""
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in TOOL_CHOICE_MODES:
            raise invalid(f"Invalid value: '{choice}'. Supported values are: 'none', 'auto', and 'required'.",
                          param="tool_choice", code="invalid_value")
        return
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise invalid("Invalid type for 'tool_choice': expected one of a string or object.",
                      param="tool_choice", code="invalid_type")
    if choice["type"] == "function" and not isinstance(choice.get("name"), str):
        raise invalid("Missing required parameter: 'tool_choice.name'.", param="tool_choice.name",
                      code="missing_required_parameter")


def _validate_tools(tools: Any, where: str = "tools") -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise invalid(f"Invalid type for '{where}': expected an array of tools.", param=where,
                      code="invalid_type")
    for i, tool in enumerate(tools):
        at = f"{where}[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid(f"Missing required parameter: '{at}.type'.", param=f"{at}.type",
                          code="missing_required_parameter")
        if tool["type"] == "function":
            if "function" in tool and "name" not in tool:  # the chat shape, sent to the wrong API
                raise invalid(f"Missing required parameter: '{at}.name'.", param=f"{at}.name",
                              code="missing_required_parameter")
            if not isinstance(tool.get("name"), str) or not _TOOL_NAME.fullmatch(tool["name"]):
                raise invalid(f"Invalid '{at}.name': string does not match pattern. Expected a "
                              "string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                              param=f"{at}.name", code="invalid_value")
            if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
                raise invalid(f"Invalid type for '{at}.parameters': expected an object.",
                              param=f"{at}.parameters", code="invalid_type")
        elif tool["type"] == "namespace":
            _validate_tools(tool.get("tools"), f"{at}.tools")


def _validate_item(item: Any, at: str) -> None:
    if not isinstance(item, dict):
        raise invalid(f"Invalid type for '{at}': expected an input item object.", param=at,
                      code="invalid_type")
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in ITEM_TYPES:
        raise invalid(f"Invalid value: '{kind}'. Supported values are: "
                      + ", ".join(f"'{t}'" for t in ITEM_TYPES) + ".", param=f"{at}.type",
                      code="invalid_value")
    if kind == "message":
        if item.get("role") not in MESSAGE_ROLES:
            raise invalid(f"Invalid value: '{item.get('role')}'. Supported values are: "
                          "'assistant', 'system', 'developer', and 'user'.", param=f"{at}.role",
                          code="invalid_value")
        if not isinstance(item.get("content"), (str, list)):
            raise invalid(f"Missing required parameter: '{at}.content'.", param=f"{at}.content",
                          code="missing_required_parameter")
    elif kind in CALLS or kind in OUTPUTS:
        if not isinstance(item.get("call_id"), str):
            raise invalid(f"Missing required parameter: '{at}.call_id'.", param=f"{at}.call_id",
                          code="missing_required_parameter")
        if kind == "function_call" and not (isinstance(item.get("name"), str)
                                            and isinstance(item.get("arguments"), str)):
            raise invalid(f"Missing required parameter: '{at}.arguments'.",
                          param=f"{at}.arguments", code="missing_required_parameter")
        if kind in ("function_call_output", "custom_tool_call_output") and not isinstance(
                item.get("output"), (str, list)):
            raise invalid(f"Missing required parameter: '{at}.output'.", param=f"{at}.output",
                          code="missing_required_parameter")
    elif kind == "reasoning" and not isinstance(item.get("summary"), list):
        raise invalid(f"Missing required parameter: '{at}.summary'.", param=f"{at}.summary",
                      code="missing_required_parameter")
    elif kind in ("compaction", "item_reference") and not isinstance(
            item.get("encrypted_content" if kind == "compaction" else "id"), str):
        field = "encrypted_content" if kind == "compaction" else "id"
        raise invalid(f"Missing required parameter: '{at}.{field}'.", param=f"{at}.{field}",
                      code="missing_required_parameter")


def item_type(item: dict[str, Any]) -> str:
    return item.get("type", "message")


def check_context(items: list[dict[str, Any]], secret: bytes, bound: dict[str, str],
                  stored_ids: Container[Any]) -> None:
    """The provider's rules over the whole context; raises the 400 it would answer."""
    calls: dict[str, str] = {}
    for item in items:
        kind = item_type(item)
        if kind in CALLS:
            calls[item["call_id"]] = kind
        elif kind in OUTPUTS and item["call_id"] not in calls:
            raise invalid(f"No tool call found for {_CALL_WORDS.get(OUTPUTS[kind], 'tool call')} "
                          f"output with call_id {item['call_id']}.", param="input")
    answered = {item["call_id"] for item in items if item_type(item) in OUTPUTS}
    for call_id, kind in calls.items():
        if call_id not in answered:
            raise invalid(f"No tool output found for {_CALL_WORDS.get(kind, 'tool call')} "
                          f"{call_id}.", param="input")
    present = {item.get("id") for item in items if isinstance(item.get("id"), str)}
    for i, item in enumerate(items):
        kind = item_type(item)
        if kind == "reasoning":
            _check_reasoning(items, i, secret, stored_ids)
        elif kind == "function_call" and item.get("id") in bound:
            needed = bound[item["id"]]
            if needed not in present:
                raise invalid(f"Item '{item['id']}' of type 'function_call' was provided without "
                              f"its required 'reasoning' item: '{needed}'.", param="input")
        elif kind == "compaction":
            payload = verify(secret, item["encrypted_content"])
            if payload is None or payload.get("k") != "compaction":
                raise invalid("The encrypted content for item "
                              f"'{item.get('id', 'compaction')}' could not be verified.",
                              param="input", code="invalid_encrypted_content")
        elif kind == "item_reference" and item["id"] not in stored_ids:
            raise invalid(f"Item with id '{item['id']}' not found.", param="input")


def _check_reasoning(items: list[dict[str, Any]], i: int, secret: bytes,
                     stored_ids: Container[Any]) -> None:
    item = items[i]
    rs_id = item.get("id")
    content = item.get("encrypted_content")
    if content is None:
        if rs_id in stored_ids:
            return
        raise invalid(f"Item with id '{rs_id}' not found. Items are not persisted when `store` is "
                      "set to false. Try again with `store` set to true, or remove this item "
                      "from your input.", param="input")
    payload = verify(secret, content)
    if payload is None or payload.get("k") != "reasoning" or payload.get("id") != rs_id:
        raise invalid(f"The encrypted content for item '{rs_id}' could not be verified.",
                      param="input", code="invalid_encrypted_content")
    following, unnamed = set(), 0
    for other in items[i + 1:]:  # the calls of the same answer: up to the next message
        if item_type(other) in ("message", "reasoning"):
            break
        if isinstance(other.get("id"), str):
            following.add(other["id"])
        elif item_type(other) in CALLS:
            unnamed += 1  # a call resent without its item id (the Vercel AI SDK with store false)
    if len(set(payload.get("binds") or ()) - following) > unnamed:
        raise invalid(f"Item '{rs_id}' of type 'reasoning' was provided without its required "
                      "following item.", param="input")


def as_items(raw_input: Any) -> list[dict[str, Any]]:
    if isinstance(raw_input, str):
        return [{"type": "message", "role": "user", "content": raw_input}]
    return list(raw_input or [])


def output_text(value: Any) -> str:
    return value if isinstance(value, str) else content_text(value)


def compaction_text(secret: bytes, item: dict[str, Any]) -> str:
    payload = verify(secret, item.get("encrypted_content")) or {}
    return str(payload.get("summary", ""))


def reasoning_text(secret: bytes, item: dict[str, Any]) -> str:
    payload = verify(secret, item.get("encrypted_content")) or {}
    summary = " ".join(str(part.get("text", "")) for part in item.get("summary") or ()
                       if isinstance(part, dict))
    return f"{summary} {payload.get('text', '')}".strip()


def to_chat(instructions: str | None, items: list[dict[str, Any]],
            secret: bytes) -> list[dict[str, Any]]:
    """Chat-shaped messages for the script: instructions and developer/system text first."""
    head: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    body: list[dict[str, Any]] = []
    for item in items:
        kind = item_type(item)
        if kind == "message":
            role = item["role"]
            message = {"role": role, "content": content_text(item["content"])}
            (head if role in ("system", "developer") else body).append(message)
        elif kind in CALLS:
            call = {"id": item["call_id"], "type": "function", "function": {
                "name": item.get("name", kind), "arguments": item.get("arguments", item.get("input", "{}"))}}
            if body and body[-1]["role"] == "assistant" and body[-1].get("tool_calls"):
                body[-1]["tool_calls"].append(call)
            else:
                body.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in OUTPUTS:
            body.append({"role": "tool", "tool_call_id": item["call_id"],
                         "content": output_text(item.get("output"))})
        elif kind == "compaction":
            head.append({"role": "system", "content": compaction_text(secret, item)})
    return head + body


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Function tools (namespaces flattened) in the chat shape the script reads."""
    out = []
    for tool in tools or ():
        if tool.get("type") == "namespace":
            out.extend(chat_tools(tool.get("tools")))
        elif tool.get("type") == "function":
            out.append({"type": "function", "function": {"name": tool["name"]}})
    return out


def item_tokens(item: dict[str, Any], secret: bytes) -> int:
    kind = item_type(item)
    if kind == "message":
        return 3 + count_text(item["role"]) + count_text(content_text(item["content"]))
    if kind in CALLS:
        return 3 + count_text(item.get("name", "")) + count_text(
            str(item.get("arguments", item.get("input", ""))))
    if kind in OUTPUTS:
        return 3 + count_text(output_text(item.get("output")))
    if kind == "reasoning":
        return count_text(reasoning_text(secret, item))
    if kind == "compaction":
        return 3 + count_text(compaction_text(secret, item))
    return 3 + count_text(orjson.dumps(item).decode())


def count_context(instructions: str | None, items: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None, secret: bytes) -> list[tuple[bytes, int]]:
    """(bytes, tokens) per prompt element in order: instructions and tools, then each item."""
    head_tokens = count_text(instructions or "") + (
        count_text(orjson.dumps(tools).decode()) if tools else 0)
    keyed = [(orjson.dumps([instructions, tools], option=orjson.OPT_SORT_KEYS), head_tokens + 3)]
    keyed += [(orjson.dumps(cache_identity(item), option=orjson.OPT_SORT_KEYS), item_tokens(item, secret))
              for item in items]
    return keyed


def cache_identity(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the prompt renders it: a message's string content is one text part, and a
    ``prompt_cache_breakpoint`` mark is metadata, not prompt text."""
    if item_type(item) != "message":
        return item
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        content = [{"type": kind, "text": content}]
    elif isinstance(content, list):
        content = [{k: v for k, v in p.items() if k != "prompt_cache_breakpoint"} if isinstance(p, dict) else p
                   for p in content]
    return {**{k: v for k, v in item.items() if k != "type"}, "type": "message", "content": content}


def window_error(prompt_tokens: int, window: int, limit: int) -> PuppetError:
    return invalid(f"Your input exceeds the context window of this model. Please adjust your "
                   f"input and try again. (input: {prompt_tokens} tokens, max_output_tokens: "
                   f"{limit}, window: {window})", param="input", code="context_length_exceeded")
