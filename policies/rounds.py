"""API rounds: the unit in which history is kept, summarised, compacted and dropped.

A round starts at a user message and runs to the next one, so an assistant tool call and its
results always share a round. Cutting history only at round ends keeps every request valid by
OpenAI's tool-pairing rules, which ``tool_pair_problems`` states as a checkable function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.messages import tool_calls

if TYPE_CHECKING:
    from policies.policy import Policy
    from policies.tokens import TokenCounter


def split_rounds(messages: list[dict]) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` ranges over non-system messages, one per round.

    A new round starts at every user message; whatever precedes the first user message (a
    greeting, an orphan tool exchange) forms round 0 on its own.
    """
    bounds: list[tuple[int, int]] = []
    start = 0
    for index, message in enumerate(messages):
        if message.get("role") == "user" and index > start:
            bounds.append((start, index))
            start = index
    if start < len(messages):
        bounds.append((start, len(messages)))
    return bounds


def tool_pair_problems(messages: list[dict]) -> list[str]:
    """Violations of OpenAI's tool-pairing rules; an empty list means the list is valid.

    Every ``tool`` message must answer a call of the nearest preceding assistant-with-tool_calls
    with only tool messages in between, and every call must be answered before the next
    non-tool message.
    """
    problems: list[str] = []
    caller: int | None = None  # index of the assistant whose results may follow
    expected: set[str] = set()
    answered: set[str] = set()

    def close(at: str) -> None:
        missing = sorted(expected - answered)
        if caller is not None and missing:
            problems.append(f"message {caller}: tool_call ids {missing} not answered before {at}")

    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if caller is None:
                problems.append(f"message {index}: tool result {call_id!r} without a preceding assistant tool call")
            elif call_id not in expected:
                problems.append(f"message {index}: tool result {call_id!r} answers no call of message {caller}")
            elif call_id in answered:
                problems.append(f"message {index}: tool_call id {call_id!r} answered twice")
            else:
                answered.add(call_id)
            continue
        close(f"message {index}")
        calls = tool_calls(message)
        if calls:
            caller, expected, answered = index, {c.get("id") for c in calls}, set()
        else:
            caller, expected, answered = None, set(), set()
    close("the end")
    return problems


def _closed_round_ends(messages: list[dict], rounds: list[tuple[int, int]]) -> list[bool]:
    """For each round, whether history may be cut right after it.

    True when every call made up to that round is answered inside it (no call waits for a
    result on the other side, and no result is separated from its call).
    """
    round_of = [0] * len(messages)
    for r, (start, end) in enumerate(rounds):
        for i in range(start, end):
            round_of[i] = r
    closed = [True] * len(rounds)
    call_round: dict[str, int] = {}
    for index, message in enumerate(messages):
        for call in tool_calls(message):
            call_round[call.get("id")] = round_of[index]
    answered: set[str] = set()
    for index, message in enumerate(messages):
        if message.get("role") != "tool":
            continue
        call_id = message.get("tool_call_id")
        answered.add(call_id)
        origin = call_round.get(call_id)
        if origin is not None:
            for r in range(origin, round_of[index]):
                closed[r] = False  # a pair spans this round end
    for call_id, r in call_round.items():
        if call_id not in answered:
            closed[r] = False  # incomplete round: its call still waits for a result
    return closed


def choose_boundary(
    messages: list[dict],
    counter: TokenCounter,
    policy: Policy,
    keys: list[str | None] | None = None,
) -> int | None:
    """End index (exclusive) of the prefix of ``messages`` to summarise, or None.

    The newest ``keep_recent_rounds`` rounds stay raw, fewer when they exceed
    ``keep_recent_tokens``, but never fewer than one. The cut sits at the end of a complete
    round, moving earlier if needed, so no tool call is separated from its results.
    """
    rounds = split_rounds(messages)
    if len(rounds) < 2:
        return None
    if keys is None:
        keys = [None] * len(messages)

    def round_tokens(r: int) -> int:
        start, end = rounds[r]
        return sum(counter.count_message(messages[i], keys[i]) for i in range(start, end))

    n = len(rounds)
    kept, kept_tokens = 1, round_tokens(n - 1)
    while kept < min(policy.keep_recent_rounds, n):
        more = round_tokens(n - 1 - kept)
        if kept_tokens + more > policy.keep_recent_tokens:
            break
        kept, kept_tokens = kept + 1, kept_tokens + more

    closed = _closed_round_ends(messages, rounds)
    for r in range(n - 1 - kept, -1, -1):
        if closed[r]:
            return rounds[r][1]
    return None
