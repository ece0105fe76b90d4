"""Transparent compaction through the gateway: what the upstream receives on long sessions."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from simulator.puppet import count_prompt
from gateway.keys import CHECKPOINTS, LEDGER, METRICS, SUMMARIZER
from simulator.workloads import TOOL_SPECS, synthetic_session
from policies.rounds import tool_pair_problems
from tests.support.agent import drive, settle


def client(gw, session="long", key="sk-a"):
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, default_headers={"X-Session-Id": session}, max_retries=0)


def assert_every_upstream_request_valid(upstream, window=32_000):
    for req in upstream.chat_requests():
        body = req["json"]
        assert tool_pair_problems([m for m in body["messages"] if m["role"] not in ("system", "developer")]) == []
        if body["model"] == "fake-32k":
            assert count_prompt(body) + (body.get("max_tokens") or 0) <= window



async def test_short_session_is_untouched(gateway, upstream):
    raw = {"model": "fake-32k", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}], "tools": TOOL_SPECS}
    async with aiohttp.ClientSession() as s:
        body = json.dumps(raw, separators=(",", ":")).encode()
        async with s.post(gateway.base_url + "/chat/completions", data=body, headers={"Content-Type": "application/json", "X-Session-Id": "short"}) as r:
            assert r.status == 200
            assert "x-palimpsest-checkpoint" not in r.headers
    assert upstream.chat_requests()[-1]["body"] == body
    assert gateway.app[CHECKPOINTS].list(gateway.app[LEDGER].sessions()[0].key) == []
    assert not any(r["headers"].get("x-palimpsest-purpose") for r in upstream.received)


async def test_long_session_fits_window_and_saves_tokens(start_gateway, upstream):
    # The transcript form of summary calls, whose system prompt is the summary instruction. Cached
    # reads at half price make folding the placeholders pay on a session this short (at 0.1 the
    # cost model settles over them instead: policies/cost.settle_size).
    gateway = await start_gateway(policy={"profile": "economy", "summary_cache_fork": False, "cached_input_rate": 0.5})
    session = synthetic_session(seed=1, rounds=30)
    history, raw = await drive(client(gateway), session, model="fake-32k")
    await settle(gateway)
    assert_every_upstream_request_valid(upstream)
    client_tokens = sum(int(r.headers["x-palimpsest-prompt-tokens-client"]) for r in raw if "x-palimpsest-prompt-tokens-client" in r.headers)
    upstream_tokens = sum(int(r.headers["x-palimpsest-prompt-tokens-upstream"]) for r in raw if "x-palimpsest-prompt-tokens-upstream" in r.headers)
    assert client_tokens > 0 and upstream_tokens < 0.6 * client_tokens
    # Summaries were made and used: later requests name a checkpoint and carry its block.
    assert any(r.headers.get("x-palimpsest-checkpoint") for r in raw[-10:])
    summary_calls = [r for r in upstream.received if r["headers"].get("x-palimpsest-purpose") == "summary"]
    assert summary_calls
    last = [r for r in upstream.chat_requests() if not r["headers"].get("x-palimpsest-purpose")][-1]["json"]
    # The client's system prompt and tools go up byte-identical; the block is a message of its own after them.
    assert last["messages"][0] == history[0] and last["tools"][: len(TOOL_SPECS)] == TOOL_SPECS
    assert last["messages"][1]["role"] == "system" and last["messages"][1]["content"].startswith("<session_summary>")
    # The client's own last turn always goes up verbatim.
    assert last["messages"][-1] == history[-2] or last["messages"][-1]["content"] == history[-2]["content"]
    # Hidden history means the recall tools are offered.
    assert {"session_search", "session_load"} <= {t["function"]["name"] for t in last["tools"]}
    # The economy profile asks for short summaries and lists at most 15 common values per kind.
    assert all("400 words" in r["json"]["messages"][0]["content"] for r in summary_calls)
    block = last["messages"][1]["content"]
    common = [line for line in block.splitlines() if line.startswith(("- paths:", "- dates:", "- numbers:", "- names:"))]
    assert common and max(len(line.split(" | ")) for line in common) == 15


async def test_placeholders_are_stable_across_turns(start_gateway, upstream):
    # A big window and no summaries: only tool-result compaction changes the view.
    gw = await start_gateway(policy={"summary_trigger_ratio": 0.01, "sync_compaction_ratio": 1.0, "keep_recent_rounds": 2,
                                     "compact_batch_rounds": 3, "compact_trigger_ratio": 0.05, "view_target_ratio": 0.02},
                             models={"fake-128k": {"context_window": 128_000}},
                             recall={"auto_tokens": 0})  # no proactive recall block: isolate compaction
    gw.app[SUMMARIZER].after_turn = lambda *a, **k: None  # no checkpoints: isolate compaction
    await drive(client(gw, "stable"), synthetic_session(seed=2, rounds=14), model="fake-128k")
    sent = [r["json"]["messages"] for r in upstream.chat_requests()]
    placeholder_by_call: dict[str, str] = {}
    changes = 0
    for messages in sent:
        for m in messages:
            if m["role"] == "tool":
                if "[palimpsest" in m["content"] or "session_load" in m["content"]:
                    first = placeholder_by_call.setdefault(m["tool_call_id"], m["content"])
                    assert first == m["content"], "a compacted result changed its placeholder"
                else:
                    assert m["tool_call_id"] not in placeholder_by_call, "a compacted result came back raw"
    assert placeholder_by_call
    # Batching: most consecutive requests extend the previous prompt (a shared prefix).
    for prev, cur in zip(sent, sent[1:]):
        if cur[: len(prev)] != prev:
            changes += 1
    assert changes <= len(sent) // 3


def metric_total(gw, name: str) -> float:
    """Sum of a metric's samples over every label set (0 when nothing was ever counted)."""
    return sum(s.value for fam in gw.app[METRICS].registry.collect() for s in fam.samples if s.name == name)


async def test_summary_failure_never_fails_the_request(start_gateway, upstream):
    # Dear cached reads: a summary is due on this short session (see the test above).
    gw = await start_gateway(policy={"summary_base_url": "http://127.0.0.1:9/v1", "profile": "economy", "cached_input_rate": 0.5})
    assert metric_total(gw, "palimpsest_summary_errors_total") == 0
    history, raw = await drive(client(gw, "fail"), synthetic_session(seed=3, rounds=28), model="fake-32k")
    await settle(gw)
    assert all(r.status_code == 200 for r in raw)
    assert_every_upstream_request_valid(upstream)
    assert metric_total(gw, "palimpsest_summary_errors_total") > 0  # the failures were counted


async def test_sync_path_waits_for_summary_and_reprojects(start_gateway, upstream):
    # Async jobs disabled: only the sync path can make checkpoints.
    # cost_model off: no early compaction event (policies/compaction.py) keeps the view under the sync ratio.
    gw = await start_gateway(policy={"summary_trigger_ratio": 0.3, "sync_compaction_ratio": 0.3, "sync_budget_s": 30,
                                     "cost_model": False})
    gw.app[SUMMARIZER].after_turn = lambda *a, **k: None
    history, raw = await drive(client(gw, "sync"), synthetic_session(seed=5, rounds=30), model="fake-32k")
    key = gw.app[LEDGER].sessions()[0].key
    cps = gw.app[CHECKPOINTS].list(key)
    assert cps and all(cp.mode == "sync" for cp in cps)
    assert any(r.headers.get("x-palimpsest-checkpoint") == cps[0].id for r in raw)
    assert_every_upstream_request_valid(upstream)


async def test_big_arrival_goes_out_tailored_with_state_without_waiting(start_gateway, upstream):
    gw = await start_gateway(policy={"sync_budget_s": 0.5})
    session = synthetic_session(seed=6, rounds=40)
    # Long user turns (pasted logs): tool-result compaction cannot help, only a summary could.
    history = [{"role": "system", "content": session.system},
               {"role": "user", "content": "Remember: the staging deploy id is DEP-58213."}, {"role": "assistant", "content": "noted"}]
    for spec in session.rounds:
        history += [{"role": "user", "content": "Here is a log:\n" + spec["output"]}, {"role": "assistant", "content": "looked at it"}]
    history.append({"role": "user", "content": "what next?"})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await client(gw, "arrival").chat.completions.with_raw_response.create(model="fake-32k", messages=history)
    assert loop.time() - t0 < 5
    assert r.parse().choices[0].message.content == "ok: what next?"
    sent = [q for q in upstream.chat_requests() if not q["headers"].get("x-palimpsest-purpose")][-1]["json"]
    assert sent["messages"][0] == history[0]  # the client's system prompt, untouched
    # After the system prompt: the pinned standing instructions (if any rule was found), then the summary block.
    at = next(i for i, m in enumerate(sent["messages"]) if "<session_summary" in str(m.get("content")))
    assert at <= 2
    block = sent["messages"][at]["content"]
    assert "DEP-58213" in block  # dropped by tailoring, carried by the deterministic state
    assert not any("DEP-58213" in (m.get("content") or "") for m in sent["messages"][at + 1:])
    assert {"session_search", "session_load"} <= {t["function"]["name"] for t in sent["tools"]}
    assert_every_upstream_request_valid(upstream)
    # A one-shot arrival pays no catch-up (the cost model prices it against the one request the
    # session has run: tests/pipeline/test_arrival.py); once the session goes on, the summary comes.
    await settle(gw)
    key = gw.app[LEDGER].sessions()[0].key
    assert not gw.app[CHECKPOINTS].list(key)
    history += [{"role": "assistant", "content": "ok: what next?"}, {"role": "user", "content": "and then?"}]
    await client(gw, "arrival").chat.completions.create(model="fake-32k", messages=history)
    await settle(gw)
    assert gw.app[CHECKPOINTS].list(key)


async def test_context_length_exceeded_when_nothing_fits(gateway, upstream):
    with pytest.raises(openai.BadRequestError) as info:
        await client(gateway, "huge").chat.completions.create(
            model="fake-8k", messages=[{"role": "system", "content": "rule " * 9000}, {"role": "user", "content": "hi"}], max_tokens=7000
        )
    assert info.value.code == "context_length_exceeded"
    assert "allows" in info.value.message
    assert upstream.chat_requests() == []


async def test_oversized_newest_message_is_rejected_with_numbers(gateway, upstream):
    with pytest.raises(openai.BadRequestError) as info:
        await client(gateway, "one").chat.completions.create(
            model="fake-8k", messages=[{"role": "user", "content": "start " + "word " * 12000 + " end"}])
    assert info.value.code == "context_length_exceeded"
    assert "12" in info.value.message and "allows" in info.value.message and "truncate_last_message" in info.value.message
    assert upstream.chat_requests() == []


async def test_single_huge_message_is_truncated_when_the_policy_opts_in(start_gateway, upstream):
    gw = await start_gateway(policy={"truncate_last_message": True})
    before = metric_total(gw, "palimpsest_truncated_last_messages_total")
    r = await client(gw, "one").chat.completions.with_raw_response.create(
        model="fake-8k", messages=[{"role": "user", "content": "start " + "word " * 12000 + " end"}])
    assert r.parse().choices[0].message.content.startswith("ok:")
    assert r.headers["x-palimpsest-truncated-last-message"] == "true"
    sent = upstream.chat_requests()[-1]["json"]["messages"][-1]["content"]
    assert sent.startswith("start") and sent.rstrip().endswith("end") and len(sent) < 40_000
    assert metric_total(gw, "palimpsest_truncated_last_messages_total") == before + 1


async def test_truncated_tool_results_are_counted_in_a_header_and_a_metric(start_gateway, upstream):
    gw = await start_gateway(policy={"max_result_tokens": 500})
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "dump it"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "head " + "row " * 6000},
                {"role": "tool", "tool_call_id": "c2", "content": "head " + "col " * 6000}]
    r = await client(gw, "cut").chat.completions.with_raw_response.create(model="fake-8k", messages=messages, tools=TOOL_SPECS)
    assert r.headers["x-palimpsest-truncated-tool-results"] == "2"
    assert "x-palimpsest-truncated-last-message" not in r.headers
    assert metric_total(gw, "palimpsest_truncated_tool_results_total") == 2
    sent = upstream.chat_requests()[-1]["json"]["messages"]
    assert all("omitted" in m["content"] and count_prompt({"messages": [m]}) < 700 for m in sent[-2:])


async def test_policy_override_by_model_glob(start_gateway, upstream):
    # Dear cached reads: a summary is due on this short session (see test_long_session_fits_window_and_saves_tokens).
    gw = await start_gateway(policies=[{"model": "fake-32*", "injection": "user", "profile": "economy",
                                        "cached_input_rate": 0.5}])
    await drive(client(gw, "user-mode"), synthetic_session(seed=7, rounds=28), model="fake-32k")
    await settle(gw)
    await drive(client(gw, "user-mode"), synthetic_session(seed=7, rounds=1), model="fake-32k", messages=None)
    sent = [r["json"] for r in upstream.chat_requests() if not r["headers"].get("x-palimpsest-purpose")]
    with_block = [b for b in sent if any(isinstance(m.get("content"), str) and m["content"].startswith("<session_summary>") and m["role"] == "user" for m in b["messages"])]
    assert with_block, "user injection mode puts the summary in a user turn"
    assert all("<session_summary>" not in (b["messages"][0].get("content") or "") for b in with_block)


async def test_forks_choose_their_own_checkpoint(start_gateway, upstream):
    gw = await start_gateway(policy={"profile": "economy"})
    session = synthetic_session(seed=8, rounds=28)
    history, _ = await drive(client(gw, "forky"), session, model="fake-32k")
    await settle(gw)
    key = gw.app[LEDGER].sessions()[0].key
    cps = gw.app[CHECKPOINTS].list(key)
    assert cps
    # Edit an early user turn that lies before every boundary: that branch has no checkpoint.
    edited = history[:2] + [{"role": "user", "content": "actually, do something else"}]
    r = await client(gw, "forky").chat.completions.with_raw_response.create(model="fake-32k", messages=edited)
    assert "x-palimpsest-checkpoint" not in r.headers
    # Continuing the main branch uses one of its checkpoints again (the newest may wait for the
    # next compaction event: a summary that lands between events does not rewrite the prefix).
    r = await client(gw, "forky").chat.completions.with_raw_response.create(model="fake-32k", messages=history + [{"role": "user", "content": "go on"}])
    assert r.headers["x-palimpsest-checkpoint"] in {cp.id for cp in gw.app[CHECKPOINTS].list(key)}


async def test_one_summary_job_per_session_under_concurrency(start_gateway, upstream):
    # A low trigger: every turn of the wave is over it and asks for a summary.
    gw = await start_gateway(policy={"summary_trigger_ratio": 0.1, "sync_compaction_ratio": 0.95, "profile": "economy",
                                     "keep_recent_tokens": 1000},
                             recall={"auto_tokens": 0})  # no proactive recall search before forwarding: isolate summary jobs
    session = synthetic_session(seed=9, rounds=22)
    history, _ = await drive(client(gw, "conc"), session, model="fake-32k")
    await settle(gw)
    registry = gw.app[METRICS].registry

    def jobs():
        enqueued = registry.get_sample_value("palimpsest_summary_jobs_enqueued_total", {"mode": "async"}) or 0
        busy = registry.get_sample_value("palimpsest_summary_jobs_dropped_total", {"reason": "busy"}) or 0
        return enqueued, busy

    before = jobs()
    upstream.state.latency_s = 0.2
    upstream.state.summary_latency_s = 5.0  # a job that summarises outlasts the wave
    await asyncio.gather(*(client(gw, "conc").chat.completions.create(model="fake-32k", messages=history + [{"role": "user", "content": f"q{i} " + "details " * 1500}]) for i in range(10)))
    await settle(gw)
    enqueued, busy = (a - b for a, b in zip(jobs(), before))
    assert enqueued + busy == 10, "every concurrent turn asked for a summary"
    # A job that finds nothing new to summarise ends at once, and the next turn may rightly
    # start another: how many do depends on the machine. What may not happen is a turn
    # queueing a second job while one runs (busy would stay 0 and all 10 be enqueued).
    assert busy >= 1 and enqueued < 10, "while one job runs for the session, the others are dropped"
    key = gw.app[LEDGER].sessions()[0].key
    boundaries = [cp.boundary for cp in gw.app[CHECKPOINTS].list(key)]
    assert len(boundaries) == len(set(boundaries)), "two jobs summarised the same delta"


async def _metrics(gw) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.root + "/metrics") as r:
            return await r.text()


async def test_legacy_functions_count_against_the_window(gateway, upstream):
    """A client on the legacy `functions` API: their schemas are prompt, so the view is fitted
    with them (they were not counted, and a view that fitted without them went over)."""
    functions = [{"name": f"tool_{n}", "description": " ".join(["Looks things up in the records."] * 40),
                  "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}} for n in range(12)]
    history = [{"role": "system", "content": "You are terse."}]
    for n in range(30):
        history += [{"role": "user", "content": f"Question {n}: " + "tell me about the ledger. " * 30},
                    {"role": "assistant", "content": f"Answer {n}: " + "the ledger keeps every message. " * 30}]
    history.append({"role": "user", "content": "And now?"})
    body = {"model": "fake-8k", "messages": history, "functions": functions, "max_tokens": 200}
    assert count_prompt(body) > 8_000 and count_prompt({**body, "functions": []}) < 20_000
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.base_url + "/chat/completions", json=body, headers={"X-Session-Id": "legacy"}) as r:
            assert r.status == 200, await r.text()
            client_tokens = int(r.headers["x-palimpsest-prompt-tokens-client"])
    sent = [q["json"] for q in upstream.chat_requests() if not q["headers"].get("x-palimpsest-purpose")]
    assert sent and all(count_prompt(b) + 200 <= 8_000 for b in sent)
    assert sent[-1]["functions"] == functions  # the client's definitions go up untouched
    # The gateway's own count of the client's prompt includes the functions.
    assert client_tokens >= count_prompt({"model": "fake-8k", "messages": [], "functions": functions})
