"""The Responses API's peer on the one request path (``gateway/pipeline/pipeline.py``).

What is the Responses API's own on ``POST /v1/responses``: parsing and rendering
(``responses/adapter.py``), reading a complete answer and a relayed stream (its terminal
event's response), the ``error`` event of a started stream, the cache fork of a view
(``responses/fork.py``), the request form kept for replay, the translation for a chat-only model
(``responses/chat_upstream.py``), and the response id remembered for its tenant once the answer
is recorded. Its answers for the recall loop are ``responses/recall.py``'s; what the request
names of the gateway's state (``previous_response_id``, compaction items) is ``routes.py``'s.
"""

from __future__ import annotations

from gateway.http.errors import GatewayError
from gateway.pipeline.adapter import FormatPeer, StreamWatch
from gateway.pipeline.turn import Turn
from gateway.responses import adapter as fmt
from gateway.responses.chat_upstream import ChatUpstream
from gateway.responses.fork import summary_fork
from gateway.responses.recall import ResponsesJsonTurn, ResponsesRecallStream
from gateway.responses.request_form import skeleton
from gateway.responses.stream import TERMINAL, answer_of, chat_usage, encode
from policies.conversation import wire_items
from store import call as store_call
from store.canonical import event_id
from store.interfaces import ResponseIdStore


class ResponsesWatch(StreamWatch):
    """A relayed Responses stream: its terminal event's response is the answer."""

    def feed(self, event: dict) -> None:
        if event.get("type") in TERMINAL and isinstance(event.get("response"), dict):
            self.final = event["response"]


class ResponsesPeer(FormatPeer):
    route = "responses"
    path = "/v1/responses"
    tool_keys = ("tools", "tool_choice", "parallel_tool_calls")
    through_chat = ChatUpstream  # a model configured with api = "chat"
    parse = staticmethod(fmt.parse_responses_request)
    render_body = staticmethod(fmt.render_body)
    request_form = staticmethod(skeleton)  # kept in the turn log for `palimpsest replay`
    watch = ResponsesWatch  # a new watch for each relayed stream
    json_turn, recall_stream = ResponsesJsonTurn, ResponsesRecallStream  # for the recall loop (recall.py)

    def __init__(self, *, response_ids: ResponseIdStore, metrics) -> None:
        self.response_ids = response_ids
        self.metrics = metrics

    def fork(self, turn: Turn, answer: dict):
        """The Responses body the upstream received, forked (gateway/responses/fork.py); none for
        a model the view went to as Chat Completions."""
        return None if turn.via_chat else summary_fork(self.sent(turn), answer, turn.view.upstream_tokens)

    def learn(self, turn: Turn, data: dict) -> None:
        turn.usage = chat_usage(data.get("usage"))
        answer = answer_of(data, turn.view.recall_names)
        if answer is not None:
            if isinstance(data.get("id"), str):
                answer["response_id"] = data["id"]
            turn.answer = answer

    def error_event(self, error: GatewayError) -> bytes:
        """An ``error`` event (the SDK raises it); no ``response.completed`` follows."""
        code = error.told_code if hasattr(error, "told_code") else error.code
        return encode({"type": "error", "code": code, "message": error.message, "param": error.param})

    async def recorded(self, turn: Turn, tenant: str | None) -> None:
        """The answer's response id remembered for its tenant. A response relayed without a
        session is remembered too (its tenant, no event), so that only that tenant may continue,
        read or delete it through the gateway."""
        response_id = (turn.answer or {}).get("response_id")
        if not response_id or turn.answer is None:
            return
        # Its output items' ids too: an item_reference to one is then known to be this tenant's.
        items = [i["id"] for i in wire_items(turn.answer, fmt.FORMAT) or () if isinstance(i.get("id"), str)]
        try:
            if turn.ref is not None:
                parent = turn.chat.ids[-1] if turn.chat.ids else None
                await store_call(self.response_ids.remember, turn.ref.tenant, response_id, turn.ref.key,
                                 turn.answer_id or event_id(parent, turn.answer), items)
            elif tenant:
                await store_call(self.response_ids.remember, tenant, response_id, "", "", items)
        except Exception:
            self.metrics.store_write_errors.labels("response_id").inc()
