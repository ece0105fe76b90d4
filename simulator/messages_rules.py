"""Anthropic Messages rules, as strict as the provider where a gateway can break them.

Errors use Anthropic's envelope (`AnthropicError`). `validate` checks the body: the version
header, ``max_tokens``, roles that alternate from a user turn (mid-conversation ``system``
messages allowed with or without the ``mid-conversation-system-2026-04-07`` beta: it is generally
available: Claude Code 2.1.332 sends system turns without the header), every ``tool_use`` answered first thing in the next user
message, at most 4 ``cache_control`` breakpoints (blocks inside tool results count), each ``ttl`` "5m" or "1h" and no 1-hour one after
a 5-minute one (in the order tools, system, messages: Anthropic answers 400 otherwise),
thinking signatures that verify, and with thinking on, a thinking block first in the assistant
turn a tool loop continues. `blocks` flattens
the prompt for counting and the prompt cache; `to_chat` gives the script its messages.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from simulator.counting import count_text
from simulator.errors import PuppetError
from simulator.signing import thinking_verifies, verify

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
          403: "permission_error", 404: "not_found_error", 413: "request_too_large",
          429: "rate_limit_error", 500: "api_error", 504: "timeout_error",
          529: "overloaded_error"}
_MESSAGES = {401: "invalid x-api-key", 404: "Not found", 413: "Request exceeds the maximum size",
             429: "Number of request tokens has exceeded your per-minute rate limit",
             500: "Internal server error", 529: "Overloaded"}
USER_BLOCKS = ("text", "image", "document", "tool_result", "search_result", "container_upload")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking", "server_tool_use",
                    "web_search_tool_result", "web_fetch_tool_result",
                    "code_execution_tool_result", "mcp_tool_use", "mcp_tool_result", "compaction")
MAX_BREAKPOINTS = 4
MIN_CACHEABLE = 1024  # tokens, as for Claude's Sonnet and Opus models
LOOKBACK_BLOCKS = 20  # a breakpoint finds earlier cache entries this many blocks back
TTLS = {"5m": 300.0, "1h": 3600.0}  # cache_control.ttl -> seconds (no ttl: 5 minutes)
IMAGE_TOKENS = 1_500


class AnthropicError(PuppetError):
    """A PuppetError rendered as {"type": "error", "error": {"type", "message"}}."""

    def __init__(self, status: int, message: str | None = None, **kw: Any) -> None:
        super().__init__(status, message or f"{_MESSAGES.get(status, 'Error')} (simulated)", **kw)
        self.type = _TYPES.get(status, "api_error")

    def response(self) -> web.Response:
        body = {"type": "error", "error": {"type": self.type, "message": self.message},
                "request_id": self.headers.get("request-id", "req_puppet")}
        return web.Response(status=self.status, body=orjson.dumps(body), headers=self.headers,
                            content_type="application/json")


def bad(message: str) -> AnthropicError:
    return AnthropicError(400, message)


def _blocks_of(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def thinking_on(body: dict[str, Any]) -> bool:
    return (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")


def validate(body: Any, headers: Any, secret: bytes, *, counting: bool = False) -> None:
    if not headers.get("anthropic-version"):
        raise bad("anthropic-version: header is required")
    if not isinstance(body, dict):
        raise bad("Request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad("model: Field required")
    if not counting:
        limit = body.get("max_tokens")
        if limit is None:
            raise bad("max_tokens: Field required")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise bad("max_tokens: Input should be a valid integer greater than or equal to 1")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise bad("messages: Field required")
    system = body.get("system")
    if system is not None and not (isinstance(system, str) or (isinstance(system, list) and all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in system))):
        raise bad("system: Input should be a valid string or a list of text blocks")
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise bad("thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'")
        if kind == "enabled" and not (isinstance(thinking.get("budget_tokens"), int)
                                      and thinking["budget_tokens"] >= 1024):
            raise bad("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if kind == "enabled" and not counting and thinking["budget_tokens"] >= body["max_tokens"]:
            raise bad("`max_tokens` must be greater than `thinking.budget_tokens`. Please consult "
                      "our documentation at https://docs.claude.com/en/docs/build-with-claude/"
                      "extended-thinking#max-tokens-and-context-window-size")
    _validate_tools(body.get("tools"))
    _validate_tool_choice(body.get("tool_choice"), thinking_on(body))
    _validate_messages(messages, secret)
    breakpoints = count_breakpoints(body)
    if breakpoints > MAX_BREAKPOINTS:
        raise bad(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                  f"Found {breakpoints}.")
    _check_ttls(body)
    if thinking_on(body):
        _check_thinking_first(messages)


TOOL_CHOICES = ("auto", "any", "tool", "none")


def _validate_tool_choice(choice: Any, thinking: bool) -> None:
    """Anthropic's ``tool_choice``: an object whose type is auto, any, tool (with a name) or none."""
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise bad("tool_choice: Input should be a valid dictionary or object to extract fields from")
    if choice.get("type") not in TOOL_CHOICES:
        raise bad(f"tool_choice: Input tag '{choice.get('type')}' found using 'type' does not match any of "
                  "the expected tags: 'auto', 'any', 'tool', 'none'")
    if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
        raise bad("tool_choice.tool.name: Field required")
    if thinking and choice["type"] in ("any", "tool"):
        raise bad("Thinking may not be enabled when tool_choice forces tool use.")


def _validate_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad("tools: Input should be a valid list")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad(f"tools.{i}.name: Field required")
        if tool.get("type", "custom") == "custom" and not isinstance(tool.get("input_schema"), dict):
            raise bad(f"tools.{i}.custom.input_schema: Field required")


def _validate_messages(messages: list[Any], secret: bytes) -> None:
    previous_role = None
    open_calls: tuple[int, list[str]] | None = None  # the assistant turn whose results are due
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        content = message.get("content")
        if role == "system":  # a mid-conversation system turn: not part of the alternation
            if not (isinstance(content, str) or isinstance(content, list)):
                raise bad(f"messages.{i}.content: Input should be a valid string or list")
            continue
        if role not in ("user", "assistant"):
            raise bad(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if previous_role is None and role != "user":
            raise bad('messages: first message must use the "user" role')
        if role == previous_role:
            raise bad('messages: roles must alternate between "user" and "assistant", but found '
                      f'multiple "{role}" roles in a row')
        if not isinstance(content, (str, list)):
            raise bad(f"messages.{i}.content: Input should be a valid string or list")
        blocks = _blocks_of(content)
        allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
        for k, block in enumerate(blocks):
            if block.get("type") not in allowed:
                raise bad(f"messages.{i}.content.{k}.type: Input tag '{block.get('type')}' found "
                          "using 'type' does not match any of the expected tags: "
                          + ", ".join(f"'{t}'" for t in allowed))
            if block["type"] == "thinking" and not thinking_verifies(
                    secret, block.get("thinking"), block.get("signature")):
                raise bad(f"messages.{i}.content.{k}: Invalid `signature` in `thinking` block")
            if block["type"] == "redacted_thinking" and (verify(secret, block.get("data")) or {}).get("k") != "redacted":
                raise bad(f"messages.{i}.content.{k}: Invalid `data` in `redacted_thinking` block")
        if role == "user":
            _check_results(i, blocks, open_calls)
            open_calls = None
        else:
            ids = [b.get("id") for b in blocks if b["type"] == "tool_use"]
            open_calls = (i, ids) if ids else None
        previous_role = role
    if open_calls:
        raise _unanswered(*open_calls)


def _unanswered(at: int, ids: list[str]) -> AnthropicError:
    return bad(f"messages.{at}: `tool_use` ids were found without `tool_result` blocks "
               f"immediately after: {', '.join(ids)}. Each `tool_use` block must have a "
               "corresponding `tool_result` block in the next message.")


def _check_results(i: int, blocks: list[dict[str, Any]],
                   open_calls: tuple[int, list[str]] | None) -> None:
    due = list(open_calls[1]) if open_calls else []
    seen_other = False
    for k, block in enumerate(blocks):
        if block["type"] != "tool_result":
            seen_other = True
            continue
        if block.get("tool_use_id") not in due:
            raise bad(f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` "
                      f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                      "corresponding `tool_use` block in the previous message.")
        if seen_other:
            raise bad(f"messages.{i}.content.{k}: `tool_result` blocks must come first in the "
                      "user message content, before any other block.")
        due.remove(block["tool_use_id"])
    if due:
        raise _unanswered(open_calls[0], due)


def _check_thinking_first(messages: list[dict[str, Any]]) -> None:
    """A tool loop in progress: the assistant turn it answers starts with thinking."""
    turns = [(i, m) for i, m in enumerate(messages) if m.get("role") != "system"]
    if len(turns) < 2 or turns[-1][1]["role"] != "user":
        return
    if not any(b["type"] == "tool_result" for b in _blocks_of(turns[-1][1]["content"])):
        return
    at, assistant = turns[-2]
    first = (_blocks_of(assistant["content"]) or [{"type": "text"}])[0]
    if first["type"] not in ("thinking", "redacted_thinking"):
        raise bad(f"messages.{at}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                  f"found `{first['type']}`. When `thinking` is enabled, a final `assistant` "
                  "message must start with a thinking block (preceeding the lastmost set of "
                  "`tool_use` and `tool_result` blocks). We recommend you include thinking blocks "
                  "from previous turns. To avoid this requirement, disable `thinking`.")


def _marked(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(path, block) of every top-level block with a cache_control, in the cache's order."""
    out = [(f"tools.{i}", t) for i, t in enumerate(body.get("tools") or ())
           if isinstance(t, dict) and t.get("cache_control")]
    system = body.get("system")
    out += [(f"system.{i}", b) for i, b in enumerate(system) if b.get("cache_control")] if isinstance(system, list) else []
    for m, message in enumerate(body.get("messages") or ()):
        for k, b in enumerate(_blocks_of(message.get("content"))):
            if b.get("type") == "tool_result":  # blocks inside a tool result may carry their own
                out += [(f"messages.{m}.content.{k}.content.{j}", inner)
                        for j, inner in enumerate(_blocks_of(b.get("content"))) if inner.get("cache_control")]
            if b.get("cache_control"):
                out.append((f"messages.{m}.content.{k}", b))
    return out


def _breakpoint_ttl(block: dict[str, Any]) -> str | None:
    """The TTL of the breakpoint a block ends the prefix at: its own marker, else (a tool
    result) the last marker nested in its content, which caches the prefix through it."""
    ttl = ttl_of(block)
    if ttl is None and block.get("type") == "tool_result":
        nested = [ttl_of(b) for b in _blocks_of(block.get("content")) if b.get("cache_control")]
        ttl = nested[-1] if nested else None
    return ttl


def ttl_of(block: dict[str, Any]) -> str | None:
    """A block's breakpoint TTL ("5m" or "1h"; no ttl is 5 minutes), None without a breakpoint."""
    control = block.get("cache_control")
    if not control:
        return None
    return control.get("ttl", "5m") if isinstance(control, dict) else "5m"


def _check_ttls(body: dict[str, Any]) -> None:
    """Anthropic's TTL rules: "5m" or "1h", and a 1-hour entry never after a 5-minute one."""
    short = False
    for path, block in _marked(body):
        ttl = ttl_of(block)
        if ttl not in TTLS:
            raise bad(f"{path}.cache_control.ephemeral.ttl: Input should be '5m' or '1h'")
        if ttl == "1h" and short:
            raise bad(f"{path}.cache_control.ttl: a ttl='1h' cache_control block must not come after a "
                      "ttl='5m' cache_control block. Note that blocks are processed in the following "
                      "order: `tools`, `system`, `messages`.")
        short = short or ttl == "5m"


def count_breakpoints(body: dict[str, Any]) -> int:
    return len(_marked(body))


def block_text(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return block.get("text", "")
    if kind == "tool_use":
        return f"{block.get('name', '')} {orjson.dumps(block.get('input', {})).decode()}"
    if kind == "tool_result":
        return "\n".join(block_text(b) for b in _blocks_of(block.get("content")))
    if kind == "thinking":
        return block.get("thinking", "")
    if kind == "compaction":
        return str(block.get("content", ""))
    return ""


def blocks(body: dict[str, Any]) -> list[tuple[bytes, int, str | None]]:
    """The prompt in Anthropic's cache order (tools, system, messages): per block its bytes
    without cache_control, its tokens, and its breakpoint's TTL ("5m" or "1h"; None: no
    breakpoint)."""
    out: list[tuple[bytes, int, str | None]] = []

    def add(prefix: str, block: dict[str, Any], tokens: int) -> None:
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        if block.get("type") == "tool_result" and isinstance(plain.get("content"), list):
            plain["content"] = [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
                                for b in plain["content"]]
        out.append((prefix.encode() + orjson.dumps(plain, option=orjson.OPT_SORT_KEYS), tokens,
                    _breakpoint_ttl(block)))

    for tool in body.get("tools") or ():
        add("tool:", tool, count_text(orjson.dumps(tool).decode()))
    for block in _blocks_of(body.get("system")):
        add("system:", block, count_text(block.get("text", "")))
    for message in body["messages"]:
        for k, block in enumerate(_blocks_of(message.get("content"))):
            tokens = IMAGE_TOKENS if block.get("type") in ("image", "document") else count_text(block_text(block))
            add(f"{message['role']}:" if k == 0 else "", block, tokens + (3 if k == 0 else 0))
    return out


def to_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat-shaped messages for the script: system text first, tool results last in a turn."""
    system = body.get("system")
    head = [{"role": "system", "content": system if isinstance(system, str) else
             "\n".join(b.get("text", "") for b in system)}] if system else []
    out: list[dict[str, Any]] = []
    for message in body["messages"]:
        parts = _blocks_of(message.get("content"))
        text = "\n".join(b.get("text", "") for b in parts if b["type"] == "text")
        if message["role"] == "system":
            head.append({"role": "system", "content": text})
        elif message["role"] == "assistant":
            calls = [{"id": b.get("id"), "type": "function", "function": {
                "name": b.get("name", ""), "arguments": orjson.dumps(b.get("input", {})).decode()}}
                     for b in parts if b["type"] == "tool_use"]
            out.append({"role": "assistant", "content": text or None,
                        **({"tool_calls": calls} if calls else {})})
        else:
            if text or not any(b["type"] == "tool_result" for b in parts):
                out.append({"role": "user", "content": text})
            out += [{"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": block_text(b)}
                    for b in parts if b["type"] == "tool_result"]
    return head + out
