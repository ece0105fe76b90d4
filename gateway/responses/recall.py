"""The Responses API for the recall loop (``gateway/pipeline/recall_loop.py``).

When a response's output calls only recall tools, the loop runs them and appends the output
items (reasoning included, so it stays bound to its calls) and ``function_call_output`` items.
The client sees one response: recall calls never reach it, in JSON or in the stream
(``gateway/pipeline/stream_filter.py`` renumbers ``output_index`` and ``sequence_number``), usage is summed,
the first call's id names the response and the response echoes the client's own tools. A
response that mixes client calls with recall calls goes to the client without the recall calls.
"""

from __future__ import annotations

from gateway.pipeline.adapter import Reply
from gateway.pipeline.stream_filter import StreamFilter
from gateway.pipeline.turn import Turn
from gateway.responses import adapter as fmt
from gateway.responses.stream import (ResponsesEvents, add_usage, answer_of, as_sent, chat_usage, is_recall_item,
                                      visible_output)
from policies.messages import tool_calls


def _reply(output: list, names: tuple[str, str], usage, complete: bool) -> Reply:
    items = [i for i in output if isinstance(i, dict)]
    assistant = fmt.assistant_item(items)
    client = any(fmt.is_call(i) and not is_recall_item(i, names) for i in items)
    recall = [c for c in tool_calls(assistant) if c["function"]["name"] in names]
    return Reply(recall=recall, client=client, complete=complete, assistant=assistant, usage=chat_usage(usage))


class ResponsesJsonTurn:
    def __init__(self, turn: Turn) -> None:
        self.names = turn.view.recall_names
        self.client_tools = turn.chat.body.get("tools")
        self.usage: dict | None = None
        self.first_id = None
        self.shown: list[dict] = []  # what recall rounds said that the client still sees (their messages)

    def read(self, data: dict) -> Reply | None:
        if not isinstance(data.get("output"), list):
            return None
        self.first_id = self.first_id or data.get("id")
        self.usage = add_usage(self.usage, data.get("usage"))
        self._output = data["output"]
        return _reply(data["output"], self.names, data.get("usage"), data.get("status", "completed") == "completed")

    def recalled(self, reply: Reply) -> None:
        # A recall round's messages: the client sees them, as a stream shows them.
        self.shown += [i for i in visible_output(self._output, self.names) if i.get("type") == "message"]

    def final(self, data: dict) -> tuple[dict, dict | None, dict | None]:
        data["output"] = self.shown + visible_output(data["output"], self.names)
        data = as_sent(data, self.client_tools)
        if self.first_id:
            data["id"] = self.first_id
        if self.usage is not None:
            data["usage"] = self.usage
        answer = answer_of(data)
        if answer is not None and isinstance(data.get("id"), str):
            answer["response_id"] = data["id"]
        return data, answer, chat_usage(self.usage)


class ResponsesRecallStream:
    """The Responses streams of one turn as one (the shared ``StreamFilter`` over
    ``ResponsesEvents``); the loop decides from the terminal event whether another round follows."""

    def __init__(self, turn: Turn) -> None:
        self.names = turn.view.recall_names
        self.events = ResponsesEvents(self.names, turn.chat.body.get("tools"))
        self.filter = StreamFilter(self.events, add_usage)
        self._done: dict[int, dict] = {}  # the round's items done, by upstream index

    def feed(self, event: dict) -> bytes:
        if (event.get("type") == "response.output_item.done" and isinstance(event.get("item"), dict)
                and isinstance(event.get("output_index"), int)):
            self._done[event["output_index"]] = event["item"]
        return self.filter.feed(event)

    def done(self) -> None:
        pass

    def _final(self) -> dict:
        terminal = self.filter.closing or {}
        return terminal.get("response") if isinstance(terminal.get("response"), dict) else {}

    def round_end(self) -> Reply | None:
        if self.filter.closing is None:
            return None
        final = self._final()
        output = final.get("output") if isinstance(final.get("output"), list) else []
        return _reply(output, self.names, final.get("usage"), self.filter.closing.get("type") == "response.completed")

    def end_round(self, *, final: bool) -> bytes:
        return self.filter.end_round(self._final().get("usage"), self._done, final=final)

    def new_round(self) -> None:
        self._done = {}
        self.filter.new_round()

    def finish(self) -> bytes:
        return self.filter.finish([self.events.closing(self.filter.closing, self.filter.first, self.filter.visible,
                                                       self.filter.usage)])

    def answer(self) -> dict | None:
        if self.filter.closing.get("type") != "response.completed":
            return None
        answer = answer_of({**self._final(), "output": self.filter.visible})
        first = self.filter.first
        if answer is not None and first and isinstance(first.get("id"), str):
            answer["response_id"] = first["id"]
        return answer

    def usage(self) -> dict | None:
        return chat_usage(self.filter.usage)
