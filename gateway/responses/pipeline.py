"""POST /v1/responses: the per-request pipeline for the OpenAI Responses API.

The same steps as chat completions (docs/architecture.md, "A request's path"), on the neutral
model the Responses adapter parses (``gateway/responses/adapter.py``):

1. identify tenant and session (``X-Session-Id``, else Codex's ``session-id`` / ``thread-id``;
   a ``previous_response_id`` the gateway recorded names its own session),
2. rebuild a ``previous_response_id`` chain from the ledger, so the view can carry (and
   compact) the whole conversation; an id the gateway does not know passes through untouched,
3. sync the input into the ledger (durable before the upstream call),
4. build the view (shared ``ViewBuilder``: projection, compaction, recall tools, tailoring),
5. forward (the client's bytes when the view is unchanged); resolve recall calls in the loop,
6. record the answer (the output items the client saw) and remember the response id.

The shared steps are ``WirePipeline``'s (``gateway/pipeline/pipeline.py``). A
``compaction_trigger`` and ``POST /v1/responses/compact`` are answered from the gateway's own
checkpoint (``gateway/responses/compaction.py``).
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.pipeline.turn import Turn
from gateway.responses import adapter as fmt
from gateway.pipeline.pipeline import StreamWatch, WirePipeline
from gateway.pipeline.views import View
from gateway.http.errors import BadRequest, GatewayError
from gateway.http.gate import tenant_of
from gateway.http.upstream import response_headers
from gateway.keys import REQUEST_ID, UPSTREAM_KEY
from gateway.responses.chat_upstream import ChatUpstream
from gateway.responses.fork import summary_fork as responses_fork
from gateway.responses.recall import RECALL
from gateway.responses.stream import TERMINAL, answer_of, chat_usage, encode
from store import call as store_call
from gateway.pipeline.history_ids import history_ids
from store.canonical import event_id, path_ids
from store.records import SessionRef
from store.interfaces import ResponseIdStore

ROUTE = "responses"
PATH = "/v1/responses"


def parse_and_hash(raw: bytes):
    chat = fmt.parse_responses_request(raw)
    return chat, history_ids(chat.history, len(raw))


class ResponsesWatch(StreamWatch):
    """A relayed Responses stream: its terminal event's response is the answer."""

    def feed(self, event: dict) -> None:
        if event.get("type") in TERMINAL and isinstance(event.get("response"), dict):
            self.final = event["response"]


class ResponsesPipeline(WirePipeline):
    route = ROUTE
    path = PATH
    through_chat = ChatUpstream  # a model configured with api = "chat"
    recall_format = RECALL

    def __init__(self, *, response_ids: ResponseIdStore, compactor, **parts) -> None:
        super().__init__(**parts)
        self.response_ids = response_ids
        self.compactor = compactor  # gateway/responses/compaction.py

    def parse_and_hash(self, raw: bytes):
        return parse_and_hash(raw)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        timing, tenant, chat, ids = await self.start(request)
        bypass = self.bypass(request, tenant)
        ref, ids, rewritten = await self.own_state(request, chat, tenant, ids, bypass=bool(bypass))
        await self.admit(request, chat, ids, ref)
        auth = self.auth(request)
        if chat.compact and ref is not None and ids and not bypass:
            await self.sync(request, chat, ids, ref)
            item = await self._compact(chat, ref, auth)
            return await self.compactor.answer_trigger(request, chat, item, {"x-request-id": request.get(REQUEST_ID, "")})
        view = View() if bypass else await self.view(chat, ref, auth)
        if rewritten and view.messages is None:
            view.messages = [*chat.instructions, *chat.history]
        await self.sync(request, chat, ids, ref)
        return await self.serve(request, self.turn(request, chat, ref, timing, view, auth, bypass))

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
            ref = self.identity.session(request, tenant, ids[0] if ids else None)
        # The history is not the client's input as it came: always rendered (a bypassed request
        # goes as it came, previous_response_id and all: the provider holds that chain too).
        rewritten = bool(prefix) and not bypass
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
        if found is None:
            # On the operator's account every tenant's stored responses meet: only ids the
            # gateway knows to be this tenant's may be continued there.
            if (self.upstream.for_model(chat.model).uses_operator_key(request.get(UPSTREAM_KEY, ""))
                    or await store_call(self.response_ids.taken, previous)):
                raise self._not_found(previous)
            return None, []  # the client's own provider account: the provider decides
        if not found.event_id:
            return None, []  # relayed without a session: the provider holds the chain
        events = await store_call(self.ledger.path_to, found.session_key, found.event_id)
        if not events:
            return None, []
        record = await store_call(self.ledger.session, found.session_key)
        if record is None:
            return None, []
        return SessionRef(record.tenant, record.session_id), [e.message for e in events]

    @staticmethod
    def _not_found(response_id: str) -> BadRequest:
        return BadRequest(f"Previous response with id '{response_id}' not found.", param="previous_response_id",
                          code="previous_response_not_found")

    async def _compacted_session(self, chat, tenant: str) -> SessionRef | None:
        """The session a compaction item of this gateway names, when the request names none
        and the item is the tenant's own."""
        for message in chat.history:
            for key, _ in self.compactor.refs(message):
                record = await store_call(self.ledger.session, key)
                if record is not None and record.tenant == tenant:
                    return SessionRef(record.tenant, record.session_id)
        return None

    async def _compact(self, chat, ref: SessionRef, auth) -> dict:
        policy = self.views.policy_for(chat.model, ref)
        window = await self.views.windows.window(chat.model, auth)
        budget = max(1, window - chat.max_output_tokens - policy.reserve_tokens)
        self.metrics.summary_enqueued.labels("client").inc()
        return await self.compactor.compact(chat, ref, policy, auth, budget)

    async def compact_route(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses/compact``: answered from the gateway's checkpoint for a request
        with a session (or a ``previous_response_id`` the gateway recorded for this tenant);
        otherwise by the provider's own endpoint (it stores nothing). Another tenant's response
        id or compaction item is refused before anything is sent or stored, as on
        ``/v1/responses``."""
        _, tenant, chat, ids = await self.start(request)
        ref, ids, _ = await self.own_state(request, chat, tenant, ids)
        if ref is None or not ids:
            upstream = self.upstream.for_model(chat.model)
            async with upstream.post(PATH + "/compact", request.headers, chat.raw, drop=self._drop,
                                     tenant_key=request.get(UPSTREAM_KEY, "")) as up:
                payload = await upstream.reader(up).read()
                return web.Response(status=up.status, reason=up.reason, body=payload,
                                    headers=response_headers(up.headers, decoded=True))
        await self.admit(request, chat, ids, ref)
        await self.sync(request, chat, ids, ref)
        item = await self._compact(chat, ref, self.auth(request))
        return web.json_response(self.compactor.compacted(chat, item), headers={"x-request-id": request.get(REQUEST_ID, "")})

    # -- forwarding --------------------------------------------------------------------------

    def render(self, turn: Turn) -> bytes:
        return orjson.dumps(fmt.render_body(turn.chat, turn.view.messages, turn.view.tools))

    def forker(self, request: web.Request):
        return self.summary_fork

    def summary_fork(self, turn: Turn, answer: dict):
        """The Responses body the upstream received, forked (gateway/responses/fork.py); none for
        a model the view went to as Chat Completions."""
        if self.transport(turn.chat.model) is not self.upstream.for_model(turn.chat.model):
            return None
        view = turn.view
        tools = turn.chat.body.get("tools") if turn.recall_refused else view.tools
        parent = turn.chat.body if view.messages is None else fmt.render_body(turn.chat, view.messages, tools)
        return responses_fork(parent, answer, view.upstream_tokens)

    def watch(self) -> StreamWatch:
        return ResponsesWatch()

    async def end_stream(self, response: web.StreamResponse, error: GatewayError) -> None:
        await end_stream_with_error(response, error)

    def learn(self, turn: Turn, data: dict) -> None:
        turn.usage = chat_usage(data.get("usage"))
        answer = answer_of(data, turn.view.recall_names)
        if answer is not None:
            if isinstance(data.get("id"), str):
                answer["response_id"] = data["id"]
            turn.answer = answer

    async def record(self, turn: Turn, tenant: str | None = None) -> None:
        """The answer into the ledger, and its response id remembered for its tenant. A response
        relayed without a session is remembered too (its tenant, no event), so that only that
        tenant may continue, read or delete it through the gateway."""
        response_id = (turn.answer or {}).get("response_id")
        await self.recorder.answer(turn)
        if not response_id or turn.answer is None:
            return
        try:
            if turn.ref is not None:
                parent = turn.chat.ids[-1] if turn.chat.ids else None
                await store_call(self.response_ids.remember, turn.ref.tenant, response_id, turn.ref.key,
                                 event_id(parent, turn.answer))
            elif tenant:
                await store_call(self.response_ids.remember, tenant, response_id, "", "")
        except Exception:
            self.metrics.store_write_errors.labels("response_id").inc()

    # -- GET / DELETE /v1/responses/{id} -----------------------------------------------------

    async def owned(self, request: web.Request, response_id: str):
        """The recorded response `response_id` of the request's tenant, or None when the gateway
        recorded none for this tenant (another tenant's id included: it is looked up per tenant)."""
        return await store_call(self.response_ids.find, tenant_of(request), response_id)


async def end_stream_with_error(response: web.StreamResponse, error: GatewayError) -> None:
    """A started Responses stream ends with an ``error`` event (the SDK raises it) and the
    connection closes: no ``response.completed`` follows, so the client never takes it for one."""
    import contextlib

    response.force_close()
    code = error.told_code if hasattr(error, "told_code") else error.code
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write(encode({"type": "error", "code": code, "message": error.message, "param": error.param}))
        await response.write_eof()
