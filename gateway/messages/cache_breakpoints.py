"""Anthropic prompt-cache breakpoints for a view the gateway rendered.

Anthropic caches explicitly: a prefix is written and read only up to a ``cache_control``
marker, and a request may carry at most 4 of them. The gateway places its own where its view
plan keeps the prefix stable:

1. the end of the client's tools and system (the prefix that never changes),
2. the end of the gateway's system blocks (the summary block: it changes only at a
   compaction event),
3. the end of the compacted rounds (the last tool result the view compacted): that prefix
   stays as it is until the next compaction event, which appends new placeholders after it,
   so the event reads it back instead of rewriting the whole conversation (issue 29);
4. the newest message (the next request of an agent loop reads everything up to it).

The compacted-rounds marker goes on only when the request has a marker left to spend: it never
takes the place of one of the client's.

The client's markers on its tools and system stay where it put them (that part goes upstream
as it sent it); its markers inside ``messages`` are dropped, because they were placed for the
client's full history, not for the view. When the client's own markers and the gateway's
would pass 4, the client's earliest go first. Blocks are copied before a marker moves: the
client's items (kept in the ledger) are never changed.
"""

from __future__ import annotations

MAX_BREAKPOINTS = 4
EPHEMERAL = {"type": "ephemeral"}
# Blocks Anthropic does not accept a cache_control on.
UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def _unmarked(block: dict) -> dict:
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if out.get("type") == "tool_result" and isinstance(out.get("content"), list):
        out["content"] = [_unmarked(b) if isinstance(b, dict) and "cache_control" in b else b for b in out["content"]]
    return out


def _has_nested(block: dict) -> bool:
    content = block.get("content")
    return isinstance(content, list) and any(isinstance(b, dict) and "cache_control" in b for b in content)


def _strip_messages(messages: list) -> list:
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and ("cache_control" in b or _has_nested(b)) for b in content):
            message = {**message, "content": [_unmarked(b) if isinstance(b, dict) else b for b in content]}
        out.append(message)
    return out


def _mark_newest(messages: list) -> bool:
    """A marker on the newest message's last markable block (in a copy); False if none."""
    for m in range(len(messages) - 1, -1, -1):
        message = messages[m]
        if not isinstance(message, dict) or message.get("role") == "system":
            continue
        content = message.get("content")
        if isinstance(content, str):
            if not content:
                return False
            messages[m] = {**message, "content": [{"type": "text", "text": content, "cache_control": dict(EPHEMERAL)}]}
            return True
        if not isinstance(content, list):
            return False
        for b in range(len(content) - 1, -1, -1):
            block = content[b]
            if isinstance(block, dict) and block.get("type") not in UNMARKABLE:
                blocks = list(content)
                blocks[b] = {**block, "cache_control": dict(EPHEMERAL)}
                messages[m] = {**message, "content": blocks}
                return True
        return False
    return False


def _mark_last_tool(body: dict):
    """A marker on the last tool (in a copy of the list); the tools as they are now."""
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[-1], dict) and "cache_control" not in tools[-1]:
        body["tools"] = tools = [*tools[:-1], {**tools[-1], "cache_control": dict(EPHEMERAL)}]
    return tools


def count_breakpoints(body: dict) -> int:
    """cache_control markers in a Messages body (tools, system, messages and tool results)."""
    def count(blocks) -> int:
        if not isinstance(blocks, list):
            return 0
        n = 0
        for block in blocks:
            if isinstance(block, dict):
                n += "cache_control" in block
                if isinstance(block.get("content"), list):
                    n += count(block["content"])
        return n

    return (count(body.get("tools")) + count(body.get("system") if isinstance(body.get("system"), list) else None)
            + sum(count(m.get("content")) for m in body.get("messages") or () if isinstance(m, dict)))


def _mark_block(messages: list, target: dict) -> bool:
    """A marker on ``target`` (a block of one of ``messages``, by identity, in a copy), unless it
    is in the newest message (marked already); False when it is not there."""
    for m in range(len(messages) - 2, -1, -1):
        message = messages[m]
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for b, block in enumerate(content):
            if block is target:
                blocks = list(content)
                blocks[b] = {**block, "cache_control": dict(EPHEMERAL)}
                messages[m] = {**message, "content": blocks}
                return True
    return False


def place_breakpoints(body: dict, *, client_system_blocks: int, frontier: dict | None = None) -> dict:
    """``body`` (a shallow copy the caller owns) with the gateway's breakpoints placed. The first
    ``client_system_blocks`` blocks of ``system`` are the client's, the rest the gateway's.
    ``frontier``: the block of ``messages`` that ends the compacted rounds (marked when a marker
    is left)."""
    body["messages"] = _strip_messages(body.get("messages") or [])
    _mark_newest(body["messages"])
    system = body.get("system")
    tools = body.get("tools")
    if isinstance(system, list) and system:
        system = [dict(b) if isinstance(b, dict) else b for b in system]
        body["system"] = system
        ends = {len(system) - 1}
        if 0 < client_system_blocks < len(system):
            ends.add(client_system_blocks - 1)  # the client's own system, before the summary block
        for i in ends:
            if "cache_control" not in system[i]:
                system[i]["cache_control"] = dict(EPHEMERAL)
        if client_system_blocks == 0:
            tools = _mark_last_tool(body)  # no client system: its prefix ends with the tools
    elif isinstance(system, str) and system:
        body["system"] = system = [{"type": "text", "text": system, "cache_control": dict(EPHEMERAL)}]
    else:
        tools = _mark_last_tool(body)
    # Over the limit: the client's earliest markers go (tools, then system blocks before the ends).
    keep = {len(system) - 1, client_system_blocks - 1} if isinstance(system, list) and system else set()
    excess = count_breakpoints(body) - MAX_BREAKPOINTS
    if excess > 0 and isinstance(tools, list):
        tools = list(tools)
        for i, tool in enumerate(tools):
            if excess > 0 and isinstance(tool, dict) and "cache_control" in tool:
                tools[i] = {k: v for k, v in tool.items() if k != "cache_control"}
                excess -= 1
        body["tools"] = tools
    if excess > 0 and isinstance(system, list):
        for i, block in enumerate(system):
            if excess > 0 and i not in keep and isinstance(block, dict) and "cache_control" in block:
                block.pop("cache_control")
                excess -= 1
    if frontier is not None and "cache_control" not in frontier and count_breakpoints(body) < MAX_BREAKPOINTS:
        _mark_block(body["messages"], frontier)
    return body
