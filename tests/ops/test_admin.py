"""The admin API and `palimpsest inspect`, through real HTTP on a long session with checkpoints."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp
import openai

from gateway.keys import CHECKPOINTS, LEDGER, PIPELINE, SUMMARIZER
from simulator.workloads import TOOL_SPECS, synthetic_session
from store.canonical import stored_form
from tests.support.agent import drive, settle

TOKEN = "t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def client(gw, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": session}, max_retries=0)



async def long_session(gw, name: str = "long", rounds: int = 30, tail_rounds: int = 12):
    session = synthetic_session(seed=11, rounds=rounds)
    history, raw = await drive(client(gw, name), session, model="fake-32k")
    await settle(gw)
    # A few more rounds with no new summary: the raw tail outgrows the protected rounds, so
    # the view holds tool results compacted after the newest boundary.
    summarizer, views = gw.app[SUMMARIZER], gw.app[PIPELINE].views
    summarizer.after_turn, restore = (lambda *a, **k: None), summarizer.after_turn
    views.summarizer = None
    _, more = await drive(client(gw, name), synthetic_session(seed=12, rounds=tail_rounds), model="fake-32k", messages=history)
    summarizer.after_turn, views.summarizer = restore, summarizer
    raw += more
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == name)
    return session, history, raw, record


async def get(gw, path: str, headers=AUTH, **params):
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.root + path, headers=headers, params=params) as r:
            return r.status, await r.json(content_type=None)


async def test_admin_is_off_without_a_token(gateway):
    for path in ("/admin/sessions", "/admin/ui", "/admin"):
        status, body = await get(gateway, path)
        assert status == 404
        assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_wrong_or_missing_token_is_401(start_gateway):
    gw = await start_gateway(server={"admin_token": TOKEN}, policy={"profile": "economy"})
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        status, body = await get(gw, "/admin/sessions", headers=headers)
        assert status == 401
        assert body["error"]["type"] == "authentication_error"
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.root + "/admin/ui") as r:  # the page asks for the token itself
            assert r.status == 200 and "text/html" in r.headers["Content-Type"]
            assert "connect-src 'self'" in r.headers["Content-Security-Policy"]


async def test_session_list_and_detail_show_checkpoints_and_hidden_events(start_gateway, upstream):
    gw = await start_gateway(server={"admin_token": TOKEN}, policy={"profile": "economy"})
    await client(gw, "short").chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    _, history, raw, record = await long_session(gw)

    status, listing = await get(gw, "/admin/sessions")
    assert status == 200
    rows = {row["session_id"]: row for row in listing["data"]}
    assert set(rows) == {"long", "short"}
    row = rows["long"]
    assert row["key"] == record.key and row["tenant"] == record.tenant
    assert row["events"] == record.events and row["requests"] == len(raw)
    assert row["checkpoints"] == len(gw.app[CHECKPOINTS].list(record.key)) >= 1
    status, limited = await get(gw, "/admin/sessions", limit="1")
    assert [r["session_id"] for r in limited["data"]] == ["long"]  # newest first

    status, detail = await get(gw, f"/admin/sessions/{record.key}")
    assert status == 200
    assert detail["head"] == record.head
    assert detail["branches"] == [{"head": record.head, "length": len(history) - 1, "current": True,
                                   "updated": detail["branches"][0]["updated"]}]
    events = detail["events"]
    assert [e["role"] for e in events] == [m["role"] for m in history[1:]]
    assert all(e["tokens"] > 0 and len(e["preview"]) <= 200 for e in events)
    cps = detail["checkpoints"]
    assert cps and all(cp["summary"] and cp["state"] and cp["model"] == "fake-32k" for cp in cps)
    used = next(cp for cp in cps if cp["in_view"])
    assert detail["basis"]["checkpoint"] == used["id"] and detail["basis"]["boundary"] == used["boundary"]
    boundary = next(i for i, e in enumerate(events) if e["id"] == used["boundary"])
    assert all(e["summarized"] for e in events[: boundary + 1])
    # Hidden too, but for the user message of a turn the boundary cuts through: it stays in the view.
    shown = [e for e in events[: boundary + 1] if not e["hidden"]]
    assert len(shown) <= 1 and all(e["role"] == "user" for e in shown)
    assert not any(e["summarized"] for e in events[boundary + 1:])
    compacted = [e for e in events if e["compacted"]]
    assert compacted and all(e["role"] == "tool" and not e["summarized"] for e in compacted)
    assert not any(e["hidden"] for e in events[-4:])  # the newest rounds stay raw
    totals = detail["totals"]
    assert totals["requests"] == len(raw)
    assert totals["upstream_tokens"] < totals["client_tokens"] and totals["saved_tokens"] > 0
    assert "not store" in detail["basis"]["system_prompt"]

    # A short session: its model is the one its newest request used, nothing is hidden.
    status, short = await get(gw, f"/admin/sessions/{rows['short']['key']}")
    assert status == 200 and short["basis"]["model_source"] == "newest request"
    assert short["basis"]["model"] == rows["short"]["model"] == "fake-32k"
    assert [e["role"] for e in short["events"]] == ["user", "assistant"]
    assert not any(e["hidden"] for e in short["events"]) and short["checkpoints"] == []
    assert short["totals"]["saved_tokens"] == 0

    status, missing = await get(gw, f"/admin/sessions/{record.tenant}/nope")
    assert status == 404 and missing["error"]["code"] == "not_found"
    status, bad_head = await get(gw, f"/admin/sessions/{record.key}", head="ev_missing")
    assert status == 404


async def test_view_is_what_the_upstream_received(start_gateway, upstream):
    gw = await start_gateway(server={"admin_token": TOKEN}, policy={"profile": "economy"})
    session, history, raw, record = await long_session(gw)
    last = [r for r in upstream.chat_requests() if not r["headers"].get("x-palimpsest-purpose")][-1]["json"]
    used = raw[-1].headers["x-palimpsest-checkpoint"]
    # The last request's path ends before the answer the ledger recorded (the session head).
    head = gw.app[LEDGER].get(record.key, record.head).parent
    body = {"system": session.system, "tools": TOOL_SPECS, "model": "fake-32k"}
    async with aiohttp.ClientSession() as s:
        url = f"{gw.root}/admin/sessions/{record.key}/view"
        async with s.post(url, headers=AUTH, params={"head": head, "checkpoint": used}, json=body) as r:
            assert r.status == 200
            view = await r.json()
    assert view["checkpoint"] == used and not view["untouched"]
    # Byte for byte but for the SDK's empty fields (`annotations: []`), which the ledger drops.
    sent = [stored_form(m) for m in last["messages"]]
    assert view["messages"] == sent
    assert view["tools"] == last["tools"]
    assert set(view["recall_tools"]) == {"session_search", "session_load"}
    assert view["tokens"]["upstream"] < view["tokens"]["client"]
    # Without the system prompt the view says so, and is otherwise the same history.
    status, bare = await get(gw, f"/admin/sessions/{record.key}/view", head=head, checkpoint=used)
    assert status == 200 and "not store" in bare["system_prompt"]
    assert bare["messages"] == sent[1:]  # the block follows the client's system prompt, which is absent here
    async with aiohttp.ClientSession() as s:
        async with s.post(url, headers=AUTH, json={"system": [{"role": "user", "content": "x"}]}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "system"
    # Inspecting wrote nothing and started no summary job.
    assert gw.app[LEDGER].session(record.key).events == record.events
    assert gw.app[SUMMARIZER].idle


async def test_inspect_cli_renders_sessions_checkpoints_and_view(start_gateway, upstream, tmp_path):
    gw = await start_gateway(server={"admin_token": TOKEN}, policy={"profile": "economy"})
    _, _, _, record = await long_session(gw, rounds=26)
    checkpoint = gw.app[CHECKPOINTS].list(record.key)[-1]
    env = {**os.environ, "PALIMPSEST_STORE__PATH": gw.settings.store.path,
           "PALIMPSEST_UPSTREAM__BASE_URL": upstream.base_url, "PALIMPSEST_POLICY__PROFILE": "economy"}

    async def inspect(*args: str) -> str:
        # Async subprocess: the puppet in this event loop keeps answering window discovery.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "inspect", *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    listing = await inspect()
    assert record.key in listing and "long" in listing
    detail = await inspect("long")
    assert checkpoint.id in detail and record.head in detail
    assert "compacted" in detail and "summarized" in detail
    as_json = json.loads(await inspect(record.key, "--json"))
    assert as_json["session"]["key"] == record.key
    assert checkpoint.id in {cp["id"] for cp in as_json["checkpoints"]}
    view = json.loads(await inspect("long", "--view", "--json"))
    assert view["checkpoint"] and any("<session_summary>" in (m.get("content") or "") for m in view["messages"][:2])
    status, from_api = await get(gw, f"/admin/sessions/{record.key}/view")
    assert view["messages"] == from_api["messages"]
    # The advice the view gives about system prompt and tools can be followed with this CLI.
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    (tmp_path / "system.txt").write_text("You are the long agent.")
    given = json.loads(await inspect("long", "--view", "--json", "--system", "@" + str(tmp_path / "system.txt"),
                                     "--tools", str(tmp_path / "tools.json")))
    assert given["messages"][0] == {"role": "system", "content": "You are the long agent."}
    assert given["tools"][0] == tools[0]
    assert any("<session_summary>" in (m.get("content") or "") for m in given["messages"][1:3])  # then the history
    assert "--system" in view["system_prompt"] and given["system_prompt"] == "given"
    bad = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "inspect", "long", "--view", "--tools",
                                               str(tmp_path / "system.txt"), env=env,
                                               stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await bad.communicate()
    assert bad.returncode == 2 and b"--tools" in err and b"not JSON" in err
    missing = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", "inspect", "nope", env=env,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await missing.communicate()
    assert missing.returncode == 1 and b"No session" in err
