"""The OpenAI Responses API (``POST /v1/responses``) as the neutral conversation model.

Input items map onto neutral items (``policies/conversation.py``):

- ``message`` items with role ``system`` / ``developer`` are instructions, like the top-level
  ``instructions`` string (which stays in the body, byte-identical);
- ``message`` items with role ``user`` are user items;
- a run of model-side items (``reasoning``, assistant ``message``, ``function_call``,
  ``custom_tool_call``, ``local_shell_call``, server-side calls, unknown types) is ONE assistant
  item: its calls become ``tool_calls`` (the ``call_id`` is the id), everything the gateway does
  not read (reasoning with ``encrypted_content``, provider ``compaction`` items, ...) its
  ``opaque`` part. A reasoning item and the call it precedes are therefore never apart;
- every ``*_output`` item (``function_call_output``, ``custom_tool_call_output``, ...) is a tool
  item answering its ``call_id``.

Each neutral item keeps the client's items as its ``wire`` form; ``render`` re-emits those
unchanged for every item the view did not touch, and builds new items only for what the gateway
wrote (the summary block as a developer message, placeholders as new ``output`` strings, recall
calls and results). The ``instructions`` and ``tools`` fields go upstream as the client sent them.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.http.errors import BadRequest
from gateway.pipeline.history_ids import INPUTS
from gateway.pipeline.request import TOO_DEEP, ChatRequest, json_object
from gateway.responses.cache_breakpoints import place_breakpoints
from gateway.responses import shape
from policies.conversation import assistant_message, opaque_identity, wire_items, with_wire

FORMAT = "responses"
INSTRUCTION_ROLES = frozenset({"system", "developer"})
TEXT_TYPES = frozenset({"input_text", "output_text", "text", "summary_text"})
# Items that carry a client-side call the client (or the gateway) answers with an *_output item.
CALL_ARGUMENT_FIELDS = ("arguments", "input", "action", "code")


def parse_responses_request(raw: bytes) -> ChatRequest:
    """The request body as a ChatRequest in the neutral model (a 400 naming the field on what
    does not have the declared shape, ``gateway/responses/shape.py``).

    A big body is compared, byte for byte, with the tenant's last few (``INPUTS``,
    gateway/pipeline/history_ids.py): the input items an agent resends are neither parsed,
    checked nor converted again."""
    spliced = INPUTS.parse(raw) if len(raw) >= INPUTS.min_bytes else None
    if spliced is None:
        body, same, before = json_object(raw, depth_checked_by_caller=True), 0, None
    else:
        body, same, before = spliced.body, spliced.same, spliced.state
    value = body.get("input")
    memo = isinstance(value, list) and bool(value) and len(raw) >= INPUTS.min_bytes
    try:  # json_object's depth check: what was not resent, the input list one level down as in the body
        if memo:
            orjson.dumps([value[same:]])
            orjson.dumps({k: v for k, v in body.items() if k != "input"})
        else:
            orjson.dumps(body)
    except orjson.JSONEncodeError:
        raise BadRequest(TOO_DEEP) from None
    shape.STYLE.check(shape.REQUEST, body, (value, same))
    instructions = body.get("instructions")
    items = input_items(value)
    compact = bool(items) and items[-1].get("type") == "compaction_trigger"
    if compact:
        items = items[:-1]  # a request, not history: the gateway answers it (gateway/responses/compaction.py)
    leading: list[dict] = []
    if isinstance(instructions, str) and instructions:
        # Counted as an instruction; rendered nowhere (it stays in the body's own field).
        leading.append(with_wire({"role": "system", "content": instructions}, FORMAT, []))
    resume = _resume(before, min(same, len(items)))
    safe: list[tuple[int, int, int]] = []
    at: list[int] = []
    neutral_instructions, history = to_neutral(items, resume=resume, safe=safe if memo else None, at=at)
    if memo:
        # Copies of the lists (not of the items): a later change to this request's lists leaves the memo as it was.
        INPUTS.remember(raw, body, (safe, list(neutral_instructions), list(history), at), spliced)
    # The request form's literals (gateway/responses/request_form.py): each system or developer
    # item where it stood among the history items, and a final compaction_trigger.
    literals = [[position, m["wire"]["items"][0]] for position, m in zip(at, neutral_instructions)]
    if compact:
        literals.append([len(history), value[-1]])
    return ChatRequest(raw, body, body["model"], bool(body.get("stream")), leading + neutral_instructions, history,
                       body.get("max_output_tokens") or 0, format=FORMAT, compact=compact, form=(literals, len(history)))


def _resume(before, same: int) -> tuple[int, list[dict], list[dict], list, list[int]] | None:
    """Where to resume converting a list whose first `same` items are those of `before` (a
    remembered parse: its safe points, instructions and history): the last point at or before
    `same` where no model-side run was open, the neutral items made up to it, the safe points
    before it, and where its instructions stood."""
    if before is None or not same:
        return None
    safe, instructions, history, at = before
    lo, hi = 0, len(safe)  # safe points are in order of their item index
    while lo < hi:
        mid = (lo + hi) // 2
        if safe[mid][0] <= same:
            lo = mid + 1
        else:
            hi = mid
    if not lo:
        return None
    point, n_instructions, n_history = safe[lo - 1]
    return point, instructions[:n_instructions], history[:n_history], safe[:lo - 1], at[:n_instructions]


def input_items(value: Any) -> list[dict]:
    """``input`` (checked: ``shape.INPUT``) as a list of items: a string is one user message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return value


def is_output(item: dict) -> bool:
    kind = item.get("type", "message")
    return isinstance(kind, str) and kind.endswith("_output")


def is_call(item: dict) -> bool:
    """A call the client answers (it has a call_id and is not an output)."""
    return not is_output(item) and item.get("type", "message") != "message" and isinstance(item.get("call_id"), str)


def content_parts(content: Any) -> Any:
    """Message content as neutral content: one text part is a string, text parts are
    ``{"type": "text"}`` parts, anything else (images, files) stays as the client sent it."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in TEXT_TYPES and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif isinstance(part, str):
            parts.append({"type": "text", "text": part})
        else:
            parts.append(part)
    if len(parts) == 1 and parts[0].get("type") == "text" and set(parts[0]) == {"type", "text"}:
        return parts[0]["text"]
    if all(p.get("type") == "text" for p in parts):
        return "".join(p["text"] for p in parts) if parts else None
    return parts


def _call_arguments(item: dict) -> str:
    for key in CALL_ARGUMENT_FIELDS:
        value = item.get(key)
        if value is None:
            continue
        return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return ""


def assistant_item(items: list[dict]) -> dict:
    """One neutral assistant item for a run of model-side items."""
    texts: list[str] = []
    calls: list[dict] = []
    opaque: list[dict] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            text = content_parts(item.get("content"))
            if isinstance(text, str):
                texts.append(text)
            elif isinstance(text, list):
                texts.extend(p["text"] for p in text if isinstance(p, dict) and p.get("type") == "text")
                opaque.extend(p for p in text if isinstance(p, dict) and p.get("type") != "text")
        elif is_call(item):
            name = item.get("name") if isinstance(item.get("name"), str) else kind
            calls.append({"id": item["call_id"], "type": "function",
                          "function": {"name": name, "arguments": _call_arguments(item)}})
            if kind != "function_call":
                opaque.append({"type": kind})  # the call's kind is part of what it is
        else:
            opaque.append(opaque_identity(item))
    return with_wire(assistant_message(texts, calls, opaque), FORMAT, items)


def tool_item(item: dict) -> dict:
    output = item.get("output")
    content = content_parts(output) if isinstance(output, (str, list, dict)) else (
        None if output is None else str(output))
    return with_wire({"role": "tool", "tool_call_id": item["call_id"], "content": content if content is not None else ""},
                     FORMAT, [item])


def to_neutral(items: list[dict], *, hoist: bool = True, resume: tuple | None = None,
               safe: list[tuple[int, int, int]] | None = None, at: list[int] | None = None) -> tuple[list[dict], list[dict]]:
    """(instructions, history) of a list of input items; with ``hoist`` False, system and
    developer messages stay in the history where they are (instructions is then empty).

    `resume` (start, instructions, history, safe points, positions): the items before ``start``
    are known to make these (a previous request's parse of the same items; no run was open
    there), so conversion starts there. `safe`, when given, gets every such point of this list:
    (item index, how many instructions, how many history items), in order. `at`, when given,
    gets each hoisted instruction's position: how many history items stood before it, a run
    open there counted as one."""
    instructions: list[dict] = []
    history: list[dict] = []
    group: list[dict] = []
    start = 0
    if resume is not None:
        start, done_instructions, done_history, done_safe, done_at = resume
        instructions.extend(done_instructions)
        history.extend(done_history)
        if safe is not None:
            safe.extend(done_safe)
        if at is not None:
            at.extend(done_at)

    def flush() -> None:
        if group:
            history.append(assistant_item(list(group)))
            group.clear()

    for i in range(start, len(items)):
        item = items[i]
        if safe is not None and not group:
            safe.append((i, len(instructions), len(history)))
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and role in INSTRUCTION_ROLES:
            if not hoist:
                flush()
            elif at is not None:
                at.append(len(history) + bool(group))
            (instructions if hoist else history).append(with_wire({"role": "system", "content": content_parts(item.get("content"))}, FORMAT, [item]))
        elif kind == "message" and role == "user":
            flush()
            history.append(with_wire({"role": "user", "content": content_parts(item.get("content"))}, FORMAT, [item]))
        elif is_output(item):
            flush()
            history.append(tool_item(item))
        elif kind == "compaction":
            flush()  # a boundary: what came before it is what it stands for
            history.append(assistant_item([item]))
        else:
            group.append(item)
    if safe is not None and not group:
        safe.append((len(items), len(instructions), len(history)))
    flush()
    return instructions, history


# -- rendering ---------------------------------------------------------------------------------


def _input_parts(content: Any, role: str) -> list[dict] | str:
    text_type = "output_text" if role == "assistant" else "input_text"
    if content is None:
        return [{"type": text_type, "text": ""}]
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    return [{"type": text_type, "text": p["text"]} if isinstance(p, dict) and p.get("type") == "text" else p
            for p in content]


def _same(message: dict, original: dict) -> bool:
    return all(message.get(k) == original.get(k) for k in ("role", "content", "tool_calls", "tool_call_id"))


def render_item(message: dict, unchanged: bool = False) -> list[dict]:
    """The wire items for one neutral item of a view (`unchanged`: the caller knows it is the
    item as parsed, so its wire items go as they are without being read again)."""
    items = wire_items(message, FORMAT)
    role = message.get("role")
    if items is not None and unchanged:
        return list(items)
    if items is not None:
        rebuilt = _reparse(message, items)
        if rebuilt is None or _same(message, rebuilt):
            return list(items)
    if role in INSTRUCTION_ROLES:
        return [{"type": "message", "role": "developer", "content": _input_parts(message.get("content"), "developer")}]
    if role == "user":
        base = dict(items[0]) if items else {"type": "message", "role": "user"}
        base["content"] = _input_parts(message.get("content"), "user")
        return [base]
    if role == "tool":
        base = dict(items[0]) if items else {"type": "function_call_output", "call_id": message.get("tool_call_id")}
        content = message.get("content")
        base["output"] = content if isinstance(content, str) or content is None else _input_parts(content, "user")
        if base["output"] is None:
            base["output"] = ""
        return [base]
    if role == "assistant":
        return _assistant_items(message, items)
    return []


def _reparse(message: dict, items: list[dict]) -> dict | None:
    role = message.get("role")
    if role == "assistant":
        return assistant_item(items)
    if role == "tool" and items:
        return tool_item(items[0])
    if items:
        return {"role": role, "content": content_parts(items[0].get("content"))}
    return None  # the top-level instructions: nothing to emit


def _assistant_items(message: dict, items: list[dict] | None) -> list[dict]:
    """An assistant item the view changed (its text was cut): the client's items with the
    message text replaced; calls and opaque items as they were."""
    content = message.get("content")
    if items:
        out, placed = [], False
        for item in items:
            if item.get("type", "message") == "message":
                if not placed:
                    out.append({**item, "content": _input_parts(content, "assistant")})
                    placed = True
                continue
            out.append(item)
        return out
    out = []
    if content:
        out.append({"type": "message", "role": "assistant", "content": _input_parts(content, "assistant")})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        out.append({"type": "function_call", "call_id": call.get("id"), "name": fn.get("name"),
                    "arguments": fn.get("arguments") or ""})
    return out


def render_input(messages: list[dict], parsed: set[int] = frozenset()) -> list[dict]:
    """Input items for a view; `parsed` holds the ids of the neutral items as the request was
    parsed (the view passes an untouched item on as the same object)."""
    out: list[dict] = []
    for message in messages:
        out.extend(render_item(message, id(message) in parsed))
    return out


def render_body(chat: ChatRequest, messages: list[dict], tools: list[dict] | None) -> dict:
    """The upstream body for a view: the client's body with ``input`` (and ``tools``) replaced."""
    body = dict(chat.body)
    body["input"] = place_breakpoints(chat.model, render_input(messages, {id(m) for m in (*chat.instructions, *chat.history)}))
    body.pop("previous_response_id", None)  # the view carries the whole chain
    if tools is not None:
        body["tools"] = tools
    return body
