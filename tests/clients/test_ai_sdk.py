"""The Vercel AI SDK (npm ``ai`` with ``@ai-sdk/openai`` and ``@ai-sdk/anthropic``) through the
gateway, on each API it speaks: ``openai(id)`` Responses (``store`` left at its default, so it
sends earlier answers as ``item_reference`` items), ``openai.chat(id)`` Chat Completions,
``anthropic(id)`` Messages (hour-long cache_control breakpoints on the system prompt and the task
via providerOptions).

Each runs its own tool loop (``generateText`` / ``streamText`` with ``stopWhen: stepCountIs``)
through a 12-step chain that overflows the 16k model, then asks back a fact only recall can
find. The client gets every step's tool call and the final text, never the gateway's recall
tools; the upstream gets compacted views (tests/clients/node_run.py). The scripts are
tests/clients/node/ai_sdk.mjs and steps.mjs; the packages are pinned in
tests/support/cli-packages.txt."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from gateway.keys import LEDGER
from simulator.messages_rules import blocks, validate
from tests.clients.node_run import (ANSWER, MODEL, PATHS, PLACEHOLDER, STEPS, TOKENS, assert_compacted_upstream,
                                    conversation, run_node)
from tests.clients.rig import GATEWAY, session_id
from tests.support.agent import settle


@pytest.mark.parametrize("mode", ["generate", "stream"])
@pytest.mark.parametrize("api", ["responses", "chat", "messages"])
async def test_ai_sdk_tool_loop_and_recall(start_gateway, upstream, api, mode):
    gw = await start_gateway(**GATEWAY)
    got = await run_node("ai_sdk.mjs", {"api": api, "mode": mode, "baseURL": gw.base_url, "model": MODEL,
                                        "session": session_id(f"ai-sdk-{api}-{mode}"), "steps": STEPS, "tokens": TOKENS})
    loop, recall = got["loop"], got["recall"]
    assert got["results"] == list(range(1, STEPS + 1))  # every tool ran, in order, once
    assert loop["tool_calls"] == ["run_step"] * STEPS and loop["tool_errors"] == []
    assert loop["steps"] == STEPS + 1 and loop["finish"][-1] == "stop"
    assert f"step {STEPS} of {STEPS}" in loop["text"]  # the model read the last tool result
    assert loop["usage"]["input"] > 0 and loop["usage"]["output"] > 0
    # The gateway's recall round is invisible: one step, text only, the fact in it.
    assert recall["steps"] == 1 and recall["tool_calls"] == [] and recall["tool_errors"] == []
    assert ANSWER in recall["text"]
    assert recall["usage"]["input"] > 0 and recall["usage"]["output"] > 0
    if mode == "stream":
        for parts in (loop["stream_parts"], recall["stream_parts"]):
            assert "error" not in parts and "finish" in parts
        assert "tool-call:run_step" in loop["stream_parts"]
        assert not [p for p in recall["stream_parts"] if p.startswith("tool")]
    assert_compacted_upstream(upstream, PATHS[api])
    bodies = conversation(upstream, PATHS[api])
    if api == "messages":  # every view by Anthropic's rules (<= 4 breakpoints, TTL order); the client's hour kept
        for r in upstream.received:
            if r["path"] == "/v1/messages" and r.get("json") and not r["headers"].get("x-palimpsest-purpose"):
                validate(r["json"], CIMultiDict(r["headers"]), upstream.state.secret)
        assert all("1h" in [t for _, _, t in blocks(body)] for body in bodies)
    if api == "responses":  # the loop's answer, resent by reference (store=true), goes up as the item itself
        assert not [i for i in bodies[STEPS + 1]["input"] if i.get("type") == "item_reference"]
        assert json.dumps(loop["text"])[1:-1] in json.dumps(bodies[STEPS + 1]["input"])


@pytest.mark.parametrize("upstream_api", ["responses", "chat"])
async def test_ai_sdk_responses_references_and_previous_response_id(start_gateway, upstream, upstream_api):
    """``openai(id)`` on a Responses and on a chat-only upstream: its recall turn resends the loop's
    answer as an ``item_reference``, which the gateway reads back from the ledger (the chat
    upstream gets the assistant's words; the session stays one branch); a third turn continues
    with ``providerOptions.openai.previousResponseId`` and only the new question, which the
    gateway rebuilds from the ledger (compacted) instead of passing the id on."""
    gw = await start_gateway(**GATEWAY, models={MODEL: {"api": upstream_api}})
    session = session_id(f"ai-sdk-refs-{upstream_api}")
    got = await run_node("ai_sdk.mjs", {"api": "responses", "mode": "generate", "baseURL": gw.base_url, "model": MODEL,
                                        "session": session, "steps": STEPS, "tokens": TOKENS, "previous": True})
    assert ANSWER in got["recall"]["text"] and ANSWER in got["previous"]["text"]
    assert got["previous"]["tool_calls"] == [] and got["previous"]["tool_errors"] == []
    bodies = conversation(upstream, PATHS[upstream_api])
    assert len(bodies) == STEPS + 1 + 2 + 2
    recall_view, previous_view = bodies[STEPS + 1], bodies[STEPS + 3]
    if upstream_api == "chat":
        assert {"role": "assistant", "content": got["loop"]["text"]} in recall_view["messages"]
    else:
        assert not [i for i in recall_view["input"] if i.get("type") == "item_reference"]
        assert "previous_response_id" not in previous_view
    assert PLACEHOLDER in json.dumps(previous_view)  # the whole chain, rebuilt and compacted
    await settle(gw)
    ledger = gw.app[LEDGER]
    records = [r for r in ledger.sessions() if r.session_id == session]
    assert len(records) == 1 and len(ledger.heads(records[0].key)) == 1


@pytest.mark.parametrize("store", [False, True], ids=["store-false", "store-true"])
async def test_ai_sdk_responses_reasoning_tool_loop(start_gateway, upstream, store):
    """``openai(id)`` as a reasoning model (``forceReasoning``, encrypted reasoning included):
    with ``store: false`` it resends each reasoning item whole and the call after it without its
    item id, with ``store: true`` the reasoning items as ``item_reference``. Either way every
    view the gateway compacts keeps each call's reasoning item (the simulator refuses a call
    without it, or a reasoning item without its call), no reference goes up unread, the session
    stays one branch and the recall turn finds the fact."""
    gw = await start_gateway(**GATEWAY)
    session = session_id(f"ai-sdk-reasoning-{store}")
    options = {"openai": {"forceReasoning": True, "reasoningEffort": "low", "store": store,
                          "include": ["reasoning.encrypted_content"]}}
    got = await run_node("ai_sdk.mjs", {"api": "responses", "mode": "stream", "baseURL": gw.base_url, "model": MODEL,
                                        "session": session, "steps": STEPS, "tokens": TOKENS, "providerOptions": options})
    assert got["results"] == list(range(1, STEPS + 1)) and got["loop"]["tool_errors"] == []
    assert ANSWER in got["recall"]["text"] and got["recall"]["tool_calls"] == []
    assert_compacted_upstream(upstream, PATHS["responses"])
    bodies = conversation(upstream, PATHS["responses"])
    assert all(body["store"] is store for body in bodies)
    assert not [i for body in bodies for i in body["input"] if i.get("type") == "item_reference"]
    assert sum(i.get("type") == "reasoning" for i in bodies[STEPS]["input"]) >= 1
    await settle(gw)
    ledger = gw.app[LEDGER]
    records = [r for r in ledger.sessions() if r.session_id == session]
    assert len(records) == 1 and len(ledger.heads(records[0].key)) == 1
