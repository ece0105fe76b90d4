"""``item_reference`` items that name an item of an answer this gateway recorded.

A client that stores its responses (the Vercel AI SDK's default, ``store: true``) resends an
earlier answer as ``{"type": "item_reference", "id": "msg_..."}`` (a reasoning item the same way).
The gateway recorded that answer as the child of the request's last message, with its items, so
the reference right after that message is replaced by the item the ledger holds: the view then
carries (and counts, and compacts) the words the upstream would read, a chat-only upstream
(``[models."x"] api = "chat"``), which cannot resolve a reference, gets them at all, and the
ledger path goes through the recorded answer instead of branching on a reference event. A
reference the session's ledger does not hold there (the provider's own, from before the gateway)
is left for the upstream to resolve, if it is the tenant's to read (``routes.py``: one recorded
for another tenant, or any unknown one on the operator's key, is refused as not found).

Such a client resends every earlier answer by reference on every request, so what was read back
is remembered (``ItemReferences``, per process, within 32 MB): an answer recorded under a message
never changes, and a later request finds it with one existence check per request (an index
look-up in the store, never a process-local cache: another process may have deleted the
session) instead of two ledger reads per reference.
"""

from __future__ import annotations

from collections import OrderedDict

import orjson

from gateway.responses import adapter as fmt
from policies.conversation import wire_items
from store import call as store_call
from store.canonical import event_id

MEMO_BYTES = 32 << 20  # (session, parent event, item id) -> item, bounded by the items' JSON size


def _refs(message: dict) -> set[str]:
    if not message.get("opaque"):  # the adapter keeps the items it does not read there
        return set()
    return {item["id"] for item in wire_items(message, fmt.FORMAT) or ()
            if item.get("type") == "item_reference" and isinstance(item.get("id"), str)}


def unresolved(chat) -> list[str]:
    """The ids of the references still in the history (left for the upstream to resolve)."""
    return [ref for m in chat.history for ref in _refs(m)]


class ItemReferences:
    def __init__(self, ledger, max_bytes: int = MEMO_BYTES) -> None:
        self.ledger = ledger
        self.max_bytes = max_bytes
        self._memo: OrderedDict[tuple[str, str | None, str], dict] = OrderedDict()
        self._sizes: dict[tuple[str, str | None, str], int] = {}
        self._bytes = 0

    async def expand(self, chat, session_key: str, ids: list[str]) -> bool:
        """Each reference to an item of the answer recorded after the message before it, as that
        item (its message parsed again); returns whether anything was replaced. `ids`: the
        history's path ids as it came."""
        out, remembered = await self._expanded(chat.history, session_key, ids, memo=True)
        # What was remembered counts only while the ledger still holds the session (a deleted
        # session's answers are not read back from memory): one existence check of a message
        # an item was recorded under, not one per reference, in the store itself (a session
        # `palimpsest delete` removed from another process is still in this process's cache).
        if remembered is not None and not await store_call(self.ledger.holds, session_key, remembered, cached=False):
            for key in [k for k in self._memo if k[0] == session_key]:
                self._forget(key)
            out, _ = await self._expanded(chat.history, session_key, ids, memo=False)
        if out is None:
            return False
        chat.history = out
        return True

    async def _expanded(self, history: list[dict], session_key: str, ids: list[str], *,
                        memo: bool) -> tuple[list[dict] | None, str | None]:
        """(the history with its references read back, or None when none was; a message an item
        came from memory under, or None)."""
        out: list[dict] = []
        parent: str | None = None
        changed = False
        remembered: str | None = None
        for i, message in enumerate(history):
            wanted = _refs(message)
            recorded: dict[str, dict] = {}
            if wanted and parent is not None:  # a reference first in the input follows nothing recorded
                recorded = self._remembered(session_key, parent, wanted) if memo else {}
                if recorded:
                    remembered = remembered or parent
                else:
                    recorded = await self._read(session_key, parent, wanted)
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
        return (out if changed else None), remembered

    def _remembered(self, session_key: str, parent: str, wanted: set[str]) -> dict[str, dict]:
        found = {ref: item for ref in wanted if (item := self._memo.get((session_key, parent, ref))) is not None}
        if len(found) < len(wanted):
            return {}
        for ref in wanted:
            self._memo.move_to_end((session_key, parent, ref))
        return found

    async def _read(self, session_key: str, parent: str, wanted: set[str]) -> dict[str, dict]:
        """The items named in `wanted` among the answers the ledger holds after `parent`."""
        found: dict[str, dict] = {}
        children = await store_call(self.ledger.children, session_key, parent)
        if not children:
            return found
        for event in await store_call(self.ledger.get_many, session_key, children):
            for item in wire_items(event.message, fmt.FORMAT) or ():
                if isinstance(item.get("id"), str) and item["id"] in wanted and item.get("type") != "item_reference":
                    found[item["id"]] = item
                    self._remember((session_key, parent, item["id"]), item)
        return found

    def _remember(self, key: tuple[str, str | None, str], item: dict) -> None:
        size = len(orjson.dumps(item))
        if size > self.max_bytes // 16:
            return  # one huge item would evict everything else: read it from the ledger each time
        self._forget(key)
        self._memo[key], self._sizes[key] = item, size
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._forget(next(iter(self._memo)))

    def _forget(self, key: tuple[str, str | None, str]) -> None:
        if key in self._memo:
            del self._memo[key]
            self._bytes -= self._sizes.pop(key)
