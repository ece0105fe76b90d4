"""Wire formats: one adapter per API a client speaks, around one neutral conversation model.

    request JSON --parse--> ChatRequest (neutral instructions + history) --policies--> view
    view --render--> upstream JSON (items the view did not change re-emitted as the client sent them)
    upstream answer / stream --assemble, filter--> client (recall calls hidden)

``chat`` is the Chat Completions format the gateway started with (its parsing lives in
``gateway/chat/request.py``); ``responses`` is the OpenAI Responses API (Codex CLI, the Agents
SDK); ``messages`` is Anthropic Messages (Claude Code). The neutral model is described in
``policies/conversation.py``. Each adapter owns: parsing (400 in its own envelope), the
canonical form of its items (opaque parts), rendering, recall-tool schemas in its format, its
stream filter and assembler, and where the summary block goes.
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
