"""A Chat Completions view as the parent of a cache-forked summary call
(``gateway/pipeline/fork.py``): the messages and tools the upstream just got, the answer's
text, then the gateway's instruction, ``tool_choice: "none"``."""

from __future__ import annotations

from gateway.pipeline.fork import SummaryFork

# Request fields a fork keeps from its parent: they route the call to the same cache.
ROUTING = ("prompt_cache_key", "user", "safety_identifier")


class ChatFork(SummaryFork):
    path = "/chat/completions"

    def body(self, texts: list[str], max_tokens: int) -> dict:
        parent = self.parent
        messages = [*parent["messages"], *({"role": "user", "content": text} for text in texts)]
        body = {"model": parent["model"], "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        body.update({k: parent[k] for k in ROUTING if isinstance(parent.get(k), str)})
        if parent.get("tools"):  # the same tools keep the cached prefix; none may be called
            body["tools"], body["tool_choice"] = parent["tools"], "none"
        return body

    def reply(self, data: dict) -> tuple[str, dict | None]:
        return data["choices"][0]["message"]["content"] or "", data.get("usage")


def summary_fork(turn, answer: dict) -> ChatFork | None:
    """The fork of a chat turn's view, its answer appended (an answer that calls tools would
    stand unpaired before the instruction, a 400: its text only)."""
    view, chat = turn.view, turn.chat
    if answer.get("tool_calls"):
        answer = {"role": "assistant", "content": answer.get("content")} if answer.get("content") else None
    tail = [answer] if answer else []
    if view.messages is None:  # forwarded as the client sent it
        messages, tools = chat.body["messages"], chat.body.get("tools")
    else:
        messages, tools = view.messages, view.tools if view.tools is not None else chat.body.get("tools")
    parent = {**chat.body, "messages": [*messages, *tail], "tools": tools}
    return ChatFork(parent, tokens=view.upstream_tokens)
