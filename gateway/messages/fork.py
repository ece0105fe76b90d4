"""A Messages view as the parent of a cache-forked summary call (``gateway/pipeline/fork.py``).

The call is the body the upstream just received for the view, ``system``, ``tools``, the
messages with their cache breakpoints, ``thinking`` and every other field as they went (a
change to ``thinking`` would void the cached messages), with the answer's text as an assistant
turn and the gateway's instruction as the user turn after it (appended to the newest user turn
when the answer had no text: roles alternate), ``tool_choice: {"type": "none"}``, not streamed.
No breakpoint is added: the parent's newest one reads the prefix, and the tail is not worth a
cache write. The parent's ``anthropic-version`` and ``anthropic-beta`` headers go with it.
"""

from __future__ import annotations

from gateway.messages.adapter import item_blocks
from gateway.pipeline.fork import SummaryFork

# Fields of the parent that would change what a summary call is.
DROPPED = ("stream", "stop_sequences", "tool_choice", "max_tokens", "output_format")
FORMAT_HEADERS = ("anthropic-version", "anthropic-beta")


def _text_blocks(content) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


class MessagesFork(SummaryFork):
    path = "/messages"
    key_header = "x-api-key"

    def __init__(self, parent: dict, answer_blocks: list[dict], *, tokens: int, headers: dict[str, str],
                 query: str = "") -> None:
        super().__init__(parent, tokens=tokens, headers=headers)
        self.answer_blocks = answer_blocks
        if query:
            self.path = f"/messages?{query}"

    def body(self, texts: list[str], max_tokens: int) -> dict:
        body = {k: v for k, v in self.parent.items() if k not in DROPPED}
        messages = list(self.parent.get("messages") or [])
        if self.answer_blocks:
            messages.append({"role": "assistant", "content": self.answer_blocks})
        added = [{"type": "text", "text": text} for text in texts]
        if messages and messages[-1].get("role") == "user":
            last = messages[-1]
            messages[-1] = {**last, "content": [*_text_blocks(last.get("content")), *added]}
        else:
            messages.append({"role": "user", "content": added})
        body["messages"] = messages
        thinking = body.get("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) and thinking.get("type") == "enabled" else 0
        body.update(tool_choice={"type": "none"}, stream=False, max_tokens=max_tokens + (budget if isinstance(budget, int) else 0))
        return body

    def reply(self, data: dict) -> tuple[str, dict | None]:
        content = data["content"]
        text = "".join(b.get("text") or "" for b in content if isinstance(b, dict) and b.get("type") == "text")
        return text, data.get("usage")


def summary_fork(parent: dict, answer: dict, tokens: int, headers: dict[str, str], query: str = "") -> MessagesFork | None:
    """The fork of the Messages body `parent` (what the upstream received), `answer` (the
    neutral item recorded) appended as its text: its tool_use blocks would stand unanswered
    before the instruction (a 400), and its thinking belongs to them."""
    messages = parent.get("messages")
    if not isinstance(messages, list) or not messages or (messages[-1] or {}).get("role") != "user":
        return None  # an assistant prefill continues; a summary cannot follow it
    blocks, _ = item_blocks(answer)
    text = [{"type": "text", "text": b["text"]} for b in blocks if b.get("type") == "text" and b.get("text")]
    return MessagesFork(parent, text, tokens=tokens, headers=headers, query=query)
