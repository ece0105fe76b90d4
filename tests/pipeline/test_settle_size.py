"""The settle size the cost model chooses (issue 29, item 3) is the one the upstream's views
settle at, on every wire format: with the model's own choice (policies/cost.settle_size) the size moves off the profile's constant once placeholders
pile up, and with the choice replaced by a bigger size the views grow to that size before each
compaction event, never back raw. What the choice is, for which session, is tested in
tests/policies/test_settle.py."""

from __future__ import annotations

import openai
import orjson
import pytest

from policies import cost
from policies.tokens import TokenCounter
from simulator.workloads import agent_loop_session
from tests.messages.test_messages import client_for, run_loop
from tests.pipeline.test_early_events import MARK, results, views
from tests.support.agent import drive_loop, drive_responses_loop, settle

SHARE = 0.375  # the replaced choice, of the budget: between view_target_ratio (0.1) and compact_trigger_ratio (0.65)
COUNTER = TokenCounter()


@pytest.fixture(autouse=True)
def fresh_memo():
    """settle_size's answers are memoized (policies/cost.settle_for): none kept across a replaced choice."""
    cost.settle_for.cache_clear()
    yield
    cost.settle_for.cache_clear()


def midway(floor, ceiling, **_):
    return SHARE * 32_000


def before_events(upstream, path: str) -> list[int]:
    """Tokens (of the request body as JSON: a little over the prompt's) of every view that came
    just before a compaction event's: the size the view had grown to when an event was taken."""
    compacted: set[str] = set()
    sizes, previous = [], None
    for body in views(upstream, path):
        now = {cid for cid, text in results(path, body) if MARK in text}
        assert compacted <= now, "a compacted result came back raw"
        if compacted and now - compacted and previous is not None:
            sizes.append(COUNTER.count_text(orjson.dumps(previous).decode()))
        compacted |= now
        previous = body
    return sizes


async def _chat(gw):
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-e", max_retries=0, default_headers={"X-Session-Id": "settle"})
    await drive_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="fake-32k")
    await api.close()


async def _responses(gw):
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-e", max_retries=0, default_headers={"X-Session-Id": "settle-r"})
    _, answered = await drive_responses_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="fake-32k")
    await api.close()
    assert len(answered) == 41


async def _messages(gw):
    await run_loop(client_for(gw), "settle-m", 30)


@pytest.mark.parametrize("drive, path", [(_chat, "/v1/chat/completions"), (_responses, "/v1/responses"),
                                         (_messages, "/v1/messages")])
async def test_views_settle_where_the_cost_model_chose(start_gateway, upstream, monkeypatch, drive, path):
    chosen: list[tuple[float, float]] = []

    def spy(floor, ceiling, **kw):
        chosen.append((floor, own(floor, ceiling, **kw)))
        return chosen[-1][1]

    own = cost.settle_size
    monkeypatch.setattr(cost, "settle_size", spy)
    cost.settle_for.cache_clear()  # the memo of settle_size's answers
    gw = await start_gateway()
    await drive(gw)
    await settle(gw)
    model = before_events(upstream, path)
    # The model's own choice, not the profile's constant: above the floor once placeholders pile up.
    assert chosen and any(size > floor for floor, size in chosen)
    upstream.received.clear()
    monkeypatch.setattr(cost, "settle_size", midway)
    cost.settle_for.cache_clear()
    gw = await start_gateway()
    await drive(gw)
    await settle(gw)
    replaced = before_events(upstream, path)
    assert model and len(replaced) > 2
    # Once the session is known not to fit for long (fit_first: the first event settles at the
    # profile's floor), an event comes once the view has grown past the size chosen (12,000
    # tokens here), not before; with the model's choice most events came well under it.
    assert min(replaced[1:]) > 0.95 * SHARE * 32_000
    assert sorted(model)[len(model) // 2] < 0.75 * min(replaced[1:])


@pytest.mark.parametrize("drive", [_chat, _responses, _messages])
async def test_the_summary_decision_prices_the_planned_settle_size(start_gateway, upstream, monkeypatch, drive):
    """The background summary decision (gateway/jobs/pace.summary_due) prices the view an event
    settles at with the size the view was planned with: the replaced choice, once the plan
    makes it, never only the profile's ``view_target_ratio``."""
    from gateway.jobs import pace

    targets: list[int] = []
    decide = pace.cost_summary_due
    monkeypatch.setattr(pace, "cost_summary_due", lambda case, *a, **k: targets.append(case.target_tokens) or decide(case, *a, **k))
    monkeypatch.setattr(cost, "settle_size", midway)
    cost.settle_for.cache_clear()
    gw = await start_gateway()
    await drive(gw)
    await settle(gw)
    assert int(SHARE * 32_000) in targets
    assert all(t == int(SHARE * 32_000) or t < 0.15 * 32_000 for t in targets)  # else the profile's floor (0.1)
