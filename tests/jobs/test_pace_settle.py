"""The background summary decision (gateway/jobs/pace.summary_due) prices the view an event
settles at with the settle size the view was planned with (``View.settle_tokens``, the plan's
``policies/cost.settle_size``), not the profile's ``view_target_ratio``; a view the planner did
not plan (forwarded untouched) falls back to the profile's size. End to end on the three wire
formats: tests/pipeline/test_settle_size.py."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.jobs import pace
from gateway.pipeline.view import View
from policies import Policy
from policies.tokens import TokenCounter
from store.canonical import path_ids

BUDGET = 32_000
COUNTER = TokenCounter()


def turn(settle_tokens: float | None, *, client_tokens: int = 90_000, view_tokens: int = 26_000, turns: int = 60):
    history: list[dict] = [{"role": "user", "content": "start"}]
    for k in range(turns):
        history += [{"role": "assistant", "content": f"answer {k}"}, {"role": "user", "content": f"question {k}"}]
    view = View(client_tokens=client_tokens, upstream_tokens=view_tokens, budget=BUDGET, policy=Policy(),
                checkpoint="cp_1", settle_tokens=settle_tokens)
    chat = SimpleNamespace(history=history, ids=path_ids(history), added=1)
    return SimpleNamespace(view=view, chat=chat)


def test_the_case_carries_the_view_s_settle_size(monkeypatch):
    cases = []
    monkeypatch.setattr(pace, "cost_summary_due", lambda case, *a, **k: cases.append(case) or False)
    pace.summary_due(turn(12_000.0), COUNTER, forks=False)
    pace.summary_due(turn(None), COUNTER, forks=False)
    assert [c.target_tokens for c in cases] == [12_000, int(Policy().view_target_ratio * BUDGET)]


def test_the_decision_follows_the_settle_size():
    """Over the budget, a summary pays by what the smaller views it enables save: settled at the
    profile's floor that is most of the view, settled just under the view almost nothing."""
    assert pace.summary_due(turn(None), COUNTER, forks=False)
    assert pace.summary_due(turn(Policy().view_target_ratio * BUDGET), COUNTER, forks=False)
    assert not pace.summary_due(turn(25_900.0), COUNTER, forks=False)
