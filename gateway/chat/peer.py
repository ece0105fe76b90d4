"""Chat Completions' peer on the one request path (``gateway/pipeline/pipeline.py``).

What is chat's own: parsing (``chat/adapter.py``), the body (without recall tools for ``n`` > 1:
the recall loop answers requests for one choice), reading a complete answer, the relayed
stream's watch and its error event, the cache fork of a view (``chat/fork.py``) and the request
form kept for replay; its answers for the recall loop are ``chat/recall.py``'s.
"""

from __future__ import annotations

from gateway.chat.request_form import skeleton
from gateway.chat.adapter import parse_chat_request
from gateway.chat.fork import summary_fork
from gateway.chat.recall import ChatJsonTurn, ChatRecallStream, body_without_recall, recall_body
from gateway.http.sse import StreamAssembler, error_event
from gateway.pipeline.adapter import FormatPeer, StreamWatch
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


class ChatPeer(FormatPeer):
    route = "chat"
    path = "/v1/chat/completions"
    parse = staticmethod(parse_chat_request)
    request_form = staticmethod(skeleton)  # kept in the turn log for `palimpsest replay`
    fork = staticmethod(summary_fork)  # gateway/chat/fork.py

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

    watch = ChatWatch  # a new watch for each relayed stream
    recall_body = staticmethod(recall_body)
    json_turn, recall_stream = ChatJsonTurn, ChatRecallStream  # for the recall loop (recall.py)
    error_event = staticmethod(error_event)


def _many_choices(body: dict) -> bool:
    n = body.get("n")
    return isinstance(n, int) and not isinstance(n, bool) and n > 1

