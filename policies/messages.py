"""The shape of OpenAI chat messages, read in one place.

Content arrives as a string, ``None`` or a list of parts; tool calls live on assistant messages
and are answered by ``tool`` messages. Every policy reads messages through these functions so
the shape rules live once.
"""

from __future__ import annotations

from typing import Any

INSTRUCTION_ROLES = frozenset({"system", "developer"})
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal"})


def content_text(content: Any) -> str:
    """All text of a message content: the string itself, or its text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text") if part.get("type", "text") in TEXT_PART_TYPES else None
                if isinstance(text, str):
                    texts.append(text)
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    return str(content)


def tool_calls(message: dict) -> list[dict]:
    """The tool calls of an assistant message (empty for anything else or a malformed list)."""
    calls = message.get("tool_calls") if message.get("role") == "assistant" else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def call_name(call: dict) -> str:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


def call_arguments(call: dict) -> str:
    function = call.get("function")
    args = function.get("arguments") if isinstance(function, dict) else None
    if args is None:
        return ""
    return args if isinstance(args, str) else str(args)


def tool_names_by_call_id(messages: list[dict]) -> dict[str, str]:
    """Map every tool_call id to the function name the assistant called."""
    names: dict[str, str] = {}
    for message in messages:  # `tool_calls` inlined: this walks every message of a long history
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list):
            continue
        for call in calls:
            call_id = call.get("id") if isinstance(call, dict) else None
            if isinstance(call_id, str):
                names[call_id] = call_name(call)
    return names


def with_text(message: dict, text: str) -> dict:
    """A shallow copy of ``message`` whose content is ``text``.

    Non-text parts (images, audio) are kept after the text so a truncated multimodal message
    still carries its attachments.
    """
    copy = type(message)(message)  # a gateway block stays one (policies.projection.SummaryBlock)
    content = message.get("content")
    if isinstance(content, list):
        others = [p for p in content if isinstance(p, dict) and p.get("type", "text") not in TEXT_PART_TYPES]
        copy["content"] = [{"type": "text", "text": text}, *others] if others else text
    else:
        copy["content"] = text
    return copy
