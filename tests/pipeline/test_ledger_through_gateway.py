"""The ledger as clients see it: idempotent resends, forks, SDK round trips, concurrency,
restarts and tenant isolation — all through real HTTP."""

from __future__ import annotations

import asyncio
import json

import openai

from gateway.keys import LEDGER
from store.canonical import path_ids


def client(gw, key="sk-tenant-a", session="s1"):
    headers = {"X-Session-Id": session} if session else {}
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, default_headers=headers, max_retries=0)


def session_events(gw, session_id, tenant_filter=None):
    ledger = gw.app[LEDGER]
    records = [r for r in ledger.sessions() if r.session_id == session_id and (tenant_filter is None or r.tenant == tenant_filter)]
    assert len(records) == 1, records
    return ledger, records[0], ledger.since(records[0].key, -1)


async def test_conversation_recorded_and_resend_is_idempotent(gateway):
    c = client(gateway)
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "first question"}]
    r1 = await c.chat.completions.create(model="m", messages=history)
    # The SDK's message object goes back as history, as real agents do.
    history += [r1.choices[0].message.model_dump(), {"role": "user", "content": "second question"}]
    await c.chat.completions.create(model="m", messages=history)
    await c.chat.completions.create(model="m", messages=history)  # retry of the same turn
    ledger, record, events = session_events(gateway, "s1")
    assert [e.role for e in events] == ["user", "assistant", "user", "assistant"]
    assert [e.message.get("content") for e in events][:3] == ["first question", "ok: first question", "second question"]
    # System prompts are instructions, not history.
    assert all(e.role != "system" for e in events)
    # The path of the resent history matches the stored events exactly.
    assert path_ids([m for m in history if m["role"] != "system"]) == [e.id for e in events[:3]]


async def test_sdk_round_trip_canonicalisation(gateway):
    c = client(gateway, session="canon")
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    first = [{"role": "user", "content": [{"type": "text", "text": 'find it [[call lookup {"q": 1}]]'}]}]
    r1 = await c.chat.completions.create(model="m", messages=first, tools=[tool])
    msg = r1.choices[0].message
    # Everything the SDK adds (refusal None, annotations, audio...) and a string instead of parts.
    second = [{"role": "user", "content": 'find it [[call lookup {"q": 1}]]'}, msg.model_dump(exclude_none=False),
              {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "42"}]
    await c.chat.completions.create(model="m", messages=second, tools=[tool])
    _, _, events = session_events(gateway, "canon")
    assert [e.role for e in events] == ["user", "assistant", "tool", "assistant"]


async def test_edit_and_regenerate_fork_without_overwriting(gateway):
    c = client(gateway, session="fork")
    base = [{"role": "user", "content": "a"}]
    r = await c.chat.completions.create(model="m", messages=base)
    base.append(r.choices[0].message.model_dump())
    await c.chat.completions.create(model="m", messages=base + [{"role": "user", "content": "b"}])
    await c.chat.completions.create(model="m", messages=base + [{"role": "user", "content": "b edited"}])
    ledger, record, events = session_events(gateway, "fork")
    contents = [e.message.get("content") for e in events]
    assert contents.count("a") == 1 and contents.count("ok: a") == 1  # shared prefix stored once
    assert "b" in contents and "b edited" in contents
    heads = ledger.heads(record.key)
    assert len(heads) == 2
    assert {ledger.path_to(record.key, h)[2].message["content"] for h in heads} == {"b", "b edited"}
    shared = ledger.path_to(record.key, heads[0])[:2]
    assert shared == ledger.path_to(record.key, heads[1])[:2]


async def test_fifty_concurrent_requests_on_one_session(gateway):
    c = client(gateway, session="busy")
    prefix = [{"role": "user", "content": "shared start"}, {"role": "assistant", "content": "ok: shared start"}]
    await asyncio.gather(*(c.chat.completions.create(model="m", messages=prefix + [{"role": "user", "content": f"q{i}"}]) for i in range(50)))
    ledger, record, events = session_events(gateway, "busy")
    ids = [e.id for e in events]
    assert len(ids) == len(set(ids))
    contents = [e.message.get("content") for e in events]
    assert contents.count("shared start") == 1
    assert sorted(c for c in contents if c and c.startswith("q")) == sorted(f"q{i}" for i in range(50))
    assert sorted(c for c in contents if c and c.startswith("ok: q")) == sorted(f"ok: q{i}" for i in range(50))
    assert [e.seq for e in events] == list(range(len(events)))


async def test_restart_loses_nothing(start_gateway):
    gw = await start_gateway()
    c = client(gw, session="durable")
    await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "remember ZFA04Y"}])
    _, _, before = session_events(gw, "durable")
    await gw.stop()
    gw2 = await start_gateway()
    _, _, after = session_events(gw2, "durable")
    assert [(e.id, e.message) for e in after] == [(e.id, e.message) for e in before]
    await client(gw2, session="durable").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "remember ZFA04Y"}, {"role": "assistant", "content": "ok: remember ZFA04Y"}, {"role": "user", "content": "next"}]
    )
    _, _, grown = session_events(gw2, "durable")
    assert [e.role for e in grown] == ["user", "assistant", "user", "assistant"]


async def test_tenants_are_isolated_and_credentials_not_stored(gateway, tmp_path):
    await client(gateway, key="sk-alice-secret-1", session="same").chat.completions.create(model="m", messages=[{"role": "user", "content": "alice"}])
    await client(gateway, key="sk-bob-secret-2", session="same").chat.completions.create(model="m", messages=[{"role": "user", "content": "bob"}])
    ledger = gateway.app[LEDGER]
    records = [r for r in ledger.sessions() if r.session_id == "same"]
    assert len(records) == 2 and records[0].tenant != records[1].tenant
    for r in records:
        texts = [e.message.get("content") for e in ledger.since(r.key, -1)]
        assert texts in (["alice", "ok: alice"], ["bob", "ok: bob"])
    blob = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert b"sk-alice-secret-1" not in blob and b"sk-bob-secret-2" not in blob


async def test_named_tenant_from_config(start_gateway):
    gw = await start_gateway(tenants={"acme": "sk-acme-key"})
    await client(gw, key="sk-acme-key", session="t").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert [r.tenant for r in gw.app[LEDGER].sessions()] == ["acme"]


async def test_fingerprint_fallback_and_off(start_gateway, upstream):
    gw = await start_gateway(session={"fallback": "fingerprint"})
    c = client(gw, session=None)
    history = [{"role": "user", "content": "no header here"}]
    r = await c.chat.completions.create(model="m", messages=history)
    history += [r.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
    await c.chat.completions.create(model="m", messages=history)
    sessions = gw.app[LEDGER].sessions()
    assert len(sessions) == 1 and sessions[0].session_id.startswith("fp:")
    assert sessions[0].events == 4
    await gw.stop()

    off = await start_gateway(session={"fallback": "off"}, store={"path": str(gw.settings.store.path) + "-off"})
    await client(off, session=None).chat.completions.create(model="m", messages=[{"role": "user", "content": "pure"}])
    assert off.app[LEDGER].sessions() == []
    assert upstream.chat_requests()[-1]["json"]["messages"] == [{"role": "user", "content": "pure"}]


# -- lifecycle: delete, readiness, answers durable when the response ends ---------------------

ADMIN = "admin-token-for-tests"


async def test_admin_delete_removes_ledger_checkpoints_and_index(start_gateway):
    import aiohttp

    from gateway.keys import CHECKPOINTS, INDEXER

    gw = await start_gateway(server={"admin_token": ADMIN})
    history = [{"role": "user", "content": "the vault code is 7781"}]
    await client(gw, session="doomed").chat.completions.create(model="m", messages=history)
    await client(gw, session="kept").chat.completions.create(model="m", messages=[{"role": "user", "content": "keep me"}])
    ledger, record, events = session_events(gw, "doomed")
    assert len(events) == 2
    gw.app[CHECKPOINTS].add(record.key, boundary=events[0].id, summary="s", state={}, covered_tokens=1, covered_events=1,
                            model="m", mode="async", previous=None, summary_tokens=1)
    await gw.app[INDEXER].catch_up(record.key)
    index = await gw.app[INDEXER].opened()
    assert await index.chunk_keys(record.key)
    url = f"{gw.root}/admin/sessions/{record.key}"
    async with aiohttp.ClientSession() as http:
        async with http.delete(url) as r:
            assert r.status == 401
        async with http.delete(url, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 200
            assert await r.json() == {"id": record.key, "object": "session.deleted", "deleted": True, "events": 2, "checkpoints": 1}
        async with http.delete(url, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 404
    assert ledger.session(record.key) is None and ledger.since(record.key, -1) == []
    assert gw.app[CHECKPOINTS].list(record.key) == []
    assert await index.chunk_keys(record.key) == set()
    assert [r.session_id for r in ledger.sessions()] == ["kept"]
    # The same conversation sent again is a new session, recorded in full.
    await client(gw, session="doomed").chat.completions.create(model="m", messages=history)
    assert len(session_events(gw, "doomed")[2]) == 2


async def test_cli_delete_by_session_id(start_gateway, capsys):
    from gateway.cli.main import delete_session_cli

    gw = await start_gateway()
    await client(gw, session="cli-doomed").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    settings = gw.settings
    (key,) = [r.key for r in gw.app[LEDGER].sessions() if r.session_id == "cli-doomed"]
    await gw.stop()
    from store.turns import TurnLog

    log = TurnLog(settings.store.path)
    assert log.session(key)  # the request's turn row
    log.close()
    assert await delete_session_cli(settings, "cli-doomed") == 0
    assert "2 events" in capsys.readouterr().out
    log = TurnLog(settings.store.path)
    assert log.session(key) == []  # the turn log's rows of the session went too
    log.close()
    assert await delete_session_cli(settings, "cli-doomed") == 1
    from store.ledger import Ledger

    ledger = Ledger(settings.store.path)
    assert ledger.sessions() == []
    ledger.close()


async def test_readyz_reports_store_reachability(gateway):
    import aiohttp

    root = gateway.base_url[: -len("/v1")]
    async with aiohttp.ClientSession() as http:
        async with http.get(root + "/readyz") as r:
            assert r.status == 200 and (await r.json())["status"] == "ready"
        gateway.app[LEDGER]._db.close()  # the store goes away
        async with http.get(root + "/readyz") as r:
            assert r.status == 503
    # Teardown closes the ledger again: give it a connection to close.
    import sqlite3

    gateway.app[LEDGER]._db = sqlite3.connect(":memory:")
    gateway.app[LEDGER]._pending = []


async def test_answer_is_durable_when_the_client_has_it(gateway, tmp_path):
    """No in-memory window: once the client has the answer, another reader of the store sees it
    (no flush, no waiting)."""
    import sqlite3

    r = await client(gateway, session="durable-now").chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    db = sqlite3.connect(str(tmp_path / "data" / "ledger.sqlite3"))
    rows = db.execute("SELECT role FROM events ORDER BY seq").fetchall()
    db.close()
    assert rows == [("user",), ("assistant",)]
    assert r.choices[0].message.content == "ok: q"


async def test_answer_is_committed_before_the_response_is_sent_or_ended(gateway, monkeypatch):
    """The order of events, JSON and streamed: the answer's append precedes the first byte of a
    JSON response and the end of a streamed one."""
    from aiohttp import web

    order: list[str] = []
    ledger = gateway.app[LEDGER]
    real_append, real_prepare, real_eof = ledger.append, web.Response.prepare, web.StreamResponse.write_eof

    def append(*a, **k):
        order.append("append")
        return real_append(*a, **k)

    async def prepare(self, request):
        if request.app is gateway.app and request.path.endswith("/chat/completions"):  # not the puppet's
            order.append("json-prepare")
        return await real_prepare(self, request)

    async def write_eof(self, *a, **k):
        if not isinstance(self, web.Response) and self._req is not None and self._req.app is gateway.app:
            order.append("stream-eof")
        return await real_eof(self, *a, **k)

    monkeypatch.setattr(ledger, "append", append)
    monkeypatch.setattr(web.Response, "prepare", prepare)
    monkeypatch.setattr(web.StreamResponse, "write_eof", write_eof)
    c = client(gateway, session="order")
    await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "json"}])
    assert order[0] == "append" and "json-prepare" in order
    order.clear()
    stream = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "streamed"}], stream=True)
    async for _ in stream:
        pass
    assert order[0] == "append" and "stream-eof" in order


async def test_retention_sweep_runs_in_the_gateway(start_gateway):
    import time

    gw = await start_gateway()
    await client(gw, session="stale").chat.completions.create(model="m", messages=[{"role": "user", "content": "old"}])
    await client(gw, session="fresh").chat.completions.create(model="m", messages=[{"role": "user", "content": "new"}])
    ledger = gw.app[LEDGER]
    stale = [r.key for r in ledger.sessions() if r.session_id == "stale"][0]
    ledger._db.execute("UPDATE sessions SET updated = ? WHERE key = ?", (time.time() - 40 * 86400, stale))
    settings = gw.settings
    await gw.stop()
    swept = await start_gateway(store={"path": settings.store.path, "retention_days": 30})
    for _ in range(100):  # the first sweep runs as the gateway starts (opening the index takes a moment)
        if [r.session_id for r in swept.app[LEDGER].sessions()] == ["fresh"]:
            break
        await asyncio.sleep(0.1)
    assert [r.session_id for r in swept.app[LEDGER].sessions()] == ["fresh"]


async def test_re_serialised_tool_arguments_keep_one_branch(gateway, upstream):
    """A framework that sends the model's arguments back re-dumped (spaces, its own key order)
    resends the same conversation: one branch, however many tool rounds."""
    c = client(gateway, session="redump")
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}
    messages = [{"role": "user", "content": 'go [[call read {"target": "/srv/0", "turn": 0}]]'}]
    for turn in range(3):
        r = await c.chat.completions.create(model="m", messages=messages, tools=[tool])
        call = r.choices[0].message.tool_calls[0]
        assert call.function.arguments == f'{{"target":"/srv/{turn}","turn":{turn}}}'  # as the model wrote them
        redumped = json.dumps(dict(reversed(list(json.loads(call.function.arguments).items()))))
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "read", "arguments": redumped}}]},
            {"role": "tool", "tool_call_id": call.id, "content": f'out {turn} [[call read {{"target": "/srv/{turn + 1}", "turn": {turn + 1}}}]]'},
        ]
    await c.chat.completions.create(model="m", messages=messages, tools=[tool])
    ledger, record, events = session_events(gateway, "redump")
    assert len(ledger.heads(record.key)) == 1
    assert [e.role for e in events] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]


async def test_cli_delete_refuses_a_session_id_that_looks_like_another_tenants_key(start_gateway, capsys):
    """Bob names a session after alice's key: `delete alice/...` must not pick alice's silently."""
    from gateway.cli.main import delete_session_cli

    gw = await start_gateway(tenants={"alice": "pk-alice", "bob": "pk-bob"})
    await client(gw, session="notes", key="pk-alice").chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    alice_key = next(r.key for r in gw.app[LEDGER].sessions())
    await client(gw, session=alice_key, key="pk-bob").chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
    bob_key = next(r.key for r in gw.app[LEDGER].sessions() if r.tenant == "bob")
    settings = gw.settings
    await gw.stop()
    assert await delete_session_cli(settings, alice_key) == 1  # a key and an id: ambiguous, nothing deleted
    assert "more than one" in capsys.readouterr().err
    assert await delete_session_cli(settings, session=alice_key, tenant="bob") == 0
    assert f"deleted {bob_key}" in capsys.readouterr().out
    assert await delete_session_cli(settings, key=alice_key) == 0
    assert f"deleted {alice_key}" in capsys.readouterr().out
    assert await delete_session_cli(settings, alice_key, key=alice_key) == 2  # one way to name it
