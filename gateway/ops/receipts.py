"""A receipt for every request of a session: what went upstream, what did not, and why
(docs/architecture.md, "Receipts").

The pipeline names each request's receipt before anything is sent (``x-palimpsest-receipt``);
the ``TurnRecorder`` builds it when the request is over, from what the view plan gathered where
it decided (``policies.planner.ViewNotes``) and what the upstream billed, and keeps it in
the ``ReceiptStore`` (the turn log's file) as long as the session. The receipt itemises the
prompt the first upstream call carried, message by message, in the gateway's own token count
(the counter the view was fitted with, before per-model calibration): the items add up to
``prompt.tokens`` exactly, and that is the count of the body the upstream received.

``GET /v1/palimpsest/receipts/{id}`` answers the tenant that made the request (any other key:
404, as if it did not exist); ``GET /admin/receipts/{id}`` answers the admin token.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import orjson
from aiohttp import web

from gateway.http.errors import NotFound
from gateway.http.gate import tenant_of
from gateway.keys import RECEIPTS
from gateway.recall.auto import OPEN as RECALLED_OPEN
from policies import recall_note
from policies.cost import cost_rates
from policies.prices import CacheUsage
from policies.projection import SummaryBlock
from policies.tokens import REPLY_PRIMING
from store.turns import StoredReceipt

RECEIPT_HEADER = "x-palimpsest-receipt"
EVENTS_SHOWN = 20  # the plan's newest compaction events a receipt lists (all are counted)


def new_receipt_id() -> str:
    """A receipt id nobody can guess (it is also the key a tenant reads it by)."""
    return "rcpt_" + secrets.token_urlsafe(18)


def prompt_items(turn: Any, counter, views) -> tuple[list[dict], int]:
    """The first upstream call's prompt, item by item, and its total (the items' sum)."""
    chat, view = turn.chat, turn.view
    if view.messages is None:  # forwarded as the client sent it: the instructions, then the path
        items = [{"kind": "instructions", "role": m.get("role"), "tokens": counter.count_message(m)} for m in chat.instructions]
        if chat.history and chat.ids:
            items.append({"kind": "verbatim", "from": chat.ids[0], "to": chat.ids[-1], "messages": len(chat.ids),
                          "tokens": path_tokens(counter, chat.history, chat.ids)})
        elif chat.history:
            items.append({"kind": "other", "tokens": counter.count_messages(chat.history) - REPLY_PRIMING})
        tools = chat.body.get("tools")
    else:
        items = _view_items(turn, counter)
        tools = chat.body.get("tools") if turn.recall_refused or view.tools is None else view.tools
    notes_names = view.recall_names
    items.append({"kind": "reply_priming", "tokens": REPLY_PRIMING})
    tool_tokens = views.tool_tokens(chat, tools)
    if tool_tokens:
        names = [_tool_name(t) for t in tools or ()]
        items.append({"kind": "tools", "tokens": tool_tokens, "names": names,
                      "recall_tools": [n for n in names if notes_names and n in notes_names]})
    total = sum(i["tokens"] for i in items)
    wire = turn.peer.wire_count(turn, views) if turn.peer is not None and view.messages is not None else None
    if wire is not None and wire != total:
        # The format's wire form merges what the view holds apart (Messages: the gateway's system
        # texts join the client's system field, a mid-conversation block joins the user turn).
        items.append({"kind": "wire_framing", "tokens": wire - total})
        total = wire
    return items, total


def path_tokens(counter, history: list[dict], ids: list[str]) -> int:
    """``counter.count_messages(history, ids)`` without the reply priming, from the longest
    leading part of the path the counter has summed before (``TokenCounter.count_path``: the
    view builder summed this very path for the request)."""
    return counter.count_path(history, ids)


def _view_items(turn: Any, counter) -> list[dict]:
    """The view's messages by origin; verbatim events that follow each other on the path are one
    item ``{from, to, messages, tokens}`` (a run of the path is named by its ends, so a receipt
    stays small however long the session)."""
    chat, view = turn.chat, turn.view
    notes = view.notes
    origins = notes.origins if notes is not None else {}
    positions = {eid: i for i, eid in enumerate(chat.ids or ())}
    instructions = {id(m) for m in chat.instructions}
    note = recall_note(*view.recall_names) if view.recall_names else None
    items: list[dict] = []
    run: dict | None = None  # the verbatim run being extended
    for message in view.messages:
        origin = origins.get(id(message))
        if origin is not None and origin[0] == "verbatim":
            eid = origin[1]
            tokens = counter.count_message(message, eid)
            at = positions.get(eid)
            if run is not None and at is not None and positions.get(run["to"], -2) + 1 == at:
                run["to"], run["messages"], run["tokens"] = eid, run["messages"] + 1, run["tokens"] + tokens
            else:
                run = {"kind": "verbatim", "from": eid, "to": eid, "messages": 1, "tokens": tokens}
                items.append(run)
            continue
        run = None
        item: dict[str, Any] = {"role": message.get("role")}
        if origin is not None:
            kind, eid, detail = origin
            item.update(kind=kind, event_id=eid, **(detail or {}))
        elif isinstance(message, SummaryBlock):
            item["kind"] = "recall_note" if message.get("content") == note else "summary"
            if item["kind"] == "summary" and view.checkpoint:
                item["checkpoint"] = view.checkpoint
        elif id(message) in instructions:
            item["kind"] = "instructions"
        elif note is not None and message.get("content") == note:
            item["kind"] = "recall_note"
        elif _recalled(message):
            item.update(kind="recalled_history", event_ids=_recalled_ids(message))
        else:
            item["kind"] = "other"
        item["tokens"] = counter.count_message(message)
        items.append(item)
    return items


def build_receipt(turn: Any, receipt_id: str, counter, views, calibration, price) -> dict:
    """The receipt of a finished turn (``gateway.pipeline.turn.Turn``) as a JSON-ready dict."""
    chat, view = turn.chat, turn.view
    notes = view.notes
    policy = view.policy
    items, total = prompt_items(turn, counter, views)
    rates = cost_rates(policy) if policy is not None else None
    by_kind: dict[str, int] = {}
    for item in items:
        by_kind[item["kind"]] = by_kind.get(item["kind"], 0) + item["tokens"]
    receipt = {
        "id": receipt_id, "object": "palimpsest.receipt", "created": round(time.time(), 3),
        "session": turn.ref.session_id if turn.ref else None, "route": turn.route, "model": chat.model,
        "upstream": turn.upstream,
        "status": turn.status, "bypass": turn.bypass,
        "forwarded_as_sent": view.messages is None,
        "reason": _reason(turn),
        "window": view.window, "budget": view.budget,
        "profile": getattr(policy, "profile", None), "cost_model": getattr(policy, "cost_model", None),
        "prompt": {"tokens": total, "by_kind": by_kind, "items": items,
                   "client_tokens": view.client_tokens, "upstream_estimate": view.upstream_tokens,
                   "calibration": round(calibration.factor(chat.model), 4),
                   "reported": turn.first_prompt_tokens},
        "verbatim": _verbatim(items),
        "summarised": _summarised(notes, counter, chat, view),
        "placeholders": [_strip(i) for i in items if i["kind"] == "placeholder"],
        "truncated": [_strip(i) for i in items if i["kind"] == "truncated"],
        "tailoring": _tailoring(notes, items, counter, chat),
        "recall": {"tools": list(view.recall_names) if view.recall_names and not turn.recall_refused else [],
                   "calls": turn.recall_calls, "rounds": turn.recall_rounds,
                   "proactive": [e for i in items if i["kind"] == "recalled_history" for e in i.get("event_ids", [])],
                   "proactive_tokens": by_kind.get("recalled_history", 0)},
        "cache": _cache(turn.billed, turn),
        "cost": _cost(turn.billed, turn.direct, rates, price),
        "events": _events(notes, chat),
    }
    return receipt


def billed_units(usage: CacheUsage | None, rates) -> float | None:
    """What `usage` costs in uncached-input-token units at the policy's `rates`."""
    if usage is None or rates is None:
        return None
    return round(usage.uncached + usage.cached * rates.cached + usage.cache_write * rates.write
                 + usage.output * rates.output, 3)


def compaction_event_here(notes) -> bool:
    """Did the view plan take a compaction event at this request: in a round new on its path
    (``notes.new_from`` on: a turn after tool results brings two, the answer and the user's
    next message), or
    in the newest round, which this request may have grown (an agent step's tool results), unless
    the event was an early one (decided on the rounds before it: taken when the round first
    appeared)?"""
    if notes is None or not notes.events or not notes.round_starts:
        return False
    newest = len(notes.round_starts) - 1
    return any(e.reason != "deferred" and (e.round >= notes.new_from or e.round == newest and not e.early)
               for e in notes.events)


def stored(receipt: dict, session_key: str, tenant: str) -> StoredReceipt:
    return StoredReceipt(receipt["id"], session_key, tenant, orjson.dumps(receipt), receipt["created"])


# -- the sections -------------------------------------------------------------------------


def _reason(turn: Any) -> str:
    view = turn.view
    if turn.bypass:
        return f"bypass ({turn.bypass})"
    if view.messages is None:
        return "under the profile's triggers: forwarded as the client sent it"
    if view.notes is not None and view.notes.sync_wait:
        return "over sync_compaction_ratio of the budget: the request waited for a summary"
    if view.client_tokens > view.budget:
        return "over the window: the view was planned to fit"
    return "the view plan (compaction events, checkpoints) applies"


def _verbatim(items: list[dict]) -> dict:
    runs = [i for i in items if i["kind"] == "verbatim"]
    return {"events": sum(r["messages"] for r in runs), "tokens": sum(r["tokens"] for r in runs),
            "runs": [{"from": r["from"], "to": r["to"], "messages": r["messages"]} for r in runs]}


def _summarised(notes, counter, chat, view) -> dict | None:
    if notes is None or (notes.checkpoint is None and not notes.state_only):
        return None
    checkpoint = notes.checkpoint
    covered = notes.summarised or []
    positions = {eid: i for i, eid in enumerate(chat.ids)}
    tokens = sum(counter.count_message(chat.history[positions[e]], e) for e in covered if e in positions)
    return {"checkpoint": checkpoint.id if checkpoint else None, "boundary": checkpoint.boundary if checkpoint else None,
            "mode": checkpoint.mode if checkpoint else None, "events": len(covered), "tokens": tokens,
            "state_only": notes.state_only}


def _tailoring(notes, items: list[dict], counter, chat) -> dict:
    dropped = (notes.dropped or []) if notes is not None else []
    positions = {eid: i for i, eid in enumerate(chat.ids)} if dropped else {}  # no pass over the path for nothing
    rows = [{"event_id": e, "tokens": counter.count_message(chat.history[positions[e]], e)} for e in dropped if e in positions]
    return {"dropped": rows, "dropped_tokens": sum(r["tokens"] for r in rows),
            "cut": [_strip(i) for i in items if i["kind"] == "cut"]}


def _cache(billed: CacheUsage | None, turn: Any) -> dict | None:
    if billed is None:
        return None
    return {"calls": 1 + turn.recall_rounds, "cached_tokens": billed.cached,
            "rewritten_tokens": billed.uncached + billed.cache_write, "cache_write_tokens": billed.cache_write}


def _cost(billed: CacheUsage | None, direct: CacheUsage | None, rates, price) -> dict:
    out: dict[str, Any] = {"unit": "uncached input tokens",
                           "billed": billed_units(billed, rates), "direct": billed_units(direct, rates)}
    if billed is not None and out["direct"]:
        out["ratio"] = round(out["billed"] / out["direct"], 4)
    if price is not None:
        out["billed_usd"] = round(price.cost(billed), 8) if billed is not None else None
        out["direct_usd"] = round(price.cost(direct), 8) if direct is not None else None
    return out


def _events(notes, chat) -> dict:
    if notes is None or not notes.events:
        return {"count": 0, "deferred": 0, "here": False, "newest": []}
    starts = notes.round_starts or []
    taken = [e for e in notes.events if e.reason != "deferred"]

    def at(r: int) -> str | None:
        return chat.ids[starts[r]] if r < len(starts) and starts[r] < len(chat.ids) else None

    return {"count": len(taken), "deferred": len(notes.events) - len(taken), "here": compaction_event_here(notes),
            "newest": [{"round": e.round, "at": at(e.round), "reason": e.reason, "tokens_before": e.tokens_before,
                        "tokens_after": e.tokens_after} for e in taken[-EVENTS_SHOWN:]]}


def _strip(item: dict) -> dict:
    return {k: v for k, v in item.items() if k not in ("kind", "role")}


def _tool_name(tool: Any) -> str:
    if not isinstance(tool, dict):
        return ""
    function = tool.get("function")
    return str((function.get("name") if isinstance(function, dict) else None) or tool.get("name") or tool.get("type") or "")


def _recalled(message: dict) -> bool:
    content = message.get("content")
    if isinstance(content, list):
        content = next((p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"), "")
    return isinstance(content, str) and content.startswith(RECALLED_OPEN)


def _recalled_ids(message: dict) -> list[str]:
    """The event ids of the passages a recalled-history block carries (one JSON object a line)."""
    content = message.get("content")
    if isinstance(content, list):
        content = next((p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"), "")
    out = []
    for line in str(content).split("\n"):
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("event_id"), str):
                out.append(record["event_id"])
    return out


# -- the routes ---------------------------------------------------------------------------


def receipt_response(found: StoredReceipt | None, receipt_id: str) -> web.Response:
    if found is None:
        raise NotFound(f"No receipt '{receipt_id}'.", param="receipt_id")
    return web.Response(body=found.body, content_type="application/json", headers={"Cache-Control": "no-store"})


async def client_receipt(request: web.Request) -> web.Response:
    """``GET /v1/palimpsest/receipts/{id}``: the receipt, for the tenant whose request it is."""
    tenant = tenant_of(request)  # the tenant gate: 401 for a missing/unknown key where keys are required
    receipt_id = request.match_info["receipt_id"]
    found = request.app[RECEIPTS].receipt(receipt_id)
    if found is not None and found.tenant != tenant:
        found = None  # another tenant's receipt does not exist for this key
    return receipt_response(found, receipt_id)
