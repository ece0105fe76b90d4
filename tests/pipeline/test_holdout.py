"""The holdout (`[policy] holdout_share`): a deterministic share of sessions goes as direct
(untouched while it fits, the oldest rounds cut when it does not, no summaries, still
recorded), and the metrics carry each request's arm, on every wire format."""

from __future__ import annotations

import openai

from gateway.keys import LEDGER, METRICS
from policies.holdout import COMPACTED, HOLDOUT, arm
from simulator.workloads import agent_loop_session, synthetic_session
from tests.messages.test_messages import client_for, run_loop
from tests.support.agent import drive, drive_responses_loop, settle

WINDOW = 32_000


def sample(gw, name: str, **labels) -> float:
    return gw.app[METRICS].registry.get_sample_value(name, labels) or 0


def summary_calls(upstream) -> list[dict]:
    return [r for r in upstream.received if r["headers"].get("x-palimpsest-purpose") == "summary"]


def test_the_arm_is_a_deterministic_share_of_sessions():
    keys = [f"tenant/session-{i}" for i in range(4000)]
    held = [k for k in keys if arm(k, 0.2) == HOLDOUT]
    assert 0.17 < len(held) / len(keys) < 0.23
    assert [arm(k, 0.2) for k in keys] == [arm(k, 0.2) for k in keys]  # same session, same arm
    assert all(arm(k, 0.3) == HOLDOUT for k in held)  # a bigger share keeps the held sessions held
    assert all(arm(k, 0.0) == COMPACTED for k in keys) and all(arm(k, 1.0) == HOLDOUT for k in keys)


def assert_direct_like(upstream, path: str, key: str) -> list[dict]:
    views = [r["json"] for r in upstream.received if r["path"] == path and r.get("json")
             and not r["headers"].get("x-palimpsest-purpose")]
    assert views and not summary_calls(upstream)  # no summaries in the holdout arm
    for body in views:
        text = str(body)
        assert "session_search" not in text and "<session_summary>" not in text  # no recall tools, no summary block
    return [body[key] for body in views]


async def test_a_chat_session_in_the_holdout_goes_as_direct_and_is_recorded(start_gateway, upstream):
    gw = await start_gateway(policy={"holdout_share": 1.0})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-h", max_retries=0, default_headers={"X-Session-Id": "h-chat"})
    history, _ = await drive(api, synthetic_session(seed=4, rounds=40), model="fake-32k")
    await api.close()
    await settle(gw)
    sent = assert_direct_like(upstream, "/v1/chat/completions", "messages")
    # While it fits the client's request goes as it came; once it does not, the oldest rounds go
    # (what remains is the system prompt and a suffix of the client's history, unchanged).
    assert sent[0] == history[:len(sent[0])]
    last = sent[-1]
    assert last[0] == history[0] and len(last) < len(history) - 1
    assert last[1:] == history[len(history) - 1 - len(last[1:]):-1]
    # Recorded all the same, and counted in its arm.
    assert gw.app[LEDGER].sessions()
    assert sample(gw, "palimpsest_arm_requests_total", arm="holdout", status="200") == len(sent)
    assert sample(gw, "palimpsest_arm_requests_total", arm="compacted", status="200") == 0
    assert sample(gw, "palimpsest_arm_billed_units_total", arm="holdout", what="billed") > 0
    assert sample(gw, "palimpsest_arm_billed_units_total", arm="holdout", what="direct") > 0


async def test_without_a_holdout_every_session_is_compacted_and_counted_so(start_gateway, upstream):
    gw = await start_gateway()
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-h", max_retries=0, default_headers={"X-Session-Id": "c-chat"})
    await drive(api, synthetic_session(seed=4, rounds=40), model="fake-32k")
    await api.close()
    await settle(gw)
    assert sample(gw, "palimpsest_arm_requests_total", arm="holdout", status="200") == 0
    assert sample(gw, "palimpsest_arm_requests_total", arm="compacted", status="200") > 0
    client = sample(gw, "palimpsest_arm_prompt_tokens_total", arm="compacted", side="client")
    assert sample(gw, "palimpsest_arm_prompt_tokens_total", arm="compacted", side="upstream") < client / 2
    assert summary_calls(upstream)  # the compacted arm summarises (and its summary calls count to it)
    assert sample(gw, "palimpsest_arm_billed_units_total", arm="compacted", what="billed") > 0


async def test_a_responses_session_in_the_holdout_goes_as_direct(start_gateway, upstream):
    gw = await start_gateway(policy={"holdout_share": 1.0})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-h", max_retries=0, default_headers={"X-Session-Id": "h-resp"})
    items, responses = await drive_responses_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="fake-32k")
    await api.close()
    await settle(gw)
    assert len(responses) == 41  # every call answered: the upstream (strict) never refused a cut
    sent = assert_direct_like(upstream, "/v1/responses", "input")
    assert sent[0] == items[:len(sent[0])]
    assert len(sent[-1]) < len(items) - 1 and sent[-1][-1] in items  # the oldest items were cut
    assert sample(gw, "palimpsest_arm_requests_total", arm="holdout", status="200") == len(sent)


async def test_a_messages_session_in_the_holdout_goes_as_direct(start_gateway, upstream):
    gw = await start_gateway(policy={"holdout_share": 1.0})
    history, answers = await run_loop(client_for(gw), "h-msg", 30)
    await settle(gw)
    assert len(answers) == 30
    sent = assert_direct_like(upstream, "/v1/messages", "messages")
    assert len(sent[-1]) < len(history) - 1  # the oldest turns were cut once it stopped fitting
    assert sample(gw, "palimpsest_arm_requests_total", arm="holdout", status="200") == 30
