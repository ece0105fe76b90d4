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

TTLs. A marker may ask ``"ttl": "1h"`` (written at 2x input, kept an hour) instead of the
5-minute default (1.25x); Anthropic refuses (400) a 1-hour marker after a 5-minute one in the
order tools, system, messages. The gateway's markers take their lifetime from the client's
markers whose content they stand for (``_ttls``), so a client that pays for an hour keeps it on
its long prefix, and the request stays ordered:

- the end of the client's system (or its last tool): 1 hour when the client asked an hour
  anywhere in its system or messages (that content was under a 1-hour marker of its own);
- the summary block and the compacted-rounds marker stand for the client's conversation: 1
  hour when the client marked a message with it;
- the newest message replaces the client's newest marker and keeps its TTL, except behind a
  1-hour compacted-rounds marker: there it writes only the raw rounds since the last
  compaction event, which the next request of a loop reads within seconds. 1 hour would cost
  0.75x more on every request's new tokens; 5 minutes costs a rewrite of that bounded tail
  (1.25x) only after a pause over 5 minutes, while the long prefix before it stays an hour.
  Without that marker (a view sent untouched, or no marker left) it keeps the client's hour.

A gateway marker that would still come after a 5-minute one is given 5 minutes (a client's
own out-of-order markers go as they came: Anthropic answers them as it would direct).
"""

from __future__ import annotations

MAX_BREAKPOINTS = 4
EPHEMERAL = {"type": "ephemeral"}  # 5 minutes
HOUR = "1h"
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


def _control(ttl: str | None) -> dict:
    return {**EPHEMERAL, "ttl": HOUR} if ttl == HOUR else dict(EPHEMERAL)


def _ttl(control) -> str:
    return HOUR if isinstance(control, dict) and control.get("ttl") == HOUR else "5m"


def _controls(blocks) -> list:
    """The cache_control objects of `blocks` (and of tool results' nested blocks), in order."""
    out = []
    for block in blocks if isinstance(blocks, list) else ():
        if isinstance(block, dict):
            if "cache_control" in block:
                out.append(block["cache_control"])
            if isinstance(block.get("content"), list):
                out += _controls(block["content"])
    return out


def _ttls(body: dict) -> tuple[bool, bool, str | None]:
    """The client's lifetimes: a 1-hour marker in its tools or system, one in its messages,
    and the TTL of its newest marker in messages (None: it marked no message)."""
    system = body.get("system")
    head = [*_controls(body.get("tools")), *_controls(system if isinstance(system, list) else None)]
    convo = [c for m in body.get("messages") or () if isinstance(m, dict) for c in _controls(m.get("content"))]
    return (any(_ttl(c) == HOUR for c in head), any(_ttl(c) == HOUR for c in convo),
            _ttl(convo[-1]) if convo else None)


def asks_an_hour(body: dict) -> bool:
    """The client marks a message for the 1-hour TTL: its conversation, and so the gateway's
    markers standing for it, are written at the 1-hour rate."""
    return _ttls(body)[1]


def _mark_newest(messages: list, ttl: str | None = None):
    """A marker on the newest message's last markable block (in a copy): its cache_control
    object, None if there is no such block."""
    for m in range(len(messages) - 1, -1, -1):
        message = messages[m]
        if not isinstance(message, dict) or message.get("role") == "system":
            continue
        content = message.get("content")
        control = _control(ttl)
        if isinstance(content, str):
            if not content:
                return None
            messages[m] = {**message, "content": [{"type": "text", "text": content, "cache_control": control}]}
            return control
        if not isinstance(content, list):
            return None
        for b in range(len(content) - 1, -1, -1):
            block = content[b]
            if isinstance(block, dict) and block.get("type") not in UNMARKABLE:
                blocks = list(content)
                blocks[b] = {**block, "cache_control": control}
                messages[m] = {**message, "content": blocks}
                return control
        return None
    return None


def _mark_last_tool(body: dict, control: dict):
    """A marker on the last tool (in a copy of the list); the tools as they are now."""
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[-1], dict) and "cache_control" not in tools[-1]:
        body["tools"] = tools = [*tools[:-1], {**tools[-1], "cache_control": control}]
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


def _mark_block(messages: list, target: dict, control: dict) -> bool:
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
                blocks[b] = {**block, "cache_control": control}
                messages[m] = {**message, "content": blocks}
                return True
    return False


def _ordered(body: dict, own: list) -> None:
    """Gateway markers (``own``, by identity) after a 5-minute marker lose their hour."""
    ids = {id(c) for c in own}
    system = body.get("system")
    short = False
    for control in [*_controls(body.get("tools")), *_controls(system if isinstance(system, list) else None),
                    *(c for m in body.get("messages") or () if isinstance(m, dict) for c in _controls(m.get("content")))]:
        if short and id(control) in ids and _ttl(control) == HOUR:
            control.pop("ttl")
        short = short or _ttl(control) != HOUR


def place_breakpoints(body: dict, *, client_system_blocks: int, frontier: dict | None = None,
                      client: dict | None = None) -> dict:
    """``body`` (a shallow copy the caller owns) with the gateway's breakpoints placed. The first
    ``client_system_blocks`` blocks of ``system`` are the client's, the rest the gateway's.
    ``frontier``: the block of ``messages`` that ends the compacted rounds (marked when a marker
    is left). TTLs as the module says, read off ``client`` (the body the client sent; default
    ``body``)."""
    hour_head, hour_convo, newest_ttl = _ttls(body if client is None else client)
    prefix_ttl = HOUR if hour_head or hour_convo else None  # the client's own system / tools
    convo_ttl = HOUR if hour_convo else None  # what stands for its conversation
    body["messages"] = _strip_messages(body.get("messages") or [])
    newest = _mark_newest(body["messages"], newest_ttl)
    own = [newest] if newest is not None else []
    system = body.get("system")
    tools = body.get("tools")
    if isinstance(system, list) and system:
        system = [dict(b) if isinstance(b, dict) else b for b in system]
        body["system"] = system
        ends = {len(system) - 1: convo_ttl if client_system_blocks < len(system) else prefix_ttl}
        if 0 < client_system_blocks < len(system):
            ends[client_system_blocks - 1] = prefix_ttl  # the client's own system, before the summary block
        for i, ttl in ends.items():
            if "cache_control" not in system[i]:
                system[i]["cache_control"] = control = _control(ttl)
                own.append(control)
        if client_system_blocks == 0:
            own.append(control := _control(prefix_ttl))
            tools = _mark_last_tool(body, control)  # no client system: its prefix ends with the tools
    elif isinstance(system, str) and system:
        own.append(control := _control(prefix_ttl))
        body["system"] = system = [{"type": "text", "text": system, "cache_control": control}]
    else:
        own.append(control := _control(prefix_ttl))
        tools = _mark_last_tool(body, control)
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
        control = _control(convo_ttl)
        if _mark_block(body["messages"], frontier, control):
            own.append(control)
            if convo_ttl == HOUR and newest is not None and _ttl(newest) == HOUR:
                newest.pop("ttl")  # the newest marker behind an hour-long compacted prefix: 5 minutes
    _ordered(body, own)
    return body
