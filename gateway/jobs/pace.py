"""A session's pace, read off its path, for the cost model's summary decision
(``policies/cost.summary_due``).

After each response the summarizer asks ``summary_due`` whether a background summary is worth
writing. The inputs come from the request itself, so every replica (and a restart) decides the
same: the session's requests so far are the client turns on its path (each user message or tool
result is what a client sends a request with), its growth is what the client added since
its previous request (the newest answer and what follows it), and its pace the client's tokens
per request so far (the interval rule of ``policies/cost.event_pays``). A cache-forked call's
input is priced as cached by the model's cache rule (its minimum prefix and step).
"""

from __future__ import annotations

from policies import TokenCounter
from policies.path_memo import PathMemo
from policies.cost import (SUMMARY_TOKENS_PER_WORD, SummaryCase, cacheable, cost_rates, requests_on_path,
                           requests_seen, summary_due as cost_summary_due, turns_after)

__all__ = ["growth_on_path", "requests_on_path", "requests_on_ids", "summary_due"]

TURNS_MEMO = 4096  # path points remembered (event id -> client turns up to it, its role)
TURNS_LOOKBACK = 16  # how far back from a path's end an earlier path's end is looked for
TURNS_STRIDE = 32  # also remembered: every 32nd message (a sibling branch's shared history)
_turns = PathMemo(stride=TURNS_STRIDE, look_back=TURNS_LOOKBACK)


def requests_on_ids(history: list[dict], ids: list[str] | None) -> int:
    """``requests_on_path`` of a path whose event ids are `ids`, counted on from the longest
    leading part remembered (``PathMemo``): a resent history costs a count of what it added,
    not a walk over all of it; an edited message changes every later id (counted afresh)."""
    if not ids or len(ids) != len(history):
        return requests_on_path(history)
    turns, _ = _turns.fold(ids, lambda state, start, stop: turns_after(history[start:stop], *state), (0, None),
                           keep=TURNS_MEMO)
    return turns


def growth_on_path(history: list[dict], ids: list[str], counter: TokenCounter) -> int:
    """Tokens the client added since its previous request: the newest answer and after."""
    last = next((i for i in range(len(history) - 1, -1, -1) if history[i].get("role") == "assistant"), None)
    if last is None:
        return 0
    return sum(counter.count_message(m, k) for m, k in zip(history[last:], ids[last:]))


def arrived(chat) -> bool:
    """Did this request bring its whole history, none of it held by the ledger before? (The
    path's ids are chained, so "its first event was unknown" means every event was.)"""
    return bool(chat.history) and chat.added is not None and chat.added >= len(chat.history)


def summary_due(turn, counter: TokenCounter, forks: bool) -> bool:
    """After a response: should a background summary be written now? (`forks`: the summary
    call would be a cache fork of the view just sent.)"""
    view, chat = turn.view, turn.chat
    policy = view.policy
    if not policy.cost_model:
        return view.upstream_tokens >= policy.summary_trigger_ratio * view.budget
    rates = cost_rates(policy)
    # An arrival (this request brought its whole history to the ledger) has run one request.
    requests = requests_seen(requests_on_ids(chat.history, chat.ids), arrived(chat))
    # A fork reads the view; a view with a checkpoint folds about what it shows after the
    # boundary; without one, everything.
    summary_input = view.upstream_tokens if forks or view.checkpoint else view.client_tokens
    case = SummaryCase(
        client_tokens=view.client_tokens, view_tokens=view.upstream_tokens, budget=view.budget,
        growth=growth_on_path(chat.history, chat.ids, counter), requests=requests,
        summary_input=summary_input,
        summary_output=int(policy.summary_max_words * SUMMARY_TOKENS_PER_WORD),
        # The size the view's plan settles an event at (the cost model's, per round), as the
        # planner chose it for this view; a view it did not plan (untouched) at the profile's.
        target_tokens=int(view.settle_tokens or policy.view_target_ratio * view.budget),
        # A fork re-reads the view just sent: the part the provider's cache rule serves (its
        # minimum prefix and step) at the read rate.
        cached_share=cacheable(summary_input, rates) / summary_input if forks and summary_input else 0.0,
        pace=view.client_tokens / max(1, requests),
    )
    return cost_summary_due(case, policy.summary_trigger_ratio, rates, fit_first=policy.fit_first)
