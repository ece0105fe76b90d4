"""Receipts (gateway/ops/receipts.py) and the per-request bypass (gateway/pipeline/bypass.py) on
all three formats, through real HTTP against the strict simulator.

A receipt itemises the prompt the upstream received: its items add up to ``prompt.tokens``,
and that is the gateway counter's count of the body the upstream really got (re-read with the
format's own adapter), exactly, on every request of a session that compacts. Receipts answer
their own tenant only, the admin token for any, and go with their session.

A bypassed request (``x-palimpsest-bypass: 1`` or ``[tenants.NAME] bypass = true``) reaches the
upstream as the client's bytes, byte for byte, in a session whose other requests are compacted;
it is still recorded (the next request stays on one branch) and counted.
"""

from __future__ import annotations

import json

import aiohttp
import orjson
import pytest

from gateway.chat.peer import ChatPeer
from gateway.keys import LEDGER, METRICS, TURNS
from gateway.messages.peer import MessagesPeer
from gateway.responses.peer import ResponsesPeer
from policies import TokenCounter
from tests.support.agent import settle

ADMIN = "admin-secret"
KEYS = {"alice": "pk-alice", "bob": "pk-bob"}
# Compaction from ~35% of a 32k budget, events whenever the trigger is passed (no cost model),
# so a dozen 1,500-token tool results make placeholders, summaries and recall tools.
POLICY = {"profile": "economy", "cost_model": False}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
PEERS = {"chat": ChatPeer, "responses": ResponsesPeer, "messages": MessagesPeer}
BASH_PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def output(step: int, tokens: int = 1500) -> str:
    facts = f"artifact for step {step} is /srv/out/step{step}.bin"
    return facts + "\n" + " ".join(f"line{step}-{i} build ok module_{step}_{i}.py passed" for i in range(tokens // 12))


def body(fmt: str, steps: int, model: str = "fake-32k") -> dict:
    """A client's agent loop after `steps` tool calls, in the format's own shape."""
    calls = [(f"call_{i}", json.dumps({"command": f"step {i}"}), output(i)) for i in range(steps)]
    if fmt == "chat":
        messages = [{"role": "system", "content": "You are a build agent."}, {"role": "user", "content": "Run the chain."}]
        for cid, args, out in calls:
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": args}}]})
            messages.append({"role": "tool", "tool_call_id": cid, "content": out})
        return {"model": model, "messages": messages,
                "tools": [{"type": "function", "function": {"name": "bash", "parameters": BASH_PARAMS}}]}
    if fmt == "responses":
        items: list[dict] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Run the chain."}]}]
        for cid, args, out in calls:
            items.append({"type": "function_call", "call_id": cid, "name": "bash", "arguments": args})
            items.append({"type": "function_call_output", "call_id": cid, "output": out})
        return {"model": model, "instructions": "You are a build agent.", "input": items,
                "tools": [{"type": "function", "name": "bash", "parameters": BASH_PARAMS}]}
    messages = [{"role": "user", "content": [{"type": "text", "text": "Run the chain."}]}]
    for cid, args, out in calls:
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": cid, "name": "bash", "input": json.loads(args)}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": cid, "content": out}]})
    return {"model": model, "max_tokens": 1024, "system": "You are a build agent.", "messages": messages,
            "tools": [{"name": "bash", "input_schema": BASH_PARAMS}]}


def continued(fmt: str, sent: dict, answer: dict) -> dict:
    """`sent` with the answer it got sent back, as a client does, and one more user message."""
    if fmt == "chat":
        message = {k: v for k, v in answer["choices"][0]["message"].items() if v is not None}
        return {**sent, "messages": [*sent["messages"], message, {"role": "user", "content": "Go on."}]}
    if fmt == "responses":
        user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}
        return {**sent, "input": [*sent["input"], *answer["output"], user]}
    return {**sent, "messages": [*sent["messages"], {"role": "assistant", "content": answer["content"]},
                                 {"role": "user", "content": [{"type": "text", "text": "Go on."}]}]}


def headers(session: str, key: str = KEYS["alice"], **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "X-Session-Id": session, "anthropic-version": "2023-06-01",
            "Content-Type": "application/json", **extra}


async def post(gw, fmt: str, raw: bytes, hdrs: dict[str, str]) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.root + PATHS[fmt], data=raw, headers=hdrs) as r:
            return r.status, dict(r.headers), await r.json(content_type=None)


async def get(gw, path: str, hdrs: dict[str, str]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.root + path, headers=hdrs) as r:
            return r.status, await r.json(content_type=None)


def client_calls(upstream, fmt: str) -> list[dict]:
    """What the upstream received for the client's requests (summary calls left out)."""
    return [r for r in upstream.received if r["path"] == PATHS[fmt] and r.get("json")
            and r["headers"].get("x-palimpsest-purpose") != "summary"]


def counted(fmt: str, raw: bytes, counter: TokenCounter) -> int:
    """The gateway counter's count of a body as the upstream received it."""
    chat = PEERS[fmt].parse(raw)
    tools = chat.body.get("tools")
    return counter.count_messages([*chat.instructions, *chat.history]) + counter.count_tools(tools)


async def start(start_gateway, **extra):
    """A gateway with tenants alice and bob. Sessions "s-*" are folded by summaries; in sessions
    "p-*" no summary is due, so old tool results become placeholders."""
    sections = {"server": {"admin_token": ADMIN}, "tenants": KEYS, "policy": POLICY,
                "policies": [{"session": "p-*", "summary_trigger_ratio": 0.6, "sync_compaction_ratio": 0.9}], **extra}
    return await start_gateway(**sections)


async def run_session(gw, fmt: str, session: str, steps: int) -> list[dict]:
    """The loop's requests one by one (summary jobs settled between them); their receipts."""
    receipts = []
    for n in range(1, steps + 1):
        status, hdrs, answer = await post(gw, fmt, orjson.dumps(body(fmt, n)), headers(session))
        assert status == 200, answer
        status, receipt = await get(gw, f"/v1/palimpsest/receipts/{hdrs['x-palimpsest-receipt']}", headers(""))
        assert status == 200, receipt
        receipts.append(receipt)
        await settle(gw)
    return receipts


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_receipt_items_add_up_to_the_upstream_prompt(start_gateway, upstream, fmt):
    # Session "s-": summaries fold the loop; session "p-": no summary is due, placeholders pile up.
    gw = await start(start_gateway)
    summarised = await run_session(gw, fmt, f"s-{fmt}", 14)
    placeheld = await run_session(gw, fmt, f"p-{fmt}", 14)
    sent = client_calls(upstream, fmt)
    counter = TokenCounter()
    assert len(sent) == len(summarised) + len(placeheld)
    for receipt, call in zip(summarised + placeheld, sent):
        items = receipt["prompt"]["items"]
        assert sum(i["tokens"] for i in items) == receipt["prompt"]["tokens"] == counted(fmt, call["body"], counter)
        assert receipt["route"] == fmt and receipt["status"] == 200 and receipt["object"] == "palimpsest.receipt"
        assert "other" not in {i["kind"] for i in items}
    first = summarised[0]
    assert first["forwarded_as_sent"] and first["placeholders"] == [] and first["summarised"] is None
    assert first["reason"].startswith("under the profile's triggers")
    # What went where, by event id: the summary (boundary, checkpoint) and what stayed verbatim ...
    last = summarised[-1]
    assert not last["forwarded_as_sent"] and last["summarised"]["checkpoint"] and last["summarised"]["events"] > 10
    assert last["summarised"]["boundary"].startswith("ev_") and last["summarised"]["tokens"] > 10_000
    assert {"summary", "verbatim", "instructions", "tools", "reply_priming"} <= {i["kind"] for i in last["prompt"]["items"]}
    runs = last["verbatim"]["runs"]
    assert last["verbatim"]["events"] == sum(r["messages"] for r in runs) > 0 and all(r["from"].startswith("ev_") for r in runs)
    assert last["recall"]["tools"] and len(last["recall"]["tools"]) == 2
    assert last["profile"] == "economy" and last["cost_model"] is False
    events = [r["events"] for r in summarised]
    assert sum(e["here"] for e in events) >= 2 and all(e["reason"] == "profile" for r in events for e in r["newest"])
    # ... and the placeholders (event id, tool, tokens before and after).
    held = placeheld[-1]
    assert held["summarised"] is None and len(held["placeholders"]) >= 5
    assert all(p["event_id"].startswith("ev_") and p["tool"] == "bash" and p["tokens_before"] > 10 * p["tokens"]
               for p in held["placeholders"])
    # What the upstream billed, against the client's own request sent direct.
    assert last["cache"] is not None and last["cost"]["billed"] < last["cost"]["direct"]
    # The turn log names each request's receipt (the inspector's chart opens them).
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == f"s-{fmt}")
    assert [t.receipt for t in gw.app[TURNS].session(record.key)] == [r["id"] for r in summarised]


async def test_receipts_answer_their_own_tenant_only(start_gateway):
    gw = await start(start_gateway)
    status, hdrs, _ = await post(gw, "chat", orjson.dumps(body("chat", 2)), headers("fence"))
    assert status == 200
    rid = hdrs["x-palimpsest-receipt"]
    path = f"/v1/palimpsest/receipts/{rid}"
    assert (await get(gw, path, headers("", KEYS["alice"])))[0] == 200
    status, error = await get(gw, path, headers("", KEYS["bob"]))  # another tenant: as if it did not exist
    assert status == 404 and set(error["error"]) == {"message", "type", "param", "code"}
    assert (await get(gw, path, {}))[0] == 404  # no key: the anonymous tenant's, which has none
    assert (await get(gw, "/v1/palimpsest/receipts/rcpt_made-up", headers("", KEYS["alice"])))[0] == 404
    assert (await get(gw, f"/admin/receipts/{rid}", {"Authorization": f"Bearer {ADMIN}"}))[0] == 200
    assert (await get(gw, f"/admin/receipts/{rid}", {"Authorization": f"Bearer {KEYS['alice']}"}))[0] == 401
    # The receipt goes with its session (deletion here; the retention sweep deletes the same way).
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "fence")
    async with aiohttp.ClientSession() as s:
        async with s.delete(f"{gw.root}/admin/sessions/{record.key}", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 200
    assert (await get(gw, path, headers("", KEYS["alice"])))[0] == 404
    assert (await get(gw, f"/admin/receipts/{rid}", {"Authorization": f"Bearer {ADMIN}"}))[0] == 404


async def test_receipt_routes_refuse_a_missing_key_where_keys_are_required(start_gateway):
    gw = await start_gateway(tenants=KEYS, server={"client_keys": "required"})
    status, hdrs, _ = await post(gw, "messages", orjson.dumps(body("messages", 1)), headers("m"))
    assert status == 200
    status, error = await get(gw, f"/v1/palimpsest/receipts/{hdrs['x-palimpsest-receipt']}", {})
    assert status == 401 and error["error"]["type"]


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_bypass_header_sends_the_clients_bytes(start_gateway, upstream, fmt):
    gw = await start(start_gateway)
    session = f"p-{fmt}"
    for steps in range(1, 12):
        status, _, answer = await post(gw, fmt, orjson.dumps(body(fmt, steps)), headers(session))
        assert status == 200, answer
        await settle(gw)
    raw = orjson.dumps(body(fmt, 12), option=orjson.OPT_INDENT_2)  # bytes no re-rendering would make
    compacted = client_calls(upstream, fmt)[-1]["body"]
    assert b"[Tool result compacted by the gateway]" in compacted  # without bypass, the view is rewritten
    status, hdrs, answer = await post(gw, fmt, raw, headers(session, **{"x-palimpsest-bypass": "1"}))
    assert status == 200, answer
    call = client_calls(upstream, fmt)[-1]
    assert call["body"] == raw
    assert "x-palimpsest-bypass" not in call["headers"]
    status, receipt = await get(gw, f"/v1/palimpsest/receipts/{hdrs['x-palimpsest-receipt']}", headers(""))
    assert receipt["bypass"] == "header" and receipt["forwarded_as_sent"]
    assert receipt["prompt"]["tokens"] == counted(fmt, raw, TokenCounter())
    # Recorded: its answer hangs off its last message, and the next request, which sends that
    # answer back, continues the same branch (no new head).
    ledger = gw.app[LEDGER]
    record = next(r for r in ledger.sessions() if r.session_id == session)
    last = receipt["verbatim"]["runs"][-1]["to"]
    (answer_id,) = ledger.children(record.key, last)
    heads = len(ledger.heads(record.key))
    await settle(gw)
    status, hdrs, _ = await post(gw, fmt, orjson.dumps(continued(fmt, body(fmt, 12), answer)), headers(session))
    assert status == 200
    assert b"[Tool result compacted by the gateway]" in client_calls(upstream, fmt)[-1]["body"]
    assert len(ledger.heads(record.key)) == heads
    newest = ledger.heads(record.key)[-1]
    assert answer_id in [e.id for e in ledger.path_to(record.key, newest)]
    metrics = gw.app[METRICS].render().decode()
    assert f'palimpsest_bypassed_requests_total{{reason="header",route="{fmt}"}} 1.0' in metrics


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_a_bypass_tenant_sends_the_clients_bytes(start_gateway, upstream, fmt):
    gw = await start(start_gateway, **{"tenants": {**KEYS, "carol": {"key": "pk-carol", "bypass": True}}})
    for steps in (11, 12):
        raw = orjson.dumps(body(fmt, steps), option=orjson.OPT_INDENT_2)
        status, hdrs, answer = await post(gw, fmt, raw, headers("p-t", "pk-carol"))
        assert status == 200, answer
        assert client_calls(upstream, fmt)[-1]["body"] == raw
    status, receipt = await get(gw, f"/v1/palimpsest/receipts/{hdrs['x-palimpsest-receipt']}", headers("", "pk-carol"))
    assert receipt["bypass"] == "tenant"
    # Another tenant on the same gateway is compacted as usual.
    for steps in range(1, 13):
        status, _, _ = await post(gw, fmt, orjson.dumps(body(fmt, steps)), headers("p-t"))
    assert b"[Tool result compacted by the gateway]" in client_calls(upstream, fmt)[-1]["body"]


async def test_a_bad_bypass_value_is_a_400_in_the_formats_envelope(start_gateway):
    gw = await start(start_gateway)
    status, _, error = await post(gw, "messages", orjson.dumps(body("messages", 1)), headers("x", **{"x-palimpsest-bypass": "maybe"}))
    assert status == 400 and error["type"] == "error" and "x-palimpsest-bypass" in error["error"]["message"]
    status, _, error = await post(gw, "chat", orjson.dumps(body("chat", 1)), headers("x", **{"x-palimpsest-bypass": "maybe"}))
    assert status == 400 and error["error"]["param"] == "x-palimpsest-bypass"


def asking(fmt: str, sent: dict, question: str) -> dict:
    """`sent` with a new user question at its end (the loop's task answered)."""
    if fmt == "chat":
        return {**sent, "messages": [*sent["messages"], {"role": "assistant", "content": "Done."},
                                     {"role": "user", "content": question}]}
    if fmt == "responses":
        done = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
        return {**sent, "input": [*sent["input"], done,
                                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}]}
    return {**sent, "messages": [*sent["messages"], {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
                                 {"role": "user", "content": [{"type": "text", "text": question}]}]}


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_streams_and_recall_rounds_get_receipts_that_add_up(start_gateway, upstream, fmt):
    """A streamed request's headers name its receipt too; a question about hidden history runs
    the recall loop (proactive passages and the model's own recall calls), and the receipt's
    items add up to the first upstream call of that turn."""
    gw = await start(start_gateway, recall={"auto_timeout_s": 60})  # the first search loads the embedder
    session = f"p-{fmt}-stream"
    counter = TokenCounter()
    for steps in range(1, 12):
        raw = orjson.dumps({**body(fmt, steps), "stream": True})
        async with aiohttp.ClientSession() as s:
            async with s.post(gw.root + PATHS[fmt], data=raw, headers=headers(session)) as r:
                assert r.status == 200 and "text/event-stream" in r.headers["Content-Type"]
                rid = r.headers["x-palimpsest-receipt"]
                await r.read()
        status, receipt = await get(gw, f"/v1/palimpsest/receipts/{rid}", headers(""))
        assert status == 200 and receipt["status"] == 200
        assert receipt["prompt"]["tokens"] == counted(fmt, client_calls(upstream, fmt)[-1]["body"], counter)
        await settle(gw)
    assert receipt["placeholders"]  # the stream's view was compacted
    before = len(client_calls(upstream, fmt))
    question = asking(fmt, body(fmt, 11), "RECALL: where is the artifact for step 2?")
    status, hdrs, answer = await post(gw, fmt, orjson.dumps(question), headers(session))
    assert status == 200, answer
    status, receipt = await get(gw, f"/v1/palimpsest/receipts/{hdrs['x-palimpsest-receipt']}", headers(""))
    first = client_calls(upstream, fmt)[before]
    assert receipt["recall"]["calls"] >= 1 and receipt["recall"]["rounds"] >= 1
    assert receipt["cache"]["calls"] == 1 + receipt["recall"]["rounds"] == len(client_calls(upstream, fmt)) - before
    assert receipt["prompt"]["tokens"] == sum(i["tokens"] for i in receipt["prompt"]["items"]) == counted(fmt, first["body"], counter)
    assert receipt["recall"]["proactive"] and receipt["recall"]["proactive_tokens"] > 0
    assert b"<recalled_history>" in first["body"]
