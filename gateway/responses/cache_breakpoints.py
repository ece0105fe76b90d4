"""OpenAI prompt-cache breakpoints for a Responses view the gateway rendered (GPT-5.6 on).

Models whose cache rule says ``prompt_cache_breakpoint`` (``policies/prices.cache_rule``) take an
explicit mark on an input content part, ``"prompt_cache_breakpoint": {"mode": "explicit"}``,
that ends a reusable prefix exactly there (not rounded to a block); a request may write up to 4,
one of them the provider's own implicit breakpoint. The gateway marks, where its view plan keeps
the prefix stable:

1. the end of the leading instructions and the gateway's summary block (it changes only at a
   compaction event),
2. the newest user message (the turn's task: an agent loop's calls append after it).

Only the request's own wire items are copied before a mark goes on: the client's items (kept in
the ledger) are never changed. A mark is metadata, not prompt text: the next request, which
marks a newer message, still shares the prefix.
"""

from __future__ import annotations

from policies.prices import cache_rule

MARK = "prompt_cache_breakpoint"
EXPLICIT = {"mode": "explicit"}
MARKABLE = frozenset({"input_text", "input_image", "input_file"})


def _marked(item: dict) -> dict | None:
    """A copy of a message item with its last markable part marked; None if it has none."""
    content = item.get("content")
    if isinstance(content, str):
        return {**item, "content": [{"type": "input_text", "text": content, MARK: dict(EXPLICIT)}]}
    if not isinstance(content, list):
        return None
    for i in range(len(content) - 1, -1, -1):
        part = content[i]
        if isinstance(part, dict) and part.get("type") in MARKABLE:
            parts = list(content)
            parts[i] = {**part, MARK: dict(EXPLICIT)}
            return {**item, "content": parts}
    return None


def place_breakpoints(model: str, items: list[dict]) -> list[dict]:
    """`items` (the view's input) with the gateway's breakpoints, for a model that takes them."""
    rule = cache_rule(model)
    if rule is None or rule.breakpoints != MARK or not items:
        return items
    out = list(items)
    lead = None  # the last instruction item before the conversation
    for i, item in enumerate(out):
        if item.get("type", "message") == "message" and item.get("role") in ("system", "developer"):
            lead = i
        else:
            break
    user = next((i for i in range(len(out) - 1, -1, -1)
                 if out[i].get("type", "message") == "message" and out[i].get("role") == "user"), None)
    for i in {lead, user} - {None}:
        marked = _marked(out[i])
        if marked is not None:
            out[i] = marked
    return out
