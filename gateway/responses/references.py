"""``item_reference`` items that name an item of an answer this gateway minted.

On a chat-only upstream (``[models."x"] api = "chat"``, ``responses/chat_upstream.py``) the gateway
writes the Responses answer itself: ``resp_<base>`` with items ``msg_<base>`` and ``fc_<base>_<n>``,
and records the response id for the tenant. A client that stores its responses (the Vercel AI
SDK's default, ``store: true``) resends an earlier answer as ``{"type": "item_reference", "id":
"msg_<base>"}``; no chat upstream can read that, so the assistant's words would be lost from every
later view. Such a reference, when ``resp_<base>`` is recorded for the request's tenant, is
replaced by the item the ledger holds. Any other reference (the provider's own ids, another
tenant's) is left for the upstream to resolve.
"""

from __future__ import annotations

import re

from gateway.responses import adapter as fmt
from policies.conversation import wire_items
from store import call as store_call

_MINTED = re.compile(r"(?:msg_([0-9a-f]{24})|fc_([0-9a-f]{24})_\d+)")


def _base(item: dict) -> str | None:
    if item.get("type") != "item_reference" or not isinstance(item.get("id"), str):
        return None
    match = _MINTED.fullmatch(item["id"])
    return (match.group(1) or match.group(2)) if match else None


def referenced(chat) -> bool:
    """Whether the history holds a reference in the gateway's minted form (only assistant items
    with opaque parts can: the adapter keeps the items it does not read there)."""
    return any(_base(item) for m in chat.history if m.get("opaque") for item in wire_items(m, fmt.FORMAT) or ())


async def expand(chat, tenant: str, response_ids, ledger) -> bool:
    """Each minted-form reference the tenant's recorded answers hold, as the item itself (the
    message it sits in parsed again); returns whether anything was replaced."""
    changed = False
    out: list[dict] = []
    for message in chat.history:
        items = wire_items(message, fmt.FORMAT) if message.get("opaque") else None
        if not items or not any(_base(item) for item in items):
            out.append(message)
            continue
        resolved = [await _resolve(item, tenant, response_ids, ledger) if _base(item) else item for item in items]
        if resolved == items:
            out.append(message)
            continue
        changed = True
        out.extend(fmt.to_neutral(resolved, hoist=False)[1])
    chat.history = out
    return changed


async def _resolve(item: dict, tenant: str, response_ids, ledger) -> dict:
    found = await store_call(response_ids.find, tenant, f"resp_{_base(item)}")
    if found is None or not found.event_id:
        return item
    events = await store_call(ledger.path_to, found.session_key, found.event_id)
    if not events:
        return item
    for recorded in wire_items(events[-1].message, fmt.FORMAT) or ():
        if recorded.get("id") == item["id"]:
            return recorded
    return item
