"""POST /v1/responses through the gateway, as Codex CLI uses it: store false, the whole input on
every call, reasoning items with encrypted content carried back.

Against the strict simulated Responses upstream (pairing, reasoning bound to its calls, the
window) and against a chat-only upstream (``api = "chat"``: the view rendered as Chat
Completions, the answer translated back), a long tool loop on a 32k model runs to its end, JSON
and streamed: every upstream request valid and inside the window, old outputs compacted, one
branch in the ledger, and recall resolved by the gateway.
"""

from __future__ import annotations

import openai
import pytest

from gateway.keys import LEDGER
from simulator.puppet import RECEIVED
from simulator.workloads import agent_loop_session
from tests.chat.test_agent_loops import assert_valid_and_fits, forwarded, is_placeholder
from tests.support.agent import RESPONSES_TOOLS, drive_responses_loop, responses_turn, settle

WINDOW = 32_000
PLACEHOLDER = "[Tool result compacted by the gateway]"


def client(gw, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": session}, max_retries=0)


def responses_bodies(upstream) -> list[dict]:
    return [r["json"] for r in upstream.app[RECEIVED]
            if r["path"].endswith("/responses") and r.get("json") and not r["headers"].get("x-palimpsest-purpose")]


def assert_responses_valid(upstream, bodies: list[dict]) -> None:
    """The simulator is as strict as the provider (pairing, reasoning binding, the window), and
    every call of the loop was answered; here also: no call went up without its reasoning."""
    for body in bodies:
        if "reasoning.encrypted_content" not in (body.get("include") or ()):
            continue  # no reasoning items asked for, none to carry
        items = body["input"]
        for i, item in enumerate(items):
            if item.get("type") == "function_call" and not item["name"].startswith("session_"):
                before = items[i - 1] if i else {}
                assert before.get("type") in ("reasoning", "function_call"), (i, before)


def gateway_config(api: str) -> dict:
    return {"models": {"fake-32k": {"context_window": WINDOW, "api": api}}}


def outputs(body: dict) -> list:
    return [i.get("output") for i in body["input"] if i.get("type") == "function_call_output"]


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_long_loop_is_compacted_and_stays_valid(start_gateway, upstream, stream, api):
    gw = await start_gateway(**gateway_config(api))
    name = f"r-{stream}-{api}"
    session = agent_loop_session(seed=5, turns=1, calls=60)  # 60 calls under one user message
    items, responses = await drive_responses_loop(client(gw, name), session, model="fake-32k", stream=stream)
    await settle(gw)
    assert len(responses) == 61
    assert responses[-1].output_text.startswith("Tool ")  # the loop ran to its end
    if api == "chat":
        bodies = forwarded(upstream)
        assert_valid_and_fits(bodies)
        assert any(is_placeholder(m) for m in bodies[-1]["messages"])
        last = str(bodies[-1]["messages"])
    else:
        bodies = responses_bodies(upstream)
        assert_responses_valid(upstream, bodies)
        assert any(str(o).startswith(PLACEHOLDER) for o in outputs(bodies[-1]))
        assert bodies[-1]["input"][0] == items[0]  # the client's developer message, as it sent it
        last = str(bodies[-1]["input"])
    assert len(bodies) >= 61
    assert len(last) < sum(len(str(i)) for i in items) / 2
    # One branch: what the client resent matched what the gateway recorded.
    ledger = gw.app[LEDGER]
    key = next(s.key for s in ledger.sessions() if s.session_id == name)
    assert len(ledger.heads(key)) == 1


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_recall_is_resolved_by_the_gateway(start_gateway, upstream, api):
    gw = await start_gateway(**gateway_config(api))
    session = agent_loop_session(seed=7, turns=1, calls=40)
    c = client(gw, f"recall-{api}")
    items, _ = await drive_responses_loop(c, session, model="fake-32k")
    await settle(gw)
    fact = session.facts[0]
    for stream in (False, True):
        asked = [*items, {"type": "message", "role": "user", "content": f"RECALL: {fact.question}"}]
        output, response = await responses_turn(c, asked, model="fake-32k", stream=stream)
        assert [i["type"] for i in output if i["type"] != "reasoning"] == ["message"]  # recall calls stayed inside
        assert fact.answer in response.output_text
        assert response.usage.input_tokens > 0
    if api == "responses":
        assert_responses_valid(upstream, responses_bodies(upstream))


async def test_a_chat_only_upstream_is_told_what_it_cannot_take(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("chat"))
    c = client(gw, "dropped")
    items = [{"type": "message", "role": "user", "content": "[[call read_file {\"target\": \"/srv/a.py\"}]]"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "from-another-provider"},
             {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{\"target\": \"/srv/a.py\"}"},
             {"type": "function_call_output", "call_id": "c1", "output": "print('hi')"}]
    raw = await c.responses.with_raw_response.create(model="fake-32k", input=items, store=False,
                                                      tools=[*RESPONSES_TOOLS, {"type": "web_search"}])
    assert raw.headers["x-palimpsest-dropped"] == "reasoning=1, tool=1"
    assert raw.parse().output_text.startswith("Tool read_file returned")
    body = forwarded(upstream)[-1]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool"]
    assert "from-another-provider" not in str(body)


async def test_a_stalled_upstream_stream_ends_the_clients_stream_with_an_error(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("responses"), upstream={"idle_timeout_s": 0.5})
    c = client(gw, "stall")
    async with c.responses.stream(model="fake-32k", input="hello [[stall 3]]", store=False) as events:
        seen = [event async for event in events]
        with pytest.raises(RuntimeError):  # the SDK's own: no response.completed arrived
            await events.get_final_response()
    assert seen[-1].type == "error" and seen[-1].code == "upstream_timeout"
    assert not any(e.type == "response.completed" for e in seen)
    ledger = gw.app[LEDGER]
    key = next(s.key for s in ledger.sessions() if s.session_id == "stall")
    assert [e.role for e in ledger.since(key, -1)] == ["user"]  # the cut answer was not recorded


async def test_a_20_mb_responses_input_is_refused_without_stalling_the_gateway(start_gateway, upstream):
    import asyncio
    import time

    import aiohttp

    gw = await start_gateway(**gateway_config("responses"))
    huge = {"model": "fake-32k", "store": False, "input": [
        {"type": "message", "role": "user", "content": "x " * (10 * 1024 * 1024)}]}
    worst = 0.0

    async def probe(http):
        nonlocal worst
        for _ in range(40):
            started = time.perf_counter()
            async with http.get(gw.root + "/healthz") as r:
                assert r.status == 200
            worst = max(worst, time.perf_counter() - started)
            await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as http:
        prober = asyncio.create_task(probe(http))
        async with http.post(gw.base_url + "/responses", json=huge, headers={"X-Session-Id": "huge"}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "context_length_exceeded"
        await prober
    assert responses_bodies(upstream) == []
    assert worst < 1.0  # the 20 MB body is parsed, hashed and counted off the event loop


@pytest.mark.parametrize("fault", ["429", "ignore"])
async def test_a_failing_summary_model_never_fails_a_responses_loop(start_gateway, upstream, fault):
    """The summary model answers 429 to every call, or ignores the required format: the loop
    still runs to its end inside the window (tailored, with the exact values), nothing fails."""
    if fault == "429":
        upstream.state.summary_status = 429
    else:
        upstream.state.summary_format = "ignore"
    gw = await start_gateway(**gateway_config("responses"), policy={"profile": "economy"})
    session = agent_loop_session(seed=13, turns=1, calls=40)
    items, responses = await drive_responses_loop(client(gw, f"faulty-{fault}"), session, model="fake-32k")
    await settle(gw)
    assert len(responses) == 41 and responses[-1].output_text.startswith("Tool ")
    summaries = [r for r in upstream.app[RECEIVED] if r["headers"].get("x-palimpsest-purpose") == "summary"]
    assert summaries  # the gateway did try to summarise
    bodies = responses_bodies(upstream)
    assert_responses_valid(upstream, bodies)
    assert PLACEHOLDER in str(bodies[-1]["input"]) or "<session_summary>" in str(bodies[-1]["input"])
