"""Two gateway replicas on one PostgreSQL database and one S3 index (moto), driven with the
openai SDK: one session's requests sprayed across them stay correct."""

from __future__ import annotations

import asyncio
import json
import random
import re

import aiohttp
import openai
import orjson
import pytest

from gateway.keys import CHECKPOINTS, INDEXER, LEDGER, PIPELINE

ADMIN = "cluster-test-admin"


def client(gw, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-test", default_headers={"X-Session-Id": session}, max_retries=0)


async def turn(gw, session: str, history: list[dict], text: str) -> None:
    history.append({"role": "user", "content": text})
    r = await client(gw, session).chat.completions.create(model="m", messages=history)
    history.append(r.choices[0].message.model_dump(exclude_none=True))


def record(gw, session: str):
    found = [r for r in gw.app[LEDGER].sessions() if r.session_id == session]
    assert len(found) == 1, found
    return found[0]


async def replicas(start_gateway, shared_store, n=2, **extra):
    return [await start_gateway(**shared_store(i, server={"admin_token": ADMIN}, **extra)) for i in range(n)]


async def test_turns_sprayed_across_replicas_record_every_message_exactly_once(start_gateway, shared_store, upstream):
    gws = await replicas(start_gateway, shared_store)
    rng = random.Random(7)
    histories = {f"spray-{i}": [] for i in range(6)}

    async def run(session: str) -> None:
        for t in range(5):
            await turn(rng.choice(gws), session, histories[session], f"{session} turn {t}")

    await asyncio.gather(*(run(s) for s in histories))
    for session, history in histories.items():
        rec = record(gws[1], session)
        events = gws[0].app[LEDGER].since(rec.key, -1)
        assert [e.message["content"] for e in events] == [m["content"] for m in history]
        assert [e.seq for e in events] == list(range(len(history)))
        assert len(gws[1].app[LEDGER].heads(rec.key)) == 1  # no accidental fork
    # Every upstream call carried its session's whole history, whichever replica sent it.
    for req in upstream.chat_requests():
        messages = req["json"]["messages"]
        session = messages[0]["content"].split(" turn ")[0]
        assert [m["content"] for m in messages] == [m["content"] for m in histories[session][: len(messages)]]


async def test_a_checkpoint_written_through_one_replica_is_used_by_the_other(start_gateway, shared_store):
    # A view adopts a checkpoint at a compaction event: a trigger this low makes every round one
    # (unconditionally: whether the event pays is not this test's question).
    low = {"compact_trigger_ratio": 0.001, "view_target_ratio": 0.0005, "summary_trigger_ratio": 0.5, "cost_model": False}
    a, b = await replicas(start_gateway, shared_store, policy=low)
    history: list[dict] = []
    for t in range(3):
        await turn(a, "cp", history, f"turn {t}")
    rec = record(a, "cp")
    events = a.app[LEDGER].since(rec.key, -1)
    assert b.app[CHECKPOINTS].list(rec.key) == []  # b has looked before a writes
    cp = a.app[CHECKPOINTS].add(rec.key, boundary=events[3].id, summary="## Summary\nturns 0 and 1", state={},
                                covered_tokens=20, covered_events=4, model="m", mode="async", previous=None, summary_tokens=5)
    history.append({"role": "user", "content": "next"})
    raw = await client(b, "cp").chat.completions.with_raw_response.create(model="m", messages=history)
    assert raw.headers.get("x-palimpsest-checkpoint") == cp.id


async def test_recall_on_one_replica_finds_what_another_wrote(start_gateway, shared_store):
    a, b = await replicas(start_gateway, shared_store)
    history: list[dict] = []
    await turn(a, "recall", history, "The staging database password is kiwi-orbit-42, keep it safe.")
    await turn(a, "recall", history, "Now let us talk about the deployment calendar.")
    rec = record(a, "recall")
    ids = [e.id for e in a.app[LEDGER].since(rec.key, -1)]

    async def search(gw) -> dict:
        call = {"id": "q", "type": "function", "function": {"name": "session_search", "arguments": json.dumps(
            {"query": "staging database password", "scope": "session"})}}
        return orjson.loads(await gw.app[PIPELINE].loop.tools.run(
            call, kind="search", session_key=rec.key, path_ids=ids, hidden=frozenset(ids)))

    # b never indexed anything: it catches up from the ledger into the shared index.
    found = await search(b)
    best = found["results"][0]
    assert "staging database password" in (best.get("passage") or best.get("snippet"))  # the fact, or the puppet's echo
    assert ids[0] in {r["event_id"] for r in found["results"]}
    # a finds the same through the index b wrote, without adding rows twice.
    rows = await (await b.app[INDEXER].opened()).chunk_keys(rec.key)
    assert [r["event_id"] for r in (await search(a))["results"]] == [r["event_id"] for r in found["results"]]
    index = await a.app[INDEXER].opened()
    table = await index._session(rec.key)
    assert await table.table.count_rows() == len(rows)


async def test_delete_through_one_replica_is_seen_by_the_other(start_gateway, shared_store):
    a, b = await replicas(start_gateway, shared_store)
    history: list[dict] = []
    await turn(b, "gone", history, "forget me")
    rec = record(a, "gone")
    async with aiohttp.ClientSession() as http:
        async with http.delete(f"{a.root}/admin/sessions/{rec.key}", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 200 and (await r.json())["events"] == 2
    assert b.app[LEDGER].session(rec.key) is None
    # b's known-event cache had these ids: the resent conversation is recorded again anyway.
    await client(b, "gone").chat.completions.create(model="m", messages=history)
    again = a.app[LEDGER].since(record(a, "gone").key, -1)
    assert [e.message["content"] for e in again] == ["forget me", "ok: forget me", "ok: forget me"]


async def test_views_and_summaries_match_a_single_replica_run(start_gateway, shared_store, upstream, tmp_path, monkeypatch):
    """The same agent session through one gateway on the embedded store, then sprayed across two
    replicas on PostgreSQL: the upstream receives the same views and summary requests, and the
    same checkpoints result. Summaries are waited for after every call, so timing cannot differ."""
    # No proactive recall block: it quotes event times and ids, which differ between the two runs.
    monkeypatch.setenv("PALIMPSEST_RECALL__AUTO_TOKENS", "0")
    from simulator.workloads import TOOL_SPECS, synthetic_session
    from tests.support.agent import settle

    # Summaries as transcripts: a cache fork's summary quotes the view's placeholders, whose
    # event ids hash the puppet's tool-call ids, which differ between the two runs.
    policy = {"summary_trigger_ratio": 0.3, "sync_compaction_ratio": 0.3, "sync_budget_s": 30, "summary_cache_fork": False}
    session = synthetic_session(seed=5, rounds=12)

    async def play(gws) -> tuple[list, list]:
        start = len(upstream.received)
        # Both runs get the same tool-call ids (the puppet numbers them per process), so the two
        # paths are the same: otherwise their placeholders and summary blocks differ by a few
        # tokens (the ids and the event ids hashing them tokenize differently), and a view plan,
        # a pure function of the path, may decide differently where a decision is that close.
        upstream.state.counter = 0
        history = [{"role": "system", "content": session.system}]
        calls = 0
        for spec in session.rounds:
            history.append({"role": "user", "content": spec["user"]})
            for step in range(2):
                gw = gws[calls % len(gws)]
                calls += 1
                r = await client(gw, "same").chat.completions.create(model="fake-8k", messages=history, tools=TOOL_SPECS)
                for g in gws:
                    await settle(g)
                message = r.choices[0].message
                history.append(message.model_dump(exclude_none=True))
                if step == 0:
                    history.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": spec["output"]})
        # The puppet numbers tool-call ids across runs, and event ids hash them: compare with
        # both renamed in order of appearance, and checkpoint boundaries by position.
        renamed: dict[str, str] = {}
        text = json.dumps([(r["headers"].get("x-palimpsest-purpose"), r["json"]["messages"]) for r in upstream.received[start:]
                           if r["path"].endswith("/chat/completions")])
        ids = re.compile(r"\b(call_[A-Za-z0-9]+|ev_[0-9a-f]+)\b")
        for found in ids.findall(text):
            renamed.setdefault(found, f"id{len(renamed)}")
        received = json.loads(ids.sub(lambda m: renamed[m.group(1)], text))
        rec = record(gws[0], "same")
        path = [e.id for e in gws[0].app[LEDGER].since(rec.key, -1)]
        cps = [(path.index(c.boundary), c.summary, c.covered_events, c.version, c.mode) for c in gws[0].app[CHECKPOINTS].list(rec.key)]
        return received, cps

    single = await start_gateway(store={"path": str(tmp_path / "single")}, policy=policy)
    alone, alone_cps = await play([single])
    await single.stop()
    sprayed, sprayed_cps = await play(await replicas(start_gateway, shared_store, policy=policy))
    assert alone_cps, "the workload must reach compaction"
    assert sprayed_cps == alone_cps
    assert [p for p, _ in sprayed] == [p for p, _ in alone]  # same summary calls at the same points
    assert sprayed == alone


async def test_readiness_follows_the_database(start_gateway, shared_store, postgres, pg_url):
    import psycopg

    (gw,) = await replicas(start_gateway, shared_store, n=1)
    db = pg_url.rsplit("/", 1)[1]

    async def ready() -> int:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{gw.root}/readyz") as r:
                return r.status

    assert await ready() == 200
    with psycopg.connect(postgres["admin"], autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false")
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (db,))
    assert await ready() == 503
    with psycopg.connect(postgres["admin"], autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
    for _ in range(50):
        if await ready() == 200:
            break
        await asyncio.sleep(0.2)
    assert await ready() == 200


RESPONSES_MODELS = {"fake-32k": {"context_window": 32_000}}


def responses_client(gw, key: str, session: str | None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, max_retries=0,
                              default_headers={"X-Session-Id": session} if session else {})


def responses_sent(upstream) -> list[dict]:
    return [r["json"] for r in upstream.received if r["path"] == "/v1/responses" and r.get("json")
            and not r["headers"].get("x-palimpsest-purpose")]


async def test_a_responses_chain_alternates_between_replicas_without_affinity(start_gateway, shared_store, upstream):
    tenants = {"tenants": {"alice": "pk-alice", "bob": "pk-bob"}, "models": RESPONSES_MODELS}
    a, b = await replicas(start_gateway, shared_store, **tenants)
    previous = None
    for n, gw in enumerate([a, b, a, b]):  # each request on the other replica, no session header
        chained = {"previous_response_id": previous} if previous else {}
        response = await responses_client(gw, "pk-alice", None if n else "chain").responses.create(
            model="fake-32k", input=f"step {n}: 77{n}1", store=False, **chained)
        assert response.output_text.startswith("ok:")
        body = responses_sent(upstream)[-1]
        assert "previous_response_id" not in body  # the gateway sent the chain itself
        assert all(f"77{k}1" in str(body["input"]) for k in range(n + 1)), n  # the whole chain, from the shared ledger
        previous = response.id
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{a.base_url}/responses/{previous}/input_items", headers={"Authorization": "Bearer pk-alice"}) as r:
            assert r.status == 200 and "7701" in await r.text()
        async with http.get(f"{b.base_url}/responses/{previous}", headers={"Authorization": "Bearer pk-bob"}) as r:
            assert r.status == 404  # per tenant on every replica
        async with http.delete(f"{b.base_url}/responses/{previous}", headers={"Authorization": "Bearer pk-alice"}) as r:
            assert (await r.json())["deleted"] is True
    with pytest.raises(openai.BadRequestError):  # deleted through b: a no longer continues it
        await responses_client(a, "pk-alice", None).responses.create(model="fake-32k", input="more", store=False,
                                                                    previous_response_id=previous)


async def test_a_compaction_item_made_on_one_replica_expands_on_the_other(start_gateway, shared_store, upstream):
    a, b = await replicas(start_gateway, shared_store, models=RESPONSES_MODELS)
    items = [{"type": "message", "role": "user", "content": "the release code is 5521"}]
    first = await responses_client(a, "sk-test", "cmp").responses.create(model="fake-32k", input=items, store=False)
    items += [i.model_dump(exclude_none=True) for i in first.output]
    for maker, user in ((a, b), (b, a)):
        trigger = await responses_client(maker, "sk-test", "cmp").responses.create(
            model="fake-32k", input=[*items, {"type": "compaction_trigger"}], store=False)
        compacted = await responses_client(maker, "sk-test", "cmp").responses.compact(model="fake-32k", input=items)
        for item in (trigger.output[0].model_dump(exclude_none=True), compacted.output[-1].model_dump(exclude_none=True)):
            assert item["type"] == "compaction"
            follow = [items[0], item, {"type": "message", "role": "user", "content": "where were we?"}]
            answer = await responses_client(user, "sk-test", "cmp").responses.create(model="fake-32k", input=follow, store=False)
            assert answer.output_text.startswith("ok:")
            body = responses_sent(upstream)[-1]
            assert not any(i.get("type") == "compaction" for i in body["input"])  # expanded, not passed on
            assert any("<session_summary>" in str(i.get("content")) for i in body["input"] if i.get("role") == "developer")
