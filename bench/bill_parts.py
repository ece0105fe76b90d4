"""Where a benchmark's bill goes (issue 29): every upstream call split into the parts a change
can move, as shares of the ideal-direct bill.

- ``main cached reads``: the client requests' prompt read from the provider's cache (x read rate);
- ``main new tokens``: what the client added since its previous request, which any request
  must send uncached (the physical floor; written to the cache at the write rate);
- ``main rewrites``: the rest of the client requests' uncached prompt, a prefix the gateway
  rewrote (compaction events, a new summary block) or the cache could not serve;
- ``recall rounds``: the recall loop's extra upstream calls, whole;
- ``summaries``: summary calls (``x-palimpsest-purpose: summary``), whole.

A call is given as a ``Call`` (its kind, prompt tokens, the part served from the cache and the
part written to it) in the order the upstream received them; the client's growth per request
comes from the client's own requests (``growth``), matched to the ``main`` calls in order.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTS = ("main cached reads", "main new tokens", "main rewrites", "recall rounds", "summaries")
RECALL_TOOLS = ("session_search", "session_load")


@dataclass(frozen=True, slots=True)
class Call:
    kind: str  # "main", "recall" or "summary"
    prompt: int  # all prompt tokens
    cached: int  # read from the cache
    written: int  # written to the cache (billed at the write rate)
    written_1h: int = 0  # of `written`, under Anthropic's 1-hour TTL (billed at the 1-hour write rate)


def cost(call: Call, read: float, write: float, write_1h: float | None = None) -> float:
    hour = write if write_1h is None else write_1h
    return (read * call.cached + write * (call.written - call.written_1h) + hour * call.written_1h
            + (call.prompt - call.cached - call.written))


def breakdown(calls: list[Call], growth: list[int], ideal: float, *, read: float = 0.1, write: float = 1.0,
              write_1h: float | None = None) -> dict[str, float]:
    """The bill's parts over `ideal` (and ``total``). `growth`: new client tokens per client
    request, in order (matched to the ``main`` calls; extra calls get none)."""
    out = dict.fromkeys(PARTS, 0.0)
    mains = 0
    for call in calls:
        if call.kind == "summary":
            out["summaries"] += cost(call, read, write, write_1h)
            continue
        if call.kind == "recall":
            out["recall rounds"] += cost(call, read, write, write_1h)
            continue
        new = min(call.prompt - call.cached, growth[mains] if mains < len(growth) else 0)
        mains += 1
        out["main cached reads"] += read * call.cached
        # New tokens are written to the cache when the prompt is cacheable: price them as the
        # call paid its uncached part, on average.
        uncached = call.prompt - call.cached
        paid = cost(call, read, write, write_1h) - read * call.cached
        out["main new tokens"] += paid * new / uncached if uncached else 0.0
        out["main rewrites"] += paid * (uncached - new) / uncached if uncached else 0.0
    out = {k: v / ideal for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def render(name: str, parts: dict[str, float]) -> str:
    """One markdown row: the parts as shares of ideal direct."""
    return f"| {name} | " + " | ".join(f"{parts[k]:.3f}" for k in (*PARTS, "total")) + " |"


def header() -> str:
    return "| bill / ideal direct | " + " | ".join(PARTS) + " | total |\n|---|" + "---|" * (len(PARTS) + 1)


def is_recall_round(body: dict) -> bool:
    """Does this request answer a recall call (its newest item is a recall tool's result), in
    any of the three formats? Recall tools may be renamed with a prefix; their names end so."""
    names: dict[str, str] = {}
    if isinstance(body.get("input"), list):  # Responses
        items = [i for i in body["input"] if isinstance(i, dict)]
        for item in items:
            if item.get("type") == "function_call":
                names[item.get("call_id")] = item.get("name", "")
        last = items[-1] if items else {}
        return last.get("type") == "function_call_output" and names.get(last.get("call_id"), "").endswith(RECALL_TOOLS)
    messages = body.get("messages") or []
    for m in messages:
        for call in m.get("tool_calls") or ():
            names[call.get("id")] = (call.get("function") or {}).get("name", "")
        for block in m.get("content") if isinstance(m.get("content"), list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_use":
                names[block.get("id")] = block.get("name", "")
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") == "tool":  # Chat
        return names.get(last.get("tool_call_id"), "").endswith(RECALL_TOOLS)
    blocks = [b for b in last.get("content") if isinstance(b, dict)] if isinstance(last.get("content"), list) else []
    results = [b for b in blocks if b.get("type") == "tool_result"]  # Messages
    return bool(results) and all(names.get(b.get("tool_use_id"), "").endswith(RECALL_TOOLS) for b in results)
