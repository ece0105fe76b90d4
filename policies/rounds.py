"""API rounds: the unit in which history is kept, summarised, compacted and dropped.

An API round is one model turn: an assistant message plus the tool results answering its
calls. A round also starts at every user message, so a round is a user message and the answer
to it, or one step of an agent loop inside a user turn (the assistant's next call after tool
results). A 60-call chain under one user message is 60 rounds, so it can be compacted and
summarised like any conversation. An assistant tool call and its results always share a round;
cutting history only at closed round ends keeps every request valid by OpenAI's tool-pairing
rules, which ``tool_pair_problems`` states as a checkable function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.messages import tool_calls

if TYPE_CHECKING:
    from policies.policy import Policy
    from policies.tokens import TokenCounter


def split_rounds(messages: list[dict]) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` ranges over non-system messages, one per API round.

    A new round starts at every user message and at every non-tool message that follows a
    tool message (the model's next step after reading results); whatever precedes the first
    such start forms round 0 on its own.
    """
    bounds: list[tuple[int, int]] = []
    start = 0
    previous = None
    for index, message in enumerate(messages):
        role = message.get("role")
        if index > start and (role == "user" or (previous == "tool" and role != "tool")):
            bounds.append((start, index))
            start = index
        previous = role
    if start < len(messages):
        bounds.append((start, len(messages)))
    return bounds


def last_user_index(messages: list[dict]) -> int | None:
    """Index of the newest user message: the one that started the current turn."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None


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

    The raw tail is the newest API rounds that fit ``keep_recent_tokens`` (the caller scales it
    to the budget with ``Policy.for_budget``), at least ``keep_recent_rounds`` of them unless
    those alone exceed the cap, and never fewer than one: a summary covers only what the view
    cannot keep raw. The cut may fall inside a user turn (the caller keeps
    that turn's user message in the view). It sits at the end of a closed round, moving earlier
    if needed, so no tool call is separated from its results. None when there is nothing worth
    a summary: everything fits the tail, or the part to cover is under a quarter of the tail's
    cap (summaries come in batches, so the prompt prefix changes rarely).
    """
    rounds = split_rounds(messages)
    if len(rounds) < 2:
        return None
    if keys is None:
        keys = [None] * len(messages)
    sizes = [counter.count_message(m, k) for m, k in zip(messages, keys)]

    def round_tokens(r: int) -> int:
        start, end = rounds[r]
        return sum(sizes[start:end])

    n = len(rounds)
    cap = policy.keep_recent_tokens
    kept, kept_tokens = 1, round_tokens(n - 1)
    while kept < n:
        more = round_tokens(n - 1 - kept)
        if kept_tokens + more > cap:
            break
        kept, kept_tokens = kept + 1, kept_tokens + more
    if kept >= n:
        return None

    closed = _closed_round_ends(messages, rounds)
    for r in range(n - 1 - kept, -1, -1):
        if closed[r]:
            end = rounds[r][1]
            return end if sum(sizes[:end]) >= cap // 4 else None
    return None
