"""The provider's native compaction, emulated on any upstream from the gateway's own checkpoints.

Codex CLI (beta ``remote_compaction_v2``) ends an input with a ``compaction_trigger`` item and
expects exactly one ``compaction`` output item; other clients call ``POST
/v1/responses/compact`` and get the user messages plus one compaction item. Either way the
client then drops the history the item stands for and sends the item instead.

The gateway answers both itself, whatever the upstream: the item's ``encrypted_content`` is an
opaque reference (``pal2.<nonce + ciphertext>``), the session key and the newest event it
covers sealed with AES-GCM under a key derived from the store's secret (``ResponseIdStore.secret``:
every replica on one store shares it). It reveals neither the tenant nor the session, and a
changed byte makes it unreadable (then it is not this gateway's, and passes through). Items of
the earlier signed-only form (``pal1.``) are still read, never issued. When the item comes back
in ``input`` it is expanded, for the tenant that owns the session only, into what it stands for:
the summary block of the newest checkpoint on that path (the summary is written first if there
is none yet, within ``sync_budget_s``; else the exact values stand in) and the model-side
events after the checkpoint's boundary. The summary block joins the request's instructions (a
developer message after the client's own), never its history: the ledger keeps conversations,
not the gateway's blocks. Compaction items the provider made are opaque and pass through.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

import orjson
from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.responses import adapter as fmt
from gateway.responses.stream import encode
from policies import extract_exact_values, render_summary_block
from policies.conversation import wire_items, with_wire
from store import call as store_call
from store.canonical import is_instruction

PREFIX = "pal2."
SIGNED = "pal1."  # the earlier form: readable session key, signed only (still accepted)
_NONCE = 12


class Compactor:
    def __init__(self, *, ledger, checkpoints, summarizer, views, secret: bytes | None = None) -> None:
        self.ledger = ledger
        self.checkpoints = checkpoints
        self.summarizer = summarizer
        self.views = views
        self.secret = secret or secrets.token_bytes(32)
        self._aead = AESGCM(HKDF(hashes.SHA256(), 32, salt=None, info=b"palimpsest compaction item v2").derive(self.secret))

    # -- the reference -------------------------------------------------------------------------

    def _mac(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()[:32]

    def item_for(self, session_key: str, event_id: str) -> dict:
        nonce = secrets.token_bytes(_NONCE)
        sealed = self._aead.encrypt(nonce, orjson.dumps([session_key, event_id]), PREFIX.encode())
        return {"type": "compaction", "id": "cmp_" + secrets.token_hex(12),
                "encrypted_content": PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")}

    def reference(self, item: dict) -> tuple[str, str] | None:
        """(session key, event id) of a compaction item this gateway made, else None."""
        content = item.get("encrypted_content")
        if item.get("type") != "compaction" or not isinstance(content, str):
            return None
        if content.startswith(PREFIX):
            plain = self._open(content[len(PREFIX):])
        elif content.startswith(SIGNED):
            payload, _, mac = content[len(SIGNED):].rpartition(".")
            ok = bool(payload) and hmac.compare_digest(mac.encode(), self._mac(payload.encode()).encode())
            plain = _b64(payload) if ok else None
        else:
            return None
        try:
            key, event = orjson.loads(plain) if plain is not None else (None, None)
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return None
        return (key, event) if isinstance(key, str) and isinstance(event, str) else None

    def _open(self, text: str) -> bytes | None:
        raw = _b64(text)
        if raw is None or len(raw) <= _NONCE:
            return None
        try:
            return self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], PREFIX.encode())
        except InvalidTag:
            return None

    # -- a compaction item in the input --------------------------------------------------------

    def ours(self, chat) -> bool:
        # Only an assistant item with opaque parts can stand for a compaction item (the adapter
        # keeps every item it does not read there): the others' wire items are not looked at.
        return any(self.refs(m) for m in chat.history if m.get("opaque"))

    def refs(self, message: dict) -> list[tuple[str, str]]:
        return [r for item in wire_items(message, fmt.FORMAT) or () if (r := self.reference(item))]

    async def expand(self, chat, session_key: str) -> None:
        """Each of this gateway's compaction items in the history, for this session only, as the
        summary block (an instruction) and the model-side events it stands for. One of another
        session (or tenant) is refused: ``LookupError``."""
        out: list[dict] = []
        for message in chat.history:
            refs = self.refs(message)
            if not refs:
                out.append(message)
                continue
            key, event = refs[-1]
            if key != session_key:
                raise LookupError("compaction item of another session")
            blocks, tail = await self._stands_for(key, event)
            chat.instructions.extend(blocks)
            out.extend(tail)
        chat.history = out

    async def _stands_for(self, key: str, event: str) -> tuple[list[dict], list[dict]]:
        events = await store_call(self.ledger.path_to, key, event)
        positions = {e.id: i for i, e in enumerate(events)}
        found = await store_call(self.checkpoints.newest_on_path, key, positions)
        if found is not None:
            checkpoint, at = found
            block = render_summary_block(checkpoint.summary, checkpoint.state)
            tail = [e.message for e in events[at + 1:]]
        else:
            block = render_summary_block(None, extract_exact_values([e.message for e in events]))
            tail = [e.message for e in events]
        summary = with_wire({"role": "system", "content": block}, fmt.FORMAT,
                            [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": block}]}])
        # The client kept its user messages itself; the rest of the covered history comes back.
        # A summary block an earlier release kept in the ledger is an instruction, not history.
        kept = [m for m in tail if is_instruction(m)]
        return [*kept, summary], [m for m in tail if m.get("role") != "user" and not is_instruction(m)]

    # -- answering a trigger -------------------------------------------------------------------

    async def compact(self, chat, ref, policy, auth, budget: int) -> dict:
        """A compaction item covering the request's whole path (a summary written first when
        the path has none, within the policy's sync budget)."""
        if self.summarizer is not None and chat.ids:
            deadline = time.perf_counter() + policy.sync_budget_s
            await self.summarizer.sync(ref, chat, policy, auth, deadline=deadline, budget=budget)
        return self.item_for(ref.key, chat.ids[-1])

    async def answer_trigger(self, request: web.Request, chat, item: dict, headers: dict) -> web.StreamResponse:
        """Exactly one ``compaction`` output item, streamed or as JSON, as the client asked."""
        response = {"id": "resp_" + secrets.token_hex(12), "object": "response", "created_at": int(time.time()),
                    "status": "completed", "model": chat.model, "output": [item],
                    "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
                              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}}
        if not chat.stream:
            return web.json_response(response, headers=headers)
        stream = web.StreamResponse(status=200, headers={**headers, "Content-Type": "text/event-stream"})
        await stream.prepare(request)
        opening = {**response, "status": "in_progress", "output": []}
        events = [{"type": "response.created", "response": opening},
                  {"type": "response.in_progress", "response": opening},
                  {"type": "response.output_item.added", "output_index": 0, "item": item},
                  {"type": "response.output_item.done", "output_index": 0, "item": item},
                  {"type": "response.completed", "response": response}]
        await stream.write(b"".join(encode({**e, "sequence_number": n}) for n, e in enumerate(events)))
        await stream.write_eof()
        return stream

    @staticmethod
    def compacted(chat, item: dict) -> dict:
        """The ``/v1/responses/compact`` answer: the user messages as sent, then the item."""
        kept = [i for m in chat.history if m.get("role") == "user" for i in (wire_items(m, fmt.FORMAT) or ())]
        return {"id": "resp_" + secrets.token_hex(12), "object": "response.compaction", "created_at": int(time.time()),
                "output": [*kept, item],
                "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}}


def _b64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, UnicodeEncodeError):
        return None
