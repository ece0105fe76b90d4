"""A new checkpoint, checked before it replaces the old one (``policies/summary_check.py``).

The summary job calls ``check`` with what it is about to write; the answer is the summary and
state to write (repaired when the check could repair them), or None: refused, the old checkpoint
stays. Every outcome is counted in ``palimpsest_summary_checks_total{outcome}``, each problem in
``palimpsest_summary_check_problems_total{problem}``.
"""

from __future__ import annotations

import logging

from policies.extraction import values_in
from policies.messages import call_arguments, content_text, tool_calls
from policies.pinned import fold_rules, partition_rules, rule_ops
from gateway.pipeline.offload import pure as off_loop  # a big covered span is read in a worker thread
from policies.summary_check import SummaryCheck, check_summary
from policies.tokens import TokenCounter

log = logging.getLogger("palimpsest.summary")
# Kinds a summary's own text is held to across checkpoints (the rare, costly-to-lose ones), and
# how many values per kind a repair keeps at most (past it, recall still finds them all).
HELD_KINDS = ("ids", "urls", "versions", "emails")
MAX_HELD = 1000


def covered_values(previous, delta_state: dict) -> dict[str, list[str]]:
    """Every exact value the new checkpoint must hold: the previous checkpoint's (its state and
    the rare values its summary quoted) and the delta's."""
    quoted = values_in(previous.summary) if previous is not None and previous.summary else {}
    old = previous.state if previous is not None else {}
    out: dict[str, list[str]] = {}
    for key in {*(old or {}), *delta_state, *(k for k in HELD_KINDS if quoted.get(k))}:
        values = [*(old or {}).get(key, []), *(quoted.get(key, []) if key in HELD_KINDS else []), *delta_state.get(key, [])]
        out[key] = list(dict.fromkeys(values))[:MAX_HELD]
    return out


def overflow_rules(covered: list[dict], policy, budget: int, counter: TokenCounter) -> list[str]:
    """The covered span's standing instructions the pinned block cannot hold: all of them when
    pinning is off, none when the budget is unknown (every one stays pinned)."""
    entries = [(None, ops) for m in covered if m.get("role") == "user"
               and (ops := rule_ops(content_text(m.get("content"))))]
    rules = fold_rules(entries)
    if not rules:
        return []
    if policy.pinned_ratio <= 0:
        return [r.text for r in rules]
    if not budget:
        return []
    return [r.text for r in partition_rules(rules, int(policy.pinned_ratio * budget), counter.count_text).overflow]


def judge(covered: list[dict], *, summary: str, state: dict, covered_state: dict, previous_summary: str | None,
          policy, budget: int, counter: TokenCounter) -> SummaryCheck:
    """The verdict on a checkpoint about to be written (pure: run off the event loop when the
    covered span is big)."""
    user_texts = [content_text(m.get("content")) for m in covered if m.get("role") == "user"]
    other_texts = [" ".join([content_text(m.get("content")), *(call_arguments(c) for c in tool_calls(m))])
                   for m in covered if m.get("role") != "user"]
    return check_summary(summary, state, covered_state=covered_state,
                         overflow_rules=overflow_rules(covered, policy, budget, counter),
                         user_texts=user_texts, other_texts=other_texts, previous_summary=previous_summary)


async def check(*, key: str, covered: list[dict], summary: str, state: dict, covered_state: dict,
                previous_summary: str | None, policy, budget: int, counter: TokenCounter, metrics) -> tuple[str, dict] | None:
    verdict = await off_loop(judge, covered, summary=summary, state=state, covered_state=covered_state,
                             previous_summary=previous_summary, policy=policy, budget=budget, counter=counter)
    metrics.summary_checks.labels(verdict.outcome).inc()
    for problem in verdict.problems:
        metrics.summary_check_problems.labels(problem).inc()
    if verdict.outcome != "passed":
        # Problems are kinds ("values", "rules", "invented"), never summary text.
        log.warning("summary check", extra={"fields": {"session": key, "outcome": verdict.outcome,
                                                       "problems": list(verdict.problems)}})
    if verdict.outcome == "refused":
        return None
    return verdict.summary, verdict.state
