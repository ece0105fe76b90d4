"""POST /v1/chat/completions: the per-request pipeline (docs/architecture.md, "A request's path").

1. parse and validate; identify tenant and session,
2. build the view the upstream receives (projection, compaction, recall tools, tailoring): a
   request refused here (400 context_length_exceeded, a storage quota) leaves nothing stored,
3. sync the messages into the ledger (durable before the upstream call; a big sync in a worker
   thread, so the event loop keeps serving),
6. forward; resolve recall calls (``RecallLoop``); stream the answer to the client as it comes,
7. record the answer, update metrics, let the summariser know (``TurnRecorder``).

When the view equals what the client sent, the client's body bytes are forwarded unchanged.
Big bodies are parsed, hashed and projected off the event loop (``gateway.pipeline.offload``).
A failure after the client's stream started ends that stream with an error event; the answer
is then incomplete and is not recorded. The steps are the shared ``WirePipeline``'s
(``gateway/pipeline/pipeline.py``); this is Chat Completions' adapter to it: parsing, the body
(without recall tools for ``n`` > 1), reading an answer, the stream watch and the error event.
"""

from __future__ import annotations

from aiohttp import web

from gateway.chat.request_form import skeleton
from gateway.chat.adapter import parse_and_hash
from gateway.chat.fork import summary_fork
from gateway.chat.recall import RECALL, body_without_recall
from gateway.http.errors import GatewayError
from gateway.http.sse import StreamAssembler, end_with_error
from gateway.keys import PIPELINE
from gateway.pipeline.pipeline import StreamWatch, WirePipeline
from gateway.pipeline.turn import Turn, clean_usage


class ChatWatch(StreamWatch):
    """A relayed chat completion stream: the message rebuilt from its chunks, complete once a
    choice names its finish_reason or the stream says ``[DONE]``."""

    def __init__(self) -> None:
        self.assembler = StreamAssembler()

    def feed(self, event: dict) -> None:
        try:
            self.assembler.add(event)
        except (AttributeError, TypeError):  # a chunk of an unexpected shape is the client's to read
            pass

    def done(self) -> None:
        self.assembler.done = True

    @property
    def final(self) -> dict | None:
        assembler = self.assembler
        if assembler.finish_reason is None and not assembler.done:
            return None
        message = assembler.message()
        # [DONE] without a finish_reason (some servers never name one) still ends a complete
        # answer; an empty one is not worth an event.
        if assembler.finish_reason is None and not message.get("content") and len(message) <= 2:
            return {"choices": []}
        return {"choices": [{"message": message, "finish_reason": assembler.finish_reason or "stop"}],
                "usage": assembler.usage}


class ChatPipeline(WirePipeline):
    route = "chat"
    path = "/v1/chat/completions"
    recall_format = RECALL
    request_form = staticmethod(skeleton)  # kept in the turn log for `palimpsest replay`

    def parse_and_hash(self, raw: bytes):
        return parse_and_hash(raw)

    def recalls(self, turn: Turn) -> bool:
        # n > 1: the recall loop would have to resolve each choice's calls apart; the view
        # goes without recall tools instead, and the choices stay the model's own.
        return super().recalls(turn) and not _many_choices(turn.chat.body)

    def body(self, turn: Turn) -> bytes:
        if turn.view.recall_names is not None:
            return body_without_recall(turn, list(turn.view.messages or ()))
        return turn.view.body(turn.chat)

    def learn(self, turn: Turn, data: dict) -> None:
        """The answer of a complete completion (choice 0), and its usage."""
        try:
            choice = data["choices"][0]
            turn.usage = clean_usage(data.get("usage"))
        except (KeyError, IndexError, TypeError):
            return
        if isinstance(choice, dict) and choice.get("finish_reason") and isinstance(choice.get("message"), dict):
            turn.answer = choice["message"]

    def watch(self) -> StreamWatch:
        return ChatWatch()

    def forker(self, request: web.Request):
        return summary_fork  # gateway/chat/fork.py

    async def end_stream(self, response: web.StreamResponse, error: GatewayError) -> None:
        await end_with_error(response, error)


def _many_choices(body: dict) -> bool:
    n = body.get("n")
    return isinstance(n, int) and not isinstance(n, bool) and n > 1


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await request.app[PIPELINE].handle(request)
