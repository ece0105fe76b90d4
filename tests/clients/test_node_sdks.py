"""The official Node SDKs' streamed tool loops through the gateway: ``openai``
(``responses.stream`` and ``chat.completions.stream``) and ``@anthropic-ai/sdk``
(``messages.stream``, a cache_control breakpoint on its tools). The same chain and recall question
as tests/clients/test_ai_sdk.py; the script is tests/clients/node/sdks.mjs."""

from __future__ import annotations

import pytest

from gateway.keys import LEDGER
from tests.clients.node_run import (ANSWER, MODEL, PATHS, STEPS, TOKENS, assert_compacted_upstream,
                                    conversation, run_node)
from tests.clients.rig import GATEWAY, session_id
from tests.support.agent import settle

LAST_EVENT = {"responses": "response.completed", "chat": "chat.completion.chunk", "messages": "message_stop"}


@pytest.mark.parametrize("api", ["responses", "chat", "messages"])
async def test_official_sdk_streamed_tool_loop_and_recall(start_gateway, upstream, api):
    gw = await start_gateway(**GATEWAY)
    got = await run_node("sdks.mjs", {"api": api, "baseURL": gw.base_url, "root": gw.root, "model": MODEL,
                                      "session": session_id(f"sdk-{api}"), "steps": STEPS, "tokens": TOKENS})
    assert got["results"] == list(range(1, STEPS + 1))
    assert got["calls"] == ["run_step"] * STEPS  # no session_search reached the client
    assert f"step {STEPS} of {STEPS}" in got["loop"]
    assert ANSWER in got["recall"]
    assert got["usage"]["input"] > 0 and got["usage"]["output"] > 0
    assert LAST_EVENT[api] in got["events"] and "error" not in got["events"]
    # On this transcript in Messages form the simulator's summaries come out over the summary
    # token limit (1.4k tokens > 1.2k for 400 words): the gateway rejects both attempts, as it
    # should, and the placeholders alone keep the chain inside the window.
    assert_compacted_upstream(upstream, PATHS[api], summary_adopted=api != "messages")


@pytest.mark.parametrize("upstream_api", ["responses", "chat"])
async def test_openai_sdk_previous_response_id_tool_loop(start_gateway, upstream, upstream_api):
    """The openai SDK's stored-conversation pattern: ``store: true``, each request only the new
    function outputs (or question) and ``previous_response_id``. The gateway rebuilds each chain
    from the ledger and sends it whole and compacted (no id upstream), on a Responses and on a
    chat-only upstream; the session is one branch."""
    gw = await start_gateway(**GATEWAY, models={MODEL: {"api": upstream_api}})
    session = session_id(f"sdk-chain-{upstream_api}")
    got = await run_node("sdks.mjs", {"api": "responses", "baseURL": gw.base_url, "root": gw.root, "model": MODEL,
                                      "session": session, "steps": STEPS, "tokens": TOKENS, "chain": True})
    assert got["results"] == list(range(1, STEPS + 1)) and got["calls"] == ["run_step"] * STEPS
    assert ANSWER in got["recall"]
    assert_compacted_upstream(upstream, PATHS[upstream_api])
    assert not [b for b in conversation(upstream, PATHS[upstream_api]) if b.get("previous_response_id")]
    await settle(gw)
    ledger = gw.app[LEDGER]
    records = [r for r in ledger.sessions() if r.session_id == session]
    assert len(records) == 1 and len(ledger.heads(records[0].key)) == 1
