"""Anthropic Messages for the recall loop (``gateway/pipeline/recall_loop.py``).

When an answer calls only recall tools (``stop_reason: tool_use``), the loop runs them and
appends the assistant message as it came (thinking blocks with their signatures included, so
they stay bound to their calls) and a user message of ``tool_result`` blocks. The client sees
one message: recall ``tool_use`` blocks never reach it, in JSON or in the stream
(``gateway/pipeline/stream_filter.py`` renumbers the block indices), the first call's id names the message
and usage is summed. An answer that mixes client calls with recall calls goes to the client
without the recall calls.
"""

from __future__ import annotations

from gateway.messages import adapter as fmt
from gateway.messages.stream import (MessageAssembler, MessagesEvents, add_usage, answer_of, chat_usage, is_recall_block,
                                     visible_blocks)
from gateway.pipeline.adapter import Reply
from gateway.pipeline.stream_filter import StreamFilter
from gateway.pipeline.turn import Turn
from policies.messages import tool_calls


def _reply(blocks: list, names: tuple[str, str], usage, complete: bool) -> Reply:
    blocks = [b for b in blocks if isinstance(b, dict)]
    assistant = fmt.assistant_item(blocks)
    client = any(b.get("type") == "tool_use" and not is_recall_block(b, names) for b in blocks)
    recall = [c for c in tool_calls(assistant) if c["function"]["name"] in names]
    return Reply(recall=recall, client=client, complete=complete, assistant=assistant, usage=chat_usage(usage))


class MessagesJsonTurn:
    def __init__(self, turn: Turn) -> None:
        self.names = turn.view.recall_names
        self.usage: dict | None = None
        self.first_id = None
        self.shown: list[dict] = []  # what recall rounds said that the client still sees (their text)

    def read(self, data: dict) -> Reply | None:
        if not isinstance(data.get("content"), list):
            return None
        self.first_id = self.first_id or data.get("id")
        self.usage = add_usage(self.usage, data.get("usage"))
        self._content = data["content"]
        return _reply(data["content"], self.names, data.get("usage"), data.get("stop_reason") == "tool_use")

    def recalled(self, reply: Reply) -> None:
        self.shown += visible_blocks(self._content, self.names)

    def final(self, data: dict) -> tuple[dict, dict | None, dict | None]:
        data["content"] = self.shown + visible_blocks(data["content"], self.names)
        if data.get("stop_reason") == "tool_use" and not any(b.get("type") == "tool_use" for b in data["content"]):
            data["stop_reason"] = "end_turn"
        if self.first_id:
            data["id"] = self.first_id
        if self.usage is not None:
            data["usage"] = {**(data.get("usage") or {}), **self.usage}
        return data, answer_of(data), chat_usage(self.usage)


class MessagesRecallStream:
    """The Messages streams of one turn as one (the shared ``StreamFilter`` over
    ``MessagesEvents``); each round's message rebuilt on the side (``MessageAssembler``)."""

    def __init__(self, turn: Turn) -> None:
        self.names = turn.view.recall_names
        self.events = MessagesEvents(self.names)
        self.filter = StreamFilter(self.events, add_usage)
        self.round = MessageAssembler()

    def feed(self, event: dict) -> bytes:
        self.round.add(event)
        return self.filter.feed(event)

    def done(self) -> None:
        pass

    def round_end(self) -> Reply | None:
        if not self.round.stopped:
            return None
        return _reply(self.round.content(), self.names, self.round.usage, self.round.stop_reason == "tool_use")

    def end_round(self, *, final: bool) -> bytes:
        return self.filter.end_round(self.round.usage, self.round.blocks, final=final)

    def new_round(self) -> None:
        self.round = MessageAssembler()
        self.filter.new_round()

    def finish(self) -> bytes:
        return self.filter.finish(self.events.closing(self.round, self.filter.visible, self.filter.usage))

    def answer(self) -> dict | None:
        return answer_of({"content": self.filter.visible, "stop_reason": self.round.stop_reason})

    def usage(self) -> dict | None:
        return chat_usage(self.filter.usage)
