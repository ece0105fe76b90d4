"""Anthropic Messages (``POST /v1/messages``, Claude Code) as the neutral conversation model.

Messages map onto neutral items (``policies/conversation.py``):

- the top-level ``system`` (a string or text blocks) is one instruction, kept in the body
  byte-identical; a ``system`` message before the first turn is an instruction rendered where it
  was; a ``system`` message inside the conversation (Claude Code's mid-conversation system
  messages) rides in the ``wire`` of the item before it, so it goes wherever that item goes,
  and is counted as an instruction;
- an assistant message is ONE assistant item: ``tool_use`` blocks become ``tool_calls`` (the
  arguments are the JSON of ``input``), text blocks its text, everything else (``thinking`` and
  ``redacted_thinking`` with their signatures, server tool blocks, provider ``compaction``
  blocks) its ``opaque`` part, so a thinking block never leaves the call it precedes;
- a user message is one tool item per ``tool_result`` block, then a user item for its other
  blocks (text; images and documents are opaque parts). An API round therefore is the assistant
  message plus the next user message's results, as ``policies/rounds.py`` sees it.

The gateway's own system items go after the client's ``system`` when they lead the view (the
summary block, the recall note) and, inside the conversation (proactive recall before the
newest user message), as a text block of the user message they precede.

``cache_control`` markers are never identity (they move every turn): the neutral copy leaves
them out. A provider ``compaction`` block is a boundary: the conversation starts at the newest
message holding one, as Anthropic reads it.

``render_body`` re-emits the client's own blocks for every item the view did not change,
regroups tool items and the user item after them into one user message (results first), puts
the gateway's system items (the summary block, the recall note) as text blocks after the
client's ``system``, and places the cache breakpoints (``gateway/messages/cache_breakpoints.py``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.pipeline.request import ChatRequest, json_object
from gateway.messages.cache_breakpoints import asks_an_hour, place_breakpoints
from gateway.messages import shape
from policies.conversation import assistant_message, opaque_identity, wire_items, with_wire

FORMAT = "messages"

def parse_messages_request(raw: bytes) -> ChatRequest:
    """The request body as a ChatRequest in the neutral model (a 400 naming the field on what
    does not have the declared shape, ``gateway/messages/shape.py``)."""
    body = json_object(raw)
    shape.STYLE.check(shape.REQUEST, body)
    messages, system = body["messages"], body.get("system")
    instructions: list[dict] = []
    if system_text(system):
        # Counted as an instruction; rendered nowhere (it stays in the body's own field).
        instructions.append(with_wire({"role": "system", "content": system_text(system)}, FORMAT, []))
    more, history = to_neutral(messages[compaction_start(messages):])
    return ChatRequest(raw, body, body["model"], bool(body.get("stream")), instructions + more, history,
                       body.get("max_tokens") or 0, format=FORMAT, long_cache=asks_an_hour(body))


def system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n\n".join(b["text"] for b in system if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def compaction_start(messages: list[dict]) -> int:
    """Where the conversation starts: at the newest message holding a provider ``compaction``
    block (Anthropic drops everything before it), or rather at the user message before that one,
    so the request still opens with a user turn (0 without a compaction block)."""
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        if isinstance(content, list) and any(b.get("type") == "compaction" for b in content):
            return next((j for j in range(i - 1, -1, -1) if messages[j].get("role") == "user"), i)
    return 0


def _blocks(content: Any) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _bare(block: dict) -> dict:
    return {k: v for k, v in block.items() if k != "cache_control"}


def neutral_content(blocks: list[dict]) -> Any:
    """Blocks as neutral content: one text block is a string, text blocks are text parts,
    anything else (images, documents) an opaque part without its cache_control."""
    parts = [{"type": "text", "text": b["text"]} if b.get("type") == "text" and isinstance(b.get("text"), str)
             else _bare(b) for b in blocks]
    if not parts:
        return None
    if len(parts) == 1 and parts[0]["type"] == "text" and len(parts[0]) == 2:
        return parts[0]["text"]
    return parts


def _arguments(value: Any) -> str:
    return orjson.dumps(value if value is not None else {}, option=orjson.OPT_SORT_KEYS).decode()


def assistant_item(blocks: list[dict], *, string: bool = False) -> dict:
    """One neutral assistant item for an assistant message's content blocks."""
    texts, calls, opaque = [], [], []
    for block in blocks:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": _arguments(block.get("input"))}})
        else:
            opaque.append(opaque_identity(block))
    return _wired(assistant_message(texts, calls, opaque), blocks, string)


def tool_item(block: dict) -> dict:
    content = block.get("content")
    content = neutral_content(_blocks(content)) if isinstance(content, (str, list)) else None
    return _wired({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content or ""}, [block], False)


def user_item(blocks: list[dict], *, string: bool = False) -> dict:
    return _wired({"role": "user", "content": neutral_content(blocks)}, blocks, string)


def _wired(item: dict, blocks: list[dict], string: bool) -> dict:
    with_wire(item, FORMAT, blocks)
    if string:
        item["wire"]["string"] = True  # the client sent the content as a plain string
    return item


def to_neutral(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """(instructions, history) of a list of messages."""
    instructions: list[dict] = []
    history: list[dict] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            text = content if isinstance(content, str) else "\n".join(
                b["text"] for b in content if isinstance(b.get("text"), str))
            if not history:
                instructions.append(with_wire({"role": "system", "content": text}, FORMAT, [message]))
                continue
            # Counted as an instruction, rendered after the item it follows.
            instructions.append(with_wire({"role": "system", "content": text}, FORMAT, []))
            history[-1]["wire"].setdefault("after", []).append(message)
            continue
        string = isinstance(content, str)
        blocks = _blocks(content)
        if role == "assistant":
            history.append(assistant_item(blocks, string=string))
            continue
        results = [b for b in blocks if b.get("type") == "tool_result"]
        history.extend(tool_item(b) for b in results)
        rest = [b for b in blocks if b.get("type") != "tool_result"]
        if rest or not results:
            history.append(user_item(rest, string=string))
    return instructions, history


# -- rendering ---------------------------------------------------------------------------------


def _same(message: dict, original: dict) -> bool:
    return all(message.get(k) == original.get(k) for k in ("role", "content", "tool_calls", "tool_call_id"))


def _reparse(message: dict, items: list[dict]) -> dict | None:
    role = message.get("role")
    if role == "assistant":
        return assistant_item(items)
    if role == "tool":
        return tool_item(items[0]) if items else None
    return user_item(items)


def content_blocks(content: Any) -> list[dict]:
    """Neutral content as content blocks."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": p["text"]} if p.get("type") == "text" else p for p in content if isinstance(p, dict)]


def item_blocks(message: dict, unchanged: bool = False) -> tuple[list[dict], bool]:
    """The content blocks of one neutral item of a view, and whether they go as a plain string.
    ``unchanged``: the item is the request's own (the view did not replace it)."""
    items = wire_items(message, FORMAT)
    if items is not None and unchanged:
        return list(items), bool(message["wire"].get("string"))
    if items is not None:
        rebuilt = _reparse(message, items)
        if rebuilt is not None and _same(message, rebuilt):
            return list(items), bool(message["wire"].get("string"))
    role = message.get("role")
    if role == "tool":
        base = _bare(items[0]) if items else {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
        content = message.get("content")
        base["content"] = content if isinstance(content, str) else content_blocks(content)
        return [base], False
    if role == "assistant":
        return _assistant_blocks(message, items), False
    return content_blocks(message.get("content")) or [{"type": "text", "text": ""}], False


def wire_same(message: dict, blocks: list[dict]) -> bool:
    """Whether ``blocks`` (from ``item_blocks``) are the client's own blocks of ``message``."""
    items = wire_items(message, FORMAT)
    return items is not None and len(items) == len(blocks) and all(a is b for a, b in zip(items, blocks))


def _assistant_blocks(message: dict, items: list[dict] | None) -> list[dict]:
    """An assistant item the view changed (its text was cut): the client's blocks with the text
    replaced; thinking and tool_use blocks as they were. A new one (a recall call) is built."""
    text = message.get("content") if isinstance(message.get("content"), str) else None
    if items:
        out, placed = [], False
        for block in items:
            if block.get("type") == "text":
                if not placed and text:
                    out.append({**_bare(block), "text": text})
                placed = True
                continue
            out.append(block)
        return out
    out = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        try:
            arguments = orjson.loads(fn.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {}
        out.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": arguments})
    return out


def render_messages(messages: list[dict], own: frozenset[int] = frozenset(),
                    changed: list[dict] | None = None) -> tuple[list[dict], list[str]]:
    """(the ``messages`` array, the gateway's system texts) of a view. Consecutive user-side
    items become one user message, its tool_result blocks first. ``own``: the ``id()`` of the
    request's own items (the view passes unchanged items on as the same objects; any other
    item is compared with what its wire form reads as). ``changed``, when given, collects in
    order the tool_result blocks the view rebuilt (compacted or cut results)."""
    out: list[dict] = []
    system: list[str] = []
    pending: list[tuple[str, list[dict], bool]] = []  # same-role entries waiting to be merged

    def flush() -> None:
        if not pending:
            return
        role = pending[0][0]
        if len(pending) == 1 and pending[0][2] and len(pending[0][1]) == 1:
            out.append({"role": role, "content": pending[0][1][0]["text"]})
        else:
            blocks = [b for _, bs, _ in pending for b in bs]
            if role == "user":
                blocks = [b for b in blocks if b.get("type") == "tool_result"] + [
                    b for b in blocks if b.get("type") != "tool_result"]
            out.append({"role": role, "content": blocks})
        pending.clear()

    started = False  # a conversation item was rendered: the gateway's system items go in place from here
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            items = wire_items(message, FORMAT)
            if items is None:
                content = message.get("content")
                text = content if isinstance(content, str) else "\n".join(b.get("text", "") for b in content_blocks(content))
                if not started:
                    system.append(text)
                    continue
                # Inside the conversation (proactive recall before the newest user message): a
                # text block of the user message it precedes, so the prefix before it stays cached.
                if pending and pending[0][0] != "user":
                    flush()
                pending.append(("user", [{"type": "text", "text": text}], False))
            elif items:
                flush()
                out.extend(items)
            continue
        started = True
        side = "assistant" if role == "assistant" else "user"
        if pending and pending[0][0] != side:
            flush()
        blocks, string = item_blocks(message, id(message) in own)
        if changed is not None and role == "tool" and id(message) not in own and not wire_same(message, blocks):
            changed.extend(blocks)
        pending.append((side, blocks, string))
        after = (message.get("wire") or {}).get("after") if wire_items(message, FORMAT) is not None else None
        if after:
            flush()
            out.extend(after)
    flush()
    return out, system


def render_body(chat: ChatRequest, messages: list[dict], tools: list[dict] | None) -> dict:
    """The upstream body for a view: the client's body with ``messages`` (and ``tools``)
    replaced, the gateway's system blocks after the client's, and the cache breakpoints placed."""
    body = dict(chat.body)
    changed: list[dict] = []
    body["messages"], extra = render_messages(messages, frozenset(map(id, chat.history)), changed)
    if tools is not None:
        body["tools"] = tools
    client_system = body.get("system")
    own = len(_blocks(client_system)) if client_system else 0
    if extra:
        body["system"] = [*(_blocks(client_system) if client_system else []),
                          *({"type": "text", "text": text} for text in extra)]
    # The last result the view compacted ends the prefix that stays until the next compaction event.
    return place_breakpoints(body, client_system_blocks=own, frontier=changed[-1] if changed else None, client=chat.body)
