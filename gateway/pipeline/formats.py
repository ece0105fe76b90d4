"""Wire formats: one adapter per API a client speaks, around one neutral conversation model.

    request JSON --parse--> ChatRequest (neutral instructions + history) --policies--> view
    view --render--> upstream JSON (items the view did not change re-emitted as the client sent them)
    upstream answer / stream --assemble, filter--> client (recall calls hidden)

Each format is a room of its own: ``gateway/chat/`` (Chat Completions, the format the gateway
started with), ``gateway/responses/`` (the OpenAI Responses API: Codex CLI, the Agents SDK) and
``gateway/messages/`` (Anthropic Messages: Claude Code). ``gateway/pipeline/`` holds what they
share and imports none of them; no format room imports another (tests/test_architecture.py).
The neutral model is described in ``policies/conversation.py``. Each adapter owns: parsing (400
in its own envelope), the canonical form of its items (opaque parts), rendering, its stream's
event shapes for the one stream state machine (``stream_filter.py``) and its assembler, and
where the summary block goes. The recall tools' schema in each
format's tool shape is here, because the view builder injects them.
"""

from __future__ import annotations

from policies import recall_tools

FORMATS = ("chat", "responses", "messages")


def recall_tools_for(fmt: str, names: tuple[str, str]) -> list[dict]:
    """The two recall tools as the client's format declares tools."""
    tools = recall_tools(*names)
    if fmt == "responses":
        return [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                 "parameters": t["function"]["parameters"], "strict": False} for t in tools]
    if fmt == "messages":
        return [{"name": t["function"]["name"], "description": t["function"]["description"],
                 "input_schema": t["function"]["parameters"]} for t in tools]
    return tools
