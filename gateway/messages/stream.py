"""Anthropic Messages streams: reading them, and the client's view of several upstream rounds as one.

A Messages stream is ``event: NAME`` / ``data: {"type": NAME, ...}`` pairs: ``message_start``,
then per content block ``content_block_start`` / ``_delta`` / ``_stop`` addressed by ``index``,
``message_delta`` (stop reason, usage), ``message_stop``; ``ping`` and ``error`` anywhere.
``MessageAssembler`` rebuilds the message one stream carried. ``MessagesEvents`` are its shapes
for the one stream state machine (``gateway/pipeline/stream_filter.py``), which turns the
streams of one turn's upstream calls (the recall loop may make several) into one for the client:

- ``message_start`` is told once, from the first call;
- the blocks of a recall ``tool_use`` never reach the client; a thinking block is held until the
  block after it shows whether it belongs to something the client sees (then it is told first,
  bound to it) or only to recall calls (then it is dropped with them);
- ``index`` is renumbered so the client sees one gapless run of blocks;
- the final ``message_delta`` carries the last call's stop reason and the usage summed over all
  calls (input, output, cache read and cache write tokens).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.messages import adapter as fmt
from gateway.http.sse import named_event as encode  # the named SSE event, shared with the other format
from gateway.pipeline.stream_filter import Kind, Role

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
TTL_KEYS = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
THINKING = frozenset({"thinking", "redacted_thinking"})


def _dict(value: Any) -> dict:
    """A provider's field read as an object (a malformed one reads as empty, never fails the stream)."""
    return value if isinstance(value, dict) else {}


def _text(obj: dict, key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def add_usage(total: dict | None, usage: Any) -> dict | None:
    """Messages usage summed over calls (the four token counts, and the cache writes' TTL split)."""
    if not isinstance(usage, dict):
        return total
    out = dict(total or {})
    for key in USAGE_KEYS:
        if (n := _count(usage.get(key))) is not None:
            out[key] = (out.get(key) or 0) + n
    split = _dict(usage.get("cache_creation"))
    if split:
        summed = dict(_dict(out.get("cache_creation")))
        for key in TTL_KEYS:
            if (n := _count(split.get(key))) is not None:
                summed[key] = (summed.get(key) or 0) + n
        out["cache_creation"] = summed
    return out


def chat_usage(usage: Any) -> dict | None:
    """Messages usage in the chat shape the recorder, metrics and calibration read: the prompt
    is every input token, cached or not; the cache writes as ``cache_write_tokens`` (OpenAI's
    name), the 1-hour ones among them as ``cache_write_1h_tokens`` (policies.prices.read_usage)."""
    if not isinstance(usage, dict):
        return None
    read = _count(usage.get("cache_read_input_tokens")) or 0
    written = _count(usage.get("cache_creation_input_tokens")) or 0
    hour = min(written, _count(_dict(usage.get("cache_creation")).get("ephemeral_1h_input_tokens")) or 0)
    prompt = (_count(usage.get("input_tokens")) or 0) + read + written
    completion = _count(usage.get("output_tokens")) or 0
    details = {"cached_tokens": read, **({"cache_write_tokens": written} if written else {}),
               **({"cache_write_1h_tokens": hour} if hour else {})}
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": details}


def is_recall_block(block: Any, names: tuple[str, str] | None) -> bool:
    return bool(names) and isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") in names


def visible_blocks(blocks: list, names: tuple[str, str] | None) -> list[dict]:
    """The content blocks the client may see: recall tool_use blocks dropped, and the thinking
    blocks that precede only them."""
    keep: list[dict] = []
    held: list[dict] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") in THINKING:
            held.append(block)
            continue
        if is_recall_block(block, names):
            held = []
            continue
        keep.extend(held)
        held = []
        keep.append(block)
    return keep + held


class MessageAssembler:
    """The message one upstream stream carried: its start, its blocks by index, its end."""

    def __init__(self) -> None:
        self.message: dict = {}
        self.blocks: dict[int, dict] = {}
        self._json: dict[int, list[str]] = {}
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: dict = {}
        self.stopped = False

    def add(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = event["message"]
            self.usage.update({k: v for k, v in (self.message.get("usage") or {}).items() if v is not None})
        elif kind == "content_block_start" and isinstance(event.get("index"), int):
            block = dict(_dict(event.get("content_block")))
            if block.get("type") in ("tool_use", "server_tool_use"):
                self._json[event["index"]] = []
            self.blocks[event["index"]] = block
        elif kind == "content_block_delta" and event.get("index") in self.blocks:
            self._delta(self.blocks[event["index"]], event["index"], _dict(event.get("delta")))
        elif kind == "content_block_stop" and event.get("index") in self._json:
            text = "".join(self._json.pop(event["index"]))
            if text:
                try:
                    self.blocks[event["index"]]["input"] = orjson.loads(text)
                except orjson.JSONDecodeError:
                    pass
        elif kind == "message_delta":
            delta = _dict(event.get("delta"))
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
                self.stop_sequence = delta.get("stop_sequence")
            if isinstance(event.get("usage"), dict):
                # message_delta usage is cumulative for the message: it replaces the start's.
                self.usage.update({k: v for k, v in event["usage"].items() if v is not None})
        elif kind == "message_stop":
            self.stopped = True

    def _delta(self, block: dict, index: int, delta: dict) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = _text(block, "text") + _text(delta, "text")
        elif kind == "thinking_delta":
            block["thinking"] = _text(block, "thinking") + _text(delta, "thinking")
        elif kind == "signature_delta":
            block["signature"] = _text(block, "signature") + _text(delta, "signature")
        elif kind == "input_json_delta" and index in self._json:
            self._json[index].append(_text(delta, "partial_json"))
        elif kind == "citations_delta" and isinstance(delta.get("citation"), dict):
            block.setdefault("citations", []).append(delta["citation"])

    def content(self) -> list[dict]:
        return [self.blocks[i] for i in sorted(self.blocks)]

    def whole(self) -> dict:
        """The message as a non-streamed answer would have carried it."""
        return {**self.message, "content": self.content(), "stop_reason": self.stop_reason,
                "stop_sequence": self.stop_sequence, "usage": dict(self.usage)}


class MessagesEvents:
    """Anthropic Messages' event shapes for the one stream state machine
    (``gateway/pipeline/stream_filter.py``): content blocks addressed by ``index``, thinking
    blocks held (as many as come: a recall ``tool_use`` takes every one before it along)."""

    index_key = "index"
    hold_one = False
    hidden_drops_held = True
    keeps_trailing_held = True

    def __init__(self, names: tuple[str, str] | None) -> None:
        self.names = names

    def kind(self, event: dict) -> Kind:
        kind = event.get("type")
        if kind == "message_start":
            return Kind.OPEN
        if kind in ("message_delta", "message_stop"):
            return Kind.CLOSE
        return Kind.START if kind == "content_block_start" else Kind.ITEM

    def role(self, event: dict) -> Role:
        block = _dict(event.get("content_block"))
        if block.get("type") in THINKING:
            return Role.HELD
        return Role.HIDDEN if is_recall_block(block, self.names) else Role.SHOWN

    def opening(self, event: dict) -> tuple[dict, dict | None]:
        return event, event["message"] if isinstance(event.get("message"), dict) else None

    def error(self, event: dict) -> dict | None:
        if event.get("type") != "error":
            return None
        return event.get("error") if isinstance(event.get("error"), dict) else {}

    encode = staticmethod(encode)

    @staticmethod
    def closing(round_: MessageAssembler, visible: list[dict], usage: dict | None) -> list[dict]:
        """The client's message_delta (the last call's stop reason, the summed usage) and message_stop."""
        delta = {"stop_reason": round_.stop_reason, "stop_sequence": round_.stop_sequence}
        if round_.stop_reason == "tool_use" and not any(b.get("type") == "tool_use" for b in visible):
            delta["stop_reason"] = "end_turn"
        return [{"type": "message_delta", "delta": delta, "usage": usage or {}}, {"type": "message_stop"}]


def answer_of(message: dict, names: tuple[str, str] | None = None) -> dict | None:
    """The neutral assistant item of what the client got (None for an incomplete answer)."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list) or not message.get("stop_reason"):
        return None
    blocks = visible_blocks(message["content"], names)
    return fmt.assistant_item(blocks) if blocks else None
