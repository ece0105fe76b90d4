"""``item_reference`` items that name an item of an answer this gateway recorded.

A client that stores its responses (the Vercel AI SDK's default, ``store: true``) resends an
earlier answer as ``{"type": "item_reference", "id": "msg_..."}`` (a reasoning item the same way).
The gateway recorded that answer as the child of the request's last message, with its items, so
the reference right after that message is replaced by the item the ledger holds: the view then
carries (and counts, and compacts) the words the upstream would read, a chat-only upstream
(``[models."x"] api = "chat"``), which cannot resolve a reference, gets them at all, and the
ledger path goes through the recorded answer instead of branching on a reference event. A
reference the session's ledger does not hold there (the provider's own, from before the gateway)
is left for the upstream to resolve.
"""

from __future__ import annotations

from gateway.responses import adapter as fmt
from policies.conversation import wire_items
from store import call as store_call
from store.canonical import event_id


def _refs(message: dict) -> set[str]:
    if not message.get("opaque"):  # the adapter keeps the items it does not read there
        return set()
    return {item["id"] for item in wire_items(message, fmt.FORMAT) or ()
            if item.get("type") == "item_reference" and isinstance(item.get("id"), str)}


def referenced(chat) -> bool:
    return any(_refs(m) for m in chat.history)


async def expand(chat, session_key: str, ids: list[str], ledger) -> bool:
    """Each reference to an item of the answer recorded after the message before it, as that
    item (its message parsed again); returns whether anything was replaced. `ids`: the
    history's path ids as it came."""
    out: list[dict] = []
    parent: str | None = None
    changed = False
    for i, message in enumerate(chat.history):
        wanted = _refs(message)
        recorded = await _recorded(ledger, session_key, parent, wanted) if wanted else {}
        if not recorded:
            out.append(message)
            parent = event_id(parent, message) if changed else ids[i]
            continue
        items = [recorded.get(item.get("id"), item) if item.get("type") == "item_reference" else item
                 for item in wire_items(message, fmt.FORMAT)]
        for rebuilt in fmt.to_neutral(items, hoist=False)[1]:
            out.append(rebuilt)
            parent = event_id(parent, rebuilt)
        changed = True
    if changed:
        chat.history = out
    return changed


async def _recorded(ledger, session_key: str, parent: str | None, wanted: set[str]) -> dict[str, dict]:
    """The items named in `wanted` among the answers the ledger holds after `parent`."""
    children = await store_call(ledger.children, session_key, parent)
    if not children:
        return {}
    found: dict[str, dict] = {}
    for event in await store_call(ledger.get_many, session_key, children):
        for item in wire_items(event.message, fmt.FORMAT) or ():
            if isinstance(item.get("id"), str) and item["id"] in wanted and item.get("type") != "item_reference":
                found[item["id"]] = item
    return found
