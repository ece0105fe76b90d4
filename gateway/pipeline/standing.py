"""The pinned block of standing instructions for a view (docs/architecture.md, "Pinned standing
instructions").

``policies/pinned.py`` finds the rules; this keeps what it found per event id (an event's text
never changes, and chat clients resend the whole history every turn) and folds it along the
request's path, so a request reads each user message once in the session's life.
"""

from __future__ import annotations

from policies.messages import content_text
from policies.pinned import PinnedRules, RuleOp, fold_rules, partition_rules, render_pinned_block, rule_ops
from policies.policy import Policy
from policies.tokens import TokenCounter

# Events whose rule operations are remembered (most have none); past it the memo starts over.
MEMO_EVENTS = 200_000


class StandingRules:
    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._ops: dict[str, tuple[RuleOp, ...]] = {}

    def ops(self, message: dict, event_id: str | None) -> tuple[RuleOp, ...]:
        if message.get("role") != "user":
            return ()
        found = self._ops.get(event_id) if event_id else None
        if found is None:
            found = rule_ops(content_text(message.get("content")))
            if event_id:
                if len(self._ops) >= MEMO_EVENTS:
                    self._ops.clear()
                self._ops[event_id] = found
        return found

    def rules(self, history: list[dict], ids: list[str], policy: Policy, budget: int) -> PinnedRules | None:
        """The session's standing rules on this path, split by the block's budget; None when
        pinning is off or there is no rule."""
        if policy.pinned_ratio <= 0:
            return None
        entries = [(eid, ops) for m, eid in zip(history, ids) if (ops := self.ops(m, eid))]
        if not entries:
            return None
        rules = fold_rules(entries)
        if not rules:
            return None
        return partition_rules(rules, int(policy.pinned_ratio * budget), self.counter.count_text)

    def block(self, rules: PinnedRules | None) -> str | None:
        return render_pinned_block(rules) if rules is not None else None

    def tokens(self, rules: PinnedRules | None) -> int:
        text = self.block(rules)
        return self.counter.count_text(text) + 4 if text else 0
