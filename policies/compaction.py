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

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate

from policies.cost import (SUMMARY_TOKENS_PER_WORD, cost_rates, event_pays, further_requests, settle_for,
                           summary_block_estimate)
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
    placeholders: list[int] = field(default_factory=list)  # indexes of results that became placeholders
    cut: list[int] = field(default_factory=list)  # indexes of results cut head/tail


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
    """The stand-in for a compacted result: enough for the model to neither redo nor guess.

    Short on purpose: a long agent loop carries dozens of these until a summary folds them.
    (The call id is in the message's own ``tool_call_id``.)"""
    return (
        f"[Tool result compacted by the gateway] {tool_name or 'tool'} succeeded, result already used "
        f'({tokens} tokens); do not run it again. Read it with {load_tool} event_id "{event_id}".'
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
    unprotected = max(0, n_rounds - policy.compaction_keep)
    return unprotected // policy.compact_batch_rounds * policy.compact_batch_rounds


def compaction_frontier_for(raw: list[int], compacted: list[int], fixed: int, policy: Policy, budget: int) -> int:
    """The frontier (a round index) for rounds of ``raw`` tokens each, ``compacted`` once compacted.

    Replays the rounds in order from a view of ``fixed`` tokens: whenever the view passes
    ``compact_trigger_ratio * budget`` the frontier jumps, at least ``compact_batch_rounds``
    rounds and far enough to bring the view to ``view_target_ratio * budget``, but never into the
    newest ``compact_keep_rounds``. Between jumps the prompt only grows at its end.
    """
    high = policy.compact_trigger_ratio * budget
    low = policy.view_target_ratio * budget
    frontier, view = 0, fixed
    for n, size in enumerate(raw):
        view += size
        if view <= high:
            continue
        frontier, view = _jump(raw, compacted, frontier, view, n, low, policy)
    return frontier


def _jump(raw: list[int], compacted: list[int], frontier: int, view: float, n: int, low: float,
          policy: Policy, gains: list[int] | None = None) -> tuple[int, float]:
    """A compaction event at round ``n``: the frontier moves at least ``compact_batch_rounds``
    and until the view is down to ``low``, never into the newest ``compact_keep_rounds``.
    ``gains``: the prefix sums of ``raw - compacted`` when no round grows once compacted (then
    the frontier is found by bisection: the plan asks this of every round, issue 29)."""
    limit = n + 1 - policy.compaction_keep
    if gains is not None:
        if limit <= frontier:
            return frontier, view
        base = gains[frontier]
        # The first round count after which the view is at or under `low`, then the batch floor.
        moved = frontier if view <= low else bisect_left(gains, base + view - low, frontier, limit + 1)
        moved = min(limit, max(moved, frontier + policy.compact_batch_rounds))
        return moved, view - (gains[moved] - base)
    moved = frontier
    while moved < limit and (view > low or moved - frontier < policy.compact_batch_rounds):
        view -= raw[moved] - compacted[moved]
        moved += 1
    return max(frontier, moved), view


@dataclass(frozen=True, slots=True)
class PlanEvent:
    """One compaction event of a view plan, and why it happened (a request's receipt shows them).

    ``reason``: ``window`` (the view was over ``sync_compaction_ratio`` of the budget, or a sync
    summary was written because the request did not fit), ``cost_model`` (under that ratio, the
    smaller view pays for its rewrite, ``policies/cost.event_pays``), ``profile`` (the cost model
    is off: the profile's ``compact_trigger_ratio`` alone decided)."""

    round: int  # the round that pushed the view over
    reason: str
    tokens_before: int  # the view as it would have been, appended
    tokens_after: int  # the view after the event
    checkpoint: int | None  # index into the marks of the checkpoint the view uses from here
    # Decided on the rounds before ``round`` only (an early event, under the trigger): taken at
    # the request on whose path ``round`` first appears, whatever that round grows to later.
    early: bool = False


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    """What view planning needs of one checkpoint on the request's path (message indexes)."""

    boundary: int  # the last message its summary covers
    after: int  # the newest message its job knew: it exists from the next request on
    tokens: int  # what its summary block costs in the view
    forced: bool = False  # written on a request's path because that request did not fit: adopted there


def plan_view(rounds: list[tuple[int, int]], raw: list[int], compacted: list[int], fixed: int,
              marks: list[CheckpointMark], policy: Policy, budget: int,
              events: list[PlanEvent] | None = None, settled: list[float] | None = None) -> tuple[int | None, int]:
    """Which checkpoint the view uses and where its compaction frontier is (a round index).

    Replays the path's rounds from a view of ``fixed`` tokens. While the view stays under
    ``compact_trigger_ratio * budget`` a new round only appends to it. When a round pushes it
    over, that round is a *compaction event*, the only place the view's prefix may change: the
    newest checkpoint that existed by then is adopted (``after`` lies in an earlier round: the
    job that wrote it had a whole request's time to finish), and the frontier jumps, at least
    ``compact_batch_rounds`` rounds and far enough to bring the view to the settle size (the
    cost model's per round, ``_settle``, from the rounds before it; ``view_target_ratio *
    budget`` without it), never into the newest ``compact_keep_rounds``. A summary that lands
    between events waits for the next one; a ``forced`` one (written on a request's own path
    because it did not fit) makes its round an event. The plan is a pure function of the path and
    its checkpoints, so every replica and every restart builds the same view.

    Between ``compact_trigger_ratio`` and ``sync_compaction_ratio`` an event happens only when
    it pays (``policies/cost.event_pays``) over the session's likely further requests; over
    ``sync_compaction_ratio``, or with ``cost_model`` off, it always does. Returns (index into
    ``marks`` or None, frontier round); each event taken is appended to ``events`` when given
    (a round whose event the cost model deferred as reason ``deferred``); ``settled`` gets the
    newest round's settle size (the summary that folds piled-up placeholders is due past it).
    """
    high = policy.compact_trigger_ratio * budget
    must = policy.sync_compaction_ratio * budget
    rates = cost_rates(policy)
    floor = low = policy.view_target_ratio * budget
    round_of = [0] * (rounds[-1][1] if rounds else 0)
    for r, (a, b) in enumerate(rounds):
        round_of[a:b] = [r] * (b - a)
    active: int | None = None
    first = frontier = 0  # first round in the view; rounds before `frontier` are compacted
    view = fixed
    forced = {round_of[m.after] for m in marks if m.forced and m.after < len(round_of)}
    grown = 0  # raw tokens of the rounds before this one: the session's observed growth
    sums = list(accumulate(compacted, initial=0))  # compacted tokens of rounds [a, b): sums[b] - sums[a]
    raws = list(accumulate(raw, initial=0))  # the same of the raw rounds
    # What compacting rounds [a, b) takes off the view: gains[b] - gains[a] (bisected by `_jump`
    # when no round grows once compacted, as with placeholders only for big results).
    gains = [r - c for r, c in zip(raws, sums)] if all(r >= c for r, c in zip(raw, compacted)) else None
    sizes = (sums, raws, gains)
    piles = list(accumulate((c if c < r else 0 for r, c in zip(raw, compacted)), initial=0))  # placeholders pile up
    for n, size in enumerate(raw):
        # The settle size (at least the floor) matters once the view is over the floor, or at an event.
        low = floor if view <= floor and view + size <= high and n < len(raw) - 1 else _settle(
            policy, rates, fixed, budget, n, piles, raws, piles[frontier] - piles[first],
            marks[active].tokens if active is not None else 0)
        view += size
        # An early event (under the trigger): the interval rule says the rewrite pays
        # (``_early``). It is decided on the rounds before this one only, which no later request
        # changes (the newest round may still grow: an answer joins its user message), so every
        # later replay of the path takes the same event and no placeholder comes back raw.
        early = None if n in forced else _early(raw, compacted, sizes, fixed, marks, policy, rates, low, n, grown,
                                                view - size, (active, first, frontier))
        grown += size
        if early is not None:
            before, (frontier, view) = view, (early[0], early[1] + size)
            # The prefix changes here anyway: the newest checkpoint that existed by then comes in
            # with it (one that did not exist yet at an earlier request only moves `first` and the
            # frontier forward: nothing comes back raw).
            # Only when it makes the view smaller: a summary block can be larger than the few
            # placeholders it would fold (the comparison does not depend on the newest round).
            adopted = _adopt(sizes, fixed, marks, round_of, n, active, first, frontier, view)
            if adopted[3] < view:
                active, first, frontier, view = adopted
            if events is not None:
                events.append(PlanEvent(n, "cost_model", int(before), int(view), active, early=True))
            continue
        if view <= high and n not in forced:
            continue
        before = (active, first, frontier, view)
        active, first, frontier, view = _adopt(sizes, fixed, marks, round_of, n, active, first, frontier, view)
        frontier, view = _jump(raw, compacted, frontier, view, n, low, policy, gains)
        if (policy.cost_model and n not in forced and before[3] <= must
                and not event_pays(before[3], view, further_requests(n + 1), rates)):
            if events is not None:
                events.append(PlanEvent(n, "deferred", int(before[3]), int(before[3]), before[0]))
            active, first, frontier, view = before  # not worth its rewrite yet: the view appends
        elif events is not None:
            reason = ("window" if n in forced or before[3] > must else "cost_model" if policy.cost_model else "profile")
            events.append(PlanEvent(n, reason, int(before[3]), int(view), active))
    if settled is not None and raw:
        settled.append(low)
    return active, frontier


def _settle(policy: Policy, rates, fixed: int, budget: int, n: int, piles: list[int], raws: list[int],
            pile: int, block: int) -> float:
    """The size an event at round ``n`` settles the view at (``policies/cost.settle_size``), from the
    rounds before it (as ``_early``): ``pile`` the placeholders in the view now, next to ``fixed``, the
    summary ``block`` and the kept raw rounds. With ``fit_first`` none folds while the client's fits."""
    floor, further = policy.view_target_ratio * budget, further_requests(n)
    if not policy.cost_model or n == 0 or policy.fit_first and fixed + raws[n] * (1 + further / n) <= budget:
        return floor
    output, fork, held = policy.summary_max_words * SUMMARY_TOKENS_PER_WORD, policy.summary_cache_fork, fixed + policy.compaction_keep * raws[n] / n
    new_block = block or summary_block_estimate(policy, budget)  # the block a fold brings
    return settle_for(floor, policy.compact_trigger_ratio * budget, pile, piles[n] / n, further, held + block,
                      held + new_block, fixed, output, fork, rates)


def _adopt(sizes: tuple, fixed: int, marks: list[CheckpointMark], round_of: list[int],
           n: int, active: int | None, first: int, frontier: int, view: float) -> tuple[int | None, int, int, float]:
    """At an event in round ``n``: the newest checkpoint that existed by then (``after`` in an
    earlier round, or a forced one of this round), with the view it makes (rounds to ``n``).
    ``sizes``: the prefix sums of the compacted and the raw rounds (and the gains)."""
    sums, raws, _ = sizes
    for i in range(len(marks) - 1, -1 if active is None else active, -1):
        mark = marks[i]
        if mark.after < len(round_of) and (round_of[mark.after] < n or mark.forced and round_of[mark.after] == n) \
                and mark.boundary < len(round_of):
            first = round_of[mark.boundary] + 1
            frontier = max(frontier, first)
            return i, first, frontier, fixed + mark.tokens + sums[frontier] - sums[first] + raws[n + 1] - raws[frontier]
    return active, first, frontier, view


def _early(raw: list[int], compacted: list[int], sizes: tuple, fixed: int, marks: list[CheckpointMark], policy: Policy, rates,
           low: float, n: int, grown: int, view: float, state: tuple[int | None, int, int]) -> tuple[int, float] | None:
    """An early compaction event at round ``n``, decided on the rounds before it (``view``: their
    view, ``grown``: their raw tokens), which no later request changes: (frontier, view without
    round ``n``) when the interval rule says it pays (``policies/cost.event_pays`` with the
    session's growth per round and the prefix the event keeps), else None. Only with the cost
    model, only over the settle size ``low``, and it adopts no new checkpoint (whether one exists
    yet can differ between requests; the event adopts the newest one after it is taken)."""
    if not policy.cost_model or n == 0 or view <= low:
        return None
    active, first, frontier = state
    moved, after = _jump(raw, compacted, frontier, view, n, low, policy, sizes[2])
    if moved <= frontier:
        return None
    kept = _kept((active, first, frontier, view), active, first, fixed, marks, sizes[0])
    if not event_pays(view, after, further_requests(n), rates, growth=grown / n, kept=kept):
        return None
    return moved, after


def _kept(before: tuple, active: int | None, first: int, fixed: int, marks: list[CheckpointMark],
          sums: list[int]) -> int:
    """The view's prefix an event leaves as it was (still read from the provider's cache): the
    fixed part, the summary block and the rounds compacted already, when the event adopts no new
    checkpoint; the fixed part when it does; nothing at the first event (the recall tools join
    the view, and tools come first in a prompt)."""
    was_active, was_first, was_frontier, _ = before
    if was_active is None and was_frontier == 0:
        return 0
    if active != was_active or first != was_first:
        return fixed
    block = marks[active].tokens if active is not None else 0
    return fixed + block + sums[was_frontier] - sums[first]


def round_sizes(messages: list[dict], event_ids: list[str | None], policy: Policy, counter: TokenCounter,
                load_tool: str = "session_load") -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """The API rounds of ``messages`` and their tokens as sent raw and once compacted.

    "Raw" already counts the head/tail cut of results over ``max_result_tokens`` (that cut
    happens in every round); "compacted" is the round with its tool results placeholdered
    (or truncated, or kept) by their tool's rule. Counts are cached by event id.
    """
    if len(event_ids) != len(messages):
        raise ValueError(f"event_ids has {len(event_ids)} entries for {len(messages)} messages.")
    counts = [counter.count_message(m, k) for m, k in zip(messages, event_ids)]
    rounds = split_rounds(messages)
    names = tool_names_by_call_id(messages)
    raw, compacted = [], []
    for start, end in rounds:
        size = low = sum(counts[start:end])
        for i in range(start, end):
            if messages[i].get("role") != "tool":
                continue
            # Without rules, a result under max_result_tokens goes as it is (and, under
            # compact_min_tokens, stays so when eligible): no placeholder to build and count.
            plain = not policy.tool_rules and counts[i] - MESSAGE_OVERHEAD <= policy.max_result_tokens
            kept = counts[i] if plain else _compacted_count(
                messages[i], event_ids[i], counts[i], names, policy, counter, load_tool, False)
            eligible = counts[i] if plain and counts[i] < policy.compact_min_tokens else _compacted_count(
                messages[i], event_ids[i], counts[i], names, policy, counter, load_tool, True)
            size -= counts[i] - kept
            low -= counts[i] - eligible
        raw.append(size)
        compacted.append(low)
    return rounds, raw, compacted


def _compacted_count(message: dict, event_id: str | None, tokens: int, names: dict[str, str], policy: Policy,
                     counter: TokenCounter, load_tool: str, eligible: bool) -> int:
    def build() -> dict:
        return _compact_one(message, event_id, tokens, names, policy, counter, load_tool, eligible)[0]

    key = _count_key(message, event_id, tokens, names, policy, load_tool, eligible)
    return counter.count_message(build()) if key is None else counter.count_built(key, build)


def _count_key(message: dict, event_id: str | None, tokens: int, names: dict[str, str], policy: Policy,
               load_tool: str, eligible: bool) -> str | None:
    """Cache key of a tool result's count as the view sends it: everything its form depends on."""
    if event_id is None:
        return None
    rule = policy.tool_rule(names.get(str(message.get("tool_call_id") or ""), ""))
    return (f"{event_id}|{load_tool}|{'c' if eligible else 'k'}|{tokens}|{policy.compact_min_tokens}|"
            f"{policy.max_result_tokens}|{rule!r}")


def _compact_one(message: dict, event_id: str | None, tokens: int, names: dict[str, str], policy: Policy,
                 counter: TokenCounter, load_tool: str, eligible: bool) -> tuple[dict, bool]:
    """One tool result as the view sends it, and whether it became a placeholder."""
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
        # Two thirds head, one third tail: the start of a result says what it is, the end how it ended.
        max_head = policy.max_result_tokens * 2 // 3
        return _truncated(message, max_head, policy.max_result_tokens - max_head, event_id, load_tool, counter), False
    return message, False


def compact_tool_results(
    messages: list[dict],
    event_ids: list[str | None],
    policy: Policy,
    counter: TokenCounter,
    load_tool: str = "session_load",
    *,
    budget: int | None = None,
    fixed_tokens: int = 0,
    frontier_at: int | None = None,
) -> tuple[list[dict], CompactionStats]:
    """A new list with eligible tool results compacted, and what it saved.

    ``messages`` is the non-system tail after the summary boundary; ``event_ids`` runs parallel
    to it. Tool results in rounds before the frontier are placeholdered (or truncated, or kept)
    by their tool's rule; results without an event id are never placeholdered because nothing
    could load them back. Any non-"keep" result larger than ``max_result_tokens`` that is not
    placeholdered is head/tail truncated, protected rounds included.

    The frontier: ``frontier_at`` (a message index, from ``plan_view``: whole rounds ending at or
    before it are eligible); else, with ``budget`` (and ``fixed_tokens``, what the view costs
    besides these messages), it follows the view's size (``compaction_frontier_for``); else it
    is every round but the protected ones, in batches (``compaction_frontier``). The newest
    ``compact_keep_rounds`` are never eligible.
    """
    counts = [counter.count_message(m, k) for m, k in zip(messages, event_ids)]
    names = tool_names_by_call_id(messages)
    stats = CompactionStats()
    stats.tokens_before = stats.tokens_after = sum(counts)
    if frontier_at is not None:
        rounds = split_rounds(messages)
        frontier = sum(1 for _, end in rounds if end <= frontier_at)
        frontier = max(0, min(frontier, len(rounds) - policy.compaction_keep))
    else:
        rounds, raw, compacted = round_sizes(messages, event_ids, policy, counter, load_tool)
        if budget is None:
            frontier = compaction_frontier(len(rounds), policy)
        else:
            frontier = compaction_frontier_for(raw, compacted, fixed_tokens, policy, budget)
            stats.compacted_tokens = sum(c for c, r in zip(compacted[:frontier], raw) if c < r)  # rounds with placeholders
            stats.raw_tail_tokens = sum(raw[frontier:])
    out = list(messages)
    for r, (start, end) in enumerate(rounds):
        before, placeholders = stats.tokens_after, 0
        for i in range(start, end):
            if messages[i].get("role") != "tool":
                continue
            new, replaced = _compact_one(messages[i], event_ids[i], counts[i], names, policy, counter, load_tool, r < frontier)
            if new is messages[i]:
                continue
            out[i] = new
            (stats.placeholders if replaced else stats.cut).append(i)
            placeholders += replaced
            stats.replaced += replaced
            stats.truncated += not replaced
            key = _count_key(messages[i], event_ids[i], counts[i], names, policy, load_tool, r < frontier)
            stats.tokens_after += (counter.count_message(new) if key is None else counter.count_built(key, lambda: new)) - counts[i]
        if frontier_at is not None:
            size = sum(counts[start:end]) + stats.tokens_after - before
            if r >= frontier:
                stats.raw_tail_tokens += size
            elif placeholders:
                stats.compacted_tokens += size  # rounds with placeholders
    return out, stats


def _truncated(
    message: dict, head: int, tail: int, event_id: str | None, load_tool: str, counter: TokenCounter
) -> dict:
    text = content_text(message.get("content"))
    cut = truncate_head_tail(text, head, tail, counter, truncation_marker(event_id, load_tool))
    return message if cut == text else with_text(message, cut)
