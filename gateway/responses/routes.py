"""The Responses API's own steps around the one request path (docs/architecture.md, "Wire formats").

``POST /v1/responses`` is the shared ``Pipeline``'s request (``gateway/pipeline/pipeline.py``,
with ``responses/peer.py``) once the request's claims on the gateway's state are settled, for its
own tenant only (``own_state``):

1. identify tenant and session (``X-Session-Id``, else Codex's ``session-id`` / ``thread-id``;
   a ``previous_response_id`` the gateway recorded names its own session),
2. rebuild a ``previous_response_id`` chain from the ledger, so the view can carry (and
   compact) the whole conversation; an id the gateway does not know passes through untouched,
3. expand this gateway's compaction items, and answer a ``compaction_trigger`` from the
   gateway's own checkpoint (``responses/compaction.py``); ``POST /v1/responses/compact`` the same way,
4. then the pipeline: the view, the ledger sync, the upstream, the answer recorded and its
   response id remembered.

``GET`` / ``DELETE /v1/responses/{id}`` read ids through ``owned`` (``responses/stored.py``).
"""

from __future__ import annotations

from aiohttp import web

from gateway.http.errors import BadRequest
from gateway.http.gate import tenant_of
from gateway.keys import REQUEST_ID, UPSTREAM_KEY
from gateway.pipeline.pipeline import Pipeline
from gateway.responses import references
from store import call as store_call
from store.canonical import path_ids
from store.interfaces import ResponseIdStore
from store.records import SessionRef


class ResponsesRoutes:
    def __init__(self, pipeline: Pipeline, *, response_ids: ResponseIdStore, compactor) -> None:
        self.pipeline = pipeline  # POST /v1/responses's steps, with the Responses peer
        self.response_ids = response_ids
        self.compactor = compactor  # gateway/responses/compaction.py
        self.references = references.ItemReferences(pipeline.ledger)  # item_reference read-back

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses``."""
        pipeline = self.pipeline
        timing, tenant, chat, ids = await pipeline.start(request)
        bypass = pipeline.bypass(request, tenant)
        ref, ids, rewritten = await self.own_state(request, chat, tenant, ids, bypass=bool(bypass))
        await pipeline.admit(request, chat, ids, ref)
        if chat.compact and ref is not None and ids and not bypass:
            await pipeline.sync(request, chat, ids, ref)
            item = await self._compact(chat, ref, pipeline.auth(request))
            return await self.compactor.answer_trigger(request, chat, item, {"x-request-id": request.get(REQUEST_ID, "")})
        return await pipeline.proceed(request, timing, chat, ids, ref, bypass, rewritten=rewritten)

    async def own_state(self, request: web.Request, chat, tenant: str, ids: list[str], *,
                        bypass: bool = False) -> tuple[SessionRef | None, list[str], bool]:
        """What of the gateway's state the request names, for its own tenant only: the one
        ownership check ``POST /v1/responses`` and ``/v1/responses/compact`` share. A
        ``previous_response_id`` the gateway recorded is rebuilt from the ledger (another tenant's
        is refused as unknown), and this gateway's compaction items are expanded (another
        session's or tenant's is refused). Returns (session, path ids, whether the history is no
        longer the client's input as it came)."""
        ref, prefix = await self._continued(request, chat, tenant)
        if prefix:
            chat.history = [*prefix, *chat.history]
            ids = path_ids(chat.history)
        if ref is None:
            ref = self.pipeline.identity.session(request, tenant, ids[0] if ids else None)
        # References to items of answers the gateway recorded, read back from the session's ledger;
        # the ones left must be the tenant's own. One walk of the history when there are none.
        left = references.unresolved(chat)
        expanded = bool(left) and ref is not None and await self.references.expand(chat, ref.key, ids)
        if expanded:
            ids = path_ids(chat.history)
            left = references.unresolved(chat)
        await self._references_owned(request, chat, tenant, left)
        # The history is not the client's input as it came: always rendered (a bypassed request
        # goes as it came, previous_response_id and all: the provider holds that chain too).
        rewritten = bool(prefix or expanded) and not bypass
        if self.compactor.ours(chat):  # a gateway compaction item is unreadable upstream, bypass or not
            rewritten = True
            ref = ref or await self._compacted_session(chat, tenant)
            try:
                await self.compactor.expand(chat, ref.key if ref is not None else "")
            except LookupError:
                raise BadRequest("The compaction item in 'input' was not made for this conversation.", param="input") from None
            ids = path_ids(chat.history)
        return ref, ids, rewritten

    async def _continued(self, request: web.Request, chat, tenant: str) -> tuple[SessionRef | None, list[dict]]:
        """A ``previous_response_id`` the gateway recorded for this tenant: its session and the
        chain before it (from the ledger). Ids are looked up per tenant: one recorded only for
        another tenant is refused as not found, and so is any unknown one on the operator's key;
        an unknown one on the client's own provider account is the provider's to answer."""
        previous = chat.body.get("previous_response_id")
        if not isinstance(previous, str) or not previous:
            return None, []
        found = await store_call(self.response_ids.find, tenant, previous)
        ledger = self.pipeline.ledger
        if found is None:
            # On the operator's account every tenant's stored responses meet: only ids the
            # gateway knows to be this tenant's may be continued there.
            if (self.pipeline.upstream.for_model(chat.model).uses_operator_key(request.get(UPSTREAM_KEY, ""))
                    or await store_call(self.response_ids.taken, previous)):
                raise BadRequest(f"Previous response with id '{previous}' not found.", param="previous_response_id",
                                 code="previous_response_not_found")
            return None, []  # the client's own provider account: the provider decides
        if not found.event_id:
            return None, []  # relayed without a session: the provider holds the chain
        events = await store_call(ledger.path_to, found.session_key, found.event_id)
        if not events:
            return None, []
        record = await store_call(ledger.session, found.session_key)
        if record is None:
            return None, []
        return SessionRef(record.tenant, record.session_id), [e.message for e in events]

    async def _references_owned(self, request: web.Request, chat, tenant: str, left: list[str]) -> None:
        """An ``item_reference`` left for the upstream to resolve must name the tenant's own item:
        one recorded for another tenant is refused as not found, and so is any unknown one on the
        operator's key, where every tenant's stored items meet (as ``previous_response_id``). A
        model reached through Chat Completions never sees a reference (it is dropped). `left`: the
        ids of the references still in the history."""
        if not left or self.pipeline.via_chat(chat.model):
            return
        owners = await store_call(self.response_ids.item_owners, left)
        operator = self.pipeline.upstream.for_model(chat.model).uses_operator_key(request.get(UPSTREAM_KEY, ""))
        for item_id in left:
            recorded_for = owners.get(item_id, frozenset())
            if tenant not in recorded_for and (operator or recorded_for):
                raise BadRequest(f"Item with id '{item_id}' not found.", param="input")

    async def _compacted_session(self, chat, tenant: str) -> SessionRef | None:
        """The session a compaction item of this gateway names, when the request names none
        and the item is the tenant's own."""
        for message in chat.history:
            for key, _ in self.compactor.refs(message):
                record = await store_call(self.pipeline.ledger.session, key)
                if record is not None and record.tenant == tenant:
                    return SessionRef(record.tenant, record.session_id)
        return None

    async def _compact(self, chat, ref: SessionRef, auth) -> dict:
        views = self.pipeline.views
        policy = views.policy_for(chat.model, ref)
        window = await views.windows.window(chat.model, auth)
        budget = max(1, window - chat.max_output_tokens - policy.reserve_tokens)
        self.pipeline.metrics.summary_enqueued.labels("client").inc()
        return await self.compactor.compact(chat, ref, policy, auth, budget)

    async def compact(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses/compact``: answered from the gateway's checkpoint for a request
        with a session (or a ``previous_response_id`` the gateway recorded for this tenant);
        otherwise by the provider's own endpoint (it stores nothing). Another tenant's response
        id or compaction item is refused before anything is sent or stored, as on
        ``/v1/responses``."""
        pipeline = self.pipeline
        timing, tenant, chat, ids = await pipeline.start(request)
        ref, ids, _ = await self.own_state(request, chat, tenant, ids)
        if ref is None or not ids:  # the provider's own endpoint, by the same relay as every request
            return await pipeline.forward(request, timing, chat, pipeline.peer.path + "/compact")
        await pipeline.admit(request, chat, ids, ref)
        await pipeline.sync(request, chat, ids, ref)
        item = await self._compact(chat, ref, pipeline.auth(request))
        return web.json_response(self.compactor.compacted(chat, item), headers={"x-request-id": request.get(REQUEST_ID, "")})

    async def owned(self, request: web.Request, response_id: str):
        """The recorded response `response_id` of the request's tenant, or None when the gateway
        recorded none for this tenant (another tenant's id included: it is looked up per tenant)."""
        return await store_call(self.response_ids.find, tenant_of(request), response_id)
