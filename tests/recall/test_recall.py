"""Recall through the gateway: the model gets old facts back; the client never sees how."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import openai
import orjson

from gateway.keys import INDEXER, LEDGER, PIPELINE
from simulator.workloads import TOOL_SPECS, synthetic_session
from tests.support.agent import drive, settle

RECALL_NAMES = {"session_search", "session_load"}


def client(gw, session="rec", key="sk-a"):
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, default_headers={"X-Session-Id": session}, max_retries=0)



async def long_history(gw, session="rec", rounds=28, seed=11):
    s = synthetic_session(seed=seed, rounds=rounds)
    history, _ = await drive(client(gw, session), s, model="fake-32k")
    await settle(gw)
    return s, history


def tool_names(body):
    return {t["function"]["name"] for t in body.get("tools") or []}


async def test_fact_hidden_by_summary_comes_back_non_streaming(gateway, upstream):
    s, history = await long_history(gateway)
    fact = s.facts[1]  # planted in a tool output of round 4, long compacted away
    n_before = len(upstream.chat_requests())
    r = await client(gateway).chat.completions.with_raw_response.create(
        model="fake-32k", messages=history + [{"role": "user", "content": f"RECALL: {fact.question}"}], tools=TOOL_SPECS
    )
    answer = r.parse().choices[0].message
    assert fact.answer in answer.content
    assert not answer.tool_calls  # the client never sees a recall call
    assert r.headers["x-palimpsest-recall-calls"] == "1"
    turn = [q["json"] for q in upstream.chat_requests()[n_before:] if not q["headers"].get("x-palimpsest-purpose")]
    assert len(turn) == 2  # search, answer: the top hit's passage was enough, no load round trip
    assert RECALL_NAMES <= tool_names(turn[0])
    # The search result the model read carries the matching passage and says it is historical data.
    result = orjson.loads(next(m["content"] for m in turn[-1]["messages"] if m["role"] == "tool" and "historical" in m.get("content", "").lower()))
    assert fact.statement in result["results"][0]["passage"]
    # Passages share passage_tokens (~4 chars each), small hits below them come whole within
    # half that again; the other hits keep a short snippet.
    assert sum(len(h.get("passage", "")) for h in result["results"]) <= 1.5 * 4 * 600
    assert all(len(h.get("snippet", "")) <= 310 for h in result["results"])
    # The fact is not in what the model saw before recalling it (besides the proactive recall block).
    assert fact.answer not in json.dumps([m for m in turn[0]["messages"]
                                          if m["role"] != "system" and not str(m.get("content")).startswith("<recalled_history>")])
    # Recall calls are side events: the path is unchanged, the next resend still matches.
    ledger = gateway.app[LEDGER]
    key = ledger.sessions()[0].key
    events = ledger.since(key, -1)
    sides = [e for e in events if e.kind == "side"]
    assert len(sides) == 2  # search call + result
    assert all(e.role in ("assistant", "tool") for e in sides)


async def test_a_small_hit_comes_whole_with_the_search_so_it_needs_no_load(gateway, upstream):
    """A hit whose whole event is small is marked complete and carries all of it, below the best
    hits too: the model reads it in the search round instead of loading it in one more."""
    s, history = await long_history(gateway, session="small-hits")
    n_before = len(upstream.chat_requests())
    await client(gateway, "small-hits").chat.completions.create(
        model="fake-32k", messages=history + [{"role": "user", "content": f"RECALL: {s.facts[1].question}"}], tools=TOOL_SPECS)
    turn = [q["json"] for q in upstream.chat_requests()[n_before:] if not q["headers"].get("x-palimpsest-purpose")]
    result = orjson.loads(next(m["content"] for m in turn[-1]["messages"] if m["role"] == "tool" and "historical" in m.get("content", "").lower()))
    ledger = gateway.app[LEDGER]
    key = ledger.sessions()[0].key
    from gateway.jobs.indexer import event_text
    whole = [h for h in result["results"] if h.get("complete")]
    assert [h for h in whole if h not in result["results"][:3]], "a small hit below the best three comes whole"
    for hit in whole:
        assert hit["passage"] == event_text(ledger.get(key, hit["event_id"])) and "total_chars" not in hit
    for hit in result["results"]:
        assert hit.get("complete") or "total_chars" in hit or "snippet" in hit  # else the model knows to load it
    assert "complete is the whole event" in result["note"]


async def test_without_passages_the_model_loads_the_top_hit(start_gateway, upstream):
    gw = await start_gateway(recall={"passage_tokens": 0})
    s, history = await long_history(gw, session="no-passages")
    fact = s.facts[1]
    n_before = len(upstream.chat_requests())
    r = await client(gw, "no-passages").chat.completions.with_raw_response.create(
        model="fake-32k", messages=history + [{"role": "user", "content": f"RECALL: {fact.question}"}], tools=TOOL_SPECS
    )
    assert fact.answer in r.parse().choices[0].message.content
    assert r.headers["x-palimpsest-recall-calls"] == "2"
    turn = [q["json"] for q in upstream.chat_requests()[n_before:] if not q["headers"].get("x-palimpsest-purpose")]
    assert len(turn) == 3  # search, load, answer
    search = orjson.loads(turn[-1]["messages"][-3]["content"])  # search result, load call, load result
    assert all("passage" not in hit for hit in search["results"])


async def test_fact_comes_back_streaming_with_one_coherent_stream(gateway, upstream):
    s, history = await long_history(gateway, session="rec-stream", seed=12)
    fact = s.facts[1]
    stream = await client(gateway, "rec-stream").chat.completions.create(
        model="fake-32k", messages=history + [{"role": "user", "content": f"RECALL: {fact.question}"}], tools=TOOL_SPECS,
        stream=True, stream_options={"include_usage": True},
    )
    ids, text, finish, usage, tool_deltas = set(), [], None, None, 0
    async for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            tool_deltas += len(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    assert fact.answer in "".join(text)
    assert tool_deltas == 0 and finish == "stop"
    assert len(ids) == 1
    # Usage adds up every upstream call of the turn.
    turn = [q for q in upstream.chat_requests() if not q["headers"].get("x-palimpsest-purpose")][-2:]
    assert usage is not None and usage.prompt_tokens > 2 * 1000
    assert all(q["json"]["stream"] for q in turn)


async def test_mixed_client_and_recall_calls_client_wins(gateway, upstream):
    s, history = await long_history(gateway, session="mixed", seed=13)
    msgs = history + [{"role": "user", "content": "[[parallel session_search read_file]]"}]
    r = await client(gateway, "mixed").chat.completions.create(model="fake-32k", messages=msgs, tools=TOOL_SPECS)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["read_file"]
    assert r.choices[0].finish_reason == "tool_calls"
    stream = await client(gateway, "mixed").chat.completions.create(model="fake-32k", messages=msgs, tools=TOOL_SPECS, stream=True)
    names, indexes, finish = [], set(), None
    async for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                indexes.add(tc.index)
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
    assert names == ["read_file"] and indexes == {0} and finish == "tool_calls"


async def test_max_rounds_then_final_call_without_recall_tools(start_gateway, upstream):
    gw = await start_gateway(recall={"max_rounds": 1})
    s, history = await long_history(gw, session="rounds", seed=14)
    n_before = len(upstream.chat_requests())
    r = await client(gw, "rounds").chat.completions.create(
        model="fake-32k", messages=history + [{"role": "user", "content": f"RECALL: {s.facts[0].question}"}], tools=TOOL_SPECS
    )
    turn = [q["json"] for q in upstream.chat_requests()[n_before:] if not q["headers"].get("x-palimpsest-purpose")]
    assert len(turn) == 2
    assert RECALL_NAMES <= tool_names(turn[0])
    assert not (RECALL_NAMES & tool_names(turn[1]))
    assert tool_names(turn[1]) == {t["function"]["name"] for t in TOOL_SPECS}
    # The final call still returns a normal answer (the puppet would call load; without the tool it answers).
    assert r.choices[0].message.content


async def test_other_tenant_with_same_session_id_finds_nothing(gateway, upstream):
    s, history = await long_history(gateway, session="shared-id", seed=15)
    fact = s.facts[0]
    # Tenant B uses the same session id; its own short history hides nothing...
    other = client(gateway, "shared-id", key="sk-b")
    r = await other.chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": f"RECALL: {fact.question}"}])
    assert "no recall tools" in r.choices[0].message.content
    # ...and its search runs in its own session: tenant A's events are unreachable.
    pipeline = gateway.app[PIPELINE]
    ledger = gateway.app[LEDGER]
    b_keys = {rec.key for rec in ledger.sessions() if rec.session_id == "shared-id"}
    assert len(b_keys) == 2
    a_key = next(k for k in b_keys if ledger.since(k, -1)[0].message["content"] != f"RECALL: {fact.question}")
    b_key = (b_keys - {a_key}).pop()
    call = {"id": "x", "type": "function", "function": {"name": "session_search", "arguments": json.dumps({"query": fact.question, "scope": "session"})}}
    result = orjson.loads(await pipeline.loop.tools.run(call, kind="search", session_key=b_key, path_ids=[], hidden=frozenset()))
    assert all(fact.answer not in h["snippet"] for h in result["results"])
    load = {"id": "y", "type": "function", "function": {"name": "session_load", "arguments": json.dumps({"event_id": ledger.since(a_key, -1)[0].id})}}
    loaded = orjson.loads(await pipeline.loop.tools.run(load, kind="load", session_key=b_key, path_ids=[], hidden=frozenset()))
    assert "error" in loaded


async def test_load_paging_and_neighbours(gateway, upstream):
    s, history = await long_history(gateway, session="paging", seed=16, rounds=26)
    ledger = gateway.app[LEDGER]
    key = ledger.sessions()[0].key
    events = [e for e in ledger.since(key, -1) if e.kind == "message"]
    tool_event = next(e for e in events if e.role == "tool" and len(e.message["content"]) > 3000)
    tools = gateway.app[PIPELINE].loop.tools
    path = [e.id for e in events]

    async def load(**args):
        call = {"id": "l", "type": "function", "function": {"name": "session_load", "arguments": json.dumps(args)}}
        return orjson.loads(await tools.run(call, kind="load", session_key=key, path_ids=path, hidden=frozenset()))

    first = await load(event_id=tool_event.id, limit=1000)
    assert first["event"]["content"] == tool_event.message["content"][:1000]
    assert first["event"]["next_offset"] == 1000 and first["event"]["total_chars"] == len(tool_event.message["content"])
    second = await load(event_id=tool_event.id, offset=1000, limit=1000)
    assert second["event"]["content"] == tool_event.message["content"][1000:2000]
    around = await load(event_id=tool_event.id, before=2, after=1, limit=10)
    pos = path.index(tool_event.id)
    assert [n["event_id"] for n in around["before"]] == path[pos - 2 : pos]
    assert [n["event_id"] for n in around["after"]] == path[pos + 1 : pos + 2]
    assert "not instructions" in around["note"]
    bad = await load(event_id="ev_nope")
    assert "error" in bad
    garbage = orjson.loads(await tools.run({"id": "g", "function": {"name": "session_load", "arguments": "{not json"}}, kind="load", session_key=key, path_ids=path, hidden=frozenset()))
    assert "error" in garbage


async def test_session_with_nothing_hidden_gets_no_recall_tools(gateway, upstream):
    r = await client(gateway, "small").chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}], tools=TOOL_SPECS)
    assert r.choices[0].message.content
    assert not (RECALL_NAMES & tool_names(upstream.chat_requests()[-1]["json"]))


async def test_client_tools_with_recall_names_are_not_shadowed(gateway, upstream):
    own = [{"type": "function", "function": {"name": "session_search", "parameters": {"type": "object", "properties": {}}}}]
    s = synthetic_session(seed=17, rounds=26)
    history, _ = await drive(client(gateway, "clash"), s, model="fake-32k")
    await settle(gateway)
    await client(gateway, "clash").chat.completions.create(model="fake-32k", messages=history + [{"role": "user", "content": "go"}], tools=own + TOOL_SPECS)
    names = [t["function"]["name"] for t in upstream.chat_requests()[-1]["json"]["tools"]]
    assert names.count("session_search") == 1  # the client's own, untouched
    assert any(n != "session_search" and "session_search" in n for n in names)


async def test_reindex_reproduces_the_index(start_gateway, upstream, tmp_path):
    gw = await start_gateway()
    s, history = await long_history(gw, session="reidx", seed=18, rounds=26)
    ledger = gw.app[LEDGER]
    key = ledger.sessions()[0].key
    call = {"id": "q", "type": "function", "function": {"name": "session_search", "arguments": json.dumps({"query": s.facts[0].question, "scope": "session"})}}
    path = [e.id for e in ledger.since(key, -1) if e.kind == "message"]  # one linear conversation
    before = orjson.loads(await gw.app[PIPELINE].loop.tools.run(call, kind="search", session_key=key, path_ids=path, hidden=frozenset()))
    rows_before = await (await gw.app[INDEXER].opened()).chunk_keys(key)
    assert len(rows_before) > len(history) // 2
    settings = gw.settings
    await gw.stop()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\npath = "{settings.store.path}"\n')
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gateway", "reindex", "--config", str(cfg)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "reindexed 1 sessions" in out.stdout
    gw2 = await start_gateway()
    after = orjson.loads(await gw2.app[PIPELINE].loop.tools.run(call, kind="search", session_key=key, path_ids=path, hidden=frozenset()))
    assert await (await gw2.app[INDEXER].opened()).chunk_keys(key) == rows_before
    # Same rows; BM25 statistics of a freshly built index differ slightly from an
    # incrementally grown one, so only the best hit must agree.
    assert after["results"][0]["event_id"] == before["results"][0]["event_id"]


async def test_recall_rounds_never_push_a_request_over_the_window(start_gateway, upstream):
    from simulator.puppet import count_prompt

    # A tiny reserve: the tailored view fills the window, so recall results must be fitted.
    gw = await start_gateway(policy={"sync_budget_s": 0.2, "reserve_tokens": 16})
    s = synthetic_session(seed=19, rounds=30)
    history = [{"role": "user", "content": "Remember: the staging deploy id is DEP-58213."}, {"role": "assistant", "content": "noted"}]
    for spec in s.rounds:
        history += [{"role": "user", "content": "log:\n" + spec["output"]}, {"role": "assistant", "content": "seen"}]
    n_before = len(upstream.chat_requests())
    r = await client(gw, "tight").chat.completions.create(
        model="fake-8k", messages=history + [{"role": "user", "content": "RECALL: What is the staging deploy id?"}], max_tokens=200
    )
    assert r.choices[0].message.content.startswith("ANSWER")
    turn = [q["json"] for q in upstream.chat_requests()[n_before:] if not q["headers"].get("x-palimpsest-purpose")]
    assert len(turn) == 2  # search, then the answer from the top hit's passage
    for body in turn:
        assert count_prompt(body) + 200 <= 8_000


async def test_search_points_at_a_fact_still_in_view_and_never_at_the_question(gateway, upstream):
    # A model may search for what its long prompt still shows (lost in the middle): the hit is
    # that event, marked in_view, not the best of the hidden history, and not the question itself.
    s, history = await long_history(gateway, session="inview", seed=12)
    fact = {"role": "user", "content": "For the record: the vault combination is 31-07-44, keep it safe."}
    history = history + [fact, {"role": "assistant", "content": "Noted."}]
    question = {"role": "user", "content": "RECALL: What is the vault combination?"}
    n_before = len(upstream.chat_requests())
    r = await client(gateway, "inview").chat.completions.create(model="fake-32k", messages=history + [question], tools=TOOL_SPECS)
    assert "31-07-44" in r.choices[0].message.content
    turn = [q["json"] for q in upstream.chat_requests()[n_before:] if not q["headers"].get("x-palimpsest-purpose")]
    assert RECALL_NAMES <= tool_names(turn[0]) and fact in turn[0]["messages"]  # history is hidden, the fact is not
    result = orjson.loads(next(m["content"] for m in turn[-1]["messages"] if m["role"] == "tool" and "results" in m.get("content", "")))
    top = result["results"][0]
    assert top["in_view"] is True and "31-07-44" in top["passage"]
    assert not any("RECALL:" in h.get("passage", h.get("snippet", "")) for h in result["results"])
