"""The Responses API on an upstream that speaks only Chat Completions (``api = "chat"``).

The client (the official SDK, as Codex uses the API: store false, the whole input every call)
runs a long tool loop on a 32k model; the gateway compacts the Responses view, renders it as
Chat Completions for the simulated chat-only upstream, and answers in the Responses API, JSON
and streamed. Every upstream request must be paired and inside the window.
"""

from __future__ import annotations

import openai
import pytest

from simulator.workloads import agent_loop_session
from tests.gateway.test_agent_loops import assert_valid_and_fits, forwarded, is_placeholder
from tests.support.agent import drive_responses_loop, responses_turn, settle
from gateway.keys import LEDGER


def client(gw, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": session}, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_long_responses_loop_is_compacted_on_a_chat_only_upstream(start_gateway, upstream, stream):
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": "chat"}})
    session = agent_loop_session(seed=5, turns=1, calls=40)
    items, responses = await drive_responses_loop(client(gw, f"r-{stream}"), session, model="fake-32k", stream=stream)
    await settle(gw)
    assert len(responses) == 41
    assert responses[-1].output_text.startswith("Tool ")  # the loop ran to its end
    bodies = forwarded(upstream)
    assert len(bodies) >= 41
    assert_valid_and_fits(bodies)
    assert any(is_placeholder(m) for m in bodies[-1]["messages"])  # old outputs became placeholders
    client_items = sum(len(str(i)) for i in items)
    assert len(str(bodies[-1]["messages"])) < client_items / 2
    # The conversation is one branch: what the client resent matched what the gateway recorded.
    ledger = gw.app[LEDGER]
    key = next(s.key for s in ledger.sessions() if s.session_id == f"r-{stream}")
    assert len(ledger.heads(key)) == 1


async def test_recall_is_resolved_by_the_gateway_through_the_responses_api(start_gateway, upstream):
    gw = await start_gateway(models={"fake-32k": {"context_window": 32_000, "api": "chat"}})
    session = agent_loop_session(seed=7, turns=1, calls=40)
    c = client(gw, "recall")
    items, _ = await drive_responses_loop(c, session, model="fake-32k")
    await settle(gw)
    fact = session.facts[0]
    for stream in (False, True):
        asked = [*items, {"type": "message", "role": "user", "content": f"RECALL: {fact.question}"}]
        output, response = await responses_turn(c, asked, model="fake-32k", stream=stream)
        assert [i["type"] for i in output] == ["message"]  # the recall calls never reached the client
        assert fact.answer in response.output_text
        assert response.usage.input_tokens > 0
