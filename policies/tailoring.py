"""Tailoring: the last guarantee that the outgoing request fits the model's budget.

Order of sacrifice: the oldest API rounds go first, whole, so tool pairs never split; then the
largest messages are cut head/tail with a marker (conversation before instructions). The
leading system messages, the summary block, the user message that started the current turn
and the newest round always stay. That user message is never cut unless the caller allows it
(``truncate_last``): the client must learn that its request did not fit. When nothing more can
give, ``ContextOverflow`` carries the numbers for a 400 ``context_length_exceeded`` instead of a
request the provider would reject.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.messages import INSTRUCTION_ROLES, content_text, with_text
from policies.projection import is_summary_block
from policies.rounds import last_user_index, split_rounds
from policies.tokens import REPLY_PRIMING, TokenCounter

# A message is never cut below this many tokens of content: less says nothing useful, and
# cutting further would only trade one overflow for a meaningless request.
MIN_TRUNCATED_TOKENS = 64
CUT_STEP_TOKENS = 1024
TRUNCATION_MARKER = "\n…[{omitted} tokens omitted by the gateway to fit the context window]…\n"


class ContextOverflow(Exception):
    """The request cannot fit the budget even after dropping and truncating."""

    def __init__(self, needed: int, budget: int) -> None:
        self.needed = needed
        self.budget = budget
        super().__init__(
            f"This request needs at least {needed} tokens after dropping old turns and truncating, "
            f"but the model's budget is {budget} tokens."
        )


@dataclass
class TailorStats:
    dropped_rounds: int = 0
    dropped_messages: int = 0
    truncated_messages: int = 0
    truncated_tool_results: int = 0
    truncated_last_message: bool = False
    tokens_before: int = 0
    tokens_after: int = 0
    kept: list[int] | None = None  # per output message, its index in the input (None: all kept)
    cut: list[int] = field(default_factory=list)  # output positions whose content was cut


def tailor(
    messages: list[dict],
    budget: int,
    counter: TokenCounter,
    fixed_tokens: int = 0,
    keys: list[str | None] | None = None,
    truncate_last: bool = False,
) -> tuple[list[dict], TailorStats]:
    """``messages`` (leading system/developer first) fitted into ``budget`` tokens.

    ``fixed_tokens`` is what the request costs besides messages (tool schemas). Returns a new
    list; the input is not mutated. Raises ``ContextOverflow`` when nothing more can give; the
    newest user message is cut only with ``truncate_last``.
    """
    if keys is None:
        keys = [None] * len(messages)
    elif len(keys) != len(messages):
        raise ValueError(f"keys has {len(keys)} entries for {len(messages)} messages.")
    counts = [counter.count_message(m, k) for m, k in zip(messages, keys)]
    total = sum(counts) + REPLY_PRIMING + fixed_tokens
    stats = TailorStats(tokens_before=total, tokens_after=total)
    if total <= budget:
        return list(messages), stats

    lead = 0
    while lead < len(messages) and messages[lead].get("role") in INSTRUCTION_ROLES:
        lead += 1
    last_user = last_user_index(messages)
    last_user = last_user if last_user is not None and last_user >= lead else None
    rounds = []
    for s, e in split_rounds(messages[lead:]):
        s, e = s + lead, e + lead
        if s == last_user and e - s > 1:
            rounds += [(s, s + 1), (s + 1, e)]  # the task stays; the step that answered it may go
        else:
            rounds.append((s, e))

    # Drop whole rounds, oldest first; the newest round, the current turn's user message and
    # summary-block rounds stay.
    dropped: set[int] = set()
    for start, end in rounds[:-1]:
        if total <= budget:
            break
        if end - start == 1 and (is_summary_block(messages[start]) or start == last_user):
            continue
        dropped.update(range(start, end))
        total -= sum(counts[start:end])
        stats.dropped_rounds += 1
        stats.dropped_messages += end - start
    kept = [i for i in range(len(messages)) if i not in dropped]
    stats.kept = kept
    out = [messages[i] for i in kept]
    sizes = [counts[i] for i in kept]

    # Still over: cut the largest conversation messages, then the instructions.
    if total > budget:
        protected = {last_user} if not truncate_last else set()
        conversation = [j for j, i in enumerate(kept)
                        if i >= lead and not is_summary_block(messages[i]) and i not in protected]
        instructions = [j for j, i in enumerate(kept) if i < lead or is_summary_block(messages[i])]
        for group in (conversation, instructions):
            for j in sorted(group, key=lambda j: sizes[j], reverse=True):
                if total <= budget:
                    break
                shrunk = _shrink(out[j], sizes[j], total - budget, counter)
                if shrunk is None:
                    continue
                new_size = counter.count_message(shrunk)
                total -= sizes[j] - new_size
                out[j], sizes[j] = shrunk, new_size
                stats.truncated_messages += 1
                stats.cut.append(j)
                stats.truncated_tool_results += out[j].get("role") == "tool"
                stats.truncated_last_message |= kept[j] == last_user
    stats.tokens_after = total
    if total > budget:
        raise ContextOverflow(total, budget)
    return out, stats


def _shrink(message: dict, size: int, excess: int, counter: TokenCounter) -> dict | None:
    """``message`` with its content cut by about ``excess`` tokens, or None if it cannot give.

    Only content is cut: tool-call arguments must stay valid JSON for the provider's template.
    """
    text = content_text(message.get("content"))
    if not text:
        return None
    # Difference of two hash-cached counts: an agent loop over budget hits this every turn, and
    # re-encoding a huge message each time would blow the latency budget.
    role = message.get("role")
    content_tokens = counter.count_message({"role": role, "content": text}) - counter.count_message({"role": role})
    # The marker itself costs tokens; aim a little lower so one cut is enough.
    target = content_tokens - excess - counter.count_text(TRUNCATION_MARKER) - 8
    if target > 2 * CUT_STEP_TOKENS:
        # Cut on a coarse grid: while an agent loop grows by a few messages per turn the cut
        # stays the same, so our slice cache and the provider's prompt cache both keep hitting.
        target = target // CUT_STEP_TOKENS * CUT_STEP_TOKENS
    target = max(MIN_TRUNCATED_TOKENS, target)
    if target >= content_tokens:
        return None
    head = target * 2 // 3
    cut = counter.head_tail(text, head, target - head)
    if cut is None:
        return None
    head_text, tail_text, omitted = cut
    return with_text(message, f"{head_text}{TRUNCATION_MARKER.replace('{omitted}', str(omitted))}{tail_text}")
