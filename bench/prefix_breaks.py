"""Where the prefix of consecutive upstream views breaks, and what each kind of break costs.

Prefix stability (``bench/common.prefix_stats``, ``bench/responses.stability``) is the mean over
consecutive view pairs (A, B) of shared(A, B) / |B|. This splits each pair's loss,
(|B| - shared) / |B|, into what explains it:

- ``growth``: the tokens B appends after what it keeps of A (the client's new messages). Every
  pair pays it, events or not: it is the loss a view that only ever appended would have too.
- ``event``: the rest of the loss, when the first element that differs was rewritten by a
  compaction event: a result that A held raw is a placeholder in B, or the summary block
  changed (a checkpoint adopted).
- ``churn``: the rest, when the first difference is anything else (a placeholder's text
  changed, the tools or instructions changed, a gateway block re-rendered (the summary block
  with the same summary and other exact values too), an item dropped...):
  a change of the prefix that no planned event explains.
- ``recall``: pairs where A or B is a recall round (the recall loop's own upstream calls).

``ceiling`` is the stability of the same views with zero events, churn and recall rewrites:
1 - the growth loss. Elements are ``(bytes, tokens)`` in prompt order, the first one the head
(tools, and for Responses the instructions); their bytes are the element's JSON.
"""

from __future__ import annotations

import os
from collections import Counter

import orjson

PLACEHOLDER = "[Tool result compacted by the gateway]"
CLASSES = ("growth", "event", "churn", "recall")


def chat_elements(body: dict) -> list[tuple[bytes, int]]:
    """A chat body as prefix elements: the tools first (OpenAI renders them first), then each
    message, as ``bench/common.prefix_stats`` compares them."""
    from simulator.puppet import count_message

    tools = body.get("tools")
    # the head counts no tokens, as prefix_stats counts only messages (a changed head shares nothing)
    head = (orjson.dumps(tools, option=orjson.OPT_SORT_KEYS), 0)
    return [head, *((orjson.dumps(m, option=orjson.OPT_SORT_KEYS), count_message(m)) for m in body.get("messages") or [])]


def _text(item: dict) -> str:
    content = next((item[k] for k in ("content", "output", "text") if k in item), None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or p.get("content") or "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def describe(key: bytes) -> tuple[str, str]:
    """(kind, identity) of one element: what it is and what stays the same across its renderings
    (a tool result's call id; a message's role and kind). Chat messages and Responses items are
    JSON; Anthropic blocks (``simulator.messages_rules.blocks``) are ``role:`` + JSON."""
    prefix = ""
    if key[:1] not in (b"{", b"["):
        at = key.find(b"{")
        prefix, key = key[:at].decode(errors="replace").rstrip(":"), key[at:]
    try:
        item = orjson.loads(key)
    except orjson.JSONDecodeError:
        return "?", ""
    if not isinstance(item, dict) or prefix == "tool":
        return "head", "head"
    text = _text(item)
    kind = item.get("type") or "message"
    if kind in ("function_call_output", "tool_result") or item.get("role") == "tool":
        call = item.get("call_id") or item.get("tool_call_id") or item.get("tool_use_id") or ""
        return ("placeholder" if PLACEHOLDER in text else "result"), f"tool:{call}"
    role = item.get("role", "") or prefix
    for mark, name in (("<session_summary", "summary"), ("<standing_instructions", "standing"),
                       ("<hidden_context_index", "summary"), ("Earlier parts of this conversation", "recall-note"),
                       ("<recalled_history", "recalled")):
        if mark in text:
            return name, name
    if role in ("system", "developer"):
        return "system", "system"
    return f"{kind}:{role}" if role else kind, f"{kind}:{role}"


def _prose(key: bytes) -> str:
    """A summary block's text before its exact values: what only a new checkpoint changes."""
    at = key.find(b"{")
    return _text(orjson.loads(key[at:])).split("Exact values from the earlier conversation")[0]


def _recall_tools_added(a: bytes, b: bytes) -> bool:
    """Did the head change only by the recall tools joining it (offered with the first event)?"""
    return b"session_search" in b and b"session_search" not in a


def _shared(a: list[tuple[bytes, int]], b: list[tuple[bytes, int]]) -> tuple[int, int]:
    tokens = n = 0
    for (x, t), (y, _) in zip(a, b):
        if x != y:
            break
        tokens, n = tokens + t, n + 1
    return tokens, n


def classify(a: list[tuple[bytes, int]], b: list[tuple[bytes, int]], *, recall: bool = False) -> dict:
    """One pair: its class, the tokens of B it shares, appends and loses otherwise, and a tag
    naming the first difference."""
    total = sum(t for _, t in b) or 1
    shared, i = _shared(a, b)
    seen = {k for k, _ in a}
    new = 0
    for key, tokens in reversed(b[i:]):  # the trailing elements A never had: the client's growth
        if key in seen:
            break
        new += tokens
    if i == len(a):
        kind, tag = "growth", "append"
    else:
        ka, ia = describe(a[i][0])
        kb, ib = describe(b[i][0]) if i < len(b) else ("end", "end")
        tag = f"{ka}->{kb}"
        if recall:
            kind = "recall"
        elif ia == ib and ka == "result" and kb == "placeholder":
            kind = "event"
        elif ka == kb == "summary" and _prose(a[i][0]) == _prose(b[i][0]):
            kind, tag = "churn", "summary block re-rendered"  # its exact values changed, its summary did not
        elif kb == "summary" and (ka != "summary" or a[i][0] != b[i][0]):
            kind = "event"  # a checkpoint adopted (its block new or changed)
        elif kb == "head" and _recall_tools_added(a[i][0], b[i][0]):
            kind, tag = "event", "recall tools offered"
        elif kb == "placeholder" and ia != ib:
            kind = "event"  # a run of results compacted where B's first is a placeholder A lacked
        else:
            kind = "churn"
    if kind == "growth":
        new = total - shared
    rewritten = max(0, total - shared - new)
    return {"class": kind, "tag": tag, "total": total, "shared": shared, "new": min(new, total - shared),
            "rewritten": rewritten, "index": i,
            "example": "" if i >= len(a) else f"A[{i}]={a[i][0][:300]!r} B[{i}]={b[i][0][:300] if i < len(b) else b''!r} "
                                              f"A has {len(a)}, B {len(b)}"}


def decompose(views: list[list[tuple[bytes, int]]], recall_flags: list[bool] | None = None) -> dict:
    """Per-pair classification of a session's consecutive views, as sums the caller can pool:
    ``pairs``, per class the pair count and the summed share of B lost (``loss_<class>``), the
    summed growth share (``loss_growth`` counts every pair's growth), the same in tokens
    (``tok_<class>``), a counter of first differences and one example of each
    (``PREFIX_BREAKS_EXAMPLES=1`` prints them)."""
    flags = recall_flags or [False] * len(views)
    out: dict = {"pairs": 0, "stability": 0.0, "tags": Counter(), "examples": {}}
    for name in CLASSES:
        out[f"n_{name}"] = 0
        out[f"loss_{name}"] = 0.0
        out[f"tok_{name}"] = 0
    for n in range(1, len(views)):
        pair = classify(views[n - 1], views[n], recall=flags[n] or flags[n - 1])
        out["pairs"] += 1
        out["stability"] += pair["shared"] / pair["total"]
        out[f"n_{pair['class']}"] += 1
        out["loss_growth"] += pair["new"] / pair["total"]
        out["tok_growth"] += pair["new"]
        if pair["class"] != "growth":
            out[f"loss_{pair['class']}"] += pair["rewritten"] / pair["total"]
            out[f"tok_{pair['class']}"] += pair["rewritten"]
            tag = f"{pair['class']}:{pair['tag']}"
            out["tags"][tag] += 1
            out["examples"].setdefault(tag, pair["example"])
    return out


def pool(parts: list[dict]) -> dict:
    """Several sessions' ``decompose`` results as one."""
    out: dict = {"pairs": 0, "stability": 0.0, "tags": Counter(), "examples": {}}
    for part in parts:
        for key, value in part.items():
            if key == "tags":
                out["tags"].update(value)
            elif key == "examples":
                for tag, example in value.items():
                    out["examples"].setdefault(tag, example)
            else:
                out[key] = out.get(key, 0) + value
    return out


def render(name: str, d: dict, ideal_cost: float | None = None) -> str:
    """One line per workload: stability, each class's pairs and mean loss, the ceiling; then the
    commonest non-growth tags. With ``ideal_cost`` (the ideal-direct bill), what each class's
    unshared tokens cost beyond a cached read (0.9 of a token each), as a share of it."""
    pairs = d["pairs"] or 1
    losses = {c: d.get(f"loss_{c}", 0.0) / pairs for c in CLASSES}
    line = (f"{name:<14} pairs {d['pairs']:>4}  stability {d['stability'] / pairs:.3f}  "
            + "  ".join(f"{c} {d.get(f'n_{c}', 0):>3} pairs -{losses[c]:.3f}" for c in CLASSES)
            + f"  ceiling {1 - losses['growth']:.3f}")
    tags = ", ".join(f"{t} x{k}" for t, k in Counter(d["tags"]).most_common(8))
    if ideal_cost:
        line += f"\n{'':<14} unshared tokens x 0.9 / ideal bill: " + "  ".join(
            f"{c} {0.9 * d.get(f'tok_{c}', 0) / ideal_cost:.3f}" for c in CLASSES)
    line += f"\n{'':<14} first differences: {tags}" if tags else ""
    if os.environ.get("PREFIX_BREAKS_EXAMPLES"):
        line += "".join(f"\n    {t}: {e}" for t, e in d.get("examples", {}).items())
    return line
