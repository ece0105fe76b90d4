"""A Responses view as the parent of a cache-forked summary call (``gateway/pipeline/fork.py``).

The call is the body the upstream just received for the view, ``instructions``, ``tools``,
``input`` and every other field as they went (``prompt_cache_key`` routes it to the same
cache), with the answer's assistant messages and the gateway's instruction appended to
``input``, ``tool_choice: "none"``, not streamed and not stored. A structured-output format is
set back to text (a summary is prose). A request that names a stored ``conversation`` has no
fork: the provider would append the summary exchange to the client's conversation.
"""

from __future__ import annotations

from gateway.pipeline.fork import SummaryFork
from gateway.responses.adapter import input_items, render_item

# Fields of the parent that would change what a summary call is, or where it goes.
DROPPED = ("stream", "stream_options", "background", "store", "max_output_tokens", "tool_choice")


def message_text(data: dict) -> str:
    """The text of a response's assistant message items."""
    parts = []
    for item in data.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    parts.append(part.get("text") or "")
    return "".join(parts)


class ResponsesFork(SummaryFork):
    path = "/responses"

    def __init__(self, parent: dict, answer_items: list[dict], *, tokens: int) -> None:
        super().__init__(parent, tokens=tokens)
        self.answer_items = answer_items

    def body(self, texts: list[str], max_tokens: int) -> dict:
        body = {k: v for k, v in self.parent.items() if k not in DROPPED}
        body["input"] = [*input_items(self.parent.get("input")), *self.answer_items,
                         *({"type": "message", "role": "user", "content": text} for text in texts)]
        text = body.get("text")
        if isinstance(text, dict) and (text.get("format") or {}).get("type", "text") != "text":
            body["text"] = {**text, "format": {"type": "text"}}
        body.update(tool_choice="none", stream=False, store=False, max_output_tokens=max_tokens)
        return body

    def reply(self, data: dict) -> tuple[str, dict | None]:
        if not isinstance(data.get("output"), list):
            raise KeyError("output")
        return message_text(data), data.get("usage")


def summary_fork(parent: dict, answer: dict, tokens: int) -> ResponsesFork | None:
    """The fork of the Responses body `parent` (what the upstream received), `answer` (the
    neutral item recorded) appended as its assistant messages: its calls would stand without
    their outputs (a 400), and its reasoning without its calls."""
    if parent.get("conversation"):
        return None
    items = [i for i in render_item(answer) if i.get("type", "message") == "message" and i.get("role") == "assistant"]
    return ResponsesFork(parent, items, tokens=tokens)
