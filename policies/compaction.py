"""Tool-result compaction: old, consumed tool payloads become recoverable placeholders.

Only the outgoing copy changes; the ledger keeps every byte, and each placeholder names the
event id to pass to the load tool. Placeholders are deterministic and the compaction frontier
moves in batches of API rounds, so the prompt prefix stays byte-identical between batches and
the provider's prompt cache keeps hitting.

With a budget, the frontier follows the view's size (``compaction_frontier_for``): it stays put
while the view is under ``compact_trigger_ratio`` of the budget, and when a round pushes it
over, it jumps far enough to bring the view back to ``view_target_ratio``. The frontier is
replayed from the start of the tail on every request, so it is a pure function of the history
and an appended turn never moves it backwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.messages import content_text, tool_names_by_call_id, with_text
from policies.policy import Policy
from policies.rounds import split_rounds
from policies.tokens import MESSAGE_OVERHEAD, TokenCounter


@dataclass
class CompactionStats:
    replaced: int = 0
    truncated: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    # With a budget: tokens of the rounds before the frontier, placeholders included. They pile
    # up in a long loop; past a point only a summary can fold them.
    compacted_tokens: int = 0
    raw_tail_tokens: int = 0  # the rounds from the frontier on, as they go up (uncompacted)


def truncate_head_tail(text: str, head_tokens: int, tail_tokens: int, counter: TokenCounter, marker: str) -> str:
    """``text`` cut to its first ``head_tokens`` and last ``tail_tokens`` tokens around ``marker``.

    ``{omitted}`` in the marker is replaced by the number of tokens cut. Text that already fits
    is returned unchanged.
    """
    cut = counter.head_tail(text, head_tokens, tail_tokens)
    if cut is None:
        return text
    head, tail, omitted = cut
    return f"{head}{marker.replace('{omitted}', str(omitted))}{tail}"


def placeholder_text(tool_name: str, tool_call_id: str, tokens: int, event_id: str, load_tool: str) -> str:
    """The stand-in for a compacted result: enough for the model to neither redo nor guess."""
    return (
        f"[Tool result compacted by the gateway] The {tool_name or 'tool'} call (tool_call_id "
        f"{tool_call_id}) succeeded and its result was already used; do not run it again. "
        f"The original result ({tokens} tokens) is stored as event {event_id}: call {load_tool} "
        f'with event_id "{event_id}" to read it.'
    )


def truncation_marker(event_id: str | None, load_tool: str) -> str:
    if event_id is None:
        return "\n…[{omitted} tokens of this tool result omitted]…\n"
    return (
        "\n…[{omitted} tokens of this tool result omitted; call "
        f'{load_tool} with event_id "{event_id}" for the full text]…\n'
    )


def compaction_frontier(n_rounds: int, policy: Policy) -> int:
    """Without a budget: rounds before this index are eligible, in steps of compact_batch_rounds."""
    unprotected = max(0, n_rounds - policy.keep_recent_rounds)
    return unprotected // policy.compact_batch_rounds * policy.compact_batch_rounds


def compaction_frontier_for(raw: list[int], compacted: list[int], fixed: int, policy: Policy, budget: int) -> int:
    """The frontier (a round index) for rounds of ``raw`` tokens each, ``compacted`` once compacted.

    Replays the rounds in order from a view of ``fixed`` tokens: whenever the view passes
    ``compact_trigger_ratio * budget`` the frontier jumps, at least ``compact_batch_rounds``
    rounds and far enough to bring the view to ``view_target_ratio * budget``, but never into the
    newest ``keep_recent_rounds``. Between jumps the prompt only grows at its end.
    """
    high = policy.compact_trigger_ratio * budget
    low = policy.view_target_ratio * budget
    frontier, view = 0, fixed
    for n, size in enumerate(raw):
        view += size
        if view <= high:
            continue
        limit = n + 1 - policy.keep_recent_rounds
        moved = frontier
        while moved < limit and (view > low or moved - frontier < policy.compact_batch_rounds):
            view -= raw[moved] - compacted[moved]
            moved += 1
        frontier = max(frontier, moved)
    return frontier


def compact_tool_results(
    messages: list[dict],
    event_ids: list[str | None],
    policy: Policy,
    counter: TokenCounter,
    load_tool: str = "session_load",
    *,
    budget: int | None = None,
    fixed_tokens: int = 0,
) -> tuple[list[dict], CompactionStats]:
    """A new list with eligible tool results compacted, and what it saved.

    ``messages`` is the non-system tail after the summary boundary; ``event_ids`` runs parallel
    to it. Tool results in rounds before the frontier are placeholdered (or truncated, or kept)
    by their tool's rule; results without an event id are never placeholdered because nothing
    could load them back. Any non-"keep" result larger than ``max_result_tokens`` that is not
    placeholdered is head/tail truncated, protected rounds included.

    With ``budget`` (and ``fixed_tokens``, what the view costs besides these messages) the
    frontier follows the view's size (``compaction_frontier_for``); without, it is every round
    but the protected ones, in batches (``compaction_frontier``).
    """
    if len(event_ids) != len(messages):
        raise ValueError(f"event_ids has {len(event_ids)} entries for {len(messages)} messages.")
    stats = CompactionStats()
    counts = [counter.count_message(m, k) for m, k in zip(messages, event_ids)]
    stats.tokens_before = stats.tokens_after = sum(counts)
    rounds = split_rounds(messages)
    names = tool_names_by_call_id(messages)
    # Two thirds head, one third tail: the start of a result says what it is, the end how it ended.
    max_head = policy.max_result_tokens * 2 // 3
    max_tail = policy.max_result_tokens - max_head

    def compact(i: int, eligible: bool) -> tuple[dict, bool]:
        message = messages[i]
        event_id, tokens = event_ids[i], counts[i]
        call_id = str(message.get("tool_call_id") or "")
        name = names.get(call_id, "")
        rule = policy.tool_rule(name)
        action = rule.action if rule else None
        if action == "keep":
            return message, False
        if eligible and event_id is not None:
            if action == "clean" or (action is None and tokens >= policy.compact_min_tokens):
                return with_text(message, placeholder_text(name, call_id, tokens, event_id, load_tool)), True
            if action == "truncate":
                cut = _truncated(message, rule.head_tokens, rule.tail_tokens, event_id, load_tool, counter)
                if cut is not message:
                    return cut, False
        if tokens - MESSAGE_OVERHEAD > policy.max_result_tokens:
            return _truncated(message, max_head, max_tail, event_id, load_tool, counter), False
        return message, False

    tools = [[i for i in range(start, end) if messages[i].get("role") == "tool"] for start, end in rounds]
    versions: dict[int, tuple[dict, bool]] = {}
    if budget is None:
        frontier = compaction_frontier(len(rounds), policy)
    else:
        raw, compacted = [], []
        for r, (start, end) in enumerate(rounds):
            size = sum(counts[start:end])
            saved = 0
            for i in tools[r]:
                versions[i] = compact(i, True)
                if versions[i][0] is not messages[i]:
                    saved += counts[i] - counter.count_message(versions[i][0])
                if counts[i] - MESSAGE_OVERHEAD > policy.max_result_tokens:  # cut even when not eligible
                    size -= counts[i] - counter.count_message(compact(i, False)[0])
            raw.append(size)
            compacted.append(sum(counts[start:end]) - saved)
        frontier = compaction_frontier_for(raw, compacted, fixed_tokens, policy, budget)
        stats.compacted_tokens = sum(c for c, r in zip(compacted[:frontier], raw) if c < r)  # rounds with placeholders
        stats.raw_tail_tokens = sum(raw[frontier:])

    out = list(messages)
    for r in range(len(rounds)):
        for i in tools[r]:
            new, replaced = versions[i] if r < frontier and i in versions else compact(i, r < frontier)
            if new is messages[i]:
                continue
            out[i] = new
            stats.replaced += replaced
            stats.truncated += not replaced
            stats.tokens_after += counter.count_message(new) - counts[i]
    return out, stats


def _truncated(
    message: dict, head: int, tail: int, event_id: str | None, load_tool: str, counter: TokenCounter
) -> dict:
    text = content_text(message.get("content"))
    cut = truncate_head_tail(text, head, tail, counter, truncation_marker(event_id, load_tool))
    return message if cut == text else with_text(message, cut)
